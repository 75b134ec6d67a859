"""The built-in offline model `heuristic` (see `model`): a deterministic, rule-based driver of the real tools.

- `model`: the pydantic-ai model, deciding each request from the message history alone;
- `findings_cell.py`: the program it runs in the sandbox (a file read as text, never imported);
- `draft`: the `ReflectionDraft` built from the findings that program printed.
"""

from __future__ import annotations

from reflector.analysis.heuristic.draft import HEURISTIC_NAME, build_draft
from reflector.analysis.heuristic.model import (
    FINDINGS_CELL,
    FINDINGS_MARKER,
    SIMPLE_CELL,
    heuristic_response,
    make_heuristic_model,
    parse_findings,
)

__all__ = [
    "HEURISTIC_NAME",
    "FINDINGS_CELL",
    "SIMPLE_CELL",
    "FINDINGS_MARKER",
    "heuristic_response",
    "make_heuristic_model",
    "parse_findings",
    "build_draft",
]
