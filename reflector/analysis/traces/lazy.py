"""The lazy view of a large trace: the canonical view whose big lists are read on access.

`open_view(fd, index)` returns the same dict as `normalize` would (see `reflector.analysis.traces.view`),
except that its big lists are sequences that parse records when they are touched:

- `traces["steps"]` (one run): `Steps`, step `i` parsed from its record on access;
- `traces["runs"]` (a batch): `Runs`, run `i` normalised from its record on access;
- `traces["raw"]`: `Records` (the records as read), or for a JSON object its other fields plus
  `Records` under the records' key.

These sequences support `len()` (free: counted by the index), indexing (negative too), slicing
(a slice is another lazy sequence, nothing is read), iteration (reads consecutive records in
blocks, holds one block), `in`, `.index()`, `.count()`, and `.grep(pattern, limit)`: the positions of
the items whose raw JSON text matches a regular expression, found without parsing the others.
Every access parses a fresh copy: keep what you need in a variable. They cannot be changed.

Runs in the sandbox host: reads go through the file descriptor opened before the lockdown
(`os.pread`, which needs no path), never through `open`.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

from reflector.analysis.traces.index import TraceIndex, run_of_record, step_of_record

__all__ = ["open_view", "LazySeq", "Records", "Steps", "Runs", "LAZY_TYPES", "BLOCK_BYTES", "resolve_ref"]

BLOCK_BYTES = 4 * 1024**2  # most bytes read at once while iterating
_REPR_ITEMS = 2


class _Source:
    """The trace's fd and index, shared by every lazy sequence of one view."""

    def __init__(self, fd: int, index: TraceIndex) -> None:
        self.fd, self.index = fd, index

    def read(self, start: int, end: int) -> bytes:
        chunks: list[bytes] = []
        pos = start
        while pos < end:
            block = os.pread(self.fd, end - pos, pos)
            if not block:
                raise OSError(f"the trace ends at byte {pos:,}, its index expects {end:,}")
            chunks.append(block)
            pos += len(block)
        return b"".join(chunks)

    def blocks(self, numbers: Sequence[int]) -> Iterator[tuple[Sequence[int], int, bytes]]:
        """`numbers` (ascending or not) cut into runs of neighbouring records, each read in one block of
        at most `BLOCK_BYTES`: (the run, the block's offset in the trace, the block)."""
        starts, ends = self.index.starts, self.index.ends
        i = 0
        while i < len(numbers):
            j = i + 1
            while (
                j < len(numbers)
                and numbers[j] == numbers[j - 1] + 1
                and ends[numbers[j]] - starts[numbers[i]] <= BLOCK_BYTES
            ):
                j += 1
            base = starts[numbers[i]]
            yield numbers[i:j], base, self.read(base, ends[numbers[j - 1]])
            i = j

    def records(self, numbers: Sequence[int]) -> Iterator[Any]:
        """The records `numbers`, parsed, reading runs of neighbours in one block."""
        starts, ends = self.index.starts, self.index.ends
        for run, base, block in self.blocks(numbers):
            for n in run:
                yield _parse(block[starts[n] - base : ends[n] - base])

    def matching(self, numbers: Sequence[int], rx: re.Pattern[str]) -> Iterator[int]:
        """The records of `numbers` whose raw JSON text `rx` finds a match in (`re.search` on each
        record's text), in order. Runs of neighbouring ASCII records (what `json.dumps` writes) are
        searched as one block, in C, and only the records a match starts in are looked at again; a
        pattern that anchors or looks behind is searched record by record."""
        blockwise = not any(t in rx.pattern for t in ("^", "$", "\\A", "\\Z", "(?<"))
        starts, ends = self.index.starts, self.index.ends
        for run, base, block in self.blocks(numbers):
            if blockwise and block.isascii():
                yield from _block_hits(
                    block.decode("ascii"),
                    run,
                    [starts[n] - base for n in run],
                    [ends[n] - base for n in run],
                    rx,
                )
            else:
                for n in run:
                    if rx.search(block[starts[n] - base : ends[n] - base].decode("utf-8", errors="replace")):
                        yield n


