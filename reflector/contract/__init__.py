"""The durable contract: every name recorded in a Temporal history and every persisted model.

Workflow, activity, agent, toolset, tool, query and patch names are written into histories (activity
types, markers, patch ids); the models below are workflow and activity inputs and outputs, so they
are written there too. A history recorded by one version replays on the next only if all of this
stays as it is: new fields always get defaults, existing names never change. Everything else in the
code base refers to these constants; none of them is spelled out anywhere else.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reflector.analysis.ledger import Ledger
from reflector.analysis.traces import TraceFormat
from sandbox.protocol import SESSION_ID_PATTERN

# ------------------------------------------------------------------------------------------ names

WORKFLOW_NAME = "ReflectionWorkflow"  # the workflow type of every session, root or child
PROGRESS_QUERY = "progress"  # ReflectionWorkflow's query (the CLI's progress line)

AGENT_NAME = "rr_reflector"  # pydantic-ai derives its activity names from these
SYNTH_AGENT_NAME = "rr_synthesizer"
TOOLSET_ID = "rr_tools"
OUTPUT_TOOL = "final_result"
EXECUTE_CODE_TOOL = "execute_code"
THINK_TOOL = "think"
RECURSE_TOOL = "recurse"
SKILL_TOOLS = ("list_skill_sections", "get_skill", "search_skills")

PREPARE_ACTIVITY = "rr.sandbox.prepare_session"
RUN_CELL_ACTIVITY = "rr.sandbox.run_cell"
EXPORT_ACTIVITY = "rr.sandbox.export_session"
CLOSE_ACTIVITY = "rr.sandbox.close_session"
SUMMARISE_ACTIVITY = "rr.summarise"
FORGET_ACTIVITY = "rr.model.forget_responses"
LOCAL_MODEL_SUFFIX = "_local"  # pydantic-ai's model-request activity name + this: the local-activity variant
# `rr rerun`: local activities that answer a reused step from the origin's recorded prefix (`RerunOf`)
RERUN_RESPONSE_ACTIVITY = "rr.rerun.reused_response"
RERUN_CELL_ACTIVITY = "rr.rerun.reused_cell"
RERUN_CHILD_ACTIVITY = "rr.rerun.reused_child"
RERUN_SUMMARY_ACTIVITY = "rr.rerun.reused_summary"
SKILL_LOOKUP_ACTIVITY = "rr.skillbook.look_up"  # a skill tool's answer from a skillbook blob (`SkillbookRef`)

LOCAL_MODEL_PATCH = "rr-local-model-requests"
"""Workflows recorded before this change keep replaying their model requests as regular activities."""
PROVIDER_MODEL_PATCH = "rr-provider-model-activities"
"""Workflows recorded before this change keep replaying provider model requests as local activities."""

PAYLOAD_DRIVER_NAME = "rr-blobs"  # external payload storage driver, named in every stored payload
PAYLOAD_S3_DRIVER_NAME = "rr-s3"  # temporalio's S3StorageDriver as rr names it (RR_BLOB_URL=s3://...)

StopReason = Literal["completed", "token_budget", "request_budget", "max_compactions", "error", "cancelled"]

CANCEL_PATCH = "rr-cancelled-output"
"""A cancelled reflection (or batch) returns its findings so far; cancelled before this: the workflow was cancelled."""

# Custom search attributes (Temporal visibility; `rr list`, the Web UI's filters): set at start by the client
# (children: by their parent), stop reason and totals upserted at the end, only where they are registered
# (`ReflectionInput.search_attributes`). Registered by the embedded server and by `rr setup`.
SA_MODEL = "RrModel"
SA_STOP_REASON = "RrStopReason"
SA_TRACE_SHA256 = "RrTraceSha256"
SA_BATCH_ID = "RrBatchId"
SA_PARENT = "RrParent"
SA_REQUESTS = "RrRequests"
SA_TOKENS = "RrTokens"
SA_CHILDREN = "RrChildren"
SEARCH_ATTRIBUTES: dict[str, str] = {  # name -> Temporal's type name (`temporal ... --search-attribute NAME=TYPE`)
    SA_MODEL: "Keyword", SA_STOP_REASON: "Keyword", SA_TRACE_SHA256: "Keyword", SA_BATCH_ID: "Keyword",
    SA_PARENT: "Keyword", SA_REQUESTS: "Int", SA_TOKENS: "Int", SA_CHILDREN: "Int",
}
SEARCH_ATTRIBUTES_PATCH = "rr-search-attributes"
"""Reflections and batches upsert their stop reason and totals when they end (and give children memo and attributes)."""
RECURSE_BY_STRATEGY_PATCH = "rr-recurse-by-strategy"
"""`recurse` is offered only where the strategy allows children (`ReflectionConfig.recursion`); recorded before
this change: below max_depth, as then (a recorded response may call it)."""
TOOL_ARG_CAPS_PATCH = "rr-tool-argument-caps"
"""`recurse` refuses a `prompt` or `context_code` over its cap (`reflector.analysis.limits`) with a tool error; recorded
before this change: the child was started with whatever the model wrote."""
INLINE_SKILLBOOK_PATCH = "rr-inline-skillbook-cap"
"""An inline `ReflectionInput.skillbook` over `reflector.analysis.limits.MAX_INLINE_SKILLBOOK_CHARS` ends the session with
an error before it starts (parsing it in workflow code blocked every workflow task); recorded before: parsed."""
MEMO_KEY = "rr_display"  # the memo set at start, for display (`rr list`): {"trace": file name, "format", "size", "runs"}

_SAFE_SESSION = re.compile(SESSION_ID_PATTERN)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ------------------------------------------------------------------------------------ the workflow


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
    search_attributes: bool = False  # the namespace has rr's search attributes: set them on children, upsert at the end
    skillbook_ref: SkillbookRef | None = None  # the skillbook, in the blob store (takes the place of `skillbook`)


# The field descriptions below are the output tool's JSON schema: they are what a model reads about each
# field, so they say what to put there (they change no validation).


class ExtractedLearning(BaseModel):
    """One atomic, reusable lesson from this trace, with the evidence it rests on."""

    learning: str = Field(
        description="One actionable rule that names the tool, argument or policy it is about "
        "(e.g. \"Before book_reservation, confirm each passenger's date of birth with the user\")."
    )
    atomicity_score: float = Field(
        ge=0.0, le=1.0,
        description="How atomic the learning is, 0 to 1: 1.0 for a single rule about one thing; lower when it "
        "bundles several ideas or stays vague.",
    )
    evidence: str = Field(
        default="",
        description="The cells that show it, each as `cell N: \"exact text it printed\"` with the step index "
        "(e.g. `cell 3: \"dob 1990-01-01 != 1990-10-01\" at step 14`); several separated by `; `.",
    )
    justification: str = Field(
        default="", description="Why the evidence supports this learning, and how following it would have avoided the failure."
    )


class SkillTag(BaseModel):
    """A skillbook skill the trace cites, tagged by its effect on the outcome (online mode)."""

    id: str = Field(description="The skill's id exactly as in the skillbook, without brackets (e.g. `section-00001`).")
    tag: Literal["helpful", "harmful", "neutral"] = Field(description="What following the skill did to this run.")


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
        description="The root cause: index (`traces['steps'][i]['index']`) of the earliest step from which the run "
        "never recovered (the misread output, the skipped check, the misunderstood request, the made-up value), "
        "traced back from the symptom; null if unknown.",
    )
    symptom_step: int | None = Field(
        default=None,
        description="Where the failure became visible (the wrong write, the wrong final answer); the same as `step` "
        "when nothing earlier caused it; null if unknown.",
    )
    actor: str | None = Field(
        default=None, description="The agent or role that took that step (for multi-agent traces: its name)."
    )
    tool: str | None = Field(default=None, description="The tool involved, if any (the called or the expected tool).")
    argument: str | None = Field(
        default=None,
        description="The argument that differs, as a path into the call's arguments (e.g. `passengers[1].dob`).",
    )
    actual: str | None = Field(default=None, description="What the agent did or used there (a value or a short call).")
    expected: str | None = Field(default=None, description="What it should have been, and where that comes from.")
    evidence: list[int] = Field(
        default_factory=list, description="Ids of the cells whose output shows this (the N of `[cell N]`)."
    )
    confidence: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="How sure the diagnosis is: 1.0 when a cell compared the trace with its expected actions.",
    )
    summary: str = Field(default="", description="One sentence: what the agent did at that step and why it is wrong.")


class ReflectionDraft(BaseModel):
    # What the model is allowed to produce. `raw` is deliberately absent: the workflow fills it.
    # No docstring on purpose: pydantic would put it in the JSON schema and pydantic-ai would append it to
    # the output tool's description, which is `reflector.analysis.prompts.OUTPUT_TOOL_DESCRIPTION` (what the model reads).

    reasoning: str = Field(description="How you reached the conclusion: the checks you ran, by cell, and what each showed.")
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
    quote: str = ""  # a quoted text of the evidence attributed to this cell ("" when the evidence quotes none)
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


# -------------------------------------------------------------------------- the sandbox activities


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
    seq: int = 0  # the cell id (its sequence number in the session); 0 in outcomes recorded before it was added


class CloseSessionInput(_Frozen):
    session_id: str


# --------------------------------------------------------------------------- the summarise activity


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


# ------------------------------------------------------------------------------ rr rerun


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


# ------------------------------------------------------------------------------ batch reflection

BATCH_WORKFLOW_NAME = "BatchReflectionWorkflow"  # the parent of a batch: one child ReflectionWorkflow per run
# (its query is PROGRESS_QUERY too, answered with a `BatchProgress`)
READ_MANIFEST_ACTIVITY = "rr.batch.read_manifest"
RECORD_RUN_ACTIVITY = "rr.batch.record_run"
WRITE_RECORDS_ACTIVITY = "rr.batch.write_records"
SYNTHESISE_BATCH_ACTIVITY = "rr.batch.synthesise"

RunOutcome = Literal["success", "failure", "unknown"]
RunStatus = Literal["reflected", "failed"]


class BatchRun(_Frozen):
    """One run of a batch, as the manifest lists it: its trace blob, or why it could not be read."""

    index: int
    run_id: str
    source: str = ""  # the file (and record) it came from
    trace: TraceRef | None = None
    error: str | None = None  # a broken run: reported as failed, never reflected on


class ManifestRef(_Frozen):
    """The manifest of a batch: a JSONL blob of `BatchRun`s (one per line, in index order)."""

    sha256: str
    size: int
    n_runs: int = Field(ge=1)


class BatchCursor(BaseModel):
    """Where a batch is: carried across continue-as-new (the new run resumes from it)."""

    next_index: int = 0  # the first run not started yet
    offset: int = 0  # its byte offset in the manifest
    reflected: int = 0
    failed: int = 0
    record_pages: list[str] = Field(default_factory=list)  # sha256 of each blob of `RunRecord`s, in index order
    runs: int = 1  # runs of the continue-as-new chain so far (this one included)
    requests: int = 0  # model requests of the children so far (the RrRequests / RrTokens search attributes)
    total_tokens: int = 0


class BatchInput(_Frozen):
    """The single input of `BatchReflectionWorkflow`."""

    manifest: ManifestRef
    config: ReflectionConfig = ReflectionConfig()
    skillbook: str = ""  # inline text: inputs recorded before `skillbook_ref`
    mode: Literal["online", "offline"] = "offline"
    concurrency: int = Field(default=8, ge=1, le=1_000)
    children_per_run: int = Field(default=500, ge=1)  # continue-as-new after this many children
    page_size: int = Field(default=100, ge=1, le=1_000)  # manifest entries read per activity
    llm_synthesis: bool | None = None  # None: one reflection session over the records when the model is an LLM
    cursor: BatchCursor | None = None
    search_attributes: bool = False  # as `ReflectionInput.search_attributes` (handed to every child)
    skillbook_ref: SkillbookRef | None = None  # handed to every child


class BatchProgress(BaseModel):
    """Answer of the batch's `progress` query."""

    phase: str = "starting"
    total: int = 0
    done: int = 0  # reflected
    running: int = 0
    failed: int = 0
    continued_as_new: int = 0
    last_event: str = ""


