"""The reflection workflow's persisted models: its input and configuration, the trace and skillbook
references, the draft, the output, the progress query's answer and the agent's dependencies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reflector.analysis.ledger import Ledger
from reflector.analysis.traces import TraceFormat
from reflector.contract.names import StopReason


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
    # the id and location of the store the client uploaded to (`reflector.runtime.storage.identity`): a worker of
    # another store refuses the reflection at its first activity, naming both ("": not recorded, unchecked)
    store_id: str = ""
    store_url: str = ""


class ReflectionConfig(_Frozen):
    """Limits and knobs of one reflection."""

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
    # When `recurse` is offered (below max_depth): "auto" only where the prompt's strategy asks to split
    # (a large trace, `reflector.analysis.prompts.may_split`); "always" at every depth below max_depth (the scripted
    # test models, or a caller who wants children on a small trace).
    recursion: Literal["auto", "always"] = "auto"


class Counters(BaseModel):
    """A session's counters: kept by the workflow (`workflows.state.SessionState.counters`) and carried
    across continue-as-new as part of `Continuation` (one definition for both)."""

    seq: int = 1  # the last cell sequence number used (1 = prefill)
    cells: int = 0
    ok_cells: int = 0
    failed_cells: int = 0
    iterations: int = 0
    compactions: int = 0
    microcompactions: int = 0
    chars_per_token: float = 4.0
    recursions: int = 0
    runs: int = 1
    # `rr rerun` (`RerunOf`): what this session took from its origin's recorded prefix instead of paying again
    reused_requests: int = 0
    reused_cells: int = 0
    reused_children: int = 0
    reused_summaries: int = 0


class Continuation(Counters):
    """Everything a session carries across continue-as-new (the new run resumes from it)."""

    messages_json: str
    ledger: Ledger
    init_ref: str
    thoughts: list[dict[str, Any]] = Field(default_factory=list)
    subagent_calls: list[dict[str, Any]] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)
    cell_outputs: dict[int, str] = Field(default_factory=dict)  # what each cell showed the model, by cell id
    # a run of the session made an in-process model request, whose response the response cache holds until
    # the session's last run forgets it (`FORGET_ONLY_CACHED_PATCH`)
    responses_cached: bool = False


class SkillbookRef(_Frozen):
    """A skillbook in the blob store (`reflector.client.upload_skillbook`); never the text itself.

    The prepare activity reads it into the sandbox variable `skillbook` and returns the ids the task
    prompt lists; the skill tools answer from it in a local activity (`SKILL_LOOKUP_ACTIVITY`).
    """

    uri: str
    sha256: str
    size: int  # bytes (UTF-8)
    chars: int = 0  # characters (the task prompt says how long it is)
    skills: int = 0  # skill ids in it (at most `reflector.analysis.limits.MAX_SKILL_IDS`)


class RerunOf(_Frozen):
    """`rr rerun`: this reflection reuses the recorded results of its origin's steps before `from_step`.

    A step is one model request of the origin's root session (its turns across its continue-as-new
    chain). The recorded prefix (`RerunPrefix`, written by `reflector.client.rerun`: the responses of steps
    1..from_step-1 and the cells, children and summaries the origin ran before its request `from_step`)
    is one blob, `prefix_sha256`; the workflow reads each item from it with a local activity
    (`activities.rerun`).
    The counts say which items exist, so the workflow decides without I/O what is reused.
    """

    origin: str  # the origin's workflow id
    from_step: int = Field(ge=1)
    prefix_sha256: str
    origin_model: str = ""
    steps: int = 0  # responses in the prefix (from_step - 1)
    cells_through: int = 0  # the last cell sequence number in the prefix (0: none)
    children: int = 0  # children (recursion numbers 1..children) in the prefix
    summaries: int = 0  # summaries (compactions 1..summaries) in the prefix


class ReflectionInput(_Frozen):
    """The single input of `ReflectionWorkflow` (a child session's too)."""

    trace: TraceRef
    question: str = ""
    ground_truth: str | None = None
    feedback: str | None = None
    skillbook: str = ""  # inline text: inputs recorded before `skillbook_ref` (the client never sends it now)
    mode: Literal["online", "offline"] = "offline"
    config: ReflectionConfig = ReflectionConfig()
    depth: int = 0
    parent_workflow_id: str | None = None
    inherit_ref: str | None = None
    context_code: str = ""
    continuation: Continuation | None = None
    rerun: RerunOf | None = None  # `rr rerun` (root sessions only; never handed to a child)
    search_attributes: bool = (
        False  # the namespace has rr's search attributes: set them on children, upsert at the end
    )
    skillbook_ref: SkillbookRef | None = (
        None  # the skillbook, in the blob store (takes the place of `skillbook`)
    )


# The field descriptions below are the output tool's JSON schema: they are what a model reads about each
# field, so they say what to put there (they change no validation). The classes' docstrings are not sent: the
# field that holds each class already describes it, and every request pays for the schema again.


def _schema_without_docstring(schema: dict[str, Any]) -> None:
    schema.pop("description", None)


class ExtractedLearning(BaseModel):
    """One atomic, reusable lesson from this trace, with the evidence it rests on."""

    model_config = ConfigDict(json_schema_extra=_schema_without_docstring)

    learning: str = Field(
        description="One actionable rule that names the tool, argument or policy it is about "
        '(e.g. "Before book_reservation, confirm each passenger\'s date of birth with the user").'
    )
    atomicity_score: float = Field(
        ge=0.0,
        le=1.0,
        description="How atomic the learning is, 0 to 1: 1.0 for a single rule about one thing; lower when it "
        "bundles several ideas or stays vague.",
    )
    evidence: str = Field(
        default="",
        description='The cells that show it, each as `cell N: "exact text it printed"` with the step index '
        '(e.g. `cell 3: "dob 1990-01-01 != 1990-10-01" at step 14`); several separated by `; `.',
    )
    justification: str = Field(
        default="",
        description="Why the evidence supports this learning, and how following it would have avoided the failure.",
    )


class SkillTag(BaseModel):
    """A skillbook skill the trace cites, tagged by its effect on the outcome (online mode)."""

    model_config = ConfigDict(json_schema_extra=_schema_without_docstring)

    id: str = Field(
        description="The skill's id exactly as in the skillbook, without brackets (e.g. `section-00001`)."
    )
    tag: Literal["helpful", "harmful", "neutral"] = Field(
        description="What following the skill did to this run."
    )


DiagnosisKind = Literal[
    "missing_action",
    "wrong_arguments",
    "extra_action",
    "wrong_information",
    "tool_error_mishandled",
    "reasoning_error",
    "policy_violation",
    "other",
]
DIAGNOSIS_KINDS: tuple[str, ...] = DiagnosisKind.__args__  # type: ignore[attr-defined]


class Diagnosis(BaseModel):
    """The decisive failure of the run: the root cause (`step`, the earliest step from which the run never
    recovered) and where it became visible (`symptom_step`), and how."""

    model_config = ConfigDict(json_schema_extra=_schema_without_docstring)

    kind: DiagnosisKind = Field(
        description=(
            "What went wrong at that step: missing_action (an expected action never taken), wrong_arguments "
            "(the right tool with a wrong value), extra_action (a harmful action that should not have been "
            "taken), wrong_information (the agent told the user something false or incomplete), "
            "tool_error_mishandled (a tool error the agent ignored or repeated), reasoning_error (a wrong "
            "inference or calculation), policy_violation (a rule of the task or domain broken), other."
        )
    )
    step: int | None = Field(
        default=None,
        description="The root cause: the `index` of the earliest step from which the run never recovered, traced "
        "back from the symptom; null if unknown.",
    )
    symptom_step: int | None = Field(
        default=None,
        description="Where the failure became visible (the wrong write, the wrong final answer); the same as `step` "
        "when nothing earlier caused it; null if unknown.",
    )
    actor: str | None = Field(
        default=None, description="The agent or role that took that step (for multi-agent traces: its name)."
    )
    tool: str | None = Field(
        default=None, description="The tool involved, if any (the called or the expected tool)."
    )
    argument: str | None = Field(
        default=None,
        description="The argument that differs, as a path into the call's arguments (e.g. `passengers[1].dob`).",
    )
    actual: str | None = Field(
        default=None, description="What the agent did or used there (a value or a short call)."
    )
    expected: str | None = Field(
        default=None, description="What it should have been, and where that comes from."
    )
    evidence: list[int] = Field(
        default_factory=list, description="Ids of the cells whose output shows this (the N of `[cell N]`)."
    )
    confidence: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="How sure the diagnosis is: 1.0 when a cell compared the trace with its expected actions.",
    )
    summary: str = Field(
        default="", description="One sentence: what the agent did at that step and why it is wrong."
    )


