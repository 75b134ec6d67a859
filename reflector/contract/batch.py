"""Batch reflection's persisted models: the manifest, the cursor, the records and the synthesis."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from reflector.analysis.traces import TraceFormat
from reflector.contract.workflow import (
    Diagnosis,
    ReflectionConfig,
    ReflectorOutput,
    SkillbookRef,
    SkillTag,
    TraceRef,
    _Frozen,
)

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
    record_pages: list[str] = Field(
        default_factory=list
    )  # sha256 of each blob of `RunRecord`s, in index order
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
    llm_synthesis: bool | None = (
        None  # None: one reflection session over the records when the model is an LLM
    )
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
    missing_actions: list[str] = Field(
        default_factory=list
    )  # names of expected actions not taken as expected
    unexpected_actions: list[str] = Field(default_factory=list)  # names of state-changing calls not expected
    what_went_wrong: str = ""
    root_cause: str = ""
    key_insight: str = ""
    learnings: list[str] = Field(default_factory=list)
    skill_tags: list[SkillTag] = Field(default_factory=list)
    failure_modes: list[str] = Field(
        default_factory=list
    )  # the keys this run counts toward (see FailureMode)
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
    failure_modes: list[FailureMode] = Field(
        default_factory=list
    )  # recurring ones (>= 2 runs) first, by runs
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
    cancelled: bool = (
        False  # cancelled (`rr cancel`): no run was started after it; the counts are the runs so far
    )


class BatchResult(BatchOutput):
    """`reflector.client.reflect_batch`'s answer: the output plus every run's record (each record's
    `workflow_id` is the child reflection: `fetch_result(client, record.workflow_id)` gives it in full)."""

    run_records: list[RunRecord] = Field(default_factory=list)