class RunRecord(BaseModel):
    """The compact record of one run of a batch (kept in the blob store, never in a history).

    The facts (reward, outcome, failing tools, action differences) are read from the run's trace; the
    diagnosis (what went wrong, root cause, learnings, skill tags) from its reflection, shortened. The
    full reflection is the output of the child workflow `workflow_id`.
    """

    index: int
    run_id: str
    source: str = ""
    status: RunStatus
    error: str | None = None
    workflow_id: str | None = None
    trace_sha256: str | None = None
    format: TraceFormat = "unknown"
    reward: float | None = None
    outcome: RunOutcome = "unknown"
    answer_correct: bool | None = None
    stop_reason: str | None = None
    failing_tools: dict[str, int] = Field(default_factory=dict)  # tool -> error results in this run
    missing_actions: list[str] = Field(default_factory=list)  # names of expected actions not taken as expected
    unexpected_actions: list[str] = Field(default_factory=list)  # names of state-changing calls not expected
    what_went_wrong: str = ""
    root_cause: str = ""
    key_insight: str = ""
    learnings: list[str] = Field(default_factory=list)
    skill_tags: list[SkillTag] = Field(default_factory=list)
    failure_modes: list[str] = Field(default_factory=list)  # the keys this run counts toward (see FailureMode)
    diagnosis: Diagnosis | None = None  # the reflection's decisive failure (step, kind, tool, ...)
    facts_error: str | None = None


