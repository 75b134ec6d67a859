"""The durable names: workflow, query, agent, toolset, tool, activity, patch, search-attribute and
payload-driver names, each spelled out once. They are written into histories: never renamed."""

from __future__ import annotations

from typing import Literal

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
SEARCH_ATTRIBUTES: dict[
    str, str
] = {  # name -> Temporal's type name (`temporal ... --search-attribute NAME=TYPE`)
    SA_MODEL: "Keyword",
    SA_STOP_REASON: "Keyword",
    SA_TRACE_SHA256: "Keyword",
    SA_BATCH_ID: "Keyword",
    SA_PARENT: "Keyword",
    SA_REQUESTS: "Int",
    SA_TOKENS: "Int",
    SA_CHILDREN: "Int",
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
PROMPT_CACHE_PATCH = "rr-prompt-cache"
"""Provider requests carry prompt-cache settings when the config says nothing (`reflector.analysis.prompt_cache`);
recorded before this change: the config's settings as they were."""
PATCHES_FIRST_PATCH = "rr-patches-first"
"""Every patch above is decided once, before the run's first command (`workflows.patches`): a run recorded with
this marker has all of them on and records no other patch marker; recorded before it: each asked where used."""
FORGET_ONLY_CACHED_PATCH = "rr-forget-only-cached"
"""A session deletes its cached model responses (`FORGET_ACTIVITY`, a regular activity: one more workflow task and
activity per reflection) only when one of its runs made an in-process model request, the only kind cached;
recorded before this change: every session did, provider-model ones included (asked at start, `workflows.patches`)."""
MEMO_KEY = "rr_display"  # the memo set at start, for display (`rr list`): {"trace": file name, "format", "size", "runs"}

BATCH_WORKFLOW_NAME = "BatchReflectionWorkflow"  # the parent of a batch: one child ReflectionWorkflow per run
# (its query is PROGRESS_QUERY too, answered with a `BatchProgress`)
READ_MANIFEST_ACTIVITY = "rr.batch.read_manifest"
RECORD_RUN_ACTIVITY = "rr.batch.record_run"
WRITE_RECORDS_ACTIVITY = "rr.batch.write_records"
SYNTHESISE_BATCH_ACTIVITY = "rr.batch.synthesise"