def _block_hits(
    text: str, run: Sequence[int], rel_starts: list[int], rel_ends: list[int], rx: re.Pattern[str]
) -> Iterator[int]:
    """The records of `run` (laid out at `rel_starts`/`rel_ends` in `text`) that contain a match."""
    r = 0
    while r < len(run):
        m = rx.search(text, rel_starts[r])
        if m is None:
            return
        r = max(r, bisect.bisect_right(rel_starts, m.start()) - 1)
        if m.start() >= rel_ends[r]:  # the match starts between two records: look at the next one
            r += 1
            if r < len(run) and rx.search(text[rel_starts[r] : rel_ends[r]]):
                yield run[r]
        elif m.end() <= rel_ends[r] or rx.search(text[rel_starts[r] : rel_ends[r]]):
            yield run[r]
        r += 1


def _as_slice(r: range) -> slice:
    """The slice that takes `r`'s positions from a sequence (a descending range may stop at -1)."""
    if not r:
        return slice(0, 0)
    return slice(r.start, r.stop if r.stop >= 0 else None, r.step)


def _parse(raw: bytes) -> Any:
    return json.loads(raw.decode("utf-8", errors="replace"))


class LazySeq(Sequence[Any]):
    """A read-only sequence over part of a trace (see the module doc)."""

    _kind = "items"
    __slots__ = ("_src", "_range")

    def __init__(self, src: _Source, positions: range) -> None:
        self._src = src
        self._range = positions

    def __len__(self) -> int:
        return len(self._range)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> LazySeq: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return type(self)(self._src, self._range[i])
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"{self._kind} indices must be integers or slices, not {type(i).__name__}")
        try:
            pos = self._range[i]
        except IndexError:
            raise IndexError(f"{self._kind} index {i} out of range ({len(self):,} items)") from None
        return next(iter(self._items([pos])))

    def __iter__(self) -> Iterator[Any]:
        step = 4096
        for k in range(0, len(self._range), step):
            yield from self._items(self._range[k : k + step])

    def __reversed__(self) -> Iterator[Any]:
        for k in range(len(self._range) - 1, -1, -1):
            yield self[k]

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(_short(x) for x in self._items(self._range[:_REPR_ITEMS])) if n else ""
        more = f", ... (+{n - _REPR_ITEMS:,})" if n > _REPR_ITEMS else ""
        return f"<lazy {self._kind}: {n:,} items [{head}{more}]; parsed on access, slice or iterate>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazySeq):
            return type(other) is type(self) and other._src is self._src and other._range == self._range
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self), id(self._src), self._range))

    def __reduce__(self) -> Any:
        raise TypeError(
            f"lazy {self._kind} cannot be copied; the sandbox hands them on by reference (keep a slice, "
            "or build a list of what you need)"
        )

    def grep(self, pattern: str, limit: int = 100, flags: int = 0) -> list[int]:
        """Positions (in this sequence) of the items whose record's raw JSON text matches `pattern`
        (a regular expression, `re.search`), at most `limit`. Reads the records but parses none."""
        rx = re.compile(pattern, flags)
        numbers = list(self._record_numbers())
        where = {n: k for k, n in enumerate(numbers)} if self._range.step != 1 else None
        found: list[int] = []
        for n in self._src.matching(numbers, rx):
            found.append(where[n] if where is not None else n - numbers[0])
            if len(found) >= limit:
                break
        return found

    def to_list(self, limit: int = 10_000) -> list[Any]:
        """The items as a plain list (refused above `limit` items: slice first)."""
        if len(self) > limit:
            raise ValueError(
                f"{len(self):,} {self._kind} are more than limit={limit:,}: slice first, or raise limit"
            )
        return list(self)

    # -- per kind ----------------------------------------------------------------------------------
    def _items(self, positions: Sequence[int]) -> Iterator[Any]:
        raise NotImplementedError

    def _record_numbers(self) -> Iterator[int]:
        return iter(self._range)

    def rr_ref(self) -> tuple[str, int, int, int]:
        r = self._range
        return (self._kind, r.start, r.stop, r.step)


class Records(LazySeq):
    """The trace's records as read (JSONL lines, array elements)."""

    _kind = "records"
    __slots__ = ()

    def _items(self, positions: Sequence[int]) -> Iterator[Any]:
        return self._src.records(positions)


