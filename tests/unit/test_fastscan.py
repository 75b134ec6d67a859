"""The fast index pass against the stdlib one: the same records, offsets, values, errors and index bytes.

`reflector.analysis.fastscan.FastScanner` (msgspec, windows of records) must give what `Scanner` (the stdlib
`json` decoder, one record at a time) gives on every input, including the ones msgspec refuses or reads
differently (NaN and Infinity, numbers beyond a double or 64 bits, lone surrogate escapes, invalid
UTF-8, BOMs, deep nesting, stray bytes before a JSONL line); and `reflector.analysis.traces.columns.
message_columns` must give the columns the message adapter's steps give. Small read buffers
(`chunk=64`) put window and buffer boundaries everywhere: inside strings, numbers and records.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import reflector.analysis.traces.index as index_mod
from reflector.analysis.fastscan import FastScanner
from reflector.analysis.traces.adapters.messages import _message_steps
from reflector.analysis.traces.columns import message_columns
from reflector.analysis.traces.index import build_index
from reflector.analysis.traces.read import MAX_NESTING
from reflector.analysis.traces.scan import Scanner

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def _run(
    cls: type[Scanner], data: bytes, name: str, chunk: int, split: bool, broken: bool
) -> tuple[str, str]:
    sc = cls(io.BytesIO(data), name, chunk=chunk, split_object=split, yield_broken=broken)
    got: list[Any] = []
    try:
        for item in sc.records():
            got.append(item)
    except Exception as exc:  # the error is part of the result: same type, same message
        got.append(("raised", type(exc).__name__, str(exc)))
    return repr(got), repr(sc.header)  # repr: NaN equals NaN, key order counts


def assert_same(data: bytes, name: str = "t.json", chunks: tuple[int, ...] = (64, 1 << 20)) -> None:
    for chunk in chunks:
        for split, broken in ((True, False), (False, False), (False, True)):
            old = _run(Scanner, data, name, chunk, split, broken)
            new = _run(FastScanner, data, name, chunk, split, broken)
            assert new == old, (chunk, split, broken)


def containers(records: list[bytes]) -> dict[str, bytes]:
    """The same records as JSON lines, a JSON array and a JSON object's `steps`."""
    return {
        "t.jsonl": b"\n".join(records) + b"\n",
        "t.json": b"[" + b", ".join(records) + b"]",
        "o.json": b'{"question": "q", "steps": [' + b",\n  ".join(records) + b'], "final_answer": "a"}',
    }


HOSTILE: dict[str, list[bytes]] = {
    "nan-inf": [b'{"a": NaN}', b'{"b": [Infinity, -Infinity]}', b'{"c": 1}'],
    "beyond-double": [b'{"x": 1e400, "y": -1e400, "z": 1e-400}', b'{"c": 2}'],
    "big-ints": [
        b'{"n": 123456789012345678901234567890}',
        b'{"m": -9223372036854775809}',
        b'{"u": 18446744073709551616}',
    ],
    "int-over-4300-digits": [b'{"ok": 1}', b'{"n": ' + b"7" * 5000 + b"}"],
    "duplicate-keys": [b'{"a": 1, "b": 2, "a": 3}', b'{"role": "user", "role": "assistant", "content": "x"}'],
    "lone-surrogate": [b'{"s": "\\ud800 x"}', b'{"s": "\\udc00"}', b'{"ok": "\\ud83d\\ude00"}'],
    "invalid-utf8": [b'{"s": "\xff\xfe bad"}', '{"s": "caf\u00e9 \u2603"}'.encode(), b'{"s": "\xc3"}'],
    "huge-string": [b'{"s": "' + b"}, {" * 300_000 + b'"}', b'{"t": "' + b"x" * 2_000_000 + b'"}'],
    "brackets-in-strings": [b'{"s": "' + b"[{" * 200 + b'"}', b'{"a": ["}, {", "] , ["]}'],
    "depth-at-limit": [b"[" * (MAX_NESTING - 2) + b"1" + b"]" * (MAX_NESTING - 2), b'{"a": 1}'],
    "depth-over": [b'{"a": 1}', b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1)],
    "depth-bomb": [b'{"a": 1}', b"[" * 100_000 + b"]" * 100_000],
    "scalars-and-mixed": [b'"a{b}"', b"12", b"true", b"null", b'{"a": 1}', b"[1, 2]", b'"x"', b"-0.5e3"],
    "control-char": [b'{"s": "a\x01b"}', b'{"ok": 1}'],
    "trailing-comma": [b'{"a": 1,}', b'{"ok": 1}'],
    "odd-whitespace": [b'\x0c{"a": 1}', b'{"b": 2}\x0b', b'\xa0{"c": 3}', b'  {"d": 4}\r'],
    "empty-containers": [b"{}", b"[]", b'{"a": {}}'],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_records_scan_alike(case: str) -> None:
    # a string longer than the default 1 MiB buffer; read 4 KiB at a time (the stdlib scanner looks for
    # the end of a JSON line from its start at each read: 64 bytes at a time would take minutes)
    chunks = (4096, 1 << 20) if case == "huge-string" else (64, 1 << 20)
    for name, data in containers(HOSTILE[case]).items():
        assert_same(data, name, chunks)


