"""`actors`, `timeline` and `suspect_mistake` (reflector/analysis/toolkit/actors.py) on hand-written conversations:
for each rule, what makes it fire and what does not; and their shape on the real Who&When files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit.actors import (
    COMBINATION,
    POSITIONAL,
    QUOTE_CHARS,
    RULES,
    actors,
    suspect_mistake,
    timeline,
)
from reflector.analysis.traces import load_normalized, normalize
from reflector.contract import DIAGNOSIS_KINDS

TASK = "How many clients get the sunset design?"
OPEN = {
    "role": "assistant",
    "name": "Planner",
    "content": f"You are given a task.\n# General Task\n{TASK}\n## Plan\n1. read",
}
OK = "exitcode: 0 (execution succeeded)\nCode output: 4"
FAIL = "exitcode: 1 (execution failed)\nCode output: Traceback (most recent call last):\nKeyError: 'Street'"
NOTHING = (
    "There is no code from the last 1 message for me to execute. Group chat manager should let others speak."
)


def msg(name: str, content: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "name": name, "content": content}


def code(text: str = "import pandas as pd\nprint(len(pd.read_excel('x.xlsx')))") -> str:
    return f"Let me count them.\n```python\n{text}\n```"


def run(*history: dict[str, Any], truth: str | None = "8") -> dict[str, Any]:
    return normalize({"question": TASK, "ground_truth": truth, "history": list(history)})


# -- actors / timeline -------------------------------------------------------------------------------
def test_actors_in_order_of_first_appearance_with_their_steps_and_roles() -> None:
    r = run(
        OPEN,
        msg("Coder", code()),
        msg("Computer_terminal", OK),
        msg("Coder", "It is 4."),
        msg("Checker", "Agreed."),
    )
    assert actors(r) == [
        {
            "actor": "Planner",
            "n_steps": 1,
            "first_step": 0,
            "last_step": 0,
            "roles": {"assistant": 1},
            "addressees": {},
        },
        {
            "actor": "Coder",
            "n_steps": 2,
            "first_step": 1,
            "last_step": 3,
            "roles": {"user": 2},
            "addressees": {},
        },
        {
            "actor": "Computer_terminal",
            "n_steps": 1,
            "first_step": 2,
            "last_step": 2,
            "roles": {"user": 1},
            "addressees": {},
        },
        {
            "actor": "Checker",
            "n_steps": 1,
            "first_step": 4,
            "last_step": 4,
            "roles": {"user": 1},
            "addressees": {},
        },
    ]


def test_actors_of_a_trace_that_names_no_one_is_one_none_group() -> None:
    r = normalize([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    assert actors(r) == [
        {
            "actor": None,
            "n_steps": 2,
            "first_step": 0,
            "last_step": 1,
            "roles": {"user": 1, "assistant": 1},
            "addressees": {},
        }
    ]


def test_timeline_previews_collapse_whitespace_and_cut_at_chars() -> None:
    r = run(OPEN, msg("Coder", "a   b\n\n c " + "x" * 300), msg("Computer_terminal", FAIL))
    rows = timeline(r, chars=20)
    assert [x["step"] for x in rows] == [0, 1, 2]
    assert rows[1] == {"step": 1, "actor": "Coder", "role": "user", "preview": "a b c xxxxxxxxxxx..."}
    assert len(rows[1]["preview"]) == 20
    assert rows[2]["error"] is True and "error" not in rows[1]
    assert timeline(r, chars=1000)[1]["preview"] == "a b c " + "x" * 300


def test_timeline_filters_by_actor_and_stops_at_limit() -> None:
    r = run(OPEN, *[msg("Coder" if i % 2 else "Computer_terminal", f"m{i}") for i in range(10)])
    assert [x["step"] for x in timeline(r, actor="Coder")] == [2, 4, 6, 8, 10]
    assert [x["step"] for x in timeline(r, actor="Coder", limit=2)] == [2, 4]
    assert timeline(r, actor="Nobody") == []


def test_timeline_names_the_tool_of_calls_and_results() -> None:
    r = normalize(
        [
            {"role": "user", "content": "list"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "Error: denied"},
        ]
    )
    rows = timeline(r)
    assert "tool" not in rows[0]
    assert rows[1]["tool"] == "ls" and rows[2]["tool"] == "ls" and rows[2]["error"] is True


def test_arguments_are_checked() -> None:
    r = run(OPEN)
    with pytest.raises(TypeError, match="limit"):
        timeline(r, limit=0)
    with pytest.raises(TypeError, match="chars"):
        timeline(r, chars=0)
    with pytest.raises(TypeError, match="actor"):
        timeline(r, actor=3)
    with pytest.raises(ValueError, match="batch"):
        actors({"runs": [r]})
    with pytest.raises(ValueError, match="rule must be"):
        suspect_mistake(r, "nope")


def test_results_are_plain_copies() -> None:
    r = run(OPEN, msg("Coder", code()))
    listed = actors(r)
    listed[0]["roles"]["assistant"] = 99
    assert actors(r)[0]["roles"] == {"assistant": 1}
    json.dumps([actors(r), timeline(r), suspect_mistake(r)])  # plain data


# -- the rules -----------------------------------------------------------------------------------------
def test_first_action_is_the_first_agent_step_that_writes_code() -> None:
    r = run(
        OPEN,
        msg("Lead", "We should read the file first."),
        msg("Coder", code()),
        msg("Computer_terminal", OK),
        msg("Checker", code("print(2)")),
    )
    g = suspect_mistake(r, "first_action")
    assert g is not None and (g["step"], g["actor"], g["kind"], g["rule"]) == (
        2,
        "Coder",
        "reasoning_error",
        "first_action",
    )
    assert '"import pandas as pd"' in g["reason"]


def test_first_action_does_not_fire_without_code_and_ignores_the_executor() -> None:
    r = run(
        OPEN,
        msg("Computer_terminal", "exitcode: 0 (execution succeeded)\nCode output: ```x```"),
        msg("Lead", "It is 4."),
    )
    assert suspect_mistake(r, "first_action") is None


def test_first_action_whose_run_failed_and_was_never_fixed_is_a_mishandled_tool_error() -> None:
    r = run(OPEN, msg("Coder", code()), msg("Computer_terminal", FAIL), msg("Coder", "Probably 4 then."))
    g = suspect_mistake(r, "first_action")
    assert g is not None and g["kind"] == "tool_error_mishandled" and g["step"] == 1
    fixed = run(
        OPEN,
        msg("Coder", code()),
        msg("Computer_terminal", FAIL),
        msg("Coder", code("print(8)")),
        msg("Computer_terminal", OK),
    )
    g = suspect_mistake(fixed, "first_action")
    assert g is not None and g["kind"] == "reasoning_error" and g["step"] == 1


def test_first_claim_skips_the_opening_task_message() -> None:
    r = run(
        OPEN,
        msg("Computer_terminal", NOTHING),
        msg("Historian", "The team won in 2019."),
        msg("Checker", "Yes."),
    )
    g = suspect_mistake(r, "first_claim")
    assert g is not None and (g["step"], g["actor"], g["kind"]) == (2, "Historian", "wrong_information")
    assert '"The team won in 2019."' in g["reason"]


def test_first_claim_in_a_plain_chat_starts_after_the_users_task() -> None:
    r = normalize([{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": "36"}])
    assert suspect_mistake(r) is None  # no ground truth, no invented data, no failure: nothing to trace
    g = suspect_mistake(r, "first_claim")
    assert g is not None and (g["step"], g["actor"], g["rule"]) == (1, None, "first_claim")
    assert "(assistant)" in g["reason"]


def test_first_claim_ignores_bare_terminate_and_falls_back_to_the_opening() -> None:
    g = suspect_mistake(run(OPEN, msg("Checker", "TERMINATE")), "first_claim")
    assert g is not None and g["step"] == 0
    assert suspect_mistake(run(msg("Checker", "TERMINATE")), "first_claim") is None


def test_wrong_answer_needs_a_ground_truth_and_compares_numbers_as_numbers() -> None:
    r = run(OPEN, msg("Lead", "Let us think."), msg("Checker", "So the final answer is 4 clients."))
    g = suspect_mistake(r, "wrong_answer")
    assert g is not None and (g["step"], g["actor"], g["kind"]) == (2, "Checker", "wrong_information")
    assert (
        suspect_mistake(run(OPEN, msg("Checker", "So the final answer is 8.0 clients.")), "wrong_answer")
        is None
    )
    assert suspect_mistake(run(OPEN, msg("Checker", "the answer is 4"), truth=None), "wrong_answer") is None


def test_wrong_answer_ignores_verdicts_code_and_the_task() -> None:
    r = run(
        msg("Planner", f"{TASK}\nThe answer is what we must find."),
        msg("Checker", "The result is correct."),
        msg("Coder", code("result = 4\nprint('answer: 4')")),
    )
    assert suspect_mistake(r, "wrong_answer") is None


def test_wrong_answer_printed_by_code_belongs_to_the_code_author() -> None:
    r = run(
        OPEN,
        msg("Coder", code()),
        msg("Computer_terminal", "exitcode: 0 (execution succeeded)\nCode output: Result: 4"),
    )
    g = suspect_mistake(r, "wrong_answer")
    assert g is not None and (g["step"], g["actor"], g["kind"]) == (1, "Coder", "reasoning_error")


def test_fabricated_data_fires_on_invented_input_not_on_real_work() -> None:
    r = run(
        OPEN,
        msg("Coder", code()),
        msg("Computer_terminal", FAIL),
        msg("Analyst", "Since the file is missing, let's create a sample dataset and proceed."),
    )
    g = suspect_mistake(r, "fabricated_data")
    assert g is not None and (g["step"], g["actor"], g["kind"]) == (3, "Analyst", "wrong_information")
    assert "let's create a sample dataset" in g["reason"]
    assert suspect_mistake(run(OPEN, msg("Coder", code())), "fabricated_data") is None
    # the opening task message may say "assume": it is the task's, not an agent's invention
    assert (
        suspect_mistake(
            run(msg("Planner", f"{TASK} Let's assume nothing."), msg("A", "ok")), "fabricated_data"
        )
        is None
    )


def test_unfixed_failure_is_the_code_author_of_a_failure_never_followed_by_a_success() -> None:
    r = run(
        OPEN,
        msg("Coder", code()),
        msg("Computer_terminal", OK),
        msg("Fixer", code("x")),
        msg("Computer_terminal", FAIL),
        msg("Fixer", "I give up."),
    )
    g = suspect_mistake(r, "unfixed_failure")
    assert g is not None and (g["step"], g["actor"], g["kind"]) == (3, "Fixer", "tool_error_mishandled")
    fixed = run(
        OPEN,
        msg("Fixer", code("x")),
        msg("Computer_terminal", FAIL),
        msg("Fixer", code("y")),
        msg("Computer_terminal", OK),
    )
    assert suspect_mistake(fixed, "unfixed_failure") is None


def test_the_combination_is_evidence_only_and_takes_the_earliest_step_it_places() -> None:
    assert COMBINATION == ("fabricated_data", "answer_origin", "wrong_answer", "unfixed_failure")
    assert not set(POSITIONAL) & set(COMBINATION)  # a step's position never makes the guess (issue 28)
    invented = run(OPEN, msg("Coder", code()), msg("Analyst", "We will assume the count is 4."))
    g = suspect_mistake(invented)
    assert g is not None and (g["rule"], g["step"]) == ("fabricated_data", 2)
    assert {"first_action", "first_claim"} <= {o["rule"] for o in g["others"]}
    # nothing in the evidence: no guess, though a first code step and a first claim exist
    assert suspect_mistake(run(OPEN, msg("Lead", "Plan: read it."), msg("Coder", code()))) is None
    # the wrong final answer's value traced to the agent that first stated it, not the one that repeated it
    traced = suspect_mistake(
        run(
            OPEN,
            msg("Lead", "I count 27 clients."),
            msg("Checker", "Agreed: 27."),
            msg("Checker", "The final answer is 27."),
        )
    )
    assert traced is not None and (traced["rule"], traced["step"], traced["actor"]) == (
        "answer_origin",
        1,
        "Lead",
    )
    # ... and an executor's output to the agent whose code printed it
    ran = suspect_mistake(
        run(
            OPEN,
            msg("Coder", code()),
            msg("Computer_terminal", "exitcode: 0\nCode output: 27"),
            msg("Checker", "The answer is 27."),
        )
    )
    assert ran is not None and (ran["rule"], ran["step"], ran["actor"]) == ("answer_origin", 1, "Coder")


def test_no_guess_for_traces_with_tool_call_structure_or_no_agent_step() -> None:
    tau_like = normalize(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "function": {"name": "ls", "arguments": "{}"}}],
            },
        ]
    )
    assert suspect_mistake(tau_like) is None
    assert suspect_mistake(run(msg("Computer_terminal", NOTHING))) is None
    assert suspect_mistake(run()) is None


def test_findings_have_the_contract_fields_and_a_short_verbatim_quote() -> None:
    long_line = "We found that " + "very " * 60 + "many clients."
    r = run(OPEN, msg("Lead", long_line), msg("Coder", code()), msg("Computer_terminal", FAIL))
    for name in RULES:
        g = suspect_mistake(r, name)
        if g is None:
            continue
        assert set(g) == {"step", "actor", "kind", "reason", "rule", "confidence"}
        assert g["kind"] in DIAGNOSIS_KINDS and 0 < g["confidence"] <= 1 and g["rule"] == name
        quote = g["reason"].split(': "', 1)[1].rstrip('"')
        assert len(quote) <= QUOTE_CHARS and quote in r["steps"][g["step"]]["content"]


# -- the real files ---------------------------------------------------------------------------------------
def test_real_whowhen_files_give_well_formed_guesses(shared_traces: Path) -> None:
    folder = shared_traces / "who-and-when" / "algorithm-generated"
    if not folder.is_dir():
        pytest.skip(f"no Who&When folder in {shared_traces}")
    labels = ("mistake_agent", "mistake_step", "mistake_reason", "is_correct")
    files = sorted(folder.glob("*.json"))
    assert len(files) == 126
    unguessed = 0
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        r = normalize({k: v for k, v in data.items() if k not in labels})
        names = {m["name"] for m in data["history"]}
        assert {a["actor"] for a in actors(r)} == names
        assert sum(a["n_steps"] for a in actors(r)) == len(data["history"])
        assert [t["step"] for t in timeline(r)] == list(range(len(data["history"])))
        g = suspect_mistake(r)
        if g is None:  # nothing in the evidence (no wrong value traced, no invented data, no failure)
            unguessed += 1
            continue
        assert g["rule"] in COMBINATION and g["kind"] in DIAGNOSIS_KINDS and g["actor"] in names
        assert 0 <= g["step"] < len(data["history"]) and r["steps"][g["step"]]["actor"] == g["actor"]
        assert g["actor"] != "Computer_terminal"
        assert all(o["rule"] in RULES and o["kind"] in DIAGNOSIS_KINDS for o in g["others"])
    assert unguessed <= 30  # 22 on 2026-12-04
    assert load_normalized(files[0])["steps"][0]["actor"] is not None
