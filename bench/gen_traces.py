"""Synthetic agent traces of a requested size, written as a stream (memory does not grow with the size).

Two shapes:
- `ace-json`: one JSON object `{"question", "ground_truth", "steps": [...], "final_answer"}` whose steps
  are ACE-style messages: `{"role": "assistant", "content", "tool_calls": [{"name", "arguments"}]}` and
  `{"role": "tool", "tool_name", "content"}` (some tool results are errors, `Error: ...`);
- `jsonl`: OpenAI-style chat messages, one per line: a system and a user message, then assistant
  messages with `tool_calls` (`id`, `type`, `function: {name, arguments}`), tool results carrying
  `tool_call_id`, and a final assistant answer;
- `jsonl-null`: the same, with `"content": null` on the assistant messages that call tools (as the
  OpenAI API returns them);
- `whowhen-json`: a multi-agent conversation in Who&When's layout, one JSON object `{"is_correct",
  "question", "ground_truth", "history": [{"content", "role", "name"}, ...], "mistake_agent",
  "mistake_step", "system_prompt": {agent: text}}`, the labels after the history as in the dataset.

Text is drawn from a small vocabulary: a few hundred bytes per step, about 3% of tool results are
errors, and one tool result in ~1,500 is long (8-64 KiB: a file listing, a page of search results).
The output is the same for the same (shape, size, seed); the file is about the requested size (the
last step is cut short of it, never past it by more than one step plus the closing bytes).

    python -m bench.gen_traces OUT --size 1GB --shape ace-json|jsonl|jsonl-null|whowhen-json [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "parse_size", "generate", "QUESTION", "GROUND_TRUTH", "FINAL_ANSWER"]

SHAPES = ("ace-json", "jsonl", "jsonl-null", "whowhen-json")
QUESTION = "How many orders in the March export were refunded twice, and what was their total value?"
GROUND_TRUTH = "17 orders, 4,212.50 EUR"
FINAL_ANSWER = "15 orders, 3,987.10 EUR"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_WORDS = (
    "the order export file table column refund refunded twice total value customer invoice line item "
    "amount currency EUR date March row rows filter query result results check again duplicate id ids "
    "status pending settled payment provider webhook retry batch page next previous count sum group by "
    "join left on where select from limit offset parse csv json field missing null empty schema header "
    "I will now then first next finally it seems looks like this that these those so because but and or "
    "not yet already maybe probably should could need want try verify compare match mismatch expected"
).split()
_TOOLS = ("sql_query", "read_file", "search_docs", "run_python", "http_get", "list_dir")
_ERRORS = (
    "Error: timeout after 30s while waiting for the tool",
    'Error: relation "refunds_march" does not exist',
    "Error: FileNotFoundError: exports/march_v2.csv",
    "Error: HTTP 503 Service Unavailable from payments API",
    "Error: Traceback (most recent call last): KeyError: 'refund_id'",
)
_LONG_EVERY = 1500  # one tool result in this many is long
_ERROR_RATE = 0.03


def parse_size(text: str) -> int:
    """`1MB`, `100MB`, `1GB` (powers of 10), `16MiB` (powers of 2), or a number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 1MB, 100MB, 1GB, 16MiB)")
    return int(float(m.group(1)) * _UNITS[unit])


