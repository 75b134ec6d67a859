"""Streaming a trace file record by record, with bounded memory.

A trace can be bigger than memory, so nothing here holds more than a read buffer and one record:
- JSONL: every non-blank line is a record;
- a JSON array: every element is a record;
- a JSON object: the object is read field by field; the elements of one large array field (`steps`,
  `messages`, `trace`, `traj`, `spans`, `runs`, `events`) are the records and the other fields
  (small: question, ground truth, ...) come back as `outer`.

Offsets are byte offsets in the file: the parser works on the bytes decoded as latin-1 (one
character per byte, so character positions are byte positions and JSON's structure is unchanged);
a record's value is re-decoded as UTF-8 only when it is not pure ASCII (`json.dumps` writes ASCII
by default, so most traces never pay for it).

The checks match `reflector.analysis.traces.read` (which reads a small trace whole): one-line `TraceError`s
naming the line or offset, and the nesting limit applied to every record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from reflector.analysis.traces.read import MAX_NESTING, TraceError, nesting_depth

__all__ = [
    "ScanHeader",
    "Scanner",
    "Batch",
    "PlainReader",
    "BrokenLine",
    "iter_records",
    "RECORD_KEYS",
    "BUFFER_BYTES",
]

BUFFER_BYTES = 1024**2
BATCH_RECORDS = 1024  # records per batch the stdlib scanner hands out (`Scanner.batches`)
FIRST_LINE_MAX = (
    1024**2
)  # longest first line read to tell JSONL from JSON (longer: JSONL only for a .jsonl name)
# Fields of a JSON object whose array elements are records (the first of them found in the object).
RECORD_KEYS: tuple[str, ...] = (
    "steps",
    "messages",
    "history",
    "trace",
    "traj",
    "spans",
    "runs",
    "events",
    "resourceSpans",
)
_WS = " \t\r\n"
_DECODER = json.JSONDecoder()
_BOM = "\xef\xbb\xbf"  # the UTF-8 byte order mark, decoded as latin-1


@dataclass
class ScanHeader:
    """What the scan learned about the container, complete once the records are exhausted."""

    container: str = ""  # "jsonl" | "json-array" | "json-object" | "json-value"
    key: str | None = None  # json-object: the field whose elements are the records
    outer: dict[str, Any] = field(default_factory=dict)  # json-object: every other field, in order
    outer_before: list[str] = field(default_factory=list)  # json-object: the fields before `key`
    n_records: int = 0
    size: int = 0


class Batch(NamedTuple):
    """Consecutive records: `starts[i]`, `ends[i]`, `values[i]` are one record's `(start, end, value)`."""

    starts: list[int]
    ends: list[int]
    values: list[Any]
    # the values are plain chat messages in the scanner's own form, read only with the function
    # `Scanner.plain_messages` returned (a scanner hands these out only after that call)
    plain: bool = False


# What the container loops yield: one record `(start, end, value)`, or a `Batch` of them (a faster
# scanner hands out a window of records at once; `records()` and `batches()` give the same records).
Item = tuple[int, int, Any] | Batch
# (values, tool-call names or None, the columns to append to, the bound on the names): see `plain_messages`
PlainReader = Callable[[list[Any], Any, Any, int], None]


class _Buffer:
    """A window on the file: `text` holds bytes [base, base + len(text)) decoded as latin-1."""

    def __init__(self, fh: IO[bytes], chunk: int) -> None:
        self.fh, self.chunk = fh, chunk
        self.text, self.base, self.eof = "", 0, False

    def fill(self, want: int) -> bool:
        """Read until `want` more characters than now are held or the file ends; False at EOF."""
        if self.eof:
            return False
        parts = [self.text]
        got = 0
        while got < want:
            block = self.fh.read(max(self.chunk, want - got))
            if not block:
                self.eof = True
                break
            parts.append(block.decode("latin-1"))
            got += len(block)
        self.text = "".join(parts)
        return got > 0

    def drop(self, pos: int) -> int:
        """Forget the text before `pos` once it is more than a chunk (copying the rest costs at most
        one buffer per chunk consumed); returns `pos` in the kept text."""
        if pos < self.chunk:
            return pos
        self.base += pos
        self.text = self.text[pos:]
        return 0

    def skip_ws(self, pos: int) -> int:
        while True:
            n = len(self.text)
            while pos < n and self.text[pos] in _WS:
                pos += 1
            if pos < n or not self.fill(self.chunk):
                return pos

    def peek(self, pos: int) -> str:
        pos = self.skip_ws(pos)
        return self.text[pos] if pos < len(self.text) else ""


