"""The inputs and outputs of the sandbox, summarise and rerun activities, and the session key."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import BaseModel, Field

from reflector.contract.workflow import Diagnosis, ReflectorOutput, SkillbookRef, TraceRef, _Frozen
from sandbox.protocol import SESSION_ID_PATTERN

_SAFE_SESSION = re.compile(SESSION_ID_PATTERN)


PREFILL_CODE = "describe_traces()"


def session_key(workflow_id: str) -> str:
    """The on-disk key of a workflow's session (journal, response cache); unsafe ids are hashed."""
    if _SAFE_SESSION.match(workflow_id):
        return workflow_id
    return "h-" + hashlib.sha256(workflow_id.encode()).hexdigest()[:40]


class LimitsInput(_Frozen):
    cell_timeout_s: float = 60.0
    max_output_chars: int = 50_000


class PrepareSessionInput(_Frozen):
    session_id: str
    trace: TraceRef
    question: str = ""
    ground_truth: str | None = None
    feedback: str | None = None
    skillbook: str = ""
    limits: LimitsInput = LimitsInput()
    inherit_ref: str | None = None
    context_code: str = ""
    skillbook_ref: SkillbookRef | None = None  # read by the activity into the sandbox variable `skillbook`


class TraceFacts(BaseModel):
    """What the deterministic fallback needs from the trace (read by the prepare activity)."""

    final_answer: str | None = None
    ground_truth: str | None = None
    answer_correct: bool | None = None
    # The trace's own question and feedback (the task prompt shows them when the caller gave none).
    question: str | None = None
    feedback: str | None = None
    # Traces with expected actions (tau-bench): `answer_correct` then says whether the agent's
    # state-changing actions match them (by name and arguments), and these name the differences.
    actions_checked: bool = False
    missing_actions: list[str] = []
    unexpected_actions: list[str] = []
    # The first divergence the toolkit computed in the facts cell (cell 2), for the budget fallback.
    diagnosis: Diagnosis | None = None


class PrepareSessionResult(BaseModel):
    init_ref: str
    preview: str
    preview_ok: bool
    facts: TraceFacts = TraceFacts()
    context_error: str | None = None
    next_seq: int = 2
    # `skillbook_ref`: the first ids of the skillbook (at most `reflector.analysis.limits.SKILL_IDS_SHOWN`) and how many
    # it has, for the task prompt; a skillbook over its caps is refused (the session ends with this error)
    skill_ids: list[str] = Field(default_factory=list)
    skill_count: int = 0
    skillbook_error: str | None = None


class SkillLookupInput(_Frozen):
    """A skill tool's call on a skillbook blob: `tool` is one of `SKILL_TOOLS`, `arg` its id or query."""

    skillbook: SkillbookRef
    tool: str
    arg: str = ""


class _SessionAt(_Frozen):
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
    seq: int = (
        0  # the cell id (its sequence number in the session); 0 in outcomes recorded before it was added
    )


class CloseSessionInput(_Frozen):
    session_id: str


class SummariseInput(_Frozen):
    model: str
    transcript_json: str
    workflow_id: str
    depth: int = 0
    max_output_tokens: int = 2_000


class SummariseResult(BaseModel):
    summary: str
    archive_ref: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0


class ReusedChild(BaseModel):
    """A child reflection the origin ran before the rerun's first live step, and what it returned."""

    workflow_id: str
    output: ReflectorOutput
    call: dict[str, Any] = Field(default_factory=dict)  # the origin's `subagent_calls` entry, when recorded


class RerunPrefix(BaseModel):
    """The blob `RerunOf.prefix_sha256`: what the origin recorded before its request `from_step`."""

    origin: str
    from_step: int
    origin_model: str = ""
    responses: list[str] = Field(default_factory=list)  # step i's ModelResponse (JSON) at index i - 1
    cells: dict[int, CellOutcome] = Field(default_factory=dict)  # by cell sequence number
    children: dict[int, ReusedChild] = Field(default_factory=dict)  # by recursion number (1, 2, ...)
    summaries: list[SummariseResult] = Field(default_factory=list)  # compaction k at index k - 1


class ReusedItemInput(_Frozen):
    """Read item `index` (0-based) of a kind from the prefix blob."""

    prefix_sha256: str
    index: int


class ReusedCellInput(_Frozen):
    """The recorded outcome of cell `seq`; its code is journaled for the new session (not run)."""

    prefix_sha256: str
    session_id: str
    seq: int
    code: str
