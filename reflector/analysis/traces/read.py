"""Reading a trace: existence and size checks, JSON / JSON lines parsing, the nesting bound.

Every reflection starts from a file a user hands us, so the first job is to fail early with a
one-line message a human can act on (`TraceError`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from reflector.analysis.traces.detect import FileFormat

__all__ = [
    "TraceError",
    "read_trace_file",
    "check_trace_file",
    "parse_trace_bytes",
    "nesting_depth",
    "MAX_BYTES_ENV",
    "MAX_NESTING",
]

MAX_BYTES_ENV = "RR_MAX_TRACE_BYTES"
# Deepest nesting of arrays/objects a trace may have. `json.loads` and everything that walks the data
# afterwards (normalisation, the sandbox's schema sketch and preview, `json.dumps`, pickling a
# snapshot, a model's own recursive cell) recurse once or more per level, and Python's default
# recursion limit is 1,000 frames: 100 leaves room for several frames per level on top of a deep
# caller. Real traces nest well under 30 levels. Checked before parsing, without recursion.
MAX_NESTING = 100


class TraceError(ValueError):
    """A trace that cannot be used; the message is one line, meant for the user."""


def read_trace_file(path: str | Path, max_bytes: int | None) -> tuple[Any, FileFormat]:
    """Read and parse a `.json` or `.jsonl` trace; returns (data, "json" | "jsonl").

    The container format is decided by content, the suffix is only a hint: people save JSONL
    as `.json` and pretty-printed JSON as `.jsonl`. `max_bytes=None` disables the size check.
    """
    p = Path(path)
    size = check_trace_file(p, max_bytes)
    if size == 0:
        raise TraceError(f"trace file is empty: {p}")
    return parse_trace_bytes(p.read_bytes(), p)


def parse_trace_bytes(raw: bytes, name: str | Path) -> tuple[Any, FileFormat]:
    """Parse the bytes of a trace file called `name` (its suffix is a hint), as `read_trace_file` does."""
    p = Path(name)
    text = raw.decode("utf-8-sig", errors="replace")
    if not text.strip():
        raise TraceError(f"trace file is empty (whitespace only): {p}")
    if nesting_depth(text, MAX_NESTING) > MAX_NESTING:
        raise TraceError(
            f"trace {p} nests deeper than {MAX_NESTING} levels of arrays/objects, the limit for traces "
            "(flatten the deepest values or store them as JSON strings)"
        )
    if p.suffix.lower() == ".jsonl":
        try:
            return _parse_jsonl(text, p), "jsonl"
        except TraceError:
            whole = _try_json(text)
            if whole is not _FAIL:
                return whole, "json"
            raise
    try:
        return json.loads(text), "json"
    except json.JSONDecodeError as exc:
        if _looks_like_jsonl(text, exc):
            return _parse_jsonl(text, p), "jsonl"
        raise TraceError(f"invalid JSON in {p} at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def check_trace_file(p: Path, max_bytes: int | None) -> int:
    """Existence, kind and size checks, before reading anything into memory."""
    if not p.exists():
        raise TraceError(f"trace file not found: {p}")
    if p.is_dir():
        raise TraceError(f"trace path is a directory, not a file: {p}")
    size = p.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise TraceError(
            f"trace file {p} is {size:,} bytes, over the limit of {max_bytes:,} bytes "
            f"(raise it with the environment variable {MAX_BYTES_ENV})"
        )
    return size


_FAIL = object()
# A JSON string, escapes included; the closing quote is optional so that an unterminated string
# consumes the rest of the text instead of being retried from every later quote (quadratic).
_JSON_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKET_RUN_RE = re.compile(r"[\[\]{}]+")


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """How deeply the arrays/objects of JSON (or JSON lines) `text` nest, brackets in strings aside.

    A linear scan with no recursion, so it is safe on a recursion bomb (`"[" * 200_000`) and on
    invalid JSON (stray closing brackets never go below 0). It stops as soon as the depth exceeds
    `stop_above` and returns that depth.
    """
    depth = deepest = 0
    for run in _BRACKET_RUN_RE.finditer(_JSON_STRING_RE.sub("", text)):
        for ch in run.group():
            if ch == "[" or ch == "{":
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if stop_above is not None and deepest > stop_above:
                        return deepest
            elif depth:
                depth -= 1
    return deepest


def _try_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _FAIL


def _loads_embedded(text: str) -> Any:
    """JSON held in a string of the trace (tool-call arguments); `_FAIL` if invalid or nested too deep.

    The file's nesting check cannot see inside strings, so JSON found there is checked again.
    """
    if nesting_depth(text, MAX_NESTING) > MAX_NESTING:
        return _FAIL
    return _try_json(text)


def _looks_like_jsonl(text: str, exc: json.JSONDecodeError) -> bool:
    """JSONL read as JSON fails with "Extra data" on line 2+, or on a stray-prefixed line 1."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return False
    if exc.msg.startswith("Extra data") and exc.lineno >= 2:
        return True
    return _parse_line(lines[0]) is not _FAIL and _parse_line(lines[1]) is not _FAIL


def _parse_line(line: str) -> Any:
    """One JSONL line; tolerates stray bytes before the first `{` (seen in real OpenClaw files)."""
    value = _try_json(line)
    if value is not _FAIL:
        return value
    start = line.find("{")
    if start > 0:
        return _try_json(line[start:])
    return _FAIL


def _parse_jsonl(text: str, p: Path) -> list[Any]:
    """Parse every non-blank line; one unrecoverable line is an error naming its number."""
    records: list[Any] = []
    bad: list[tuple[int, str]] = []
    numbered = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    for lineno, line in numbered:
        value = _parse_line(line)
        if value is _FAIL:
            bad.append((lineno, _json_error(line)))
        else:
            records.append(value)
    if not records:
        lineno, msg = bad[0]
        raise TraceError(f"not valid JSON or JSONL: no line of {p} parses (line {lineno}: {msg})")
    if bad:
        lineno, msg = bad[0]
        more = f" (and {len(bad) - 1} more broken lines)" if len(bad) > 1 else ""
        raise TraceError(f"broken JSONL in {p}: line {lineno} is not valid JSON: {msg}{more}")
    return records


def _json_error(line: str) -> str:
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at column {exc.colno}"
    return "unparseable"
