"""The decision timeline of a reflection (`rr audit`): a typed model built from its histories alone.

One `Session` per workflow (the root, and each child nested in the `ChildItem` of the `recurse` call that
started it); a session's `items` are in history order across every run of its continue-as-new chain.
`reflector.client.audit.build` fills it; `render_text` and `render_html` show it; `--json` prints it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from reflector.client.audit.capture import RequestInput

__all__ = [
    "ToolCall",
    "BudgetPoint",
    "ModelRequestItem",
    "CellItem",
    "ChildItem",
    "CompactionItem",
    "IncidentItem",
    "RunItem",
    "Item",
    "CitationAudit",
    "LearningAudit",
    "Reflection",
    "Session",
    "Audit",
]


class ToolCall(BaseModel):
    tool: str
    call_id: str = ""
    args: dict[str, Any] | str = Field(default_factory=dict)


class BudgetPoint(BaseModel):
    """Spent by this session (and the children finished so far) after one charge."""

    event_id: int
    label: str  # "request 3", "summary", "child <id>"
    requests: int
    tokens: int


class ModelRequestItem(BaseModel):
    kind: Literal["model_request"] = "model_request"
    event_id: int
    step: int  # 1-based, per session (across its runs)
    agent: str = ""  # the activity type names the agent (rr_reflector, rr_synthesizer)
    model: str = ""
    path: Literal["local activity", "activity", "reused"] = (
        "local activity"  # reused: `rr rerun`, from the origin
    )
    attempts: int = 1
    given: RequestInput | None = None  # None: not rebuilt (replay failed)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    failed: str | None = None  # the request failed for good (no response)


class CellItem(BaseModel):
    kind: Literal["cell"] = "cell"
    event_id: int
    workflow_id: str
    seq: int  # the cell id the model saw as "[cell N]"
    code: str = ""
    origin: Literal["model", "prefill", "compaction"] = "model"
    call_id: str = ""
    ok: bool = True
    output: str = ""
    error: str | None = None
    duration_ms: float = 0.0
    attempts: int = 1
    host_restarted: bool = False
    cells_replayed: int = 0
    truncated: bool = False
    submitted: bool = False
    reused: bool = False  # `rr rerun`: the origin's outcome, not run again

    @property
    def anchor(self) -> str:
        return cell_anchor(self.workflow_id, self.seq)


def cell_anchor(workflow_id: str, seq: int) -> str:
    return f"cell-{workflow_id}-{seq}"


class ChildItem(BaseModel):
    kind: Literal["child"] = "child"
    event_id: int
    workflow_id: str
    call_id: str = ""
    prompt: str = ""
    context_code: str = ""
    status: str = "started"  # completed, failed, timed out, canceled, terminated, started
    stop_reason: str | None = None
    key_insight: str = ""
    requests: int = 0
    tokens: int = 0
    reused: bool = False  # `rr rerun`: the origin's child and its output, not run again
    session: Session | None = None  # None: its history is not in the bundle


class CompactionItem(BaseModel):
    kind: Literal["compaction"] = "compaction"
    event_id: int
    summary: str = ""
    archive_ref: str = ""
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1
    reused: bool = False  # `rr rerun`: the origin's summary


class IncidentItem(BaseModel):
    """A fault the reflection survived (or did not): retries, timeouts, a worker change."""

    kind: Literal["incident"] = "incident"
    event_id: int
    what: str  # "activity retried", "activity timed out", "workflow task timed out", "worker changed", ...
    detail: str = ""
    worker: str = ""
    previous_worker: str = ""
    gap_s: float | None = None


class RunItem(BaseModel):
    """The start of a run of the continue-as-new chain (the first run has one too)."""

    kind: Literal["run"] = "run"
    event_id: int
    index: int
    run_id: str
    reason: str = ""  # "continued as new" for every run after the first


Item = Annotated[
    ModelRequestItem | CellItem | ChildItem | CompactionItem | IncidentItem | RunItem,
    Field(discriminator="kind"),
]


class CitationAudit(BaseModel):
    cell: int
    exists: bool
    printed: bool = True
    quote: str = ""
    anchor: str = ""  # the cited cell's anchor in the HTML report ("" when the cell does not exist)

    @property
    def supported(self) -> bool:
        return self.exists and self.printed


class LearningAudit(BaseModel):
    index: int
    learning: str
    evidence: str = ""
    citations: list[CitationAudit] = Field(default_factory=list)
    source: Literal["workflow", "audit"] = "audit"  # who checked the citations

    @property
    def uncited(self) -> bool:
        return not self.citations


class Reflection(BaseModel):
    status: str = "running"  # completed, failed, canceled, terminated, timed out, running
    stop_reason: str | None = None
    reasoning: str = ""
    error_identification: str = ""
    root_cause_analysis: str = ""
    correct_approach: str = ""
    key_insight: str = ""
    learnings: list[LearningAudit] = Field(default_factory=list)
    failure: str | None = None
    raw: dict[str, Any] = Field(default_factory=dict)


class Session(BaseModel):
    workflow_id: str
    run_ids: list[str] = Field(default_factory=list)
    depth: int = 0
    parent_workflow_id: str | None = None
    question: str = ""
    model: str = ""
    trace: dict[str, Any] = Field(default_factory=dict)
    items: list[Item] = Field(default_factory=list)
    budget: list[BudgetPoint] = Field(default_factory=list)
    reflection: Reflection = Field(default_factory=Reflection)
    events: int = 0
    replay_failure: str | None = None

    def cells(self) -> list[CellItem]:
        return [i for i in self.items if isinstance(i, CellItem)]

    def requests(self) -> list[ModelRequestItem]:
        return [i for i in self.items if isinstance(i, ModelRequestItem)]

    def children(self) -> list[ChildItem]:
        return [i for i in self.items if isinstance(i, ChildItem)]


class Audit(BaseModel):
    """`rr audit`'s answer: the root session with its children nested, and the header totals."""

    root_id: str
    source: str  # "server" or the file audited
    model: str = ""
    trace: dict[str, Any] = Field(default_factory=dict)
    stop_reason: str | None = None
    status: str = "running"
    requests: int = 0
    tokens: int = 0
    cells: int = 0
    children: int = 0
    compactions: int = 0
    incidents: int = 0
    cells_rebuilt: int = 0  # cells whose sandbox host had died and was rebuilt (from the journal) to run them
    rerun: dict[str, Any] | None = None
    inputs_rebuilt: bool = True  # every model request's input was rebuilt by replay
    session: Session


ChildItem.model_rebuild()