@pytest.mark.parametrize(
    "data",
    [
        b'\xef\xbb\xbf[{"a": 1}, {"b": 2}]',  # a BOM
        b'\xef\xbb\xbf{"a": 1}\n{"b": 2}\n',
        b'\x1b[0m{"type": "session", "id": "s"}\n{"type": "message", "message": {"role": "user"}}\n',  # OpenClaw
        b'{"a": 1}\n\n   \n{"b": 2}\r\n{"c": 3}',  # blank lines, CRLF, no final newline
        b'{"a": 1}\nnot json\n{"b": 2}\n{broken\n',  # broken lines (errors, or BrokenLine records)
        b'[{"a": 1}, {"b": 2}] trailing',
        b'[{"a": 1} {"b": 2}]',
        b'[{"a": 1}, {"b": 2}',  # unterminated
        b'{"steps": [{"a": 1}], "steps": [{"b": 2}]}',  # the record field twice
        b'{"question": "q", "steps": []}',
        b"[]",
        b"   ",
    ],
)
def test_hostile_files_scan_alike(data: bytes) -> None:
    for name in ("t.json", "t.jsonl"):
        assert_same(data, name)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(st.dictionaries(st.text(max_size=8), _VALUES, max_size=5), min_size=1, max_size=12),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1, 2]),
)
def test_generated_traces_scan_alike(
    records: list[dict[str, Any]], ascii_only: bool, indent: int | None
) -> None:
    lines = [json.dumps(r, ensure_ascii=ascii_only).encode("utf-8", errors="surrogatepass") for r in records]
    for name, data in containers(lines).items():
        assert_same(data, name)
    pretty = json.dumps(records, ensure_ascii=ascii_only, indent=indent).encode(
        "utf-8", errors="surrogatepass"
    )
    assert_same(pretty, "p.json")


@settings(max_examples=100, deadline=None)
@given(
    records=st.lists(st.dictionaries(st.text(max_size=5), _SCALARS, max_size=3), min_size=2, max_size=8),
    at=st.integers(min_value=0),
    junk=st.binary(min_size=1, max_size=3),
)
def test_damaged_traces_scan_alike(records: list[dict[str, Any]], at: int, junk: bytes) -> None:
    lines = [json.dumps(r).encode() for r in records]
    for name, data in containers(lines).items():
        cut = at % len(data)
        assert_same(data[:cut] + junk + data[cut:], name)


