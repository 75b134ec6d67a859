"""The batched index pass against the pass a record at a time, on hostile and generated traces.

The index pass takes its records a batch at a time (`Scanner.batches`): `FastScanner` hands out windows of
records parsed by msgspec, windows of plain chat messages as typed records
(`reflector.analysis.fastmessages`), and the pass settles codes, counts and blocks once per batch. The
reference here is the pass as it was, one record at a time (`OneByOne`: the stdlib scanner, every batch
one record, plain messages read by the adapter): the same format, index bytes and error message, on
every input. Small read buffers put window and buffer boundaries everywhere.
"""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import reflector.analysis.traces.index as index_mod
import reflector.analysis.traces.index_file as index_file
from reflector.analysis.fastmessages import MESSAGES, message_run
from reflector.analysis.fastscan import FastScanner
from reflector.analysis.traces.columns import PlainColumns, plain_run
from reflector.analysis.traces.read import MAX_NESTING
from reflector.analysis.traces.scan import Batch, Scanner
from tests.unit.test_fastscan import _MESSAGE, _plain_trace


class OneByOne(Scanner):
    """The stdlib scanner handing out one record per batch: the pass as it ran before batches."""

    def batches(self) -> Iterator[Batch]:
        for start, end, value in self.records():
            yield Batch([start], [end], [value])


def _small(chunk: int) -> type[Scanner]:
    class Small(FastScanner):
        def __init__(self, fh: Any, name: str, **kw: Any) -> None:
            super().__init__(fh, name, chunk=chunk, **kw)

    return Small


def _index(scanner: type[Scanner], data: bytes, name: str) -> tuple[Any, ...]:
    out = io.BytesIO()
    try:
        got = index_mod.write_index(io.BytesIO(data), name, out, scanner=scanner)
    except Exception as exc:  # the error is part of the result: same type, same message
        return ("raised", type(exc).__name__, str(exc))
    return got, out.getvalue() if got[1] is not None else b""


def assert_same_index(data: bytes, name: str) -> None:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(index_mod, "plain_run", lambda values, i, *args: i)  # every record through the adapter
        want = _index(OneByOne, data, name)
    for scanner in (FastScanner, _small(64), _small(4096), Scanner):
        assert _index(scanner, data, name) == want, scanner


def _lines(msgs: list[Any]) -> list[bytes]:
    return [json.dumps(m).encode() for m in msgs]


def _shapes(records: list[bytes]) -> dict[str, bytes]:
    return {
        "t.jsonl": b"\n".join(records) + b"\n",
        "t.json": b"[" + b", ".join(records) + b"]",
        "o.json": b'{"question": "q", "steps": [' + b",\n  ".join(records) + b'], "final_answer": "a"}',
        "m.json": b'{"task": "t", "messages": [' + b", ".join(records) + b"]}",
    }


PLAIN = _lines(_plain_trace(150))  # over 200 records: the sample, then windows read as plain messages


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tail=st.lists(_MESSAGE | st.text(max_size=3), max_size=12), cut=st.integers(min_value=0))
def test_generated_message_traces_index_alike(tail: list[Any], cut: int) -> None:
    records = PLAIN + _lines(tail)
    for name, data in _shapes(records).items():
        assert_same_index(data, name)
    k = len(PLAIN) // 2 + cut % len(tail) if tail else len(PLAIN) // 2
    assert_same_index(_shapes(records[:k] + _lines(tail) + records[k:])["t.jsonl"], "t.jsonl")


