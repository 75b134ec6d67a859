"""Durable data contracts: workflow/activity inputs and the reflection output.

Every model here is persisted in Temporal histories, so new fields always get defaults and
existing names never change (they are the durable contract).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reflector.formats import TraceFormat
from reflector.ledger import Ledger, UsageRecord, UsageSummary

__all__ = [
    "TraceRef",
    "ReflectionConfig",
    "ReflectionInput",
    "ExtractedLearning",
    "SkillTag",
    "ReflectionDraft",
    "ReflectorOutput",
    "UsageSummary",
    "RunTrace",
    "StopReason",
    "Progress",
    "Continuation",
    "WORKFLOW_NAME",
    "Ledger",
    "UsageRecord",
]

StopReason = Literal["completed", "token_budget", "request_budget", "max_compactions", "error"]


WORKFLOW_NAME = "ReflectionWorkflow"  # durable: the workflow type name of every session, root or child


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TraceRef(_Frozen):
    """A reference to a trace in the content-addressed blob store; never the trace itself.

    `uri` is store-relative (`blob:sha256:<hex>`) so that client and workers with different
    local paths (or an S3 store) resolve the same reference.
    """

    uri: str
    sha256: str
    size: int
    format: TraceFormat = "unknown"


class ReflectionConfig(_Frozen):
    """Limits and knobs of one reflection; defaults are the architecture's reference figures."""

    model: str = "heuristic"
    model_settings: dict[str, Any] | None = None
    max_tokens: int = Field(default=500_000, ge=1)
    max_requests: int = Field(default=50, ge=1)
    context_window: int = Field(default=128_000, ge=1_000)
    max_depth: int = Field(default=2, ge=0)
    child_budget_fraction: float = Field(default=0.5, gt=0, le=1)
    max_compactions: int = Field(default=3, ge=0)
    microcompact_keep_recent: int = Field(default=3, ge=0)
    cell_timeout_s: float = Field(default=60.0, gt=0)
    max_output_chars: int = Field(default=50_000, ge=200)
    max_failed_repeats: int = Field(default=3, ge=1)
    max_consecutive_cell_errors: int = Field(default=6, ge=1)


class Continuation(BaseModel):
    """Everything a session carries across continue-as-new (the new run resumes from it)."""

    messages_json: str
    ledger: Ledger
    init_ref: str
    seq: int
    cells: int = 0
    ok_cells: int = 0
    failed_cells: int = 0
    iterations: int = 0
    compactions: int = 0
    microcompactions: int = 0
    chars_per_token: float = 4.0
    recursions: int = 0
    runs: int = 1
    thoughts: list[dict[str, Any]] = Field(default_factory=list)
    subagent_calls: list[dict[str, Any]] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)


class ReflectionInput(_Frozen):
    """The single input of `ReflectionWorkflow` (a child session's too)."""

    trace: TraceRef
    question: str = ""
    ground_truth: str | None = None
    feedback: str | None = None
    skillbook: str = ""
    mode: Literal["online", "offline"] = "offline"
    config: ReflectionConfig = ReflectionConfig()
    depth: int = 0
    parent_workflow_id: str | None = None
    inherit_ref: str | None = None
    context_code: str = ""
    continuation: Continuation | None = None


class ExtractedLearning(BaseModel):
    learning: str
    atomicity_score: float = Field(ge=0.0, le=1.0)
    evidence: str = ""
    justification: str = ""


class SkillTag(BaseModel):
    id: str
    tag: Literal["helpful", "harmful", "neutral"]


class ReflectionDraft(BaseModel):
    """What the model is allowed to produce. `raw` is deliberately absent: the workflow fills it."""

    reasoning: str
    error_identification: str
    root_cause_analysis: str
    correct_approach: str
    key_insight: str
    extracted_learnings: list[ExtractedLearning] = Field(default_factory=list)
    skill_tags: list[SkillTag] = Field(default_factory=list)


class RunTrace(BaseModel):
    total_iterations: int = 0
    subagent_calls: list[dict[str, Any]] = Field(default_factory=list)
    timed_out: bool = False
    compactions: int = 0
    microcompactions: int = 0
    depth: int = 0
    stop_reason: StopReason = "completed"
    cells: int = 0
    failed_cells: int = 0
    continued_as_new: int = 0


class ReflectorOutput(ReflectionDraft):
    """The reflection returned by `ReflectionWorkflow`.

    `raw` carries `rr_trace`, `usage`, `thoughts`, `workflow_id` (and `model`), all written by the
    workflow from its own state.
    """

    raw: dict[str, Any] = Field(default_factory=dict)


class Progress(BaseModel):
    """Answer of the workflow's `progress` query (shown by the CLI while it waits)."""

    phase: str = "starting"
    iterations: int = 0
    cells: int = 0
    failed_cells: int = 0
    requests: int = 0
    total_tokens: int = 0
    last_event: str = ""
