"""The durable contract: every name recorded in a Temporal history and every persisted model.

Workflow, activity, agent, toolset, tool, query and patch names are written into histories (activity
types, markers, patch ids); the models below are workflow and activity inputs and outputs, so they
are written there too. A history recorded by one version replays on the next only if all of this
stays as it is: new fields always get defaults, existing names never change. Everything else in the
code base refers to these constants; none of them is spelled out anywhere else.

`names` (the durable names), `workflow` (the reflection's models), `activities` (the sandbox, summarise
and rerun activities' models), `batch` (batch reflection's models); all re-exported here. The names are
imported at once (plain constants); the models on first use (PEP 562 `__getattr__`), so a process that needs
only names (a home's keeper registering the search attributes) imports neither pydantic nor the models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflector.contract.names import (
    AGENT_NAME,
    BATCH_WORKFLOW_NAME,
    CANCEL_PATCH,
    CLOSE_ACTIVITY,
    EXECUTE_CODE_TOOL,
    EXPORT_ACTIVITY,
    FORGET_ACTIVITY,
    INLINE_SKILLBOOK_PATCH,
    LOCAL_MODEL_PATCH,
    LOCAL_MODEL_SUFFIX,
    MEMO_KEY,
    OUTPUT_TOOL,
    PATCHES_FIRST_PATCH,
    PAYLOAD_DRIVER_NAME,
    PAYLOAD_S3_DRIVER_NAME,
    PREPARE_ACTIVITY,
    PROGRESS_QUERY,
    PROMPT_CACHE_PATCH,
    PROVIDER_MODEL_PATCH,
    READ_MANIFEST_ACTIVITY,
    RECORD_RUN_ACTIVITY,
    RECURSE_BY_STRATEGY_PATCH,
    RECURSE_TOOL,
    RERUN_CELL_ACTIVITY,
    RERUN_CHILD_ACTIVITY,
    RERUN_RESPONSE_ACTIVITY,
    RERUN_SUMMARY_ACTIVITY,
    RUN_CELL_ACTIVITY,
    SA_BATCH_ID,
    SA_CHILDREN,
    SA_MODEL,
    SA_PARENT,
    SA_REQUESTS,
    SA_STOP_REASON,
    SA_TOKENS,
    SA_TRACE_SHA256,
    SEARCH_ATTRIBUTES,
    SEARCH_ATTRIBUTES_PATCH,
    SKILL_LOOKUP_ACTIVITY,
    SKILL_TOOLS,
    SUMMARISE_ACTIVITY,
    SYNTH_AGENT_NAME,
    SYNTHESISE_BATCH_ACTIVITY,
    THINK_TOOL,
    TOOL_ARG_CAPS_PATCH,
    TOOLSET_ID,
    WORKFLOW_NAME,
    WRITE_RECORDS_ACTIVITY,
    StopReason,
)

if TYPE_CHECKING:
    from reflector.contract.activities import (
        PREFILL_CODE,
        CellInput,
        CellOutcome,
        CloseSessionInput,
        ExportInput,
        ExportResult,
        LimitsInput,
        PrepareSessionInput,
        PrepareSessionResult,
        RerunPrefix,
        ReusedCellInput,
        ReusedChild,
        ReusedItemInput,
        SkillLookupInput,
        SummariseInput,
        SummariseResult,
        TraceFacts,
        session_key,
    )
    from reflector.contract.batch import (
        BatchCursor,
        BatchInput,
        BatchOutput,
        BatchProgress,
        BatchResult,
        BatchRun,
        BatchSynthesis,
        FailedRun,
        FailureMode,
        ManifestPage,
        ManifestRef,
        ReadManifestInput,
        RecordRunInput,
        RecurringText,
        RunOutcome,
        RunRecord,
        RunStatus,
        SynthesiseBatchInput,
        SynthesiseBatchResult,
        WriteRecordsInput,
    )
    from reflector.contract.workflow import (
        DIAGNOSIS_KINDS,
        CellCitation,
        ChildProgress,
        Continuation,
        Counters,
        Diagnosis,
        DiagnosisKind,
        ExtractedLearning,
        Progress,
        ReflectionConfig,
        ReflectionDraft,
        ReflectionInput,
        ReflectorDeps,
        ReflectorOutput,
        RerunOf,
        RunTrace,
        SkillbookRef,
        SkillTag,
        TraceRef,
    )

# the submodules defining the models re-exported below (imported on the first use of one of them)
_MODEL_MODULES = ("workflow", "activities", "batch")

if not TYPE_CHECKING:  # hidden from type checkers, which then check every imported name against the above

    def __getattr__(name: str) -> Any:
        if name in __all__:
            for submodule in _MODEL_MODULES:
                # `__import__`, not `importlib.import_module`: inside Temporal's workflow sandbox the builtin
                # is the sandbox's importer, as for an import statement
                module = __import__(f"{__name__}.{submodule}", fromlist=[name])
                if hasattr(module, name):
                    value = getattr(module, name)
                    globals()[name] = value
                    return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})


__all__ = [
    "AGENT_NAME",
    "BATCH_WORKFLOW_NAME",
    "BatchCursor",
    "BatchInput",
    "BatchOutput",
    "BatchProgress",
    "BatchResult",
    "BatchRun",
    "BatchSynthesis",
    "CANCEL_PATCH",
    "CLOSE_ACTIVITY",
    "CellCitation",
    "CellInput",
    "CellOutcome",
    "ChildProgress",
    "CloseSessionInput",
    "Continuation",
    "Counters",
    "DIAGNOSIS_KINDS",
    "Diagnosis",
    "DiagnosisKind",
    "EXECUTE_CODE_TOOL",
    "EXPORT_ACTIVITY",
    "ExportInput",
    "ExportResult",
    "ExtractedLearning",
    "FORGET_ACTIVITY",
    "FailedRun",
    "FailureMode",
    "INLINE_SKILLBOOK_PATCH",
    "PATCHES_FIRST_PATCH",
    "PROMPT_CACHE_PATCH",
    "LOCAL_MODEL_PATCH",
    "LOCAL_MODEL_SUFFIX",
    "LimitsInput",
    "MEMO_KEY",
    "ManifestPage",
    "ManifestRef",
    "OUTPUT_TOOL",
    "PAYLOAD_DRIVER_NAME",
    "PAYLOAD_S3_DRIVER_NAME",
    "PREFILL_CODE",
    "PREPARE_ACTIVITY",
    "PROGRESS_QUERY",
    "PROVIDER_MODEL_PATCH",
    "PrepareSessionInput",
    "PrepareSessionResult",
    "Progress",
    "READ_MANIFEST_ACTIVITY",
    "RECORD_RUN_ACTIVITY",
    "RECURSE_BY_STRATEGY_PATCH",
    "RECURSE_TOOL",
    "RERUN_CELL_ACTIVITY",
    "RERUN_CHILD_ACTIVITY",
    "RERUN_RESPONSE_ACTIVITY",
    "RERUN_SUMMARY_ACTIVITY",
    "RUN_CELL_ACTIVITY",
    "ReadManifestInput",
    "RecordRunInput",
    "RecurringText",
    "ReflectionConfig",
    "ReflectionDraft",
    "ReflectionInput",
    "ReflectorDeps",
    "ReflectorOutput",
    "RerunOf",
    "RerunPrefix",
    "ReusedCellInput",
    "ReusedChild",
    "ReusedItemInput",
    "RunOutcome",
    "RunRecord",
    "RunStatus",
    "RunTrace",
    "SA_BATCH_ID",
    "SA_CHILDREN",
    "SA_MODEL",
    "SA_PARENT",
    "SA_REQUESTS",
    "SA_STOP_REASON",
    "SA_TOKENS",
    "SA_TRACE_SHA256",
    "SEARCH_ATTRIBUTES",
    "SEARCH_ATTRIBUTES_PATCH",
    "SKILL_LOOKUP_ACTIVITY",
    "SKILL_TOOLS",
    "SUMMARISE_ACTIVITY",
    "SYNTHESISE_BATCH_ACTIVITY",
    "SYNTH_AGENT_NAME",
    "SkillLookupInput",
    "SkillTag",
    "SkillbookRef",
    "StopReason",
    "SummariseInput",
    "SummariseResult",
    "SynthesiseBatchInput",
    "SynthesiseBatchResult",
    "THINK_TOOL",
    "TOOLSET_ID",
    "TOOL_ARG_CAPS_PATCH",
    "TraceFacts",
    "TraceRef",
    "WORKFLOW_NAME",
    "WRITE_RECORDS_ACTIVITY",
    "WriteRecordsInput",
    "session_key",
]