class Scanner:
    """Iterate over a trace's records: `for start, end, value in Scanner(fh, name).records(): ...`, or
    `for starts, ends, values in Scanner(fh, name).batches(): ...` (the same records, in lists).

    `header` is filled as the scan goes (complete at the end).
    """

    def __init__(
        self,
        fh: IO[bytes],
        name: str,
        *,
        chunk: int = BUFFER_BYTES,
        split_object: bool = True,
        yield_broken: bool = False,
    ) -> None:
        self.fh, self.name, self.chunk = fh, name, chunk
        self.split_object = split_object
        self.yield_broken = yield_broken  # JSONL: a broken line comes back as a `BrokenLine` record
        self.jsonl_hint = name.lower().endswith(".jsonl")
        self.header = ScanHeader()
        self._end = 0

    # -- public ------------------------------------------------------------------------------------
    def records(self) -> Iterator[tuple[int, int, Any]]:
        for item in self._items():
            if isinstance(item, Batch):
                yield from zip(item.starts, item.ends, item.values, strict=True)
            else:
                yield item

    def batches(self) -> Iterator[Batch]:
        """The records in order, grouped (up to `BATCH_RECORDS` at a time, or as a faster scanner reads them)."""
        starts: list[int] = []
        ends: list[int] = []
        values: list[Any] = []
        try:
            for item in self._items():
                if isinstance(item, Batch):
                    if starts:
                        yield Batch(starts, ends, values)
                        starts, ends, values = [], [], []
                    yield item
                    continue
                start, end, value = item
                starts.append(start)
                ends.append(end)
                values.append(value)
                if len(starts) >= BATCH_RECORDS:
                    yield Batch(starts, ends, values)
                    starts, ends, values = [], [], []
        except Exception:
            if starts:  # the records before the error first: a pass that stops at one of them says so
                yield Batch(starts, ends, values)
            raise
        if starts:
            yield Batch(starts, ends, values)

    def plain_messages(self) -> PlainReader | None:
        """Let `batches()` hand out, from now on, batches of plain chat messages in this scanner's own
        form (`Batch.plain`), and return the function that reads their index columns as
        `reflector.analysis.traces.columns.plain_run` reads dicts; None: this scanner has no such form
        (the stdlib one). `records()` must not be used after it."""
        return None

    def _items(self) -> Iterator[Item]:
        buf = _Buffer(self.fh, self.chunk)
        pos = buf.skip_ws(0)
        if buf.text.startswith(_BOM, pos):
            pos = buf.skip_ws(pos + len(_BOM))
        if pos >= len(buf.text):
            raise TraceError(f"trace file is empty (whitespace only): {self.name}")
        first = buf.text[pos]
        if first not in "[{" or self._is_jsonl(buf, pos):
            yield from self._jsonl(buf, pos)
        elif first == "[":
            yield from self._array(buf, pos, top=True)
        elif self.split_object:
            yield from self._object(buf, pos)
        else:
            self.header.container = "json-value"
            value, end = self._value(buf, pos, 0)
            self._expect_end(buf, end)
            self.header.n_records = 1
            yield buf.base + pos, buf.base + end, value
        self.header.size = buf.base + len(buf.text)

    def _is_jsonl(self, buf: _Buffer, pos: int) -> bool:
        """JSON lines when the first line is a whole JSON value and more follows it; decided on the
        first line alone (a pretty-printed document's first line is `{` or `[`). A first line longer
        than `FIRST_LINE_MAX` is taken as JSONL only for a `.jsonl` name."""
        nl = buf.text.find("\n", pos)
        while nl < 0 and len(buf.text) - pos < FIRST_LINE_MAX and buf.fill(self.chunk):
            nl = buf.text.find("\n", pos)
        if nl < 0:
            return self.jsonl_hint  # one line: the whole file, or longer than FIRST_LINE_MAX
        line = buf.text[pos:nl].strip()
        try:
            _, end = _DECODER.raw_decode(line)
        except (json.JSONDecodeError, RecursionError):
            return self.jsonl_hint and buf.peek(nl + 1) != ""  # a broken first line of a .jsonl file
        return end == len(line) and (self.jsonl_hint or buf.peek(nl + 1) != "")

    # -- containers --------------------------------------------------------------------------------
    def _array(self, buf: _Buffer, pos: int, *, top: bool) -> Iterator[Item]:
        """Elements of the array opening at `pos`; returns with `buf` positioned after its `]`."""
        depth_above = 1 if top else 2
        if top:
            self.header.container = "json-array"
        pos += 1
        expect_value = True
        first = True
        while True:
            pos = buf.drop(buf.skip_ws(pos)) if top or first else buf.skip_ws(pos)
            if pos >= len(buf.text):
                raise self._error(buf, pos, "unterminated array (the file ends inside it)")
            ch = buf.text[pos]
            if ch == "]" and (first or not expect_value):
                self._end = pos + 1
                if top:
                    self._expect_end(buf, pos + 1)
                return
            if not expect_value:
                if ch != ",":
                    raise self._error(buf, pos, "expecting ',' or ']' between records")
                pos += 1
                expect_value = True
                continue
            end = yield from self._array_records(buf, pos, depth_above)
            pos, expect_value, first = end, False, False
            if not top:
                pos = buf.drop(pos)

    def _array_records(self, buf: _Buffer, pos: int, depth_above: int) -> Generator[Item, None, int]:
        """Yield the record starting at `pos` (one or more: a faster scanner may read a window of them);
        return where the last one ends."""
        value, end = self._value(buf, pos, depth_above)
        yield buf.base + pos, buf.base + end, value
        self.header.n_records += 1
        return end

    def _object(self, buf: _Buffer, pos: int) -> Iterator[Item]:
        self.header.container = "json-object"
        outer = self.header.outer
        pos += 1
        first = True
        while True:
            pos = buf.drop(buf.skip_ws(pos))
            if pos >= len(buf.text):
                raise self._error(buf, pos, "unterminated object (the file ends inside it)")
            if buf.text[pos] == "}" and first:
                break
            key, pos = self._value(buf, pos, 1)
            if not isinstance(key, str):
                raise self._error(buf, pos, "expecting a property name")
            pos = buf.skip_ws(pos)
            if buf.text[pos : pos + 1] != ":":
                raise self._error(buf, pos, "expecting ':' after a property name")
            pos = buf.skip_ws(pos + 1)
            if key == self.header.key:  # JSON keeps the last value; the records were the first one
                raise self._error(
                    buf,
                    pos,
                    f"the field {key!r} appears twice in the object (its first value "
                    "was read as the records; remove the duplicate)",
                )
            if self.header.key is None and key in RECORD_KEYS and buf.peek(pos) == "[":
                self.header.key = key
                self.header.outer_before = list(outer)
                pos = buf.skip_ws(pos)
                yield from self._array(buf, pos, top=False)
                pos = self._end
            else:
                value, pos = self._value(buf, pos, 1)
                outer[key] = value
            first = False
            pos = buf.skip_ws(pos)
            ch = buf.text[pos : pos + 1]
            if ch == "}":
                break
            if ch != ",":
                raise self._error(buf, pos, "expecting ',' or '}' between properties")
            pos += 1
        self._expect_end(buf, pos + 1)
        if self.header.key is None:  # no record array: the whole object is the one record
            self.header.container = "json-value"

    def _jsonl(self, buf: _Buffer, pos: int) -> Iterator[Item]:
        self.header.container = "jsonl"
        lineno = 1 + buf.text.count("\n", 0, pos)
        bad: list[tuple[int, str]] = []
        pos = buf.drop(pos)
        while True:
            nl = buf.text.find("\n", pos)
            while nl < 0 and buf.fill(self.chunk):
                nl = buf.text.find("\n", pos)
            end = nl if nl >= 0 else len(buf.text)
            yield from self._line_items(buf.text[pos:end], buf.base + pos, lineno, bad)
            if nl < 0:
                break
            lineno += 1
            pos = buf.drop(nl + 1)
        self._jsonl_end(bad)

    def _line_items(self, line: str, at: int, lineno: int, bad: list[tuple[int, str]]) -> Iterator[Item]:
        """The record of JSONL line `lineno` (`line`, without its newline, starts at byte `at`): none for a
        blank line; a broken one is added to `bad` (or comes back as a `BrokenLine` with `yield_broken`)."""
        if not line.strip():
            return
        value, first, last = self._line(line, lineno, bad)
        lead = at + len(line) - len(line.lstrip())
        if value is not _BAD:
            yield lead + first, lead + last, value
            self.header.n_records += 1
        elif self.yield_broken:
            n, msg = bad.pop()
            yield lead, lead + len(line.strip()), BrokenLine(n, msg)

    def _jsonl_end(self, bad: list[tuple[int, str]]) -> None:
        """The error a JSONL file's broken lines (or its having none) make, once all lines are read."""
        if bad and not self.yield_broken:
            n, msg = bad[0]
            if not self.header.n_records:
                raise TraceError(f"not valid JSON or JSONL: no line of {self.name} parses (line {n}: {msg})")
            more = f" (and {len(bad) - 1} more broken lines)" if len(bad) > 1 else ""
            raise TraceError(f"broken JSONL in {self.name}: line {n} is not valid JSON: {msg}{more}")
        if not self.header.n_records and not self.yield_broken:
            raise TraceError(f"trace file is empty (whitespace only): {self.name}")

    # -- values ------------------------------------------------------------------------------------
    def _line(self, line: str, lineno: int, bad: list[tuple[int, str]]) -> tuple[Any, int, int]:
        """A JSONL line's value and where it starts and ends in the stripped line (`_BAD` if broken)."""
        text = line.strip()
        start = 0 if text[:1] in "[{" else max(text.find("{"), 0)  # stray bytes before `{` (OpenClaw)
        if _depth_over(text, MAX_NESTING):
            raise TraceError(
                f"trace {self.name} nests deeper than {MAX_NESTING} levels of arrays/objects at line {lineno}, "
                "the limit for traces (flatten the deepest values or store them as JSON strings)"
            )
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            bad.append((lineno, f"{exc.msg} at column {exc.colno}"))
            return _BAD, 0, 0
        if text[end:].strip():
            bad.append((lineno, f"Extra data at column {end + 1}"))
            return _BAD, 0, 0
        return _redecode(text[start:end], value), start, end

    def _value(self, buf: _Buffer, pos: int, depth_above: int) -> tuple[Any, int]:
        """Parse the value at `pos`, reading more of the file while it is cut by the buffer's end."""
        while True:
            try:
                value, end = _DECODER.raw_decode(buf.text, pos)
            except json.JSONDecodeError as exc:
                if buf.eof or not _maybe_truncated(exc, len(buf.text)):
                    raise self._error(buf, exc.pos, exc.msg) from None
                buf.fill(max(self.chunk, len(buf.text) - pos))
                continue
            except RecursionError:
                raise self._nesting(buf, pos) from None
            if end >= len(buf.text) and not buf.eof and not isinstance(value, dict | list | str):
                buf.fill(self.chunk)  # a number or literal may go on in the next block
                continue
            if isinstance(value, dict | list):
                if _depth_over(buf.text[pos:end], MAX_NESTING - depth_above):
                    raise self._nesting(buf, pos)
                value = _redecode(buf.text[pos:end], value)
            elif isinstance(value, str) and not value.isascii():
                value = _redecode(buf.text[pos:end], value)
            return value, end

    def _expect_end(self, buf: _Buffer, pos: int) -> None:
        pos = buf.skip_ws(pos)
        if pos < len(buf.text):
            raise self._error(
                buf, pos, "Extra data after the JSON document (JSON lines need one record per line)"
            )

    def _error(self, buf: _Buffer, pos: int, msg: str) -> TraceError:
        return TraceError(f"invalid JSON in {self.name} at byte {buf.base + pos:,}: {msg}")

    def _nesting(self, buf: _Buffer, pos: int) -> TraceError:
        return self._nesting_at(buf.base + pos)

    def _nesting_at(self, at: int) -> TraceError:
        return TraceError(
            f"trace {self.name} nests deeper than {MAX_NESTING} levels of arrays/objects (at byte "
            f"{at:,}), the limit for traces (flatten the deepest values or store them as JSON strings)"
        )


