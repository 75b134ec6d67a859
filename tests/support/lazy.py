"""The lazy view of a trace file, as a large trace's sandbox host reads it (index built, file read by offset)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reflector.analysis.traces.index import TraceIndex, build_index
from reflector.analysis.traces.lazy import open_view


def lazy_view(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the lazy view of `path` (its index built and round-tripped through bytes); closes the file after."""
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        view, _roots = open_view(fd, TraceIndex.from_bytes(index.to_bytes()))
        yield view
    finally:
        os.close(fd)