class Runs(LazySeq):
    """A batch's runs, each normalised to the canonical single-run view on access."""

    _kind = "runs"
    __slots__ = ()

    def _items(self, positions: Sequence[int]) -> Iterator[Any]:
        kind = self._src.index.record_kind
        for rec in self._src.records(positions):
            yield run_of_record(kind, rec)


class Steps(LazySeq):
    """One run's canonical steps, each parsed from its record on access."""

    _kind = "steps"
    __slots__ = ()

    def _items(self, positions: Sequence[int]) -> Iterator[Any]:
        idx = self._src.index
        n_indexed = len(idx.step_records)
        indexed = [p for p in positions if p < n_indexed]
        records = [idx.step_records[p] for p in indexed]
        parsed = iter(self._src.records(records))
        for p in positions:
            if p >= n_indexed:
                yield dict(idx.tail_steps[p - n_indexed])
                continue
            rec = next(parsed)
            first = p - idx.step_subs[p]
            step = step_of_record(idx.record_kind, rec, first)[idx.step_subs[p]]
            tool = idx.step_tools[p]
            if tool >= 0:  # the name as resolved over the whole trace (a tool result's, from its call)
                step["tool_name"] = idx.tools[tool]
            yield step

    def _record_numbers(self) -> Iterator[int]:
        idx = self._src.index
        for p in self._range:
            if p < len(idx.step_records):
                yield idx.step_records[p]

    def where(
        self, role: str | None = None, is_error: bool | None = None, tool_name: str | None = None
    ) -> list[int]:
        """Positions (in this sequence) of the steps with every given `role` / `is_error` / `tool_name`,
        read from the index's columns: nothing is parsed."""
        idx = self._src.index
        indexed, offset, tail = self._split()
        wanted: list[tuple[array[int], int]] = []
        if role is not None:
            wanted.append((idx.step_roles, idx.roles.index(role) if role in idx.roles else -2))
        if is_error is not None:
            wanted.append((idx.step_errors, 1 if is_error else 0))
        if tool_name is not None:
            wanted.append((idx.step_tools, idx.tools.index(tool_name) if tool_name in idx.tools else -2))
        if wanted:
            column, code = wanted[0]
            found = [k for k, v in enumerate(column[_as_slice(indexed)]) if v == code]
            for column, code in wanted[1:]:
                found = [k for k in found if column[indexed[k]] == code]
        else:
            found = list(range(len(indexed)))
        found = [offset + k for k in found]
        for k, t in tail:
            if (
                (role is None or t["role"] == role)
                and (is_error is None or bool(t["is_error"]) == is_error)
                and (tool_name is None or t["tool_name"] == tool_name)
            ):
                found.append(k)
        return sorted(found) if tail and offset else found

    def counts(self, key: str, is_error: bool | None = None) -> dict[str, int]:
        """How many steps have each value of `key` ("role", "tool_name" or "is_error"), optionally only
        among the steps with the given `is_error`; from the index's columns (nothing is parsed)."""
        if key not in ("role", "tool_name", "is_error"):
            raise ValueError("counts(key): key is 'role', 'tool_name' or 'is_error'")
        idx = self._src.index
        indexed, _offset, tail = self._split()
        column = {"role": idx.step_roles, "tool_name": idx.step_tools, "is_error": idx.step_errors}[key]
        values = column[_as_slice(indexed)]
        if is_error is not None:
            flags = idx.step_errors[_as_slice(indexed)]
            values = array(
                values.typecode, (v for v, e in zip(values, flags, strict=True) if bool(e) == is_error)
            )
        coded: dict[int, int] = {}
        for v in values:
            coded[v] = coded.get(v, 0) + 1
        out: dict[str, int] = {}
        for v, n in coded.items():
            if key == "role":
                name = idx.roles[v]
            elif key == "tool_name":
                name = idx.tools[v] if v >= 0 else "None"
            else:
                name = str(bool(v))
            out[name] = n
        for _k, t in tail:
            if is_error is None or bool(t["is_error"]) == is_error:
                out[str(t[key])] = out.get(str(t[key]), 0) + 1
        return out

    def _split(self) -> tuple[range, int, list[tuple[int, dict[str, Any]]]]:
        """This sequence's indexed steps (a range of step numbers, which starts at position `offset` here)
        and its tail steps (position here, step)."""
        idx = self._src.index
        n_indexed = len(idx.step_records)
        r = self._range
        tail = (
            [(k, idx.tail_steps[p - n_indexed]) for k, p in enumerate(r) if p >= n_indexed]
            if idx.tail_steps
            else []
        )
        if not tail:
            return r, 0, []
        if r.step > 0:
            return r[: len(r) - len(tail)], 0, tail
        return r[len(tail) :], len(tail), tail

    def tool_call_counts(self) -> dict[str, int]:
        """Tool calls by name over the whole run (from the index; the same for every slice)."""
        counts = dict(self._src.index.call_counts)
        for t in self._src.index.tail_steps:
            for c in t["tool_calls"]:
                counts[str(c["name"])] = counts.get(str(c["name"]), 0) + 1
        return counts

    def grep(self, pattern: str, limit: int = 100, flags: int = 0) -> list[int]:
        """Positions of the steps whose record's raw JSON text matches `pattern` (a message that
        became several steps matches for each of them)."""
        rx = re.compile(pattern, flags)
        idx = self._src.index
        n_indexed = len(idx.step_records)
        wanted = sorted({idx.step_records[p] for p in self._range if p < n_indexed})
        hits = set(self._src.matching(wanted, rx))
        found: list[int] = []
        for k, p in enumerate(self._range):
            if p >= n_indexed:
                hit = bool(rx.search(json.dumps(idx.tail_steps[p - n_indexed], ensure_ascii=False)))
            else:
                hit = idx.step_records[p] in hits
            if hit:
                found.append(k)
                if len(found) >= limit:
                    break
        return found