HOSTILE: dict[str, list[bytes]] = {
    "nan": [b'{"role": "tool", "content": "x", "n": NaN}'],
    "surrogate": [b'{"role": "user", "content": "\\ud800"}'],
    "invalid-utf8": [b'{"role": "user", "content": "\xff"}'],
    "big-int-id": [b'{"role": "tool", "content": "x", "tool_call_id": 123456789012345678901234567890}'],
    "not-a-dict": [b"[1, 2]", b'"text"', b"7"],
    "duplicate-role": [b'{"role": "user", "content": "q", "role": "assistant"}'],
    "deep-within": [b'{"role": "user", "content": "x", "name": ' + b"[" * 40 + b"]" * 40 + b"}"],
    "deep-over": [b'{"role": "user", "content": "x", "name": ' + b"[" * 120 + b"]" * 120 + b"}"],
    "falsy-calls": [
        b'{"role": "assistant", "content": "", "tool_calls": {}}',
        b'{"role": "tool", "content": "Error"}',
    ],
    "calls-odd": [
        b'{"role": "assistant", "content": "", "tool_calls": [{"id": 0, "function": {"name": "f"}}]}',
        b'{"role": "assistant", "content": "", "tool_calls": [{"id": "c9", "function": {}, "name": "g"}]}',
        b'{"role": "tool", "content": "ok", "tool_call_id": "c9"}',
        b'{"role": "assistant", "content": "", "tool_calls": [{"id": "c8", "function": {"name": "h", "x": 1}}]}',
        b'{"role": "tool", "content": "no such file", "tool_call_id": "c8"}',
    ],
    "openclaw-like": [b'{"type": "message", "message": {"role": "user", "content": "hi"}}'],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_records_after_the_sample_index_alike(case: str) -> None:
    records = PLAIN + HOSTILE[case] + PLAIN[:20]
    for name, data in _shapes(records).items():
        assert_same_index(data, name)


@pytest.mark.parametrize(
    "data",
    [
        b"\r\n".join(PLAIN) + b"\r\n",  # CRLF
        b"\n\n".join(PLAIN) + b"\n",  # blank lines
        b"\n".join(b"  " + r + b" \t" for r in PLAIN),  # blanks around every value, no final newline
        b"\xef\xbb\xbf" + b"\n".join(PLAIN),  # a BOM
        b"\n".join(PLAIN[:210])
        + b"\n"
        + b'{"role": "user", "content": "x"}, {"role": "user", "content": "y"}\n',
        b"\n".join(PLAIN[:210]) + b"\n{broken\n" + b"\n".join(PLAIN[:10]),
        b"\n".join(PLAIN[:210]) + b"\n[1]\n" + b"\n".join(PLAIN[:10]),
        b"\n".join(PLAIN[:210]) + b"\n\x1b[0m" + PLAIN[0] + b"\n",  # stray bytes before a record
    ],
)
def test_hostile_jsonl_windows_index_alike(data: bytes) -> None:
    assert_same_index(data, "t.jsonl")


@pytest.mark.parametrize(
    "data",
    [
        b"[" + b",\n".join(PLAIN[:100]) + b", " + b" ,  ".join(PLAIN[100:]) + b"]",  # separators of two kinds
        b"[" + b", ".join(PLAIN[:230]) + b", " + b"[" * (MAX_NESTING - 1) + b"]" * (MAX_NESTING - 1) + b"]",
        b"[" + b", ".join(PLAIN[:230]) + b", " + b"[" * MAX_NESTING + b"]" * MAX_NESTING + b"]",
        b"[" + b", ".join(PLAIN[:230]) + b", 1e400, " + b", ".join(PLAIN[:20]) + b"]",
        b"[" + b", ".join(PLAIN[:230]) + b", {broken, " + b", ".join(PLAIN[:20]) + b"]",
        b"[" + b", ".join(PLAIN[:230]) + b"] trailing",
    ],
)
def test_hostile_arrays_index_alike(data: bytes) -> None:
    assert_same_index(data, "t.json")


def test_a_pass_error_comes_before_a_later_parse_error() -> None:
    """An OpenClaw event that is not an object fails the pass; the broken JSON after it is never reached
    (a batch holding both must not report the parse error first)."""
    events = [b'{"type": "session", "id": "s"}'] + [
        b'{"type": "message", "message": {"role": "user", "content": "hi"}}'
    ] * 240
    for data, name in (
        (b"\n".join([*events, b"[1]", *events[:5], b"{broken"]), "t.jsonl"),
        (b"[" + b", ".join([*events, b"[1]", *events[:5], b"{broken"]) + b"]", "t.json"),
    ):
        assert_same_index(data, name)
        assert "is not an object" in str(_index(FastScanner, data, name))


_TEXT = st.sampled_from(["", "ok", "Error: boom", "[thinking] x [/thinking] y", "not found", "c1", "c2"])
_FUNCTION = st.fixed_dictionaries({}, optional={"name": _TEXT, "arguments": st.none() | _TEXT})
_PLAIN_CALL = st.fixed_dictionaries(
    {},
    optional={
        "id": st.none() | _TEXT,
        "type": st.none() | st.just("function"),
        "function": st.none() | _FUNCTION,
        "name": _TEXT,
        "arguments": st.none() | _TEXT,
    },
)
# messages msgspec reads as plain (`fastmessages.Message`), and some it does not
_PLAIN_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]), "content": _TEXT},
    optional={
        "tool_calls": st.none() | st.lists(_PLAIN_CALL, max_size=3),
        "tool_call_id": st.none() | _TEXT,
        "name": st.none() | _TEXT,
        "tool_name": st.none() | _TEXT,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(_PLAIN_MESSAGE, min_size=1, max_size=8) | st.lists(_MESSAGE, min_size=1, max_size=8),
    recent=st.sampled_from([0, 1, 2]),
    shared=st.booleans(),
)
@example(
    messages=[
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {}, "name": "grep"}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "function": {"name": "sql"}}]},
        {"role": "tool", "content": "Error: x", "tool_call_id": "c1"},
        {"role": "tool", "content": "ok", "tool_call_id": "c2", "tool_name": "other"},
        {"role": "tool", "content": "ok", "tool_call_id": "c3", "name": "named"},
    ],
    recent=0,
    shared=True,
)
def test_message_run_is_plain_run(messages: list[Any], recent: int, shared: bool) -> None:
    """Where msgspec reads a window as plain messages, their columns and the tool-call names left
    behind are `plain_run`'s on the same records as dicts (bounded or not, shared or per message)."""
    blob = json.dumps(messages).encode()
    try:
        typed = MESSAGES.decode(blob)
    except msgspec.DecodeError:
        return
    values = json.loads(blob)
    names_a: OrderedDict[str, str] | None = OrderedDict(c0="x") if shared else None
    names_b: OrderedDict[str, str] | None = OrderedDict(c0="x") if shared else None
    a, b = PlainColumns(), PlainColumns()
    assert plain_run(values, 0, names_a, a, recent) == len(values)  # all plain: msgspec accepts a subset
    message_run(typed, names_b, b, recent)
    assert [a.roles, a.contents, a.errors, a.tools, a.calls] == [
        b.roles,
        b.contents,
        b.errors,
        b.tools,
        b.calls,
    ]
    assert names_a == names_b


