"""The record index of a large trace: built in one streaming pass, stored next to the trace.

A trace too big to parse whole is read by the sandbox as a lazy view (`reflector.analysis.traces.lazy`):
records are parsed when a cell touches them, found by the byte ranges kept here. The pass also
computes everything of the canonical view that needs the whole trace (question, final answer,
counts, rewards, the tool names that tool results get from earlier calls), so the lazy view answers
those without reading the trace again, and `len()` is free.

What is indexed (`lazy_shape`): JSONL files and JSON arrays whose records are runs (tau-bench, ACE:
a batch, one run per record) or steps/messages/events of one run (ACE, messages, OpenClaw, an
unknown list), and JSON objects whose `steps` / `trace` / `messages` / `history` array holds the
steps of one ACE or messages run (`history`: a multi-agent conversation such as Who&When's, one step
per message). An object whose later fields would make a whole read take other steps (a `messages`
list after a `history`, say) is read whole, so both readings agree. Other shapes (OTel spans, which
are ordered by time across records, and a single tau-bench run) are read whole.

The stored index (its format, where it lives) is `reflector.analysis.traces.index_file`'s.
"""

from __future__ import annotations

import io
import itertools
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import IO, Any, cast

from reflector.analysis.traces.adapters.ace import _ace_step, _history_message_step, _norm_ace_run
from reflector.analysis.traces.adapters.messages import _message_steps
from reflector.analysis.traces.adapters.openclaw import _openclaw_step
from reflector.analysis.traces.adapters.tau import _norm_tau_run
from reflector.analysis.traces.columns import PlainColumns, plain_run
from reflector.analysis.traces.detect import TraceFormat, detect_format
from reflector.analysis.traces.index_file import INDEX_SUFFIX, INDEX_VERSION, TraceIndex, _Writer, index_path
from reflector.analysis.traces.read import TraceError
from reflector.analysis.traces.scan import Batch, PlainReader, ScanHeader, Scanner
from reflector.analysis.traces.view import (
    _THINKING_RE,
    _batch_view,
    _opt_float,
    _opt_str,
    _run_view,
    said_text,
)

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

SAMPLE_RECORDS = 200  # records read before the format is decided (the bounded sample)
_MAX_CUSTOM = 200  # OpenClaw custom events kept in the metadata (the rest are counted)
RECENT_CALLS = 65_536  # tool-call ids the index pass remembers to name the results that follow


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
        if fmt == "ace" and key == "history":
            return "run", "history-message"
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
    if record_kind == "history-message":
        return [_history_message_step(record, {} if call_names is None else call_names, first)]
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
        self.last_said: str | None = None  # a conversation's answer: its last text that is not a tool's
        self.n = 0

    def add(self, step: dict[str, Any]) -> None:
        self.add_text(step["role"], step["content"])

    def add_many(self, roles: list[str], contents: list[str]) -> None:
        """`add_text` for each (role, content) in order: only the first user text and the last assistant
        text can change the result, so only those are looked for."""
        self.n += len(roles)
        self.roles.update(roles)
        if self.first_user is None:
            for role, content in zip(roles, contents, strict=True):
                if role == "user" and (text := _text_of(content)):
                    self.first_user = text
                    break
        for k in range(len(roles) - 1, -1, -1):
            if roles[k] == "assistant" and (said := said_text(contents[k])):
                self.last_assistant = said
                break
        for k in range(len(roles) - 1, -1, -1):
            if roles[k] != "tool" and (said := said_text(contents[k])):
                self.last_said = said
                break

    def add_text(self, role: str, content: str) -> None:
        self.n += 1
        self.roles[role] += 1
        if role != "tool" and (said := said_text(content)):
            self.last_said = said
        if role in ("user", "assistant"):
            text = _text_of(content)
            if text:
                if role == "user" and self.first_user is None:
                    self.first_user = text
                elif role == "assistant" and (said := said_text(content)):
                    self.last_assistant = said


