"""The trace scan with a compiled JSON parser (msgspec): the same records, offsets and errors, faster.

`FastScanner` is `reflector.analysis.traces.scan.Scanner` with a bulk path: where the stdlib scanner parses one
record per call on the file decoded as latin-1 text, this one keeps the file's bytes and hands a whole window
of records (about a read buffer) to msgspec, which splits it into records (`msgspec.Raw`: the exact bytes of
each, so the byte offsets come from their lengths) and decodes them in C, and hands them on as one `Batch`.
The stdlib scanner stays the rule: whatever msgspec refuses (NaN and Infinity, numbers beyond a double's
range, lone surrogate escapes, invalid UTF-8, a window cut inside a string, a broken or blank JSONL line) is
parsed by the inherited code, record by record, with its values and its errors, so the records, offsets,
values, header and error messages are those of `Scanner` (tested against it on hostile inputs in
tests/unit/test_fastscan.py).

Why it is correct to cut a window at a guessed boundary: a window is accepted only when `[` + the
window + `]` is a valid JSON array; JSON is tokenised left to right, so its elements are exactly the
next records of the real array. A wrong guess (a brace inside a string, inside a record) fails to parse
and costs one more try; after a few, or after msgspec refuses a value, that stretch of the file goes
through the stdlib path. JSON lines: a window of whole lines joined by commas is one array whose elements
are the lines' values when it parses and has as many elements as lines (a line holding two values has
more; an empty or broken line does not parse).

The nesting limit is checked by the parse itself: the window is decoded as a list of values of bounded
depth (`_bounded`), so a record nested deeper than `_TYPED_DEPTH` fails that parse and only then is its
depth measured (`_deeper`), as before.

Lives outside `reflector/analysis/traces/` (stdlib-only, imported by the sandbox host): only the client and the
worker build indexes, and only they import msgspec.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterator
from itertools import accumulate, repeat
from operator import add, is_
from typing import IO, Any, Union

import msgspec

from reflector.analysis.fastmessages import MESSAGES, message_run
from reflector.analysis.traces.read import MAX_NESTING
from reflector.analysis.traces.scan import BUFFER_BYTES, Batch, Item, PlainReader, Scanner, _Buffer

__all__ = ["FastScanner"]

_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_VALUES = msgspec.json.Decoder()
_WS = b" \t\r\n"
_TRIES = 3  # window cuts tried before a stretch goes through the stdlib path
# Depth up to which the window parse checks nesting itself (deeper records are measured as before).
# Real records nest about this deep or less (8 for a tau-bench run, 4 for a chat message); building
# the decoder costs 2^depth (8: ~4 ms, once per process; 10: ~16 ms).
_TYPED_DEPTH = 8
_Errors = (msgspec.DecodeError, RecursionError)
_PLAIN_MISSES = 8


@functools.cache
def _bounded(depth: int, containers: bool) -> msgspec.json.Decoder[Any]:
    """A decoder of a JSON array whose elements nest at most `depth` levels (an element that is an object
    or array is one level), and, with `containers`, are objects or arrays. The values are those of the
    untyped decoder (the types are JSON's own); a deeper element is a `msgspec.ValidationError`."""
    scalar: Any = Union[str, int, float, bool, None]  # noqa: UP007  # runtime types, built for msgspec
    inner: Any = scalar
    for _ in range(depth - 1):
        inner = Union[scalar, list[inner], dict[str, inner]]  # noqa: UP007
    record: Any = Union[list[inner], dict[str, inner]]  # noqa: UP007
    if not containers:
        record = Union[scalar, record]  # noqa: UP007
    return msgspec.json.Decoder(list.__class_getitem__(record))


def _deeper(value: Any, limit: int) -> bool:
    """Whether the array/object `value` nests deeper than `limit` levels: the stdlib scanner's check
    (`nesting_depth` of the record's text) on the parsed value, which for valid JSON is the same depth.
    Walking the values costs less than counting the brackets of the text (strings are most of a trace's
    bytes); a long array of scalars is checked in C (`map`)."""
    if limit < 1:
        return True
    children = value.values() if type(value) is dict else value
    if len(children) > 16:
        kinds = set(map(type, children))
        if dict not in kinds and list not in kinds:
            return False
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and _deeper(child, limit - 1):
            return True
    return False


def _decode(blob: bytes, n: int, limit: int, raws: list[msgspec.Raw] | None) -> tuple[list[Any], int, bool]:
    """(values, k, deep) of the JSON array `blob` of `n` would-be records: `values[:k]` are the first k
    records' values (k == n: all of them); record k < n is nested deeper than `limit` (`deep`) or is one
    msgspec refuses (the stdlib reads it). `raws`: the elements' bytes, to find a refused one in a window
    msgspec refuses as a whole; None: the window's records must be objects or arrays, and k is 0 or n."""
    containers = raws is None
    values: list[Any] | None
    try:
        values = _bounded(min(limit, _TYPED_DEPTH), containers).decode(blob)
        if len(values) == n:
            return values, n, False
        values = []
    except msgspec.ValidationError:
        values = None  # deeper than the typed depth, a scalar where records must be containers, or refused
    except _Errors:
        values = []  # a value msgspec refuses (NaN, a lone surrogate, invalid UTF-8, ...)
    if values is None:
        try:
            values = _VALUES.decode(blob)
        except _Errors:
            values = []
    if len(values) != n:
        if raws is None:
            return [], 0, False
        values = []
        for raw in raws:
            try:
                values.append(_VALUES.decode(raw))
            except _Errors:
                break
    for i, value in enumerate(values):
        kind = type(value)
        if kind is dict or kind is list:
            if _deeper(value, limit):
                return values, 0 if containers else i, not containers
        elif containers:
            return values, 0, False
    return values, len(values), False


class _Bytes:
    """A window on the file as bytes: `data` holds bytes [base, base + len(data)). Taken over from the
    stdlib scanner's `_Buffer` at a position and handed back to it (the stdlib path reads text)."""

    def __init__(self, buf: _Buffer, pos: int) -> None:
        self.fh, self.chunk, self.eof = buf.fh, buf.chunk, buf.eof
        self.data = buf.text[pos:].encode("latin-1")
        self.base = buf.base + pos

    def fill(self, want: int) -> bool:
        """Read until `want` more bytes than now are held or the file ends; False at EOF."""
        if self.eof:
            return False
        parts = [self.data]
        got = 0
        while got < want:
            block = self.fh.read(max(self.chunk, want - got))
            if not block:
                self.eof = True
                break
            parts.append(block)
            got += len(block)
        self.data = b"".join(parts)
        return got > 0

    def drop(self, pos: int) -> int:
        """Forget the bytes before `pos` once they are more than a chunk; returns `pos` in the kept data."""
        if pos < self.chunk:
            return pos
        self.base += pos
        self.data = self.data[pos:]
        return 0

    def skip_ws(self, pos: int) -> int:
        while True:
            data = self.data
            n = len(data)
            while pos < n and data[pos] in _WS:
                pos += 1
            if pos < n or not self.fill(self.chunk):
                return pos

    def hand_back(self, buf: _Buffer, pos: int) -> int:
        """Give the bytes from `pos` on back to the stdlib scanner's buffer; returns `pos` in its text."""
        buf.text = self.data[pos:].decode("latin-1")
        buf.base = self.base + pos
        buf.eof = self.eof
        return 0


class FastScanner(Scanner):
    """`Scanner` (same arguments, same results) with JSON arrays and JSON lines parsed by msgspec."""

    def __init__(
        self,
        fh: IO[bytes],
        name: str,
        *,
        chunk: int = BUFFER_BYTES,
        split_object: bool = True,
        yield_broken: bool = False,
    ) -> None:
        super().__init__(fh, name, chunk=chunk, split_object=split_object, yield_broken=yield_broken)
        self._sep = b""  # the separator between two records as this file writes it (b", ", b",\n  ", ...)
        self._slow_until = -1  # the stdlib path parses the records that start before this offset
        self._plain = 0  # after `plain_messages()`: windows that may still fail to parse as plain messages

    def plain_messages(self) -> PlainReader:
        """Windows of plain chat messages come as `reflector.analysis.fastmessages.Message` records from
        now on, read by `message_run` (a window with any other record is parsed as before)."""
        self._plain = _PLAIN_MISSES
        return message_run

    def _plain_window(self, blob: bytes, n: int) -> list[Any] | None:
        """The `n` records of the JSON array `blob` as plain messages, or None (also once `_PLAIN_MISSES`
        windows in a row were not all plain: this trace's windows are parsed once, as values)."""
        if not self._plain:
            return None
        try:
            msgs: list[Any] = MESSAGES.decode(blob)
        except _Errors:
            self._plain -= 1
            return None
        if len(msgs) != n:
            return None
        self._plain = _PLAIN_MISSES
        return msgs

    # -- JSON arrays: the stdlib loop (Scanner._array), with a bulk step at each record start ------------------------
    def _array_records(self, buf: _Buffer, pos: int, depth_above: int) -> Generator[Item, None, int]:
        """Windows of records parsed at once while msgspec takes them; else (and for the next window's worth
        of bytes) the stdlib scanner's one record."""
        if buf.base + pos >= self._slow_until:
            at = buf.base + pos
            end = yield from self._windows(buf, pos, MAX_NESTING - depth_above)
            if end is not None:
                return end
            pos = at - buf.base  # `buf` was handed back from the record's start
            self._slow_until = max(self._slow_until, at + self.chunk)
        return (yield from super()._array_records(buf, pos, depth_above))

    def _windows(self, buf: _Buffer, pos: int, limit: int) -> Generator[Item, None, int | None]:
        """Batches of the records from `pos` (a record's first character) on, a window at a time, while the
        windows parse and each is followed by a comma and an object or array. Then `buf` holds the bytes
        from the end of the last record yielded (returns 0, where it ends in `buf.text`), or, when none
        was, from `pos` on (returns None)."""
        b = _Bytes(buf, pos)
        p = 0
        last: int | None = None  # where the last record yielded ends in `b.data`
        while b.base + p >= self._slow_until:
            got = yield from self._window(b, p, limit)
            if got is None:
                break
            last = b.drop(got)  # the bytes before the record's end are not needed again
            q = b.skip_ws(last)
            if b.data[q : q + 1] != b",":
                break
            q = b.skip_ws(q + 1)
            if b.data[q : q + 1] not in (b"{", b"["):
                break
            p = q
        if last is None:
            b.hand_back(buf, 0)
            return None
        return b.hand_back(buf, last)

    def _window(self, b: _Bytes, p: int, limit: int) -> Generator[Item, None, int | None]:
        """Yield the records of one window starting at `p` (a record's first character) as a `Batch`; return
        where the last one ends, or None (nothing yielded) when no window parses."""
        if len(b.data) - p < self.chunk:
            b.fill(self.chunk)
        data = b.data
        opener = data[p : p + 1]
        if opener not in (b"{", b"["):
            return None
        closer = b"}" if opener == b"{" else b"]"
        bound = closer + self._sep + opener if self._sep else closer
        cut = len(data)
        for _ in range(_TRIES):
            cut = data.rfind(bound, p, cut)
            if cut <= p:
                return None
            blob = b"".join((b"[", memoryview(data)[p : cut + 1], b"]"))  # one copy
            try:
                raws = _RAWS.decode(blob)
            except _Errors:
                continue
            break
        else:
            return None
        n = len(raws)
        lens = list(map(len, raws))
        if not self._sep and n > 1:
            q = p + lens[0]
            while data[q] in _WS:
                q += 1
            q += 1  # the comma (the window parsed as an array)
            while data[q] in _WS:
                q += 1
            self._sep = data[p + lens[0] : q]
        at = b.base + p
        joined = self._sep.join(raws) if n > 1 else b""
        if len(joined) == len(blob) - 2 and blob.startswith(joined, 1):  # one kind of separator
            starts = list(accumulate(map(add, lens, repeat(len(self._sep))), initial=at))
            del starts[n:]
        else:  # separators of several kinds (or one record): each found
            starts = []
            q = p
            for length in lens:
                starts.append(b.base + q)
                q += length
                while q <= cut and data[q] in _WS:
                    q += 1
                q += 1
                while q <= cut and data[q] in _WS:
                    q += 1
        ends: list[int] = list(map(add, starts, lens))
        plain = self._plain_window(blob, n)
        if plain is not None:
            yield Batch(starts, ends, plain, True)
            self.header.n_records += n
            return ends[-1] - b.base
        values, k, deep = _decode(blob, n, limit, raws)
        if k:
            yield Batch(starts[:k], ends[:k], values[:k])
            self.header.n_records += k
        if deep:
            raise self._nesting_at(starts[k])
        if k < n:  # msgspec refuses record k: the stdlib reads it and the next window's worth
            self._slow_until = starts[k] + self.chunk
            return None if k == 0 else ends[k - 1] - b.base
        return ends[-1] - b.base

    # -- JSON lines: windows of whole lines to msgspec, line by line where it refuses one, the stdlib path last --
    def _jsonl(self, buf: _Buffer, pos: int) -> Iterator[Item]:
        self.header.container = "jsonl"
        lineno = 1 + buf.text.count("\n", 0, pos)
        bad: list[tuple[int, str]] = []
        b = _Bytes(buf, pos)
        p = 0
        while True:
            if len(b.data) - p < self.chunk:
                b.fill(self.chunk)
            data = b.data
            last_nl = data.rfind(b"\n", p)
            if last_nl >= p:  # whole lines [p, last_nl)
                if p:
                    lines = data[p:last_nl].split(b"\n")
                else:
                    lines = data.split(b"\n")  # (no copy of the window first)
                    lines.pop()  # what follows the last newline
                yield from self._lines(lines, b.base + p, lineno, bad)
                lineno += len(lines)
                p = b.drop(last_nl + 1)
                continue
            # the rest is one line (the file's last, or longer than a buffer)
            nl = data.find(b"\n", p)
            while nl < 0 and b.fill(self.chunk):
                nl = b.data.find(b"\n", len(data))
                data = b.data
            end = nl if nl >= 0 else len(data)
            yield from self._lines([data[p:end]], b.base + p, lineno, bad)
            if nl < 0:
                break
            lineno += 1
            p = b.drop(nl + 1)
        b.hand_back(buf, len(b.data))
        self._jsonl_end(bad)

    def _lines(self, lines: list[bytes], at: int, lineno: int, bad: list[tuple[int, str]]) -> Iterator[Item]:
        """The records of consecutive JSONL lines (`lines[0]` starts at byte `at` and is line `lineno`)."""
        n = len(lines)
        lens = list(map(len, lines))
        first, last = lines[0], lines[-1]
        lines[0] = b"[" + first
        lines[-1] = (lines[0] if n == 1 else last) + b"]"
        blob = b",".join(lines)  # one copy of the window (the brackets on its first and last lines)
        lines[0], lines[-1] = first, last
        plain = self._plain_window(blob, n)
        values, k, _deep = (plain, n, False) if plain is not None else _decode(blob, n, MAX_NESTING, None)
        del blob
        if k == n and n:
            starts = list(accumulate(map(add, lens, repeat(1)), initial=at))
            del starts[n:]
            stripped = list(map(bytes.strip, lines))
            if not all(map(is_, stripped, lines)):  # blanks around values (CRLF): where each value is
                starts = [s + len(line) - len(line.lstrip()) for s, line in zip(starts, lines, strict=True)]
                lens = list(map(len, stripped))
            yield Batch(starts, list(map(add, starts, lens)), values, plain is not None)
            self.header.n_records += n
            return
        for line in lines:  # line by line: msgspec where it takes the line, else the stdlib
            got = self._fast_line(line)
            if got is not None:
                lead, length, value = got
                yield at + lead, at + lead + length, value
                self.header.n_records += 1
            else:
                yield from self._line_items(line.decode("latin-1"), at, lineno, bad)
            at += len(line) + 1
            lineno += 1

    def _fast_line(self, line: bytes) -> tuple[int, int, Any] | None:
        """(where the value starts in the line, its length, the value) when msgspec parses the line as an
        object or array nested within the limit; None sends the line to the stdlib path."""
        stripped = line.strip(_WS)
        if stripped[:1] not in (b"{", b"["):
            return None
        try:
            value = _VALUES.decode(stripped)
        except _Errors:
            return None
        if _deeper(value, MAX_NESTING):
            return None  # the stdlib path raises the nesting error
        return len(line) - len(line.lstrip(_WS)), len(stripped), value
