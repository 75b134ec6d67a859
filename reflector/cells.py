"""Inputs and outputs of the sandbox activities (durable contract; imported by workflows)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from reflector.types import TraceRef

__all__ = [
    "PREPARE_ACTIVITY",
    "RUN_CELL_ACTIVITY",
    "PREFILL_CODE",
    "LimitsInput",
    "PrepareSessionInput",
    "PrepareSessionResult",
    "CellInput",
    "CellOutcome",
    "CLOSE_ACTIVITY",
    "EXPORT_ACTIVITY",
    "ExportInput",
    "ExportResult",
    "TraceFacts",
    "CloseSessionInput",
    "session_key",
]

PREPARE_ACTIVITY = "rr.sandbox.prepare_session"
RUN_CELL_ACTIVITY = "rr.sandbox.run_cell"
PREFILL_CODE = "describe_traces()"
_SAFE_SESSION = re.compile(r"^[A-Za-z0-9_.:@=+-]{1,200}$")


def session_key(workflow_id: str) -> str:
    """The on-disk key of a workflow's session (journal, response cache); unsafe ids are hashed."""
    if _SAFE_SESSION.match(workflow_id):
        return workflow_id
    return "h-" + hashlib.sha256(workflow_id.encode()).hexdigest()[:40]


class _In(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitsInput(_In):
    cell_timeout_s: float = 60.0
    max_output_chars: int = 50_000


class PrepareSessionInput(_In):
    session_id: str
    trace: TraceRef
    question: str = ""
    ground_truth: str | None = None
    feedback: str | None = None
    skillbook: str = ""
    limits: LimitsInput = LimitsInput()
    inherit_ref: str | None = None
    context_code: str = ""


class TraceFacts(BaseModel):
    """What the deterministic fallback needs from the trace (read by the prepare activity)."""

    final_answer: str | None = None
    ground_truth: str | None = None
    answer_correct: bool | None = None
    # Traces with expected actions (tau-bench): `answer_correct` then says whether the agent's
    # state-changing actions match them (by name and arguments), and these name the differences.
    actions_checked: bool = False
    missing_actions: list[str] = []
    unexpected_actions: list[str] = []


class PrepareSessionResult(BaseModel):
    init_ref: str
    preview: str
    preview_ok: bool
    facts: TraceFacts = TraceFacts()
    context_error: str | None = None
    next_seq: int = 2


class _SessionAt(_In):
    """A session's sandbox at cell `seq`, with what a fresh host needs to rebuild it."""

    session_id: str
    seq: int
    trace: TraceRef
    init_ref: str
    limits: LimitsInput = LimitsInput()
    inherit_ref: str | None = None


class CellInput(_SessionAt):
    """Run `code` as cell `seq`."""

    code: str


EXPORT_ACTIVITY = "rr.sandbox.export_session"


class ExportInput(_SessionAt):
    """Export the namespace after cell `seq` for a child session."""


class ExportResult(BaseModel):
    export_ref: str
    skipped: list[str] = []


class CellOutcome(BaseModel):
    ok: bool
    output: str
    error: str | None = None
    error_kind: str | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    submitted: Any | None = None
    host_restarted: bool = False
    cells_replayed: int = 0


CLOSE_ACTIVITY = "rr.sandbox.close_session"


class CloseSessionInput(_In):
    session_id: str