class _Text:
    """Deterministic filler text and tool payloads from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choices(_WORDS, k=self.rng.randint(lo, hi)))

    def arguments(self, tool: str) -> str:
        r = self.rng
        if tool == "sql_query":
            args: dict[str, Any] = {
                "sql": f"SELECT order_id, amount FROM refunds WHERE month = 3 AND n > {r.randint(1, 3)} "
                f"LIMIT {r.choice((50, 100, 500))}"
            }
        elif tool in ("read_file", "list_dir"):
            args = {"path": f"exports/{r.choice(('march', 'refunds', 'orders'))}_{r.randint(1, 40)}.csv"}
        elif tool == "http_get":
            args = {"url": f"https://payments.example/api/v2/refunds?page={r.randint(1, 300)}"}
        else:
            args = {"query" if tool == "search_docs" else "code": self.words(6, 20)}
        return json.dumps(args)

    def result(self, tool: str) -> str:
        r = self.rng
        if r.random() < _ERROR_RATE:
            return f"{r.choice(_ERRORS)} ({tool}, attempt {r.randint(1, 3)})"
        if r.randrange(_LONG_EVERY) == 0:
            n = r.randint(8 * 1024, 64 * 1024) // 48
            return "\n".join(
                f"{r.randint(100000, 999999)},{r.randint(1, 99999) / 100:.2f},EUR,{r.choice(('settled', 'pending', 'refunded'))}"
                for _ in range(n)
            )
        if tool == "sql_query":
            rows = [
                f"({r.randint(100000, 999999)}, {r.randint(1, 99999) / 100:.2f})"
                for _ in range(r.randint(2, 8))
            ]
            return f"{len(rows)} rows: " + ", ".join(rows)
        return self.words(15, 70)


def _ace_steps(t: _Text) -> Iterator[dict[str, Any]]:
    while True:
        tool = t.rng.choice(_TOOLS)
        yield {
            "role": "assistant",
            "content": t.words(25, 80),
            "tool_calls": [{"name": tool, "arguments": t.arguments(tool)}],
        }
        yield {"role": "tool", "tool_name": tool, "content": t.result(tool)}


def _openai_messages(t: _Text, null_content: bool) -> Iterator[dict[str, Any]]:
    n = 0
    while True:
        k = 2 if t.rng.random() < 0.15 else 1  # sometimes two calls in one turn
        calls: list[tuple[str, str]] = []  # (id, tool)
        for _ in range(k):
            calls.append((f"call_{n:08d}", t.rng.choice(_TOOLS)))
            n += 1
        words = t.words(25, 80)
        yield {
            "role": "assistant",
            "content": None if null_content else words,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": tool, "arguments": t.arguments(tool)}}
                for cid, tool in calls
            ],
        }
        for cid, tool in calls:
            yield {"role": "tool", "tool_call_id": cid, "content": t.result(tool)}


_AGENTS = ("Orchestrator", "WebSurfer", "Coder", "Computer_terminal", "Verifier")


def _conversation(t: _Text) -> Iterator[dict[str, Any]]:
    """Group-chat turns: each agent speaks in turn; the terminal answers the coder with a result."""
    while True:
        agent = t.rng.choice(_AGENTS)
        if agent == "Computer_terminal":
            yield {
                "content": "exitcode: 0 (execution succeeded)\nCode output: " + t.result("sql"),
                "role": "user",
                "name": agent,
            }
        else:
            yield {
                "content": t.words(25, 120),
                "role": "assistant" if agent == "Orchestrator" else "user",
                "name": agent,
            }


def generate(out: Path, size: int, shape: str, seed: int = 0) -> int:
    """Write a trace of about `size` bytes to `out` (through a temp file, renamed at the end); returns
    the bytes written."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (one of {', '.join(SHAPES)})")
    t = _Text(seed)
    tmp = out.with_name(out.name + ".partial")
    written = 0
    with open(tmp, "w", encoding="utf-8", buffering=1 << 20) as f:

        def put(text: str) -> None:
            nonlocal written
            f.write(text)
            written += len(text)  # the text is ASCII (json.dumps escapes the rest)

        if shape == "whowhen-json":
            head = json.dumps({"is_correct": False, "question": QUESTION, "ground_truth": GROUND_TRUTH})[:-1]
            labels = {
                "mistake_agent": "Coder",
                "mistake_step": "3",
                "system_prompt": {a: "You are " + a for a in _AGENTS},
            }
            tail = "], " + json.dumps(labels)[1:]
            put(head + ', "history": [')
            sep = ""
            for turn in _conversation(t):
                text = sep + json.dumps(turn)
                if written + len(text) + len(tail) > size and sep:
                    break
                put(text)
                sep = ", "
            put(tail)
        elif shape == "ace-json":
            head = json.dumps({"question": QUESTION, "ground_truth": GROUND_TRUTH})[:-1] + ', "steps": ['
            tail = "], " + json.dumps({"final_answer": FINAL_ANSWER})[1:]
            put(head)
            sep = ""
            for step in _ace_steps(t):
                text = sep + json.dumps(step)
                if written + len(text) + len(tail) > size and step["role"] == "assistant" and sep:
                    break
                put(text)
                sep = ", "
            put(tail)
        else:
            system = {
                "role": "system",
                "content": "You are a data analyst agent. Use the tools to answer; report numbers exactly.",
            }
            put(json.dumps(system) + "\n" + json.dumps({"role": "user", "content": QUESTION}) + "\n")
            last = json.dumps({"role": "assistant", "content": f"The answer: {FINAL_ANSWER}."}) + "\n"
            first = True
            for msg in _openai_messages(t, shape == "jsonl-null"):
                line = json.dumps(msg) + "\n"
                if written + len(line) + len(last) > size and msg["role"] == "assistant" and not first:
                    break
                put(line)
                first = False
            put(last)
    tmp.replace(out)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gen_traces", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--size", required=True, help="about this many bytes: 1MB, 100MB, 1GB (10^n), 16MiB (2^n)"
    )
    ap.add_argument("--shape", required=True, choices=SHAPES)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        size = parse_size(args.size)
    except ValueError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    n = generate(args.out, size, args.shape, args.seed)
    dt = time.perf_counter() - t0
    print(
        f"{args.out}: {n:,} bytes ({args.shape}, seed {args.seed}) in {dt:.1f} s ({n / 1e6 / max(dt, 1e-9):.0f} MB/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
