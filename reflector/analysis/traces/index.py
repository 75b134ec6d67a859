"""The record index of a large trace: built in one streaming pass, stored next to the trace.

A trace too big to parse whole is read by the sandbox as a lazy view (`reflector.analysis.traces.lazy`):
records are parsed when a cell touches them, found by the byte ranges kept here. The pass also
computes everything of the canonical view that needs the whole trace (question, final answer,
counts, rewards, the tool names that tool results get from earlier calls), so the lazy view answers
those without reading the trace again, and `len()` is free.

What is indexed (`lazy_shape`): JSONL files and JSON arrays whose records are runs (tau-bench, ACE:
a batch, one run per record) or steps/messages/events of one run (ACE, messages, OpenClaw, an
unknown list), and JSON objects whose `steps` / `trace` / `messages` array holds the steps of one
ACE or messages run. Other shapes (OTel spans, which are ordered by time across records, and a
single tau-bench run) are read whole.

Stored format (`TraceIndex.to_bytes`): one line of JSON (the header) followed by the integer arrays
it lists, native little-endian. The index of trace `sha` lives in the blob store under a name derived
from `sha` and `INDEX_VERSION`, so every worker finds the same one and a new version never reads an
old one.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from reflector.analysis.traces.adapters.ace import _ace_step, _norm_ace_run
from reflector.analysis.traces.adapters.messages import _message_steps
from reflector.analysis.traces.adapters.openclaw import _openclaw_step
from reflector.analysis.traces.adapters.tau import _norm_tau_run
from reflector.analysis.traces.columns import message_columns
from reflector.analysis.traces.detect import TraceFormat, detect_format
from reflector.analysis.traces.read import TraceError
from reflector.analysis.traces.scan import ScanHeader, Scanner
from reflector.analysis.traces.view import _THINKING_RE, _batch_view, _opt_float, _opt_str, _run_view

__all__ = [
    "TraceIndex",
    "build_index",
    "write_index",
    "index_path",
    "INDEX_VERSION",
    "INDEX_SUFFIX",
    "SAMPLE_RECORDS",
    "step_of_record",
    "run_of_record",
    "lazy_shape",
]

INDEX_VERSION = 3  # 3: written as it is built (constant memory), the resolved tool name is a column
INDEX_SUFFIX = f".index-v{INDEX_VERSION}"  # the index of blob X is the file X + this suffix, beside it
SAMPLE_RECORDS = 200  # records read before the format is decided (the bounded sample)
_MAX_CUSTOM = 200  # OpenClaw custom events kept in the metadata (the rest are counted)
# The columns, by group (a record group and a step group grow at different rates), with their types.
_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "records": (("starts", "q"), ("ends", "q")),
    "steps": (
        ("step_records", "q"),
        ("step_subs", "i"),
        ("step_roles", "h"),
        ("step_errors", "b"),
        ("step_tools", "i"),
    ),
}
_COLUMNS = {name: code for group in _GROUPS.values() for name, code in group}
BLOCK_ENTRIES = 65_536  # entries per column a writer holds before it writes them out
_FOOTER = struct.Struct("<Q")
RECENT_CALLS = 65_536  # tool-call ids the index pass remembers to name the results that follow


@dataclass
class TraceIndex:
    """Byte ranges of a trace's records, plus the parts of its canonical view that need all of it.

    Stored as blocks of column entries written while the trace is scanned, then a JSON footer (the
    header fields and where each block is) and the footer's length: the writer's memory does not grow
    with the trace. `from_bytes` reads it back whole (the sandbox host holds it: the memory formula).
    """

    format: str
    kind: str  # "run": records are steps of one run | "batch": records are runs
    container: str  # "jsonl" | "json-array" | "json-object"
    key: str | None  # json-object: the field holding the records
    record_kind: str  # how a record becomes steps/a run: "ace-step" | "message" | "openclaw" | "none" | "tau-run" | "ace-run"
    size: int
    header: dict[str, Any]  # the view without `steps` / `runs` / `raw`
    outer: dict[str, Any] = field(default_factory=dict)  # json-object: the other fields
    tail_steps: list[dict[str, Any]] = field(default_factory=list)  # ACE: steps after the indexed ones
    starts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    step_records: array[int] = field(default_factory=lambda: array("q"))  # step -> record (kind "run")
    step_subs: array[int] = field(default_factory=lambda: array("i"))  # step -> its position in the record
    # Columns of the indexed steps, so that filters and counts need no parsing (`Steps.where`):
    step_roles: array[int] = field(default_factory=lambda: array("h"))  # position in `roles`
    step_errors: array[int] = field(default_factory=lambda: array("b"))  # 1: is_error
    # position in `tools` of the step's tool_name as resolved over the whole trace (a tool result may get
    # it from an earlier call), -1: none
    step_tools: array[int] = field(default_factory=lambda: array("i"))
    roles: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    call_counts: dict[str, int] = field(default_factory=dict)  # tool-call name -> calls, over every step

    @property
    def n_records(self) -> int:
        return len(self.starts)

    @property
    def n_steps(self) -> int:
        return len(self.step_records) + len(self.tail_steps)

    def nbytes(self) -> int:
        """Memory the index takes once loaded (the columns; the header is small)."""
        return sum(getattr(self, name).itemsize * len(getattr(self, name)) for name in _COLUMNS)

    def meta(self) -> dict[str, Any]:
        return {
            "version": INDEX_VERSION,
            "format": self.format,
            "kind": self.kind,
            "container": self.container,
            "key": self.key,
            "record_kind": self.record_kind,
            "size": self.size,
            "header": self.header,
            "outer": self.outer,
            "tail_steps": self.tail_steps,
            "roles": self.roles,
            "tools": self.tools,
            "call_counts": self.call_counts,
            "byteorder": sys.byteorder,
        }

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        w = _Writer(out)
        for name in _COLUMNS:
            w.bufs[name].extend(getattr(self, name))
        w.finish(self.meta())
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> TraceIndex:
        if len(data) < _FOOTER.size:
            raise ValueError("trace index is truncated")
        (n,) = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
        if n > len(data) - _FOOTER.size:
            raise ValueError("trace index is truncated")
        body = len(data) - _FOOTER.size - n
        try:
            head = json.loads(data[body : body + n])
        except ValueError:
            raise ValueError("trace index is truncated or damaged") from None
        if not isinstance(head, dict) or head.get("version") != INDEX_VERSION:
            version = head.get("version") if isinstance(head, dict) else None
            raise ValueError(f"trace index version {version!r}, expected {INDEX_VERSION}")
        idx = cls(
            format=head["format"],
            kind=head["kind"],
            container=head["container"],
            key=head["key"],
            record_kind=head["record_kind"],
            size=int(head["size"]),
            header=head["header"],
            outer=head["outer"],
            tail_steps=head["tail_steps"],
            roles=list(head["roles"]),
            tools=list(head["tools"]),
            call_counts=dict(head["call_counts"]),
        )
        swap = head.get("byteorder") != sys.byteorder
        for group, count, offset in head["blocks"]:
            pos = int(offset)
            for name, code in _GROUPS[group]:
                col = array(code)
                size = int(count) * col.itemsize
                if pos + size > body:
                    raise ValueError("trace index is truncated")
                col.frombytes(data[pos : pos + size])
                if swap:
                    col.byteswap()
                getattr(idx, name).extend(col)
                pos += size
        n_steps = len(idx.step_records)
        step_cols = (idx.step_subs, idx.step_roles, idx.step_errors, idx.step_tools)
        if len(idx.starts) != len(idx.ends) or any(len(c) != n_steps for c in step_cols):
            raise ValueError("trace index is truncated or inconsistent")
        if any(s < 0 or e > idx.size or s > e for s, e in zip(idx.starts, idx.ends, strict=True)):
            raise ValueError("trace index has a record outside the trace")
        if any(r < 0 or r >= len(idx.starts) for r in idx.step_records):
            raise ValueError("trace index has a step outside the trace")
        if any(t >= len(idx.tools) for t in idx.step_tools) or any(
            r >= len(idx.roles) for r in idx.step_roles
        ):
            raise ValueError("trace index is inconsistent (a column names an unknown value)")
        return idx


class _Writer:
    """Writes an index's columns in blocks as they grow, then the footer (see `TraceIndex`)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.pos = 0
        self.blocks: list[tuple[str, int, int]] = []
        # the columns, emptied in place when written (the pass calls these once or more per record)
        self.bufs: dict[str, array[int]] = {name: array(code) for name, code in _COLUMNS.items()}
        self._records = tuple(self.bufs[name] for name, _code in _GROUPS["records"])
        self._steps = tuple(self.bufs[name] for name, _code in _GROUPS["steps"])

    def record(self, start: int, end: int) -> None:
        starts, ends = self._records
        starts.append(start)
        ends.append(end)
        if len(starts) >= BLOCK_ENTRIES:
            self._flush("records")

    def step(self, record: int, sub: int, role: int, error: int, tool: int) -> None:
        records, subs, roles, errors, tools = self._steps
        records.append(record)
        subs.append(sub)
        roles.append(role)
        errors.append(error)
        tools.append(tool)
        if len(records) >= BLOCK_ENTRIES:
            self._flush("steps")

    def _flush(self, group: str) -> None:
        names = [name for name, _code in _GROUPS[group]]
        count = len(self.bufs[names[0]])
        if not count:
            return
        self.blocks.append((group, count, self.pos))
        for name in names:
            data = self.bufs[name].tobytes()
            self.out.write(data)
            self.pos += len(data)
            del self.bufs[name][:]

    def finish(self, meta: dict[str, Any]) -> int:
        """Write what is left and the footer; returns the index's size in bytes."""
        self._flush("records")
        self._flush("steps")
        footer = json.dumps({**meta, "blocks": self.blocks}, ensure_ascii=True, default=str).encode()
        self.out.write(footer)
        self.out.write(_FOOTER.pack(len(footer)))
        self.pos += len(footer) + _FOOTER.size
        return self.pos


