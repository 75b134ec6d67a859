"""The trace scan with a compiled JSON parser (msgspec): the same records, offsets and errors, faster.

`FastScanner` is `reflector.analysis.traces.scan.Scanner` with a bulk step: where the stdlib scanner parses one
record per call, this one hands a whole window of records (about a read buffer) to msgspec, which
splits it into records (`msgspec.Raw`: the exact bytes of each, so the byte offsets come from their
lengths) and decodes them in C. The stdlib scanner stays the rule: whatever msgspec refuses (NaN and
Infinity, numbers beyond a double's range, lone surrogate escapes, invalid UTF-8, a window cut inside
a string) is parsed by the inherited code, record by record, with its values and its errors, so the
records, offsets, values, header and error messages are those of `Scanner` (tested against it on
hostile inputs in tests/unit/test_fastscan.py).

Why it is correct to cut a window at a guessed boundary: a window is accepted only when `[` + the
window + `]` is a valid JSON array; JSON is tokenised left to right, so its elements are exactly the
next records of the real array. A wrong guess (a brace inside a string, inside a record) fails to parse
and costs one more try; after a few, or after msgspec refuses a value, that stretch of the file goes
through the stdlib path.

Lives outside `reflector/analysis/traces/` (stdlib-only, imported by the sandbox host): only the client and the
worker build indexes, and only they import msgspec.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import IO, Any

import msgspec

from reflector.analysis.traces.read import MAX_NESTING, TraceError
from reflector.analysis.traces.scan import _BAD, BUFFER_BYTES, BrokenLine, Scanner, _Buffer

__all__ = ["FastScanner"]

_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_VALUES = msgspec.json.Decoder()
_WS = " \t\r\n"
_TRIES = 3  # window cuts tried before a stretch goes through the stdlib path


_REFUSED = object()


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
        self._sep = ""  # the separator between two records as this file writes it (", ", ",\n  ", ...)
        self._slow_until = -1  # the stdlib path parses the records that start before this offset

    # -- JSON arrays: the stdlib loop (Scanner._array), with a bulk step at each record start ------------------------
    def _array_records(
        self, buf: _Buffer, pos: int, depth_above: int
    ) -> Generator[tuple[int, int, Any], None, int]:
        """A window of records parsed at once where msgspec takes it; else (and for the next window's worth of
        bytes) the stdlib scanner's one record."""
        if buf.base + pos >= self._slow_until:
            end = yield from self._bulk(buf, pos, MAX_NESTING - depth_above)
            if end is not None:
                return end
            self._slow_until = buf.base + pos + self.chunk
        return (yield from super()._array_records(buf, pos, depth_above))

    def _bulk(self, buf: _Buffer, pos: int, limit: int) -> Generator[tuple[int, int, Any], None, int | None]:
        """Yield the records of a window starting at `pos` (a record's first character); return where
        the last one ends, or None (nothing yielded) when no window parses."""
        if len(buf.text) - pos < self.chunk:
            buf.fill(self.chunk)
        text = buf.text
        opener = text[pos]
        if opener not in "{[":
            return None
        closer = "}" if opener == "{" else "]"
        bound = closer + self._sep + opener if self._sep else ""
        cut = len(text)
        for _ in range(_TRIES):
            cut = text.rfind(bound, pos, cut) if bound else text.rfind(closer, pos, cut)
            if cut <= pos:
                return None
            blob = ("[" + text[pos : cut + 1] + "]").encode("latin-1")
            try:
                raws = _RAWS.decode(blob)
            except (msgspec.DecodeError, RecursionError):
                continue
            break
        else:
            return None
        try:
            values: list[Any] | None = _VALUES.decode(blob)
        except (msgspec.DecodeError, RecursionError):
            values = None  # one of them needs the stdlib (NaN, a lone surrogate, invalid UTF-8, ...)
        del blob
        start = pos
        end = pos
        last = len(raws) - 1
        for i, raw in enumerate(raws):
            end = start + len(raw)
            if values is not None:
                value = values[i]
            else:
                try:
                    value = _VALUES.decode(raw)
                except (msgspec.DecodeError, RecursionError):
                    value = _REFUSED
            if value is _REFUSED:  # the stdlib's value, or its error (its own nesting check first)
                value, _end = self._value(buf, start, MAX_NESTING - limit)
                text = buf.text
            elif (type(value) is dict or type(value) is list) and _deeper(value, limit):
                raise self._nesting(buf, start)
            yield buf.base + start, buf.base + end, value
            self.header.n_records += 1
            if i < last:
                nxt = end
                while text[nxt] in _WS:
                    nxt += 1
                nxt += 1  # the comma (the window parsed as an array)
                while text[nxt] in _WS:
                    nxt += 1
                if not self._sep:
                    self._sep = text[end:nxt]
                start = nxt
        return end

    # -- JSON lines: whole lines to msgspec, the stdlib path for any line it refuses --------------
    def _jsonl(self, buf: _Buffer, pos: int) -> Iterator[tuple[int, int, Any]]:
        self.header.container = "jsonl"
        lineno = 1 + buf.text.count("\n", 0, pos)
        bad: list[tuple[int, str]] = []
        pos = buf.drop(pos)
        while True:
            if len(buf.text) - pos < self.chunk:
                buf.fill(self.chunk)
            text = buf.text
            last_nl = text.rfind("\n", pos)
            if last_nl > pos:  # whole lines [pos, last_nl]
                lines = text[pos:last_nl].encode("latin-1").split(b"\n")
                start = pos
                for line in lines:
                    end = start + len(line)
                    got = self._fast_line(line)
                    if got is not None:
                        lead, length, value = got
                        yield buf.base + start + lead, buf.base + start + lead + length, value
                        self.header.n_records += 1
                    else:
                        yield from self._slow_line(buf, text[start:end], start, lineno, bad)
                    lineno += 1
                    start = end + 1
                pos = buf.drop(last_nl + 1)
                continue
            # the rest is one line (the file's last, or longer than a buffer): the stdlib loop
            nl = buf.text.find("\n", pos)
            while nl < 0 and buf.fill(self.chunk):
                nl = buf.text.find("\n", pos)
            end = nl if nl >= 0 else len(buf.text)
            yield from self._slow_line(buf, buf.text[pos:end], pos, lineno, bad)
            if nl < 0:
                break
            lineno += 1
            pos = buf.drop(nl + 1)
        if bad and not self.yield_broken:
            n, msg = bad[0]
            if not self.header.n_records:
                raise TraceError(f"not valid JSON or JSONL: no line of {self.name} parses (line {n}: {msg})")
            more = f" (and {len(bad) - 1} more broken lines)" if len(bad) > 1 else ""
            raise TraceError(f"broken JSONL in {self.name}: line {n} is not valid JSON: {msg}{more}")
        if not self.header.n_records and not self.yield_broken:
            raise TraceError(f"trace file is empty (whitespace only): {self.name}")

    def _fast_line(self, line: bytes) -> tuple[int, int, Any] | None:
        """(where the value starts in the line, its length, the value) when msgspec parses the line as an
        object or array nested within the limit; None sends the line to the stdlib path."""
        stripped = line.strip(b" \t\r\n")
        if stripped[:1] not in (b"{", b"["):
            return None
        try:
            value = _VALUES.decode(stripped)
        except (msgspec.DecodeError, RecursionError):
            return None
        if _deeper(value, MAX_NESTING):
            return None  # the stdlib path raises the nesting error
        return len(line) - len(line.lstrip(b" \t\r\n")), len(stripped), value

    def _slow_line(
        self, buf: _Buffer, line: str, pos: int, lineno: int, bad: list[tuple[int, str]]
    ) -> Iterator[tuple[int, int, Any]]:
        """The stdlib scanner's handling of one JSONL line (`line` starts at `pos` in the buffer)."""
        if not line.strip():
            return
        value, first, last = self._line(line, lineno, bad)
        lead = buf.base + pos + len(line) - len(line.lstrip())
        if value is not _BAD:
            yield lead + first, lead + last, value
            self.header.n_records += 1
        elif self.yield_broken:
            n, msg = bad.pop()
            yield lead, lead + len(line.strip()), BrokenLine(n, msg)