class ReadManifestInput(_Frozen):
    manifest: ManifestRef
    offset: int
    first_index: int
    limit: int = Field(ge=1)


class ManifestPage(BaseModel):
    runs: list[BatchRun]
    next_offset: int


class RecordRunInput(_Frozen):
    batch_id: str
    run: BatchRun
    workflow_id: str | None = None
    output: ReflectorOutput | None = None
    error: str | None = None


class WriteRecordsInput(_Frozen):
    batch_id: str
    records: list[str]  # sha256 of each run's record, in index order


class FailureMode(BaseModel):
    """A failure mode and the runs it occurs in (each run counted once, however often it failed so)."""

    key: str  # e.g. "tool_error:get_user_details", "missing_action:book_reservation", "answer_mismatch"
    label: str
    runs: int
    failing_runs: int  # of them, runs whose outcome is a failure
    share: float  # runs / reflected runs
    run_ids: list[str]  # evidence: the first MAX_CITED ids, in run order
    more_runs: int = 0  # runs not cited


class RecurringText(BaseModel):
    """A learning (or skill tag) that several runs' reflections share, with the runs that say it."""

    text: str
    runs: int
    run_ids: list[str]
    more_runs: int = 0


class FailedRun(BaseModel):
    index: int
    run_id: str
    error: str