LAZY_TYPES: tuple[type[LazySeq], ...] = (Records, Runs, Steps)
_BY_KIND = {cls._kind: cls for cls in LAZY_TYPES}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:120] + "..."


def open_view(fd: int, index: TraceIndex) -> tuple[dict[str, Any], dict[str, LazySeq]]:
    """The lazy canonical view of the trace open on `fd`, and its root sequences by kind."""
    src = _Source(fd, index)
    records = Records(src, range(index.n_records))
    roots: dict[str, LazySeq] = {"records": records}
    view: dict[str, Any] = json.loads(json.dumps(index.header))  # a private copy cells may change
    if index.kind == "batch":
        runs = Runs(src, range(index.n_records))
        roots["runs"] = runs
        view["runs"] = runs
        raw: Any = records
    else:
        steps = Steps(src, range(index.n_steps))
        roots["steps"] = steps
        view["steps"] = steps
        raw = records
        if index.container == "json-object":
            raw = {**json.loads(json.dumps(index.outer)), str(index.key): records}
    ordered: dict[str, Any] = {
        k: view[k]
        for k in ("format", "question", "ground_truth", "feedback", "final_answer", "reward")
        if k in view
    }
    for key in ("steps", "runs"):
        if key in view:
            ordered[key] = view[key]
    ordered.update({k: v for k, v in view.items() if k not in ordered})
    ordered["raw"] = raw
    return ordered, roots


def resolve_ref(roots: dict[str, LazySeq], ref: tuple[Any, ...]) -> LazySeq:
    """The lazy sequence named by `LazySeq.rr_ref()` in a view with these roots (a snapshot or a
    child session's export refers to the trace this way, never by copy)."""
    kind, start, stop, step = ref
    root = roots.get(str(kind))
    cls = _BY_KIND.get(str(kind))
    if root is None or cls is None:
        raise ValueError(f"this session's trace has no lazy {kind!r}")
    positions = range(int(start), int(stop), int(step))
    if positions == root._range:
        return root  # `s = traces["steps"]` stays an alias of the view's own sequence
    if positions and (min(positions) < 0 or max(positions) >= len(root)):
        raise ValueError(f"lazy {kind} {positions} is outside this session's trace ({len(root):,} items)")
    return cls(root._src, positions)
