"""Trace reading, format detection and normalisation (the package reflector/analysis/traces)."""

from __future__ import annotations

import copy
import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.traces import (
    MAX_NESTING,
    TraceError,
    detect_format,
    iter_runs,
    load_normalized,
    load_normalized_bytes,
    looks_like_error,
    nesting_depth,
    normalize,
    parse_trace_bytes,
    read_trace_file,
    render_call,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "reflector" / "examples"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real traces folder {SHARED} is absent (only present in the dev workspace)"
)

RUN_KEYS = {
    "format",
    "question",
    "ground_truth",
    "feedback",
    "final_answer",
    "reward",
    "steps",
    "metadata",
    "raw",
}
STEP_KEYS = {"index", "role", "content", "tool_calls", "tool_name", "is_error", "actor", "addressee"}
TAU_KEYS = {"actions", "expected_actions", "expected_outputs"}  # the ground truth is actions, not text


# ---- fixtures written here ------------------------------------------------------------------

ACE: dict[str, Any] = {
    "question": "What is 6 * 7?",
    "ground_truth": "42",
    "feedback": "wrong",
    "reasoning": "6*7 = 36",
    "final_answer": "36",
    "skill_ids": ["math-00001"],
}

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "be helpful"},
    {"role": "user", "content": "Find order 7"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"id": 7}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Error: order 7 not found"},
    {"role": "assistant", "content": "Order 7 does not exist."},
]

ANTHROPIC_MESSAGES: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "/"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "bin etc", "is_error": False}
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "bin and etc"}]},
    ],
    "ground_truth": "bin etc",
}

OPENCLAW: list[dict[str, Any]] = [
    {"type": "session", "version": 3, "id": "s1", "timestamp": "2026-01-01T00:00:00Z", "cwd": "/app"},
    {"type": "custom", "customType": "model-snapshot", "data": {"modelId": "m"}},
    {"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": "read notes"}]}},
    {
        "type": "message",
        "message": {
            "role": "assistant",
            "model": "m",
            "content": [
                {"type": "thinking", "thinking": "I will read it"},
                {"type": "toolCall", "id": "x1", "name": "read", "arguments": {"file_path": "/n.md"}},
            ],
        },
    },
    {
        "type": "message",
        "message": {
            "role": "toolResult",
            "toolCallId": "x1",
            "toolName": "read",
            "content": [{"type": "text", "text": "boom"}],
            "isError": True,
        },
    },
    {
        "type": "message",
        "message": {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "oops\nsecond line"},
                {"type": "text", "text": "No notes."},
            ],
        },
    },
]