class BatchSynthesis(BaseModel):
    """The computed synthesis over a batch's run records: deterministic, every number a count of runs."""

    method: str
    n_runs: int
    reflected: int
    failed: int
    outcomes: dict[str, int]  # success / failure / unknown -> runs
    mean_reward: float | None = None
    incomplete_reflections: int = 0
    failure_modes: list[FailureMode] = Field(default_factory=list)  # recurring ones (>= 2 runs) first, by runs
    single_run_modes: int = 0  # modes seen in one run only (listed only in the records)
    recurring_learnings: list[RecurringText] = Field(default_factory=list)
    harmful_skills: list[RecurringText] = Field(default_factory=list)
    failed_runs: list[FailedRun] = Field(default_factory=list)  # the first ones; the records list all
    summary: str = ""


class SynthesiseBatchInput(_Frozen):
    batch_id: str
    record_pages: list[str]
    n_runs: int


class SynthesiseBatchResult(BaseModel):
    synthesis: BatchSynthesis
    records: TraceRef  # every RunRecord as one JSON list (the LLM synthesis session's trace)


class BatchOutput(BaseModel):
    """What `BatchReflectionWorkflow` returns: counts, the synthesis and where the records are."""

    batch_id: str
    model: str
    n_runs: int
    reflected: int
    failed: int
    continued_as_new: int = 0
    synthesis: BatchSynthesis
    records: TraceRef
    llm_synthesis: ReflectorOutput | None = None
    llm_synthesis_error: str | None = None
    cancelled: bool = False  # cancelled (`rr cancel`): no run was started after it; the counts are the runs so far


class BatchResult(BatchOutput):
    """`reflector.client.reflect_batch`'s answer: the output plus every run's record (each record's
    `workflow_id` is the child reflection: `fetch_result(client, record.workflow_id)` gives it in full)."""

    run_records: list[RunRecord] = Field(default_factory=list)
