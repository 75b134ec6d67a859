"""The record index of a large trace: built in one streaming pass, stored next to the trace.

A trace too big to parse whole is read by the sandbox as a lazy view (`reflector.traces.lazy`):
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

import json
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from reflector.traces.adapters.ace import _ace_step, _norm_ace_run
from reflector.traces.adapters.messages import _message_steps
from reflector.traces.adapters.openclaw import _openclaw_step
from reflector.traces.adapters.tau import _norm_tau_run
from reflector.traces.detect import TraceFormat, detect_format
from reflector.traces.read import TraceError
from reflector.traces.scan import ScanHeader, Scanner
from reflector.traces.view import _THINKING_RE, _batch_view, _opt_float, _opt_str, _run_view

__all__ = [
    "TraceIndex",
    "build_index",
    "index_path",
    "INDEX_VERSION",
    "INDEX_SUFFIX",
    "SAMPLE_RECORDS",
    "step_of_record",
    "run_of_record",
    "lazy_shape",
]

INDEX_VERSION = 2  # 2: step columns (role, error, tool) and tool-call counts
INDEX_SUFFIX = f".index-v{INDEX_VERSION}"  # the index of blob X is the file X + this suffix, beside it
SAMPLE_RECORDS = 200  # records read before the format is decided (the bounded sample)
_ARRAYS = ("starts", "ends", "step_records", "step_subs", "step_roles", "step_errors", "step_tools")
_MAX_CUSTOM = 200  # OpenClaw custom events kept in the metadata (the rest are counted)


@dataclass
class TraceIndex:
    """Byte ranges of a trace's records, plus the parts of its canonical view that need all of it."""

    format: str
    kind: str  # "run": records are steps of one run | "batch": records are runs
    container: str  # "jsonl" | "json-array" | "json-object"
    key: str | None  # json-object: the field holding the records
    record_kind: str  # how a record becomes steps/a run: "ace-step" | "message" | "openclaw" | "none" | "tau-run" | "ace-run"
    size: int
    header: dict[str, Any]  # the view without `steps` / `runs` / `raw`
    outer: dict[str, Any] = field(default_factory=dict)  # json-object: the other fields
    tail_steps: list[dict[str, Any]] = field(default_factory=list)  # ACE: steps after the indexed ones
    tool_names: dict[int, str] = field(default_factory=dict)  # step number -> name known only from an earlier call
    starts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    step_records: array[int] = field(default_factory=lambda: array("q"))  # step -> record (kind "run")
    step_subs: array[int] = field(default_factory=lambda: array("q"))  # step -> its position in the record
    # Columns of the indexed steps, so that filters and counts need no parsing (`Steps.where`):
    step_roles: array[int] = field(default_factory=lambda: array("q"))  # position in `roles`
    step_errors: array[int] = field(default_factory=lambda: array("q"))  # 1: is_error
    step_tools: array[int] = field(default_factory=lambda: array("q"))  # position in `tools`, -1: no tool_name
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
        """Memory the index takes once loaded (the arrays; the header is small)."""
        return sum(getattr(self, name).itemsize * len(getattr(self, name)) for name in _ARRAYS)

    def to_bytes(self) -> bytes:
        head = {
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
            "tool_names": {str(k): v for k, v in self.tool_names.items()},
            "roles": self.roles,
            "tools": self.tools,
            "call_counts": self.call_counts,
            "arrays": {name: len(getattr(self, name)) for name in _ARRAYS},
            "byteorder": sys.byteorder,
        }
        parts = [json.dumps(head, ensure_ascii=True, default=str).encode() + b"\n"]
        parts.extend(getattr(self, name).tobytes() for name in _ARRAYS)
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> TraceIndex:
        nl = data.index(b"\n")
        head = json.loads(data[:nl])
        if head.get("version") != INDEX_VERSION:
            raise ValueError(f"trace index version {head.get('version')!r}, expected {INDEX_VERSION}")
        idx = cls(
            format=head["format"], kind=head["kind"], container=head["container"], key=head["key"],
            record_kind=head["record_kind"], size=int(head["size"]), header=head["header"], outer=head["outer"],
            tail_steps=head["tail_steps"], tool_names={int(k): v for k, v in head["tool_names"].items()},
            roles=list(head["roles"]), tools=list(head["tools"]), call_counts=dict(head["call_counts"]),
        )
        pos = nl + 1
        for name in _ARRAYS:
            arr = array("q")
            n = int(head["arrays"][name]) * arr.itemsize
            arr.frombytes(data[pos : pos + n])
            if head.get("byteorder") != sys.byteorder:
                arr.byteswap()
            pos += n
            setattr(idx, name, arr)
        n = len(idx.step_records)
        columns = (idx.step_subs, idx.step_roles, idx.step_errors, idx.step_tools)
        if pos != len(data) or len(idx.starts) != len(idx.ends) or any(len(c) != n for c in columns):
            raise ValueError("trace index is truncated or inconsistent")
        if any(s < 0 or e > idx.size or s > e for s, e in zip(idx.starts, idx.ends, strict=True)):
            raise ValueError("trace index has a record outside the trace")
        return idx


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
def step_of_record(record_kind: str, record: Any, first: int, call_names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The canonical steps of one record, numbered from `first`."""
    if record_kind == "ace-step":
        return [_ace_step(first, record)]
    if record_kind == "message":
        return _message_steps(record, {} if call_names is None else call_names, first)
    if record_kind == "openclaw":
        if isinstance(record, dict) and record.get("type") == "message" and isinstance(record.get("message"), dict):
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
        self.n += 1
        role = step["role"]
        self.roles[role] += 1
        if role in ("user", "assistant"):
            content = step["content"]
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
            self.session.update({f"session_{k}": v for k, v in ev.items() if k in ("id", "cwd", "timestamp", "version")})
        elif etype == "custom":
            self.n_custom += 1
            if len(self.custom) < _MAX_CUSTOM:
                self.custom.append({"customType": ev.get("customType"), "data": ev.get("data")})
        msg = ev.get("message")
        if isinstance(msg, dict) and msg.get("model"):
            self.models.add(str(msg["model"]))


def build_index(
    fh: IO[bytes], name: str, *, on_record: Callable[[int], None] | None = None
) -> tuple[str, TraceIndex | None]:
    """(format, index) of the trace in `fh` (binary, at offset 0); the index is None when the shape is
    read whole (see the module doc).

    Raises `TraceError` on a trace that is not valid JSON / JSONL (the same one-line messages as
    `reflector.traces.read`). `on_record(n)` is called every 10,000 records (progress).
    """
    scanner = Scanner(fh, name)
    records = scanner.records()
    sample: list[tuple[int, int, Any]] = []
    for item in records:
        sample.append(item)
        if len(sample) >= SAMPLE_RECORDS:
            break
    h = scanner.header
    values = [v for _s, _e, v in sample]
    fmt = _detect(h, values)
    shape = lazy_shape(h.container, h.key, fmt, values)
    if shape is None:
        for _ in records:  # still validate the whole file
            pass
        return fmt, None
    kind, record_kind = shape
    idx = TraceIndex(format=fmt, kind=kind, container=h.container, key=h.key, record_kind=record_kind, size=0, header={})
    stats = _RunStats()
    oc = _OpenclawStats() if record_kind == "openclaw" else None
    call_names: dict[str, str] = {}
    rewards: list[float] = []
    roles: dict[str, int] = {}
    tools: dict[str, int] = {}
    calls: Counter[str] = Counter()

    def each(items: Iterator[tuple[int, int, Any]]) -> None:
        for start, end, value in items:
            rec = len(idx.starts)
            idx.starts.append(start)
            idx.ends.append(end)
            if on_record is not None and rec % 10_000 == 0:
                on_record(rec)
            if kind == "batch":
                run = _checked(run_of_record, fmt, rec, record_kind, value)
                if run.get("reward") is not None:
                    rewards.append(run["reward"])
                continue
            if oc is not None:
                oc.add(value)
            steps = _checked(step_of_record, fmt, rec, record_kind, value, stats.n, call_names)
            # the names a tool result gets from earlier calls: what the record alone does not give
            fresh = step_of_record(record_kind, value, stats.n) if record_kind == "message" and steps else steps
            for sub, step in enumerate(steps):
                number = stats.n
                idx.step_records.append(rec)
                idx.step_subs.append(sub)
                if step.get("tool_name") and step["tool_name"] != fresh[sub].get("tool_name"):
                    idx.tool_names[number] = step["tool_name"]
                idx.step_roles.append(_code(roles, step["role"]))
                idx.step_errors.append(1 if step.get("is_error") else 0)
                tool = step.get("tool_name")
                idx.step_tools.append(_code(tools, str(tool)) if tool else -1)
                for call in step.get("tool_calls") or ():
                    calls[str(call.get("name"))] += 1
                stats.add(step)

    each(iter(sample))
    each(records)
    idx.size = h.size
    idx.outer = dict(h.outer)
    idx.roles, idx.tools, idx.call_counts = list(roles), list(tools), dict(calls)
    if kind == "batch":
        meta = _batch_view(cast(TraceFormat, fmt), None, [{"reward": r} for r in rewards])["metadata"]
        meta["n_runs"] = idx.n_records
        idx.header = {"format": fmt, "metadata": meta}
    else:
        _finish_run(idx, stats, oc)
    return fmt, idx


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
        raise TraceError(f"record {rec} of the trace does not look like format {fmt!r}: {type(exc).__name__}: {exc}") from None


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
        explicit = outer.get("final_answer") or _ao(outer, "final_answer") or (out if isinstance(out, str) else None)
        header["final_answer"] = _opt_str(explicit) or stats.last_assistant
        header["metadata"]["n_steps"] = stats.n
    elif fmt == "messages":
        w = outer
        extra = {k: v for k, v in w.items() if isinstance(v, (str, int, float, bool))}
        header = _run_view(
            "messages", None, [],
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
        header = _run_view("openclaw", None, [], question=stats.first_user, final_answer=stats.last_assistant,
                           metadata=meta)
        header["metadata"]["n_steps"] = stats.n
    else:
        header = _run_view("unknown", None, [], metadata={"note": "unrecognised shape: explore raw", "raw_keys": []})
    header.pop("steps", None)
    header.pop("raw", None)
    idx.header = header


def _ao(outer: dict[str, Any], key: str) -> Any:
    out = outer.get("agent_output") or outer.get("generator_output")
    return out.get(key) if isinstance(out, dict) else None
