"""The stored record index of a trace (`reflector.analysis.traces.index` builds it in one pass): its columns,
written block by block as the pass goes, and read back whole; where it lives.

Stored format (`_Writer`, `TraceIndex.to_bytes`; read by `TraceIndex.from_bytes`): blocks of column entries
written as the trace is scanned, then a JSON footer (the header fields, the writer's byte order and where each
block is) and the footer's length; a reader on the other byte order swaps the arrays. The index of trace `sha`
lives in the blob store under a name derived from `sha` and `INDEX_VERSION`, so every worker finds the same
one and a new version never reads an old one.
"""

from __future__ import annotations

import io
import json
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = ["TraceIndex", "index_path", "INDEX_VERSION", "INDEX_SUFFIX"]

# 3: written as it is built (constant memory), the resolved tool name is a column; 4: a multi-agent
# `history` is indexed (record kind "history-message"), so an rr that cannot read one never finds it; 5: a run's
# answer is never a bare end-of-chat token (`view.said_text`), in every format, as the whole read gives it
INDEX_VERSION = 5
INDEX_SUFFIX = f".index-v{INDEX_VERSION}"  # the index of blob X is the file X + this suffix, beside it
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
    record_kind: str  # how a record becomes steps/a run: "ace-step" | "message" | "history-message" | "openclaw" | "none" | "tau-run" | "ace-run"
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
        # the columns, emptied in place when written (the pass adds a batch of records at a time)
        self.bufs: dict[str, array[int]] = {name: array(code) for name, code in _COLUMNS.items()}
        self._records = tuple(self.bufs[name] for name, _code in _GROUPS["records"])
        self._steps = tuple(self.bufs[name] for name, _code in _GROUPS["steps"])

    def add(
        self,
        first: int,
        starts: Sequence[int],
        ends: Sequence[int],
        step_records: Sequence[int],
        subs: Sequence[int],
        roles: Sequence[int],
        errors: Sequence[int],  # bools are ints
        tools: Sequence[int],
    ) -> None:
        """Append records `first`, `first + 1`, ... (their starts and ends) and the steps of records
        (`step_records`, in record order) as if each record were appended and then its steps, one entry
        at a time: a block is written when it is full, in that order, so the bytes do not depend on
        how the entries were grouped."""
        rec_bufs, step_bufs = self._records, self._steps
        step_cols = (step_records, subs, roles, errors, tools)
        ri = si = 0
        n_rec, n_steps = len(starts), len(step_records)
        while True:
            r_full = ri + BLOCK_ENTRIES - len(rec_bufs[0]) - 1  # the entry that fills the records' block
            s_full = si + BLOCK_ENTRIES - len(step_bufs[0]) - 1
            if r_full < n_rec and (s_full >= n_steps or first + r_full <= step_records[s_full]):
                for buf, col in zip(rec_bufs, (starts, ends), strict=True):
                    _extend(buf, col[ri : r_full + 1])
                ri = r_full + 1
                self._flush("records")
            elif s_full < n_steps:
                for buf, col in zip(step_bufs, step_cols, strict=True):
                    _extend(buf, col[si : s_full + 1])
                si = s_full + 1
                self._flush("steps")
            else:
                for buf, col in zip(rec_bufs, (starts, ends), strict=True):
                    _extend(buf, col[ri:] if ri else col)
                for buf, col in zip(step_bufs, step_cols, strict=True):
                    _extend(buf, col[si:] if si else col)
                return

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


def _extend(buf: array[int], col: Sequence[int]) -> None:
    """`buf.extend(col)`; a list through `fromlist` (half the time per entry)."""
    buf.fromlist(col if type(col) is list else list(col))


def index_path(trace_path: str) -> str:
    """Where the index of the trace stored at `trace_path` lives: next to it (the blob store, the
    sandbox host and `rr gc` all find it this way)."""
    return trace_path + INDEX_SUFFIX