class ReflectionDraft(BaseModel):
    # What the model is allowed to produce. `raw` is deliberately absent: the workflow fills it.
    # No docstring on purpose: pydantic would put it in the JSON schema and pydantic-ai would append it to
    # the output tool's description, which is `reflector.analysis.prompts.OUTPUT_TOOL_DESCRIPTION` (what the model reads).

    reasoning: str = Field(
        description="How you reached the conclusion: the checks you ran, by cell, and what each showed."
    )
    error_identification: str = Field(
        description="What went wrong, concretely: the step index, the tool call or message, and the wrong value or "
        "omission. If nothing went wrong, say so and what shows it."
    )
    root_cause_analysis: str = Field(
        description="Why the agent did it: the check it skipped, the rule it misread or the assumption it made. "
        "Say so when the trace does not show the cause."
    )
    correct_approach: str = Field(
        description="What the agent should have done at that step, precisely enough to follow (tool, arguments, rule)."
    )
    key_insight: str = Field(description="The one lesson to keep, in one sentence.")
    extracted_learnings: list[ExtractedLearning] = Field(
        default_factory=list,
        description="Atomic, reusable learnings (usually 1 to 3), each about one tool, argument or rule, each with evidence.",
    )
    skill_tags: list[SkillTag] = Field(
        default_factory=list,
        description="Online mode: every cited skill that exists in the skillbook (exact id match), tagged; otherwise empty.",
    )
    diagnosis: Diagnosis | None = Field(
        default=None,
        description="The decisive failure: its root cause (`step`) and its symptom (`symptom_step`). Null only when "
        "the run did not fail or no step could be identified.",
    )


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


