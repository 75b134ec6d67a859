"""`failing_calls`: identical retries are told apart from changed ones, and recovery is read off later calls."""

from __future__ import annotations

import json
from typing import Any

from reflector.analysis.toolkit import failing_calls
from reflector.analysis.traces import normalize


def _run(calls: list[tuple[str, dict[str, Any], str]]) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n, (name, args, result) in enumerate(calls):
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{n}", "function": {"name": name, "arguments": json.dumps(args)}}],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
    return normalize(msgs)


def test_identical_retries_and_changed_retries_are_told_apart() -> None:
    run = _run(
        [
            ("read", {"path": "a.md"}, "Error: ENOENT"),
            ("read", {"path": "a.md"}, "Error: ENOENT"),
            ("exec", {"cmd": "ls"}, "exited with code 2"),
            ("read", {"path": "b.md", "lines": 10.0}, "Error: ENOENT"),
            ("read", {"lines": 10, "path": "b.md"}, "Error: ENOENT"),  # the same canonical arguments
            ("read", {"path": "c.md"}, "contents"),
        ]
    )
    read, exec_ = failing_calls(run)
    assert read["tool"] == "read" and exec_["tool"] == "exec"
    assert [a["step"] for a in read["attempts"]] == [1, 3, 7, 9]
    assert read["attempts"][0] == {"step": 1, "args": {"path": "a.md"}, "error": "Error: ENOENT"}
    assert read["identical_retries"] == 2
    assert read["changes"] == [
        {
            "from_step": 3,
            "to_step": 7,
            "differences": [
                {"path": "path", "expected": "a.md", "actual": "b.md"},
                {"path": "lines", "expected": None, "actual": 10, "note": "not expected"},
            ],
        }
    ]
    assert (read["recovered"], read["recovered_step"]) == (True, 11)
    assert exec_["attempts"] == [{"step": 5, "args": {"cmd": "ls"}, "error": "exited with code 2"}]
    assert (exec_["identical_retries"], exec_["changes"], exec_["recovered"]) == (0, [], False)


def test_a_success_before_the_last_failure_is_not_a_recovery() -> None:
    run = _run(
        [("fetch", {"u": 1}, "Error: 500"), ("fetch", {"u": 1}, "ok"), ("fetch", {"u": 2}, "Error: 500")]
    )
    (group,) = failing_calls(run)
    assert group["recovered"] is False and group["identical_retries"] == 0
    assert [c["from_step"] for c in group["changes"]] == [1]


def test_no_failures_no_groups() -> None:
    assert failing_calls(_run([("fetch", {"u": 1}, "ok")])) == []
    assert failing_calls(normalize([{"role": "user", "content": "hi"}])) == []
