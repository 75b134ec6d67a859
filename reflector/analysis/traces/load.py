"""From parsed data (or a file, or its bytes) to the canonical view: detect the format, run its adapter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from reflector.analysis.traces.adapters.ace import _norm_ace
from reflector.analysis.traces.adapters.messages import _norm_messages
from reflector.analysis.traces.adapters.openclaw import _norm_openclaw
from reflector.analysis.traces.adapters.otel import _norm_otel
from reflector.analysis.traces.adapters.tau import _norm_tau
from reflector.analysis.traces.adapters.unknown import _norm_unknown
from reflector.analysis.traces.detect import detect_format
from reflector.analysis.traces.read import MAX_NESTING, TraceError, parse_trace_bytes, read_trace_file

__all__ = ["normalize", "load_normalized", "load_normalized_bytes"]

_ADAPTERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "ace": _norm_ace,
    "messages": _norm_messages,
    "openclaw": _norm_openclaw,
    "tau-bench": _norm_tau,
    "otel": _norm_otel,
    "unknown": _norm_unknown,
}


def normalize(data: Any, fmt: str | None = None) -> dict[str, Any]:
    """The canonical view of `data` (format detected when `fmt` is None or "unknown").

    A forced `fmt` that does not fit the data raises TraceError rather than producing a
    silently empty view.
    """
    if fmt is None or fmt == "unknown":
        fmt = detect_format(data)
    adapter = _ADAPTERS.get(fmt)
    if adapter is None:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of: {', '.join(_ADAPTERS)}")
    try:
        return adapter(data)
    except (AttributeError, TypeError, KeyError) as exc:
        raise TraceError(f"trace does not look like format {fmt!r}: {type(exc).__name__}: {exc}") from None
    except RecursionError:  # data built in Python, not read by `parse_trace_bytes` (which bounds nesting)
        raise TraceError(
            f"trace nests too deeply to normalise (traces read from files are limited to "
            f"{MAX_NESTING} levels)"
        ) from None


def load_normalized(path: str | Path, fmt: str | None = None) -> dict[str, Any]:
    """Read `path` without a size limit (the caller already checked it) and normalise it."""
    data, _ = read_trace_file(path, None)
    return normalize(data, fmt)


def load_normalized_bytes(raw: bytes, name: str | Path, fmt: str | None = None) -> dict[str, Any]:
    """`load_normalized` of a trace already read (the sandbox host reads it from an fd)."""
    if not raw:
        raise TraceError(f"trace file is empty: {name}")
    data, _ = parse_trace_bytes(raw, name)
    return normalize(data, fmt)