_BAD = object()


@dataclass(frozen=True)
class BrokenLine:
    """A JSONL line that is not valid JSON (`Scanner(yield_broken=True)`): its number and the error."""

    lineno: int
    error: str


def _depth_over(text: str, limit: int) -> bool:
    """Whether `text` nests deeper than `limit`. Counting the opening brackets (in strings too) bounds
    the depth from above, in C: only a record with more of them than the limit is scanned properly."""
    if text.count("[") + text.count("{") <= limit:
        return False
    return nesting_depth(text, limit) > limit


def _maybe_truncated(exc: json.JSONDecodeError, length: int) -> bool:
    """Whether a parse error can be the buffer's end cutting a valid value (then read more)."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= length - 8


def _redecode(latin: str, value: Any) -> Any:
    """The value with its strings decoded as UTF-8 (the scan read the bytes as latin-1)."""
    if latin.isascii():
        return value
    return json.loads(latin.encode("latin-1").decode("utf-8", errors="replace"))


def iter_records(fh: IO[bytes], name: str, *, yield_broken: bool = False) -> Iterator[tuple[int, int, Any]]:
    """`(start, end, value)` of each top-level record of a trace file opened in binary mode.

    For a JSON array its elements, for JSONL its lines, for a single JSON object the object itself
    (`start`/`end` are byte offsets: `raw[start:end]` is the record's JSON text). `yield_broken`: a
    broken JSONL line is a `BrokenLine` value instead of an error at the end (a batch reports it as
    one failed run).
    """
    yield from Scanner(fh, name, split_object=False, yield_broken=yield_broken).records()