class CellCitation(BaseModel):
    """One cell a learning cites in its `evidence` ("cell N", optionally with quoted text), as the
    workflow checked it against what that cell printed (`reflector.analysis.citations`)."""

    learning: int  # index in `extracted_learnings`
    cell: int  # the cited cell id: the N of the "[cell N]" line that heads every cell output the model sees
    exists: bool  # a cell with that id ran in this session (cell 1 is the prefill shown in the task prompt)
    quote: str = (
        ""  # a quoted text of the evidence attributed to this cell ("" when the evidence quotes none)
    )
    printed: bool = True  # the quote appears in that cell's output (as printed, or JSON/repr-escaped)

    @property
    def supported(self) -> bool:
        return self.exists and self.printed


class ReflectorOutput(ReflectionDraft):
    """The reflection returned by `ReflectionWorkflow`.

    `raw` carries `rr_trace`, `usage`, `thoughts`, `workflow_id` (and `model`), all written by the
    workflow from its own state. `citations` links each learning to the cells its evidence cites and
    says whether each citation holds (the cell ran, the quoted text is in its output).
    """

    # ACE's ReflectorOutput defaults these two to "" (the draft the model writes still requires them)
    error_identification: str = ""
    root_cause_analysis: str = ""
    raw: dict[str, Any] = Field(default_factory=dict)
    citations: list[CellCitation] = Field(default_factory=list)


class ChildProgress(BaseModel):
    """A child session as its parent's `progress` query describes it (usage: for a finished child)."""

    workflow_id: str
    done: bool = False
    requests: int = 0
    total_tokens: int = 0
    stop_reason: str | None = None


class Progress(BaseModel):
    """Answer of the workflow's `progress` query (`rr status`, and `rr reflect` while it waits).

    `cells` counts the cells the model wrote; `last_cell` is the id of the latest cell that ran (its
    sequence number, the N of "[cell N]": ids count the prefill and internal cells too, so the latest id
    is not the count). `requests` / `total_tokens` are this session's ledger: its own requests and those
    of its finished children, against `max_requests` / `max_tokens`, its budget (the tree's budget for the
    root, the allocation carved for it for a child); a running child's usage reaches the ledger when the
    child ends, so `rr status` adds the running children's own progress to get the tree total.
    """

    phase: str = "starting"
    iterations: int = 0
    cells: int = 0
    failed_cells: int = 0
    requests: int = 0
    total_tokens: int = 0
    last_event: str = ""
    model: str = ""
    depth: int = 0
    max_depth: int = 0
    max_requests: int = 0  # 0: answered by a worker older than these fields
    max_tokens: int = 0
    last_cell: int = 0  # 0: no cell ran yet
    last_tool: str = ""  # the tool(s) the model called in its latest response ("" before the first)
    compactions: int = 0
    microcompactions: int = 0
    children_started: int = 0
    children_done: int = 0
    child_running: str = ""  # the workflow id of the child running now ("" when none)
    children: list[ChildProgress] = Field(default_factory=list)  # every child started, in order
    continued_as_new: int = 0


class ReflectorDeps(BaseModel):
    """The agent's run dependencies: small and serialisable (they ride along every model-request activity)."""

    workflow_id: str
    depth: int = 0
    max_depth: int = 2
    max_tokens: int = 500_000
    max_requests: int = 50
    has_skillbook: bool = False
    may_recurse: bool = True  # set by the workflow: `recurse` is offered (`workflows.tools.recurse_offered`)
