"""`ReflectionWorkflow`: one durable reflection session.

Deterministic orchestration only: the prefill, every sandbox cell and every model request are
activities recorded in history; this code decides, counts and assembles the output. Whatever
happens inside the agent loop (budget spent, a model that never answers properly), the workflow
returns a `ReflectorOutput` with a typed stop reason instead of failing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import capture_run_messages
    from pydantic_ai.exceptions import AgentRunError, UnexpectedModelBehavior, UsageLimitExceeded
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolReturnPart
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.usage import UsageLimits

    from reflector import prompts
    from reflector.cells import (
        CLOSE_ACTIVITY,
        PREPARE_ACTIVITY,
        CloseSessionInput,
        PrepareSessionInput,
        PrepareSessionResult,
    )
    from reflector.types import (
        Progress,
        ReflectionDraft,
        ReflectionInput,
        ReflectorOutput,
        RunTrace,
        StopReason,
        UsageSummary,
    )
    from workflows.agent import ReflectorDeps, reflector_agent
    from workflows.session import CELL_RETRY, REBUILD_ALLOWANCE_S, SessionEnded, SessionState

__all__ = ["ReflectionWorkflow", "WORKFLOW_NAME"]

WORKFLOW_NAME = "ReflectionWorkflow"
PREVIEW_CHARS = 4_000


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)
class ReflectionWorkflow(PydanticAIWorkflow):
    """One reflection session.

    Runs outside Temporal's Python workflow sandbox (`sandboxed=False`): under load the sandbox's
    per-run module re-import and per-call proxying cost ~30% of the worker's CPU per step
    (measured in `bench/throughput.py`: 39 -> 56 steps/s at 50 concurrent reflections). What the
    sandbox would catch at run time is guarded instead by a lint rule banning clocks, randomness
    and uuid4 in workflow code, by tests that run with `max_cached_workflows=0` (every task
    replays from scratch), and by replaying committed histories in CI. Everything imported here
    is side-effect free at import time.
    """

    __pydantic_ai_agents__ = [reflector_agent]

    @workflow.init
    def __init__(self, inp: ReflectionInput) -> None:
        self.state = SessionState(inp=inp, session_id=workflow.info().workflow_id)

    @workflow.query
    def progress(self) -> Progress:
        usage = self.state.usage
        return self.state.progress(
            requests=getattr(usage, "requests", 0),
            total_tokens=getattr(usage, "total_tokens", 0),
            iterations=self.state.iterations,
        )

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        cfg = inp.config
        state = self.state
        state.phase = "preparing sandbox"
        prep: PrepareSessionResult = await workflow.execute_local_activity(
            PREPARE_ACTIVITY,
            PrepareSessionInput(
                session_id=state.session_id,
                trace=inp.trace,
                question=inp.question,
                ground_truth=inp.ground_truth,
                feedback=inp.feedback,
                skillbook=inp.skillbook,
                limits=state.limits,
            ),
            result_type=PrepareSessionResult,
            start_to_close_timeout=timedelta(seconds=cfg.cell_timeout_s + REBUILD_ALLOWANCE_S),
            retry_policy=CELL_RETRY,
            summary="prefill",
        )
        state.init_ref = prep.init_ref
        state.phase = "thinking"

        deps = ReflectorDeps(
            workflow_id=state.session_id, depth=inp.depth, max_tokens=cfg.max_tokens, max_requests=cfg.max_requests
        )
        draft: ReflectionDraft | None = None
        stop_reason: StopReason = "completed"
        error = ""
        with capture_run_messages() as messages:
            try:
                result = await reflector_agent.run(
                    self._task_prompt(prep),
                    deps=deps,
                    model=cfg.model,
                    model_settings=_model_settings(cfg.model_settings),
                    usage_limits=UsageLimits(request_limit=cfg.max_requests, total_tokens_limit=cfg.max_tokens),
                )
                draft = result.output
            except SessionEnded as e:
                draft = e.draft
                if draft is None:
                    stop_reason, error = e.stop_reason, e.detail  # type: ignore[assignment]
            except UsageLimitExceeded as e:
                stop_reason = "request_budget" if "request" in str(e).lower() else "token_budget"
                error = str(e)
            except (UnexpectedModelBehavior, AgentRunError) as e:
                stop_reason, error = "error", f"{type(e).__name__}: {e}"
        state.phase = "finishing"
        await workflow.execute_local_activity(
            CLOSE_ACTIVITY,
            CloseSessionInput(session_id=state.session_id),
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=CELL_RETRY,
            summary="close sandbox",
        )
        state.phase = "done"
        return self._output(draft, list(messages), stop_reason, error)

    def _task_prompt(self, prep: PrepareSessionResult) -> str:
        inp = self.state.inp
        preview = prep.preview
        if len(preview) > PREVIEW_CHARS:
            preview = preview[:PREVIEW_CHARS] + "\n[... preview truncated; call describe_traces() or slice `traces`]"
        skillbook_line = (
            f"A skillbook ({len(inp.skillbook)} chars) is in the variable `skillbook`.\n" if inp.skillbook else ""
        )
        return prompts.render(
            prompts.TASK,
            format=inp.trace.format,
            size=inp.trace.size,
            question=inp.question or "(see traces)",
            ground_truth=inp.ground_truth if inp.ground_truth is not None else "(not given)",
            feedback=inp.feedback if inp.feedback is not None else "(not given)",
            mode=inp.mode,
            skillbook_line=skillbook_line,
            preview=preview,
        )

    def _output(
        self, draft: ReflectionDraft | None, messages: list[ModelMessage], stop_reason: StopReason, error: str
    ) -> ReflectorOutput:
        state = self.state
        usage = _usage(messages)
        if draft is None:
            draft = _fallback(state, messages, stop_reason, error)
        raw: dict[str, Any] = {
            "rr_trace": RunTrace(
                total_iterations=usage.requests,
                subagent_calls=[],
                timed_out=stop_reason != "completed",
                compactions=0,
                depth=state.inp.depth,
                stop_reason=stop_reason,
                cells=state.cells,
                failed_cells=state.failed_cells,
            ).model_dump(),
            "usage": usage.model_dump(),
            "thoughts": list(state.thoughts),
            "workflow_id": state.session_id,
            "model": state.inp.config.model,
        }
        if error:
            raw["error"] = error
        return ReflectorOutput(**draft.model_dump(), raw=raw)


def _model_settings(given: dict[str, Any] | None) -> ModelSettings:
    """Temperature 0.0 unless the caller passed settings (then theirs, untouched)."""
    return ModelSettings(**given) if given else ModelSettings(temperature=0.0)  # type: ignore[typeddict-item]


def _usage(messages: list[ModelMessage]) -> UsageSummary:
    responses = [m for m in messages if isinstance(m, ModelResponse)]
    inp = sum(r.usage.input_tokens for r in responses)
    out = sum(r.usage.output_tokens for r in responses)
    return UsageSummary(input_tokens=inp, output_tokens=out, total_tokens=inp + out, requests=len(responses))


def _fallback(state: SessionState, messages: list[ModelMessage], stop_reason: StopReason, error: str) -> ReflectionDraft:
    """A deterministic reflection from what the session saw, when the model could not finish."""
    outputs = [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == "execute_code"
    ]
    seen = outputs[-1][:2_000] if outputs else "(no cell output)"
    why = {
        "token_budget": "the token budget was spent",
        "request_budget": "the request budget was spent",
        "max_compactions": "the context was compacted the maximum number of times",
        "error": "the model did not produce a valid reflection",
        "completed": "the session ended",
    }[stop_reason]
    return ReflectionDraft(
        reasoning=(
            f"INCOMPLETE: the reflection stopped early because {why} ({error}). "
            f"{state.cells} cells ran ({state.failed_cells} failed). This is not a finding that nothing went wrong."
        ),
        error_identification=f"Not determined: the session stopped early ({stop_reason}). Last cell output: {seen}",
        root_cause_analysis="Not determined: the session stopped before an analysis was complete.",
        correct_approach="Re-run the reflection with a larger budget (--max-requests / --max-tokens).",
        key_insight="Incomplete reflection; see raw.rr_trace.stop_reason.",
        extracted_learnings=[],
        skill_tags=[],
    )