# -- message columns ------------------------------------------------------------------------------
_ROLES = st.sampled_from(
    [
        "system",
        "user",
        "assistant",
        "tool",
        "developer",
        "function",
        "human",
        "ai",
        "Assistant",
        "Orchestrator (-> WebSurfer)",
        "toolResult",
        "",
    ]
)
_IDS = st.sampled_from(["c1", "c2", "", None, 7])
_CALL = st.fixed_dictionaries(
    {},
    optional={
        "id": _IDS,
        "type": st.just("function"),
        "function": st.none()
        | st.just({})
        | st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["sql", "read", "", 3]),
                "arguments": st.none() | st.just('{"q": 1}') | st.just({"q": 1}),
            },
        ),
        "name": st.sampled_from(["sql", "grep"]),
        "arguments": st.just("{}"),
    },
)
_MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": _ROLES,
        "content": st.none()
        | st.sampled_from(
            [
                "",
                "  ",
                "ok",
                "Error: boom",
                "[thinking] x [/thinking] y",
                "no such file here",
                "fine, no errors",
            ]
        )
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.just("hi")}), max_size=2),
        "tool_calls": st.none() | st.just([]) | st.lists(_CALL, max_size=3) | _CALL | st.just(["x"]),
        "tool_call_id": _IDS,
        "name": st.none() | st.sampled_from(["sql", "Planner", "user", ""]),
        "tool_name": st.just("sql"),
        "is_error": st.booleans(),
        "function_call": st.just({"name": "f", "arguments": "{}"}),
    },
)


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(_MESSAGE | st.text(max_size=3), min_size=1, max_size=6))
@example(
    messages=[
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {}, "name": "grep"}]},
        {"role": "tool", "content": "Error: x", "tool_call_id": "c1"},
    ]
)
@example(
    messages=[
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "c1", "name": "grep"}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "sql"},
        {"role": "tool", "content": "ok", "tool_call_id": "c2"},
    ]
)
def test_message_columns_are_the_adapters(messages: list[Any]) -> None:
    fast_names: dict[str, str] = {}
    slow_names: dict[str, str] = {}
    for msg in messages:
        before = dict(fast_names)
        cols = message_columns(msg, fast_names)
        steps = _message_steps(msg, slow_names, 0)
        if cols is None:
            assert fast_names == before  # declined: nothing changed; the adapter reads it
            fast_names = dict(slow_names)
            continue
        assert len(steps) == 1
        step = steps[0]
        role, content, err, tool, names = cols
        assert (role, content, err, tool) == (
            step["role"],
            step["content"],
            step["is_error"],
            step["tool_name"],
        )
        assert names == [str(c.get("name")) for c in step["tool_calls"]]
        assert fast_names == slow_names


def _plain_trace(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "be exact"},
        {"role": "user", "content": "how many?"},
    ]
    for i in range(n):
        out.append(
            {
                "role": "assistant",
                "content": f"step {i}" if i % 3 else "",
                "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": "sql", "arguments": '{"q": 1}'}}
                ],
            }
        )
        out.append(
            {"role": "tool", "tool_call_id": f"c{i}", "content": "Error: no table" if i % 7 == 0 else "rows"}
        )
        if i % 11 == 0:  # not plain: the adapter reads these
            out.append(
                {"role": "assistant", "content": [{"type": "text", "text": "parts"}], "name": "Planner"}
            )
    out.append({"role": "assistant", "content": "  FINAL: 3  "})
    return out


@pytest.mark.parametrize("shape", ["jsonl", "ace-object", "history-object"])
def test_index_bytes_equal_the_stdlib_pass(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = _plain_trace(300)
    if shape == "jsonl":
        data, name = b"\n".join(json.dumps(m).encode() for m in msgs), "t.jsonl"
    else:
        key = "steps" if shape == "ace-object" else "history"
        data, name = json.dumps({"question": "q", key: msgs}).encode(), "t.json"
    fast_out, slow_out = io.BytesIO(), io.BytesIO()
    fast = index_mod.write_index(io.BytesIO(data), name, fast_out, scanner=FastScanner)
    monkeypatch.setattr(
        index_mod, "plain_run", lambda values, i, *args: i
    )  # every record through the adapter
    slow = index_mod.write_index(io.BytesIO(data), name, slow_out, scanner=Scanner)
    assert fast == slow and fast[1] is not None
    assert fast_out.getvalue() == slow_out.getvalue()


@pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/traces is absent (only a checkout beside the shared folder has it)"
)
def test_shared_traces_index_alike() -> None:
    for path in sorted(SHARED.rglob("*.json*")):  # the Who&When runs too
        data = path.read_bytes()
        assert_same(data, path.name)
        assert (
            build_index(io.BytesIO(data), path.name, scanner=FastScanner)[1]
            == build_index(io.BytesIO(data), path.name)[1]
        )


def test_nan_records_keep_the_stdlib_values() -> None:
    data = b'[{"a": NaN, "b": 1e400}, {"c": "\\ud800"}, {"d": "ok"}]'
    got = [v for _s, _e, v in FastScanner(io.BytesIO(data), "t.json").records()]
    assert math.isnan(got[0]["a"]) and got[0]["b"] == math.inf
    assert got[1] == {"c": "\ud800"} and got[2] == {"d": "ok"}