def _text_of(content: str) -> str:
    """A user or assistant step's text as the run's question or answer (thinking removed, stripped)."""
    return (_THINKING_RE.sub("", content) if "[thinking]" in content else content).strip()


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
    scan's buffer, one batch of records (a buffer's worth, or 1,024), one block of column entries and the
    small tables. `scanner`: the
    scanner class (`reflector.analysis.fastscan.FastScanner` where msgspec is installed: the same records, faster).
    """
    scan = scanner(fh, name)
    batches = scan.batches()
    head: list[Batch] = []  # the batches holding the bounded sample
    n_head = 0
    for batch in batches:
        head.append(batch)
        n_head += len(batch.values)
        if n_head >= SAMPLE_RECORDS:
            break
    h = scan.header
    values = [v for b in head for v in b.values][:SAMPLE_RECORDS]
    fmt = _detect(h, values)
    shape = lazy_shape(h.container, h.key, fmt, values)
    if shape is None:
        for _ in batches:  # still validate the whole file
            pass
        return fmt, None
    kind, record_kind = shape
    idx = TraceIndex(
        format=fmt, kind=kind, container=h.container, key=h.key, record_kind=record_kind, size=0, header={}
    )
    p = _Pass(out, fmt, kind, record_kind, on_record)
    if p.plain is not None:
        p.reader = scan.plain_messages()
    del values
    while head:
        p.batch(head.pop(0))
    for batch in batches:
        p.batch(batch)
    if h.container == "json-object" and _shadowed(str(h.key), h.outer):
        return detect_format({**h.outer, str(h.key): []}), None
    idx.size = h.size
    idx.outer = dict(h.outer)
    idx.roles, idx.tools, idx.call_counts = list(p.roles), list(p.tools), dict(p.calls)
    if kind == "batch":
        meta = _batch_view(cast(TraceFormat, fmt), None, [{"reward": r} for r in p.rewards])["metadata"]
        meta["n_runs"] = p.n_records
        idx.header = {"format": fmt, "metadata": meta}
    else:
        _finish_run(idx, p.stats, p.oc)
    return fmt, p.w.finish(idx.meta())


class _Pass:
    """The index pass's state, fed one batch of records at a time (`Scanner.batches`)."""

    def __init__(
        self, out: IO[bytes], fmt: str, kind: str, record_kind: str, on_record: Callable[[int], None] | None
    ) -> None:
        self.fmt, self.kind, self.record_kind, self.on_record = fmt, kind, record_kind, on_record
        self.w = _Writer(out)
        self.stats = _RunStats()
        self.oc = _OpenclawStats() if record_kind == "openclaw" else None
        self.call_names: OrderedDict[str, str] = _RecentCalls()
        self.rewards: list[float] = []
        self.roles: dict[str, int] = {}
        self.tools: dict[str, int] = {}
        self.calls: Counter[str] = Counter()
        self.n_records = 0
        # message records resolve tool names across records; an ACE step is one message on its own
        self.plain = {"message": True, "history-message": True, "ace-step": False}.get(record_kind)
        self.reader: PlainReader | None = None  # the scanner's reader of its own plain messages

    def batch(self, batch: Batch) -> None:
        rec0 = self.n_records
        values = batch.values
        n = len(values)
        self.n_records = rec0 + n
        if self.on_record is not None:
            for rec in range(-(-rec0 // 10_000) * 10_000, rec0 + n, 10_000):
                self.on_record(rec)
        if self.kind == "batch":
            for rec, value in enumerate(values, rec0):
                run = _checked(run_of_record, self.fmt, rec, self.record_kind, value)
                if run.get("reward") is not None:
                    self.rewards.append(run["reward"])
            self.w.add(rec0, batch.starts, batch.ends, [], [], [], [], [])
            return
        # The steps of the batch, in order: plain messages' columns straight from `plain_run`, every
        # other record's from its canonical steps; role and tool codes, counts and the run's question
        # and answer are settled once per batch, in the same order a step at a time would.
        cols = PlainColumns()
        plain, oc, stats = self.plain, self.oc, self.stats
        names = self.call_names if plain else None
        if batch.plain and self.reader is not None:  # plain chat messages, already checked by the scanner
            self.reader(values, names, cols, RECENT_CALLS)
            self._steps(rec0, batch, range(rec0, rec0 + n), [0] * n, cols)
            return
        step_recs: list[int] = []
        subs: list[int] = []
        i = 0
        while i < n:
            if plain is not None:
                j = plain_run(values, i, names, cols, RECENT_CALLS)
                if j > i:
                    step_recs.extend(range(rec0 + i, rec0 + j))
                    subs.extend(itertools.repeat(0, j - i))
                    i = j
                    if i == n:
                        break
            rec, value = rec0 + i, values[i]
            if oc is not None:
                oc.add(value)
            first = stats.n + len(cols.roles)
            steps = _checked(step_of_record, self.fmt, rec, self.record_kind, value, first, self.call_names)
            for sub, step in enumerate(steps):
                step_recs.append(rec)
                subs.append(sub)
                cols.roles.append(step["role"])
                cols.contents.append(step["content"])
                cols.errors.append(bool(step.get("is_error")))
                cols.tools.append(step.get("tool_name"))
                cols.calls.extend(str(call.get("name")) for call in step.get("tool_calls") or ())
            i += 1
        self._steps(rec0, batch, step_recs, subs, cols)

    def _steps(
        self, rec0: int, batch: Batch, step_recs: Sequence[int], subs: list[int], cols: PlainColumns
    ) -> None:
        """Write the batch's records and steps; settle its codes, counts and the run's statistics."""
        tools = self.tools
        tool_codes = []
        for tool in cols.tools:
            if not tool:
                tool_codes.append(-1)
                continue
            key = tool if type(tool) is str else str(tool)
            code = tools.get(key)
            if code is None:
                code = tools[key] = len(tools)
            tool_codes.append(code)
        self.w.add(
            rec0,
            batch.starts,
            batch.ends,
            step_recs,
            subs,
            _codes(self.roles, cols.roles),
            cols.errors,
            tool_codes,
        )
        self.calls.update(cols.calls)
        self.stats.add_many(cols.roles, cols.contents)


def _codes(table: dict[str, int], values: list[str]) -> list[int]:
    """Each value's position in `table` (new ones added at the end, in order)."""
    try:
        return list(map(table.__getitem__, values))
    except KeyError:
        return [_code(table, v) for v in values]


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
    if h.container == "json-value":  # an object without a record array: all of it is in `outer`
        return detect_format(h.outer)
    if h.container in ("jsonl", "json-array"):
        return detect_format(sample)
    return "unknown"


# The fields a whole read takes a run's steps from, first the one it prefers (`detect.detect_format`,
# then `adapters.ace._ace_base_steps`): the scanner takes the first record array it meets.
_STEP_FIELDS = ("traj", "resourceSpans", "spans", "messages", "history", "steps", "trace")


def _shadowed(key: str, outer: dict[str, Any]) -> bool:
    """Whether a field found after the records (`outer`) would make a whole read take other steps."""
    for field in _STEP_FIELDS:
        if field == key:
            return False
        if field in outer and (field == "resourceSpans" or isinstance(outer[field], list)):
            return True
    return False


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
        said = stats.last_said if idx.key == "history" else stats.last_assistant
        header["final_answer"] = _opt_str(explicit) or said
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