def _tau_run(reward: float = 0.0) -> dict[str, Any]:
    return {
        "task_id": 3,
        "trial": 1,
        "reward": reward,
        "info": {
            "task": {
                "user_id": "u1",
                "instruction": "Cancel my trip Z7GOZK",
                "actions": [
                    {"name": "get_reservation_details", "kwargs": {"reservation_id": "Z7GOZK"}},
                    {"name": "cancel_reservation", "kwargs": {"reservation_id": "Z7GOZK"}},
                ],
                "outputs": [],
            },
            "reward_info": {"reward": reward, "info": {"r_actions": reward}, "actions": []},
        },
        "traj": [
            {"role": "system", "content": "policy"},
            {"role": "user", "content": "Cancel Z7GOZK please"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "function": {"name": "cancel_reservation", "arguments": '{"reservation_id":"BAD"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "a",
                "name": "cancel_reservation",
                "content": "Error: reservation not found",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "b",
                        "function": {
                            "name": "cancel_reservation",
                            "arguments": '{"reservation_id":"Z7GOZK"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "b",
                "name": "cancel_reservation",
                "content": '{"status": "cancelled"}',
            },
            {"role": "assistant", "content": "Done, it is cancelled."},
        ],
    }


OTEL_SPANS: list[dict[str, Any]] = [
    {
        "name": "tool_call",
        "context": {"trace_id": "t", "span_id": "2"},
        "parent_id": "1",
        "start_time": "2024-01-01T00:00:02Z",
        "attributes": {"openinference.span.kind": "TOOL", "tool.name": "search", "output.value": "boom"},
        "status": {"status_code": "ERROR", "description": "timeout"},
    },
    {
        "name": "agent",
        "context": {"trace_id": "t", "span_id": "1"},
        "parent_id": None,
        "start_time": "2024-01-01T00:00:01Z",
        "attributes": {"openinference.span.kind": "AGENT", "input.value": "find x", "output.value": "x is 3"},
        "status": {"status_code": "OK"},
    },
]

OTLP: dict[str, Any] = {
    "resourceSpans": [
        {
            "scopeSpans": [
                {
                    "spans": [
                        {
                            "name": "llm",
                            "spanId": "a",
                            "startTimeUnixNano": "5",
                            "attributes": [{"key": "input.value", "value": {"stringValue": "hi"}}],
                            "status": {"code": 2, "message": "rate limited"},
                        }
                    ]
                }
            ]
        }
    ]
}


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


# ---- reading: every bad input gives a clear TraceError ------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found: .*nope.json"):
        read_trace_file(tmp_path / "nope.json", None)


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory"):
        read_trace_file(tmp_path, None)


@pytest.mark.parametrize("content", ["", "  \n\n  "])
def test_empty_file(tmp_path: Path, content: str) -> None:
    with pytest.raises(TraceError, match="empty"):
        read_trace_file(_write(tmp_path, "e.json", content), None)


def test_too_large_names_size_limit_and_env_var(tmp_path: Path) -> None:
    p = _write(tmp_path, "big.json", json.dumps({"question": "x" * 100}))
    with pytest.raises(TraceError) as exc:
        read_trace_file(p, 10)
    msg = str(exc.value)
    assert f"{p.stat().st_size:,} bytes" in msg and "limit of 10 bytes" in msg and "RR_MAX_TRACE_BYTES" in msg
    assert "\n" not in msg


def test_invalid_json_has_line_and_column(tmp_path: Path) -> None:
    p = _write(tmp_path, "bad.json", '{\n  "question": "x",\n  "oops" 1\n}')
    with pytest.raises(TraceError, match=r"invalid JSON in .*bad.json at line 3, column 10"):
        read_trace_file(p, None)


def test_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.jsonl", '{"a": 1}\n{"b": \n{"c": 3}\n')
    with pytest.raises(TraceError, match=r"broken JSONL in .*line 2 is not valid JSON"):
        read_trace_file(p, None)


def test_jsonl_where_no_line_parses(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.jsonl", "hello\nworld\n")
    with pytest.raises(TraceError, match=r"no line of .* parses \(line 1:"):
        read_trace_file(p, None)


def test_jsonl_tolerates_stray_bytes_before_first_brace(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.jsonl", '/speci{"type": "session", "id": "s"}\n{"type": "message"}\n')
    data, kind = read_trace_file(p, None)
    assert kind == "jsonl" and data == [{"type": "session", "id": "s"}, {"type": "message"}]


def test_jsonl_content_in_json_file_is_detected(tmp_path: Path) -> None:
    data, kind = read_trace_file(
        _write(tmp_path, "t.json", '{"role": "user"}\n{"role": "assistant"}\n'), None
    )
    assert kind == "jsonl" and len(data) == 2


def test_pretty_json_in_jsonl_file_is_detected(tmp_path: Path) -> None:
    data, kind = read_trace_file(_write(tmp_path, "t.jsonl", json.dumps(ACE, indent=2)), None)
    assert kind == "json" and data == ACE


def test_utf8_bom_and_size_limit_ok(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.json", b"\xef\xbb\xbf" + json.dumps(ACE).encode())
    data, kind = read_trace_file(p, 10_000)
    assert data == ACE and kind == "json"


def test_forced_format_that_does_not_fit() -> None:
    with pytest.raises(TraceError, match="does not look like format 'openclaw'"):
        normalize(["just", "strings"], "openclaw")


def test_unknown_format_name() -> None:
    with pytest.raises(TraceError, match="unknown trace format 'xml'"):
        normalize({}, "xml")


# ---- nesting: a recursion bomb or very deep JSON is refused with the limit, never a traceback -----

DEEP_REFUSED = f"nests deeper than {MAX_NESTING} levels"


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
@pytest.mark.parametrize(
    "text",
    ["[" * 200_000, '{"a":' * 200_000, "[" * 5_000 + "]" * 5_000, '{"a":' * 5_000 + "1" + "}" * 5_000],
    ids=["list-bomb", "dict-bomb", "valid-lists-5000", "valid-dicts-5000"],
)
def test_deep_json_is_refused_with_the_limit(tmp_path: Path, text: str, suffix: str) -> None:
    p = _write(tmp_path, "deep" + suffix, text)
    start = time.perf_counter()
    with pytest.raises(TraceError, match=DEEP_REFUSED) as exc:
        read_trace_file(p, None)
    assert "\n" not in str(exc.value)
    # the sandbox host loads the trace through these, from bytes
    with pytest.raises(TraceError, match=DEEP_REFUSED):
        parse_trace_bytes(text.encode(), p.name)
    with pytest.raises(TraceError, match=DEEP_REFUSED):
        load_normalized_bytes(text.encode(), p.name)
    assert time.perf_counter() - start < 5


def test_one_deep_line_of_jsonl_is_refused(tmp_path: Path) -> None:
    lines = ['{"type": "session", "id": "s"}', '{"type": "message", "x": ' + "[" * 3_000 + "]" * 3_000 + "}"]
    with pytest.raises(TraceError, match=DEEP_REFUSED):
        read_trace_file(_write(tmp_path, "t.jsonl", "\n".join(lines)), None)


def test_brackets_inside_strings_do_not_count(tmp_path: Path) -> None:
    text = json.dumps({"question": "[" * 10_000 + '\\"{' * 1_000, "final_answer": "}" * 50})
    data, _ = read_trace_file(_write(tmp_path, "t.json", text), None)
    assert data["question"].startswith("[[[") and nesting_depth(text) == 1


def test_nesting_scan_is_linear_on_hostile_strings(tmp_path: Path) -> None:
    # unterminated strings full of escaped quotes: a naive string regex retries from every quote
    for text in ('"' + '\\"' * 1_000_000, '["' + "\\" * 2_000_001, '"' * 2_000_001):
        start = time.perf_counter()
        with pytest.raises(TraceError, match="invalid JSON|not valid JSON"):
            read_trace_file(_write(tmp_path, "t.json", text), None)
        assert time.perf_counter() - start < 5


def _nest(levels: int, leaf: Any) -> Any:
    """`leaf` inside `levels` alternating lists and dicts."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def _content_parts(levels: int) -> Any:
    """Anthropic-style content parts nested `levels` deep (`_text` recurses through them)."""
    value: Any = ["deep text"] if levels % 2 else "deep text"
    for _ in range(levels // 2):
        value = [{"type": "text", "content": value}]
    return value


def _at_the_limit(make: Callable[[int], Any]) -> str:
    """The JSON text of `make(k)` for the k that makes the file nest exactly MAX_NESTING levels."""
    k = MAX_NESTING
    while nesting_depth(json.dumps(make(k))) > MAX_NESTING:
        k -= 1
    text = json.dumps(make(k))
    assert nesting_depth(text) == MAX_NESTING
    return text


def _tau_deep(k: int) -> Any:
    run = _tau_run()
    run["info"]["task"]["actions"].append({"name": "update_reservation", "kwargs": {"x": _nest(k, 1)}})
    run["traj"][2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"x": _nest(k, 1)})
    run["traj"].append({"role": "assistant", "content": _content_parts(k)})
    return [run]


AT_THE_LIMIT: dict[str, Callable[[int], Any]] = {
    "messages": lambda k: {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _content_parts(k)}]
    },
    "tau-bench": _tau_deep,
    "ace": lambda k: {"question": "q", "trace": _nest(k, "t"), "steps": [_nest(k, "s")]},
    "otel": lambda k: [
        {"name": "tool", "span_id": "1", "attributes": {"tool.name": "t", "tool.parameters": _nest(k, 1)}}
    ],
    "openclaw": lambda k: [
        {"type": "session", "id": "s"},
        {"type": "message", "message": {"role": "assistant", "content": _content_parts(k)}},
    ],
    "unknown": lambda k: _nest(k, None),
}


def _from_deep_stack(frames: int, fn: Callable[[], Any]) -> Any:
    """Call `fn` with `frames` frames already on the stack (a worker or host is never called at depth 0)."""
    return fn() if frames == 0 else _from_deep_stack(frames - 1, fn)


@pytest.mark.parametrize("fmt", list(AT_THE_LIMIT))
def test_trace_at_the_nesting_limit_is_safe_downstream(tmp_path: Path, fmt: str) -> None:
    from sandbox.host.namespace import _clip, _schema  # what describe_traces() runs over `traces`

    p = _write(tmp_path, "t.json", _at_the_limit(AT_THE_LIMIT[fmt]))

    def everything() -> None:
        data, _ = read_trace_file(p, None)
        assert detect_format(data) == fmt
        view = normalize(data)
        text = json.dumps(view)
        assert json.loads(text) == view
        assert pickle.loads(pickle.dumps(view)) == view  # snapshots and child exports pickle it
        assert copy.deepcopy(view) == view
        _schema(view)
        json.dumps(_clip(view))
        repr(view)

    _from_deep_stack(300, everything)


def test_deep_json_inside_a_string_is_kept_as_text() -> None:
    run = _tau_run()
    deep_args = "[" * 5_000 + "]" * 5_000
    run["traj"][2]["tool_calls"][0]["function"]["arguments"] = deep_args
    view = normalize(run)
    assert view["steps"][2]["tool_calls"][0]["arguments"] == deep_args
    assert render_call("f", deep_args) == f"f({deep_args})"


def test_deep_python_data_is_a_trace_error_not_a_recursion_error() -> None:
    deep = {"messages": [{"role": "user", "content": _content_parts(5_000)}]}
    with pytest.raises(TraceError, match="nests too deeply"):
        normalize(deep)


# ---- detection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fmt"),
    [
        (ACE, "ace"),
        ([ACE, ACE], "ace"),
        (MESSAGES, "messages"),
        (ANTHROPIC_MESSAGES, "messages"),
        (OPENCLAW, "openclaw"),
        (_tau_run(), "tau-bench"),
        ([_tau_run(), _tau_run(1.0)], "tau-bench"),
        (OTEL_SPANS, "otel"),
        (OTLP, "otel"),
        ({"foo": 1}, "unknown"),
        ([], "unknown"),
        ("text", "unknown"),
        ([1, 2], "unknown"),
    ],
)
def test_detect_format(data: Any, fmt: str) -> None:
    assert detect_format(data) == fmt


# ---- adapters --------------------------------------------------------------------------------


def _check_run_shape(view: dict[str, Any]) -> None:
    assert set(view) == (RUN_KEYS | TAU_KEYS if view["format"] == "tau-bench" else RUN_KEYS)
    for i, step in enumerate(view["steps"]):
        assert set(step) == STEP_KEYS and step["index"] == i and isinstance(step["content"], str)
        assert all(
            set(c) == {"name", "arguments"} and isinstance(c["arguments"], str) for c in step["tool_calls"]
        )


def test_ace_adapter() -> None:
    v = normalize(ACE)
    _check_run_shape(v)
    assert (v["format"], v["question"], v["ground_truth"], v["final_answer"]) == (
        "ace",
        "What is 6 * 7?",
        "42",
        "36",
    )
    assert v["steps"][0]["content"] == "6*7 = 36" and v["metadata"]["skill_ids"] == ["math-00001"]
    assert v["raw"] is ACE


def test_ace_structured_steps_and_agent_output() -> None:
    data = {
        "question": "q",
        "agent_output": {"reasoning": "r", "final_answer": "a"},
        "steps": ["look", {"tool": "search", "args": {"q": "x"}, "observation": "Error: timeout"}],
    }
    v = normalize(data)
    _check_run_shape(v)
    assert v["final_answer"] == "a"
    assert v["steps"][1]["tool_name"] == "search" and v["steps"][1]["is_error"]
    assert v["steps"][1]["tool_calls"] == [{"name": "search", "arguments": '{"q": "x"}'}]
    assert v["steps"][-1]["content"] == "r"


def test_ace_batch() -> None:
    v = normalize([ACE, {**ACE, "final_answer": "42"}])
    assert set(v) == {"format", "runs", "metadata", "raw"} and v["metadata"]["n_runs"] == 2
    assert [r["final_answer"] for r in iter_runs(v)] == ["36", "42"]


def test_messages_adapter() -> None:
    v = normalize(MESSAGES)
    _check_run_shape(v)
    assert v["format"] == "messages" and v["question"] == "Find order 7"
    assert v["final_answer"] == "Order 7 does not exist." and v["ground_truth"] is None
    call, result = v["steps"][2], v["steps"][3]
    assert call["tool_calls"] == [{"name": "get_order", "arguments": '{"id": 7}'}]
    assert (result["role"], result["tool_name"], result["is_error"]) == ("tool", "get_order", True)


def test_messages_wrapper_with_anthropic_parts() -> None:
    v = normalize(ANTHROPIC_MESSAGES)
    _check_run_shape(v)
    assert v["ground_truth"] == "bin etc" and v["final_answer"] == "bin and etc"
    tool_steps = [s for s in v["steps"] if s["role"] == "tool"]
    assert tool_steps == [
        {
            "index": 2,
            "role": "tool",
            "content": "bin etc",
            "tool_calls": [],
            "tool_name": "ls",
            "is_error": False,
            "actor": None,
            "addressee": None,
        }
    ]
    assert v["steps"][1]["tool_calls"] == [{"name": "ls", "arguments": '{"path": "/"}'}]


def test_openclaw_adapter() -> None:
    v = normalize(OPENCLAW)
    _check_run_shape(v)
    assert v["format"] == "openclaw" and v["question"] == "read notes" and v["final_answer"] == "No notes."
    assert (
        v["metadata"]["session_id"] == "s1" and v["metadata"]["custom"][0]["customType"] == "model-snapshot"
    )
    assistant, result = v["steps"][1], v["steps"][2]
    assert assistant["tool_calls"] == [{"name": "read", "arguments": '{"file_path": "/n.md"}'}]
    assert "[thinking] I will read it" in assistant["content"]
    assert (result["role"], result["tool_name"], result["is_error"]) == ("tool", "read", True)


def test_tau_bench_single_run() -> None:
    v = normalize(_tau_run(0.0))
    _check_run_shape(v)
    assert v["question"] == "Cancel my trip Z7GOZK" and v["reward"] == 0.0
    # what the agent said, verbatim, and nothing else
    assert v["final_answer"] == "Done, it is cancelled."
    # what it did and what was expected: structured, side by side, never folded into text
    assert v["actions"] == [
        {"name": "cancel_reservation", "arguments": {"reservation_id": "BAD"}, "step": 2, "is_error": True},
        {
            "name": "cancel_reservation",
            "arguments": {"reservation_id": "Z7GOZK"},
            "step": 4,
            "is_error": False,
        },
    ]
    assert v["expected_actions"] == [
        {"name": "get_reservation_details", "arguments": {"reservation_id": "Z7GOZK"}},
        {"name": "cancel_reservation", "arguments": {"reservation_id": "Z7GOZK"}},
    ]
    assert v["expected_outputs"] == [] and v["ground_truth"] is None
    assert "r_actions=0.0" in v["feedback"] and v["metadata"]["id"] == "task3-trial1"
    assert [s["index"] for s in v["steps"] if s["is_error"]] == [3]


def test_tau_bench_final_answer_is_the_last_message_verbatim() -> None:
    run = _tau_run(0.0)
    said = "  I could not find it.\n\nAnything else? [thinking] kept as written [/thinking]\n"
    run["traj"][-1]["content"] = said
    # the agent's last message with text, not a later tool call or the user's reply
    run["traj"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "transfer_to_human_agents", "arguments": "{}"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c",
            "name": "transfer_to_human_agents",
            "content": "Transfer successful",
        },
        {"role": "user", "content": "Thanks ###STOP###"},
    ]
    v = normalize(run)
    assert v["final_answer"] == said
    assert "(no database-changing actions)" not in json.dumps(v)
    assert [a["name"] for a in v["actions"]] == [
        "cancel_reservation",
        "cancel_reservation",
        "transfer_to_human_agents",
    ]
    run["traj"] = [m for m in run["traj"] if m["role"] != "assistant" or m.get("tool_calls")]
    assert normalize(run)["final_answer"] is None  # an agent that never wrote has no final answer


def test_tau_bench_outputs_and_unparsable_arguments_are_kept_as_recorded() -> None:
    run = _tau_run(1.0)
    run["info"]["task"]["outputs"] = ["327", 1000]
    run["traj"][2]["tool_calls"][0]["function"]["arguments"] = "{not json"
    v = normalize(run)
    assert v["expected_outputs"] == ["327", "1000"]
    assert v["actions"][0]["arguments"] == "{not json"


def test_tau_bench_batch() -> None:
    v = normalize([_tau_run(0.0), _tau_run(1.0)])
    assert v["format"] == "tau-bench" and v["metadata"] == {"n_runs": 2, "mean_reward": 0.5, "n_failed": 1}
    assert [r["reward"] for r in v["runs"]] == [0.0, 1.0]


def test_render_call_is_canonical() -> None:
    a = render_call("f", {"b": 250.0, "a": [{"y": 1, "x": "s"}]})
    b = render_call("f", '{"a": [{"x": "s", "y": 1}], "b": 250}')
    assert a == b == 'f(a=[{"x":"s","y":1}], b=250)'


def test_otel_spans_sorted_by_start() -> None:
    v = normalize(OTEL_SPANS)
    _check_run_shape(v)
    assert [s["role"] for s in v["steps"]] == ["agent", "tool"]
    assert v["question"] == "find x" and v["final_answer"] == "x is 3"
    tool = v["steps"][1]
    assert tool["tool_name"] == "search" and tool["is_error"] and "timeout" in tool["content"]


def test_otlp_resource_spans() -> None:
    v = normalize(OTLP)
    assert v["format"] == "otel" and v["steps"][0]["is_error"] and "input: hi" in v["steps"][0]["content"]


def test_unknown_is_passed_through() -> None:
    data = {"foo": [1, 2]}
    v = normalize(data)
    assert v["format"] == "unknown" and v["steps"] == [] and v["raw"] is data
    assert v["metadata"]["raw_keys"] == ["foo"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Error: bad", True),
        ('{"status": "error"}', True),
        ("ls: cannot access: No such file or directory", True),
        ("(Command exited with code 2)", True),
        ("Invalid argument", True),
        ("2026-02-27", False),
        ('{"reservation_id": "X"}', False),
        ("ok " + "x" * 2000 + " error", False),
    ],
)
def test_looks_like_error(text: str, expected: bool) -> None:
    assert looks_like_error(text) is expected


# ---- examples shipped to users ---------------------------------------------------------------


def test_example_failed_math() -> None:
    v = load_normalized(EXAMPLES / "failed_math.json")
    assert v["format"] == "ace" and v["ground_truth"] == "408" and "398" in v["final_answer"]


def test_example_tool_error() -> None:
    v = load_normalized(EXAMPLES / "tool_error.json")
    assert v["format"] == "messages"
    assert [(s["index"], s["tool_name"]) for s in v["steps"] if s["is_error"]] == [
        (3, "get_weather"),
        (5, "get_weather"),
    ]


# ---- real traces (dev workspace only) --------------------------------------------------------


@needs_shared
@pytest.mark.parametrize(
    "name",
    [
        "openclaw-b3db607f-7ae8-4089-b806-44800e961672.jsonl",
        "openclaw-f967d602-325a-4a45-8d54-ee17484cfd96.jsonl",
    ],
)
def test_real_openclaw(name: str) -> None:
    data, kind = read_trace_file(SHARED / name, 10_000_000)
    assert kind == "jsonl" and detect_format(data) == "openclaw"
    v = normalize(data)
    _check_run_shape(v)
    assert v["steps"] and v["final_answer"] and "[thinking]" not in v["final_answer"]
    errors = [s for s in v["steps"] if s["is_error"]]
    assert errors and all(s["tool_name"] in ("read", "exec") for s in errors)


@needs_shared
def test_real_tau_bench() -> None:
    v = load_normalized(SHARED / "tau-bench-airline-gpt-4o.json")
    assert v["format"] == "tau-bench" and v["metadata"]["n_runs"] == 120 and v["metadata"]["n_failed"] == 84
    for run in v["runs"]:
        _check_run_shape(run)
        assert run["question"] and run["ground_truth"] is None and run["final_answer"] is not None
        traj = run["raw"]["traj"]
        last = next(
            m["content"]
            for m in reversed(traj)
            if m["role"] == "assistant" and (m.get("content") or "").strip()
        )
        assert run["final_answer"] == last  # verbatim: nothing appended, nothing stripped
        calls = [c["function"] for m in traj if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert [a["name"] for a in run["actions"]] == [c["name"] for c in calls]
        assert [a["arguments"] for a in run["actions"]] == [json.loads(c["arguments"]) for c in calls]
        task = run["raw"]["info"]["task"]
        assert run["expected_actions"] == [
            {"name": a["name"], "arguments": a["kwargs"]} for a in task["actions"]
        ]
        assert run["expected_outputs"] == task["outputs"]
    ids = {r["metadata"]["id"] for r in v["runs"]}
    assert len(ids) == 120


@pytest.mark.timeout(60)
async def test_sandbox_host_loads_a_trace_at_the_nesting_limit(tmp_path: Path) -> None:
    from sandbox.executor import SubprocessExecutor
    from tests.sandbox.conftest import TEST_LIMITS

    p = _write(tmp_path, "t.json", _at_the_limit(AT_THE_LIMIT["tau-bench"]))
    ex = SubprocessExecutor(TEST_LIMITS)
    await ex.start(str(p), "auto", {})
    try:
        r = await ex.run_cell(
            "describe_traces(max_preview=300)\nprint('dumped', len(json.dumps(traces)) > 0)"
        )
        assert r.ok, r
        assert "schema:" in r.stdout and "dumped True" in r.stdout
    finally:
        await ex.close()


def test_a_bare_end_of_chat_token_is_no_runs_answer_in_any_format() -> None:
    """AutoGen ends a chat with TERMINATE: the answer is the last assistant text that says something."""
    chat = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "assistant", "content": " TERMINATE. "},
    ]
    assert normalize(chat)["final_answer"] == "4"
    assert normalize({"question": "What is 2 + 2?", "messages": chat})["final_answer"] == "4"
    assert normalize({"question": "What is 2 + 2?", "steps": chat})["final_answer"] == "4"
    assert normalize([{"role": "assistant", "content": "TERMINATE"}])["final_answer"] is None
    assert normalize([{"role": "assistant", "content": "Terminate the process first."}])["final_answer"] == (
        "Terminate the process first."
    )


def test_the_lazy_view_of_a_chat_that_ends_with_terminate_has_the_whole_reads_answer(tmp_path: Path) -> None:
    from tests.support.lazy import lazy_view

    chat = [{"role": "user", "content": "count"}]
    chat += [
        {"role": "assistant", "content": f"step {i}"} for i in range(2000)
    ]  # plain: the index's fast path
    chat += [{"role": "assistant", "content": "TERMINATE"}, {"role": "user", "content": ""}]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in chat) + "\n", encoding="utf-8")
    whole = load_normalized(path)
    assert whole["final_answer"] == "step 1999"
    for view in lazy_view(path):
        assert view["final_answer"] == whole["final_answer"]
