"""The trace as the host reads it from the descriptors opened before the lockdown: whole (normalised by the
trace reader, or plain JSON without it), or lazily through its index."""

from __future__ import annotations

import json
import os
from typing import Any

from sandbox.host.namespace import load_traces


def _index_path(trace_path: str) -> str:
    try:
        from reflector.analysis.traces.index import index_path
    except ImportError:  # a host without the project's trace reader reads every trace whole
        return trace_path + "\0"  # a name no file has
    return index_path(trace_path)


def _open_lazy(trace_fd: int, index_fd: int) -> tuple[Any, dict[str, Any]]:
    """The lazy view of a large trace: the index is read whole, the trace stays open on `trace_fd`."""
    from reflector.analysis.traces.index import TraceIndex
    from reflector.analysis.traces.lazy import open_view

    with os.fdopen(index_fd, "rb") as fh:
        index = TraceIndex.from_bytes(fh.read())
    if os.fstat(trace_fd).st_size != index.size:
        raise ValueError(
            f"the trace's index is for {index.size:,} bytes, the trace has {os.fstat(trace_fd).st_size:,}"
        )
    return open_view(trace_fd, index)


def _load_trace_fd(fd: int | None, name: str, trace_format: str) -> Any:
    """Load the trace from the fd opened before the lockdown (the path is no longer reachable)."""
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read()
    try:
        from reflector.analysis.traces import load_normalized_bytes
    except ImportError:
        return load_traces(None, trace_format) if not raw else _plain_json(raw, name, trace_format)
    fmt = None if trace_format in ("", "auto", "json", "jsonl") else trace_format
    return load_normalized_bytes(raw, name, fmt)


def _plain_json(raw: bytes, name: str, trace_format: str) -> Any:
    text = raw.decode("utf-8-sig", errors="replace")
    if trace_format == "jsonl" or name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)