def test_plain_messages_are_read_as_typed_records() -> None:
    """The fast path is taken: past the sample, windows of a plain trace come as typed messages."""
    pure = _lines([m for m in _plain_trace(150) if isinstance(m["content"], str)])
    data = b"\n".join(pure * 3) + b"\n"
    sc = FastScanner(io.BytesIO(data), "t.jsonl", chunk=4096)
    batches = sc.batches()
    first = next(batches)
    assert not first.plain and isinstance(first.values[0], dict)
    sc.plain_messages()
    assert all(b.plain for b in batches)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(0, 3), max_size=9)), max_size=12),
)
def test_blocks_are_written_as_a_record_at_a_time_would(sizes: list[tuple[int, list[int]]]) -> None:
    """Batches of records and steps, written through `_Writer.add`, give the bytes one record and then
    its steps at a time give, with blocks filling at any point (5 entries a block here)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(index_file, "BLOCK_ENTRIES", 5)
        _write_both(sizes)


def _write_both(sizes: list[tuple[int, list[int]]]) -> None:
    one, many = io.BytesIO(), io.BytesIO()
    w1, w2 = index_file._Writer(one), index_file._Writer(many)
    rec = 0
    for n_records, steps_per in sizes:
        steps_per = (steps_per + [1] * n_records)[:n_records]
        starts, ends = list(range(rec, rec + n_records)), list(range(rec + 1, rec + n_records + 1))
        step_recs = [rec + i for i, k in enumerate(steps_per) for _ in range(k)]
        cols = [list(range(len(step_recs))) for _ in range(4)]
        w2.add(rec, starts, ends, step_recs, *cols)
        for i in range(n_records):
            w1.add(rec + i, [starts[i]], [ends[i]], [], [], [], [], [])
            mine = [j for j, r in enumerate(step_recs) if r == rec + i]
            w1.add(rec + i, [], [], [step_recs[j] for j in mine], *[[c[j] for j in mine] for c in cols])
        rec += n_records
    assert w1.finish({}) == w2.finish({})
    assert one.getvalue() == many.getvalue()
