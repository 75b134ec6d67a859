"""A Magentic-One style multi-agent failure the project wrote itself (issue 28): the agents are named only in
the `role` field ("Orchestrator (thought)", "Orchestrator (-> WebSurfer)", "WebSurfer", "FileSurfer",
"Assistant"), never in `name`; the first message is the human's task. WebSurfer misreads the page at step 6
(it reports the 2010 figure as the 2020 one), and everything after builds on that value.

`renamed(trace, mapping)` renames the agents in every role; `MISTAKE` is (agent, step) of the mistake.
"""

from __future__ import annotations

import copy
import re
from typing import Any

QUESTION = "What was Exampletown's population in the 2020 census, according to the town's website?"
TRUTH = "48,213"

MAGENTIC_ONE: dict[str, Any] = {
    "question": QUESTION,
    "ground_truth": TRUTH,
    "history": [
        {"role": "human", "content": QUESTION},
        {
            "role": "Orchestrator (thought)",
            "content": "Initial plan: WebSurfer finds the town's official website and its census page; FileSurfer "
            "reads any downloaded census table; Assistant writes the answer.",
        },
        {
            "role": "Orchestrator (-> WebSurfer)",
            "content": "Please search the web for the official Exampletown website and open its census page.",
        },
        {
            "role": "WebSurfer",
            "content": "I typed 'Exampletown official website census' into the search bar. The first result is "
            "exampletown.gov/census, titled 'Census figures of Exampletown'.",
        },
        {
            "role": "Orchestrator (thought)",
            "content": "The census page is found. Next: read the 2020 figure there.",
        },
        {
            "role": "Orchestrator (-> WebSurfer)",
            "content": "Please open exampletown.gov/census and read the 2020 population.",
        },
        {
            "role": "WebSurfer",
            "content": "I clicked 'Census figures of Exampletown'. The table on the page reads: 'Census 2010: 45,902 "
            "residents | Census 2020: 48,213 residents'. The 2020 population is 45,902.",
        },
        {
            "role": "Orchestrator (thought)",
            "content": "WebSurfer reports the figure; FileSurfer can check the table file.",
        },
        {
            "role": "Orchestrator (-> FileSurfer)",
            "content": "Please open census.csv from the downloads, if any.",
        },
        {"role": "FileSurfer", "content": "There is no file named census.csv in the downloads folder."},
        {
            "role": "Orchestrator (-> Assistant)",
            "content": "Please write the final answer from WebSurfer's report.",
        },
        {"role": "Assistant", "content": "FINAL ANSWER: 45,902"},
    ],
}
MISTAKE = ("WebSurfer", 6)  # the misread: the page held 48,213 for 2020, WebSurfer states 45,902
AGENTS = ("Orchestrator", "WebSurfer", "FileSurfer", "Assistant")


def renamed(trace: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """`trace` with every agent renamed in its roles (and in the text, where agents name each other)."""
    out = copy.deepcopy(trace)
    rx = re.compile(r"\b(" + "|".join(map(re.escape, mapping)) + r")\b")
    for msg in out["history"]:
        msg["role"] = rx.sub(lambda m: mapping[m.group(1)], msg["role"])
        msg["content"] = rx.sub(lambda m: mapping[m.group(1)], msg["content"])
    return out


def swapped_reports(trace: dict[str, Any]) -> dict[str, Any]:
    """`trace` with the agents' order changed: the misreading report is now FileSurfer's (steps 5-6 and 8-9
    trade places), so the evidence moves to another agent at another step."""
    out = copy.deepcopy(trace)
    h = out["history"]
    h[5], h[6], h[8], h[9] = (
        {
            "role": "Orchestrator (-> FileSurfer)",
            "content": "Please open census.csv from the downloads and read 2020.",
        },
        {
            "role": "FileSurfer",
            "content": h[6]["content"].replace(
                "I clicked 'Census figures of Exampletown'.", "I opened census.csv."
            ),
        },
        {"role": "Orchestrator (-> WebSurfer)", "content": "Please check the census page again."},
        {"role": "WebSurfer", "content": "The page did not load this time."},
    )
    return out
