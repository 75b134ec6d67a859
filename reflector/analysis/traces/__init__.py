"""Trace loading, validation and normalisation.

Every reflection starts from a file a user hands us, so the first job is to fail early with a
one-line message a human can act on (`TraceError`). The second job is to give the model one
canonical view of the many trace shapes in the wild (ACE dicts, OpenAI message lists, OpenClaw
session JSONL, tau-bench trajectories, OTel/OpenInference spans) while keeping the raw data at
hand, because no adapter sees everything and the model may need to dig further.

This package is imported by the CLI *and* by the sandbox host process, so it only depends on the
standard library (no other `reflector` module) and performs no I/O beyond reading the given file.

- `read`: reading a file or its bytes, size checks, JSON / JSON lines parsing, the nesting bound;
- `detect`: the format names and the detection of a trace's shape;
- `view`: the canonical views (documented there) and the helpers adapters build them with;
- `adapters`: one module per format, each turning data of that shape into its view;
- `load`: detection plus the format's adapter (`normalize`), from data, a file or its bytes.
"""

from __future__ import annotations

from reflector.analysis.traces.adapters.tau import render_call
from reflector.analysis.traces.detect import FileFormat, TraceFormat, detect_format
from reflector.analysis.traces.load import load_normalized, load_normalized_bytes, normalize
from reflector.analysis.traces.read import (
    MAX_BYTES_ENV,
    MAX_NESTING,
    TraceError,
    check_trace_file,
    nesting_depth,
    parse_trace_bytes,
    read_trace_file,
)
from reflector.analysis.traces.view import iter_runs, looks_like_error

__all__ = [
    "TraceError",
    "TraceFormat",
    "FileFormat",
    "read_trace_file",
    "check_trace_file",
    "detect_format",
    "normalize",
    "load_normalized",
    "load_normalized_bytes",
    "parse_trace_bytes",
    "looks_like_error",
    "render_call",
    "iter_runs",
    "MAX_BYTES_ENV",
    "MAX_NESTING",
    "nesting_depth",
]