def index_path(trace_path: str) -> str:
    """Where the index of the trace stored at `trace_path` lives: next to it (the blob store, the
    sandbox host and `rr gc` all find it this way)."""
    return trace_path + INDEX_SUFFIX


def lazy_shape(container: str, key: str | None, fmt: str, sample: list[Any]) -> tuple[str, str] | None:
    """(kind, record_kind) when a trace of this shape is indexed, else None (it is read whole)."""
    if container in ("jsonl", "json-array"):
        if fmt == "tau-bench":
            return "batch", "tau-run"
        if fmt == "ace" and all(isinstance(r, dict) for r in sample):
            return "batch", "ace-run"
        if fmt == "messages":
            return "run", "message"
        if fmt == "openclaw":
            return "run", "openclaw"
        if fmt == "unknown":
            return "run", "none"
        return None
    if container == "json-object":
        if fmt == "ace" and key in ("steps", "trace"):
            return "run", "ace-step"
        if fmt in ("ace", "messages") and key == "messages":
            return "run", "message"
    return None


# -- one record -> its steps / its run (shared by the index pass and the lazy view) ----------------
def step_of_record(
    record_kind: str, record: Any, first: int, call_names: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The canonical steps of one record, numbered from `first`."""
    if record_kind == "ace-step":
        return [_ace_step(first, record)]
    if record_kind == "message":
        return _message_steps(record, {} if call_names is None else call_names, first)
    if record_kind == "openclaw":
        if (
            isinstance(record, dict)
            and record.get("type") == "message"
            and isinstance(record.get("message"), dict)
        ):
            return [_openclaw_step(first, record["message"])]
        return []
    return []


def run_of_record(record_kind: str, record: Any) -> dict[str, Any]:
    """The canonical single-run view of one record of a batch."""
    if record_kind == "tau-run":
        return _norm_tau_run(record)
    return _norm_ace_run(record)


# -- the pass --------------------------------------------------------------------------------------
class _RunStats:
    """What the canonical view of one run needs from all its steps, gathered step by step."""

    def __init__(self) -> None:
        self.roles: Counter[str] = Counter()
        self.first_user: str | None = None
        self.last_assistant: str | None = None
        self.n = 0

    def add(self, step: dict[str, Any]) -> None:
        self.add_text(step["role"], step["content"])

    def add_text(self, role: str, content: str) -> None:
        self.n += 1
        self.roles[role] += 1
        if role in ("user", "assistant"):
            text = (_THINKING_RE.sub("", content) if "[thinking]" in content else content).strip()
            if text:
                if role == "user" and self.first_user is None:
                    self.first_user = text
                elif role == "assistant":
                    self.last_assistant = text


class _OpenclawStats:
    def __init__(self) -> None:
        self.types: Counter[str] = Counter()
        self.session: dict[str, Any] = {}
        self.custom: list[Any] = []
        self.n_custom = 0
        self.models: set[str] = set()

    def add(self, ev: Any) -> None:
        if not isinstance(ev, dict):
            raise TraceError("an OpenClaw event is not an object")
        etype = ev.get("type")
        self.types[str(etype)] += 1
        if etype == "session":
            self.session.update(
                {f"session_{k}": v for k, v in ev.items() if k in ("id", "cwd", "timestamp", "version")}
            )
        elif etype == "custom":
            self.n_custom += 1
            if len(self.custom) < _MAX_CUSTOM:
                self.custom.append({"customType": ev.get("customType"), "data": ev.get("data")})
        msg = ev.get("message")
        if isinstance(msg, dict) and msg.get("model"):
            self.models.add(str(msg["model"]))


def build_index(
    fh: IO[bytes],
    name: str,
    *,
    on_record: Callable[[int], None] | None = None,
    scanner: type[Scanner] = Scanner,
) -> tuple[str, TraceIndex | None]:
    """(format, index) of the trace in `fh` (binary, at offset 0), built in memory; the index is None
    when the shape is read whole (see the module doc). `write_index` streams it instead."""
    out = io.BytesIO()
    fmt, size = write_index(fh, name, out, on_record=on_record, scanner=scanner)
    return fmt, (TraceIndex.from_bytes(out.getvalue()) if size is not None else None)


def write_index(
    fh: IO[bytes],
    name: str,
    out: IO[bytes],
    *,
    on_record: Callable[[int], None] | None = None,
    scanner: type[Scanner] = Scanner,
) -> tuple[str, int | None]:
    """Scan the trace in `fh` (binary, at offset 0) and write its index to `out` as it goes; returns
    (format, the index's size in bytes), the size None (nothing written) when the shape is read whole.

    Raises `TraceError` on a trace that is not valid JSON / JSONL (the same one-line messages as
    `reflector.analysis.traces.read`). `on_record(n)` is called every 10,000 records (progress). Memory: the
    scan's buffer, one record, one block of column entries and the small tables. `scanner`: the
    scanner class (`reflector.analysis.fastscan.FastScanner` where msgspec is installed: the same records, faster).
    """
    scan = scanner(fh, name)
    records = scan.records()
    sample: list[tuple[int, int, Any]] = []
    for item in records:
        sample.append(item)
        if len(sample) >= SAMPLE_RECORDS:
            break
    h = scan.header
    values = [v for _s, _e, v in sample]
    fmt = _detect(h, values)
    shape = lazy_shape(h.container, h.key, fmt, values)
    if shape is None:
        for _ in records:  # still validate the whole file
            pass
        return fmt, None
    kind, record_kind = shape
    idx = TraceIndex(
        format=fmt, kind=kind, container=h.container, key=h.key, record_kind=record_kind, size=0, header={}
    )
    w = _Writer(out)
    stats = _RunStats()
    oc = _OpenclawStats() if record_kind == "openclaw" else None
    call_names: dict[str, str] = _RecentCalls()
    rewards: list[float] = []
    roles: dict[str, int] = {}
    tools: dict[str, int] = {}
    calls: Counter[str] = Counter()
    n_records = 0
    # message records resolve tool names across records; an ACE step is one message on its own
    plain = {"message": True, "ace-step": False}.get(record_kind)

    def each(items: Iterator[tuple[int, int, Any]]) -> None:
        nonlocal n_records
        for start, end, value in items:
            rec = n_records
            n_records += 1
            w.record(start, end)
            if on_record is not None and rec % 10_000 == 0:
                on_record(rec)
            if kind == "batch":
                run = _checked(run_of_record, fmt, rec, record_kind, value)
                if run.get("reward") is not None:
                    rewards.append(run["reward"])
                continue
            if oc is not None:
                oc.add(value)
            cols = None if plain is None else message_columns(value, call_names if plain else {})
            if cols is not None:  # a plain chat message: its columns without its step (same values)
                role, content, err, tool, names = cols
                w.step(rec, 0, _code(roles, role), 1 if err else 0, _code(tools, str(tool)) if tool else -1)
                for call in names:
                    calls[call] += 1
                stats.add_text(role, content)
                continue
            steps = _checked(step_of_record, fmt, rec, record_kind, value, stats.n, call_names)
            for sub, step in enumerate(steps):
                tool = step.get("tool_name")
                w.step(
                    rec,
                    sub,
                    _code(roles, step["role"]),
                    1 if step.get("is_error") else 0,
                    _code(tools, str(tool)) if tool else -1,
                )
                for call in step.get("tool_calls") or ():
                    calls[str(call.get("name"))] += 1
                stats.add(step)

    each(iter(sample))
    del sample, values
    each(records)
    idx.size = h.size
    idx.outer = dict(h.outer)
    idx.roles, idx.tools, idx.call_counts = list(roles), list(tools), dict(calls)
    if kind == "batch":
        meta = _batch_view(cast(TraceFormat, fmt), None, [{"reward": r} for r in rewards])["metadata"]
        meta["n_runs"] = n_records
        idx.header = {"format": fmt, "metadata": meta}
    else:
        _finish_run(idx, stats, oc)
    return fmt, w.finish(idx.meta())


class _RecentCalls(OrderedDict[str, str]):
    """Tool-call id -> name for the last `RECENT_CALLS` calls: a result names a call made shortly
    before it, and an unbounded table would grow with the trace (1 GB of messages: ~200 MB)."""

    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        if len(self) > RECENT_CALLS:
            self.popitem(last=False)  # O(1); deleting a plain dict's first key is not


def _code(table: dict[str, int], value: str) -> int:
    """`value`'s position in `table` (added at the end when new)."""
    code = table.get(value)
    if code is None:
        code = table[value] = len(table)
    return code


def _detect(h: ScanHeader, sample: list[Any]) -> str:
    if h.container == "json-object":
        return detect_format({**h.outer, str(h.key): sample}) if h.key else detect_format(h.outer)
    if h.container in ("jsonl", "json-array"):
        return detect_format(sample)
    return "unknown"


def _checked(fn: Callable[..., Any], fmt: str, rec: int, *args: Any) -> Any:
    try:
        return fn(*args)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise TraceError(
            f"record {rec} of the trace does not look like format {fmt!r}: {type(exc).__name__}: {exc}"
        ) from None


def _finish_run(idx: TraceIndex, stats: _RunStats, oc: _OpenclawStats | None) -> None:
    fmt, outer = idx.format, idx.outer
    if fmt == "ace":
        skeleton = _norm_ace_run({**outer, str(idx.key): []})
        tail = skeleton["steps"]
        for i, step in enumerate(tail):
            step["index"] = stats.n + i
            stats.add(step)
        idx.tail_steps = tail
        header = {k: v for k, v in skeleton.items() if k not in ("steps", "raw")}
        out = outer.get("agent_output") or outer.get("generator_output")
        explicit = (
            outer.get("final_answer") or _ao(outer, "final_answer") or (out if isinstance(out, str) else None)
        )
        header["final_answer"] = _opt_str(explicit) or stats.last_assistant
        header["metadata"]["n_steps"] = stats.n
    elif fmt == "messages":
        w = outer
        extra = {k: v for k, v in w.items() if isinstance(v, (str, int, float, bool))}
        header = _run_view(
            "messages",
            None,
            [],
            question=_opt_str(w.get("question") or w.get("task")) or stats.first_user,
            ground_truth=_opt_str(w.get("ground_truth")),
            feedback=_opt_str(w.get("feedback")),
            final_answer=_opt_str(w.get("final_answer")) or stats.last_assistant,
            reward=_opt_float(w.get("reward")),
            metadata={"roles": dict(stats.roles), **extra},
        )
        header["metadata"]["n_steps"] = stats.n
    elif fmt == "openclaw" and oc is not None:
        meta: dict[str, Any] = {"event_types": dict(oc.types), **oc.session}
        if oc.custom:
            meta["custom"] = oc.custom
            if oc.n_custom > len(oc.custom):
                meta["custom_not_listed"] = oc.n_custom - len(oc.custom)
        meta["models"] = sorted(oc.models)
        meta["user_turns"] = stats.roles.get("user", 0)
        header = _run_view(
            "openclaw", None, [], question=stats.first_user, final_answer=stats.last_assistant, metadata=meta
        )
        header["metadata"]["n_steps"] = stats.n
    else:
        header = _run_view(
            "unknown", None, [], metadata={"note": "unrecognised shape: explore raw", "raw_keys": []}
        )
    header.pop("steps", None)
    header.pop("raw", None)
    idx.header = header


def _ao(outer: dict[str, Any], key: str) -> Any:
    out = outer.get("agent_output") or outer.get("generator_output")
    return out.get(key) if isinstance(out, dict) else None
