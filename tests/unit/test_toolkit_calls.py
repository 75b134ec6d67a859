"""`tool_calls`, `expected_actions`, `is_write`: calls paired with results on every adapter, lazy views too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit import expected_actions, is_write, tool_calls
from reflector.analysis.traces import normalize
from reflector.analysis.traces.lazy import Steps
from tests.support.lazy import lazy_view


def _call(cid: str | None, name: str, args: dict[str, Any]) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    if cid is not None:
        call["id"] = cid
    return call


def tau_run(expected: list[tuple[str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """A tau-bench run: a read, a failed write, the same write again (ok), a last message."""
    traj = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "cancel ABC"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "get_reservation_details", {"id": "ABC"})],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_reservation_details", "content": '{"id": "ABC"}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c2", "cancel_reservation", {"id": "ABD"})],
        },
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "cancel_reservation",
            "content": "Error: reservation not found",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c3", "cancel_reservation", {"id": "ABC"})],
        },
        {"role": "tool", "tool_call_id": "c3", "name": "cancel_reservation", "content": "x" * 2000},
        {"role": "assistant", "content": "Done."},
    ]
    actions = [
        {"name": n, "kwargs": a}
        for n, a in (expected if expected is not None else [("cancel_reservation", {"id": "ABC"})])
    ]
    return {
        "task_id": 3,
        "trial": 0,
        "reward": 1.0,
        "info": {"task": {"user_id": "u", "instruction": "cancel", "actions": actions, "outputs": []}},
        "traj": traj,
    }


def test_tau_bench_calls_come_from_actions_with_their_results() -> None:
    calls = tool_calls(normalize(tau_run()))
    assert [(c["step"], c["name"], c["args"], c["result_step"], c["is_error"]) for c in calls] == [
        (2, "get_reservation_details", {"id": "ABC"}, 3, False),
        (4, "cancel_reservation", {"id": "ABD"}, 5, True),
        (6, "cancel_reservation", {"id": "ABC"}, 7, False),
    ]
    assert calls[1]["result"] == "Error: reservation not found"
    assert calls[2]["result"] == "x" * 500 + "...(+1,500 chars)"
    assert calls[0]["actor"] is None
    assert tool_calls(normalize(tau_run()), limit=2) == calls[:2]


def test_parallel_calls_are_paired_by_call_id_even_out_of_order() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "two lookups"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("a", "lookup", {"q": 1}), _call("b", "lookup", {"q": 2})],
        },
        {"role": "tool", "tool_call_id": "b", "content": "two"},
        {"role": "tool", "tool_call_id": "a", "content": "one"},
    ]
    calls = tool_calls(normalize(msgs))
    assert [(c["args"], c["result"], c["result_step"]) for c in calls] == [
        ({"q": 1}, "one", 3),
        ({"q": 2}, "two", 2),
    ]
    # without ids, the results answer the calls in order, by tool name
    for m in msgs:
        m.pop("tool_call_id", None)
        for c in m.get("tool_calls", []):
            c.pop("id")
        if m["role"] == "tool":
            m["name"] = "lookup"
    calls = tool_calls(normalize(msgs))
    assert [(c["args"], c["result"]) for c in calls] == [({"q": 1}, "two"), ({"q": 2}, "one")]


def test_results_are_paired_by_tool_name_when_ids_are_absent() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call(None, "search", {"q": "x"}), _call(None, "fetch", {"u": 1})],
        },
        {"role": "tool", "name": "fetch", "content": "page"},
        {"role": "tool", "name": "search", "content": "Error: bad query"},
        {"role": "assistant", "content": "", "tool_calls": [_call(None, "fetch", {"u": 2})]},
    ]
    calls = tool_calls(normalize(msgs))
    assert [(c["name"], c["result"], c["is_error"]) for c in calls] == [
        ("search", "Error: bad query", True),
        ("fetch", "page", False),
        ("fetch", None, False),
    ]
    assert calls[2]["result_step"] is None


def test_anthropic_parts_and_unparseable_arguments() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_use", "id": "t1", "name": "grep", "input": {"p": "x"}},
                {"type": "tool_use", "id": "t2", "name": "grep", "input": {"p": "y"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": "found y"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "found x"},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t3", "function": {"name": "run", "arguments": "not json{"}}],
        },
    ]
    calls = tool_calls(normalize(msgs))
    assert [(c["step"], c["args"], c["result"]) for c in calls] == [
        (0, {"p": "x"}, "found x"),
        (0, {"p": "y"}, "found y"),
        (3, "not json{", None),
    ]


def test_openclaw_otel_and_free_form_ace_steps() -> None:
    events = [
        {"type": "session", "id": "s"},
        {
            "type": "message",
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "toolCall", "id": "k1", "name": "read", "arguments": {"path": "a"}},
                    {"type": "toolCall", "id": "k2", "name": "read", "arguments": {"path": "b"}},
                ],
            },
        },
        {
            "type": "message",
            "message": {
                "role": "toolResult",
                "toolCallId": "k2",
                "toolName": "read",
                "content": [{"type": "text", "text": "B"}],
            },
        },
        {
            "type": "message",
            "message": {
                "role": "toolResult",
                "toolCallId": "k1",
                "toolName": "read",
                "isError": True,
                "content": [{"type": "text", "text": "ENOENT"}],
            },
        },
    ]
    calls = tool_calls(normalize(events))
    assert [(c["args"], c["result"], c["is_error"]) for c in calls] == [
        ({"path": "a"}, "ENOENT", True),
        ({"path": "b"}, "B", False),
    ]
    spans = [
        {
            "span_id": "1",
            "name": "search",
            "start_time": "1",
            "status": {"status_code": "ERROR", "message": "boom"},
            "attributes": {
                "openinference.span.kind": "TOOL",
                "tool.name": "search",
                "tool.parameters": '{"q": 1}',
            },
        }
    ]
    (call,) = tool_calls(normalize(spans))
    assert (call["step"], call["name"], call["args"], call["result_step"], call["is_error"]) == (
        0,
        "search",
        {"q": 1},
        0,
        True,
    )
    ace = {
        "question": "q",
        "steps": [{"thought": "t", "action": "count", "args": {"i": 1}, "observation": "ok 1"}],
    }
    (call,) = tool_calls(normalize(ace))
    assert (call["name"], call["args"], call["result_step"], call["is_error"]) == (
        "count",
        {"i": 1},
        0,
        False,
    )
    assert "ok 1" in call["result"]


def test_expected_actions_come_from_the_task_only() -> None:
    run = normalize(tau_run([("cancel_reservation", {"id": "ABC"}), ("get_x", {})]))
    assert expected_actions(run) == [
        {"name": "cancel_reservation", "args": {"id": "ABC"}},
        {"name": "get_x", "args": {}},
    ]
    assert expected_actions(normalize(tau_run([]))) == []  # the task expects nothing: not "unknown"
    said = [{"role": "assistant", "content": "I will call cancel_reservation(id=ABC)"}]
    assert expected_actions(normalize(said)) is None


def test_is_write_uses_the_read_only_prefixes() -> None:
    assert is_write("cancel_reservation") and is_write("book_reservation")
    assert not any(
        is_write(n)
        for n in (
            "get_user_details",
            "search_direct_flight",
            "calculate",
            "think",
            "transfer_to_human_agents",
            "list_all_airports",
        )
    )
    with pytest.raises(TypeError, match="tool name"):
        is_write(None)


def test_a_batch_or_anything_but_one_run_is_refused_with_what_to_pass() -> None:
    batch = normalize([tau_run(), tau_run()])
    with pytest.raises(
        ValueError, match=r"batch view of 2 runs; pass one run: tool_calls\(traces\['runs'\]\[i\]\)"
    ):
        tool_calls(batch)
    assert tool_calls(batch["runs"][1]) == tool_calls(normalize(tau_run()))
    with pytest.raises(TypeError, match="pass one run"):
        tool_calls(batch["runs"])
    with pytest.raises(ValueError, match="no 'steps' list"):
        expected_actions({"question": "q"})
    with pytest.raises(TypeError, match="limit must be an int"):
        tool_calls(normalize(tau_run()), limit=0)
    with pytest.raises(TypeError, match=r"steps\[0\] is a int"):
        tool_calls({"steps": [1]})


def test_results_are_plain_copies_the_trace_does_not_share() -> None:
    run = normalize(tau_run())
    calls = tool_calls(run)
    calls[0]["args"]["id"] = "CHANGED"
    assert run["actions"][0]["arguments"] == {"id": "ABC"}
    assert tool_calls(run)[0]["args"] == {"id": "ABC"}


_lazy = lazy_view  # tests/support/lazy.py


def test_a_lazy_view_gives_the_same_calls_as_the_whole_view(tmp_path: Path) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(400):
        msgs.append(
            {"role": "assistant", "content": f"step {i}", "tool_calls": [_call(f"id{i}", "probe", {"i": i})]}
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": f"id{i}",
                "content": "error: nope" if i % 50 == 0 else f"ok {i} é",
            }
        )
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps(m, ensure_ascii=False) for m in msgs) + "\n", encoding="utf-8")
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        whole = tool_calls(normalize(msgs))
        assert len(whole) == 400
        assert tool_calls(view) == whole
        assert tool_calls(view, limit=3) == whole[:3]
        assert sum(c["is_error"] for c in tool_calls(view)) == 8
