"""`ReflectionWorkflow`: one durable reflection session (the root, or a child started by `recurse`).

Deterministic orchestration only: the prefill, every sandbox cell, every model request and every
summary are activities recorded in history; this code decides, counts and assembles the output.
Whatever happens inside the agent loop (budget spent, too many compactions, a model that never
answers properly), the workflow returns a `ReflectorOutput` with a typed stop reason instead of
failing.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow
from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import capture_run_messages
    from pydantic_ai.exceptions import AgentRunError, UnexpectedModelBehavior, UsageLimitExceeded
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, ToolReturnPart
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.usage import UsageLimits

    from reflector.analysis import prompts
    from reflector.analysis.citations import check_citations
    from reflector.analysis.limits import MAX_INLINE_SKILLBOOK_CHARS, SKILL_IDS_SHOWN
    from reflector.analysis.prompt_cache import caches, with_prompt_cache
    from reflector.analysis.provider_errors import describe as describe_error
    from reflector.analysis.skillbook import IDS_LINE, parse_skillbook
    from reflector.contract import (
        CANCEL_PATCH,
        CLOSE_ACTIVITY,
        EXECUTE_CODE_TOOL,
        FORGET_ACTIVITY,
        FORGET_ONLY_CACHED_PATCH,
        INLINE_SKILLBOOK_PATCH,
        PREPARE_ACTIVITY,
        PROGRESS_QUERY,
        PROMPT_CACHE_PATCH,
        RECURSE_BY_STRATEGY_PATCH,
        SEARCH_ATTRIBUTES_PATCH,
        WORKFLOW_NAME,
        CloseSessionInput,
        PrepareSessionInput,
        PrepareSessionResult,
        Progress,
        ReflectionConfig,
        ReflectionDraft,
        ReflectionInput,
        ReflectorDeps,
        ReflectorOutput,
        RunTrace,
        StopReason,
    )
    from reflector.runtime import search_attributes as sa
    from workflows.activity_options import CELL_RETRY, REBUILD_ALLOWANCE_S
    from workflows.agents import reflector_agent, synthesis_agent
    from workflows.fallback import fallback_draft
    from workflows.local_model import local_model_requests
    from workflows.patches import begin, patch_on
    from workflows.rerun import rerun_raw
    from workflows.state import SessionEnded, SessionState, await_cancel_safe, clear_cancellation

__all__ = ["ReflectionWorkflow", "WORKFLOW_NAME"]

PREVIEW_CHARS = 4_000
CANCELLED_DETAIL = "cancelled by request (rr cancel)"
SYNTHESIS_FINDINGS_CHARS = 12_000


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

    __pydantic_ai_agents__ = [reflector_agent, synthesis_agent]

    @workflow.init
    def __init__(self, inp: ReflectionInput) -> None:
        self.state = SessionState.create(inp, workflow.info().workflow_id)

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> Progress:
        return self.state.progress()

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        begin()  # every patch decided before the first command (workflows.patches)
        state = self.state
        messages_in: list[ModelMessage] | None = None
        prompt: str | None = None
        if inp.continuation is not None:
            messages_in = ModelMessagesTypeAdapter.validate_json(inp.continuation.messages_json)
        elif len(inp.skillbook) > MAX_INLINE_SKILLBOOK_CHARS and patch_on(INLINE_SKILLBOOK_PATCH):
            # parsed here it would block the workflow task past the deadlock detector (every attempt)
            return self._ended(
                self._output(
                    None,
                    [],
                    "error",
                    (
                        f"the inline skillbook is {len(inp.skillbook):,} characters, over the limit of "
                        f"{MAX_INLINE_SKILLBOOK_CHARS:,} for `ReflectionInput.skillbook`: pass it as `skillbook_ref` "
                        "(reflector.client.upload_skillbook, which build_input uses)"
                    ),
                )
            )
        else:
            try:
                prep = await self._prepare(inp)
            except asyncio.CancelledError:  # `rr cancel` before the first turn
                if not patch_on(CANCEL_PATCH):
                    raise
                clear_cancellation()
                state.phase = "finishing"
                await self._close()
                state.phase = "done"
                return self._ended(self._output(None, [], "cancelled", CANCELLED_DETAIL))
            if prep.skillbook_error is not None:
                return self._ended(
                    self._output(None, [], "error", f"skillbook refused: {prep.skillbook_error}")
                )
            if prep.context_error is not None:
                return self._ended(
                    self._output(
                        None,
                        [],
                        "error",
                        f"context_code failed: {prep.context_error}",
                        context_error=prep.context_error,
                    )
                )
            prompt = self._task_prompt(prep)

        deps = ReflectorDeps(
            workflow_id=state.session_id,
            depth=inp.depth,
            max_depth=inp.config.max_depth,
            max_tokens=inp.config.max_tokens,
            max_requests=inp.config.max_requests,
            has_skillbook=bool(inp.skillbook.strip()) or inp.skillbook_ref is not None,
            may_recurse=_may_recurse(inp),
        )
        draft: ReflectionDraft | None = None
        stop_reason: StopReason = "completed"
        error = ""
        with capture_run_messages() as messages:
            try:
                result = await reflector_agent.run(
                    prompt,
                    message_history=messages_in,
                    deps=deps,
                    model=inp.config.model,
                    model_settings=_model_settings(inp.config, state.session_id),
                    # the ledger (SessionControl) enforces the tree-wide budget; this is a backstop
                    # (`rr rerun`: plus the reused steps, which the ledger does not charge)
                    usage_limits=UsageLimits(request_limit=inp.config.max_requests + 1 + _reused_steps(inp)),
                )
                draft = result.output
            except SessionEnded as e:
                draft = e.draft
                if draft is None:
                    stop_reason, error = e.stop_reason, e.detail  # type: ignore[assignment]
            except UsageLimitExceeded as e:
                stop_reason, error = "request_budget", str(e)
            except (UnexpectedModelBehavior, AgentRunError) as e:
                stop_reason, error = "error", describe_error(e)  # a provider's error: its complaint, one line
            except (ActivityError, ChildWorkflowError) as e:
                # an activity or child that failed for good (retries exhausted, non-retryable error)
                cause = e.cause if e.cause is not None else e
                stop_reason, error = "error", f"{type(e).__name__}: {e} ({type(cause).__name__}: {cause})"
            except asyncio.CancelledError:
                # `rr cancel`: the cell, request or child in flight was cancelled (await_cancel_safe); the
                # sandbox is closed below and the output is built from the findings so far
                if not patch_on(CANCEL_PATCH):
                    raise
                clear_cancellation()
                stop_reason, error = "cancelled", CANCELLED_DETAIL
        if draft is None and stop_reason in ("token_budget", "request_budget", "max_compactions"):
            draft = await self._synthesise(list(messages))
        state.phase = "finishing"
        await self._close()
        state.phase = "done"
        return self._ended(self._output(draft, list(messages), stop_reason, error))

    async def _prepare(self, inp: ReflectionInput) -> PrepareSessionResult:
        state = self.state
        state.phase = "preparing sandbox"
        prep: PrepareSessionResult = await await_cancel_safe(
            workflow.start_local_activity(
                PREPARE_ACTIVITY,
                PrepareSessionInput(
                    session_id=state.session_id,
                    trace=inp.trace,
                    question=inp.question,
                    ground_truth=inp.ground_truth,
                    feedback=inp.feedback,
                    skillbook=inp.skillbook,
                    limits=state.limits,
                    inherit_ref=inp.inherit_ref,
                    context_code=inp.context_code,
                    skillbook_ref=inp.skillbook_ref,
                ),
                result_type=PrepareSessionResult,
                start_to_close_timeout=timedelta(seconds=inp.config.cell_timeout_s * 2 + REBUILD_ALLOWANCE_S),
                retry_policy=CELL_RETRY,
                summary="prefill",
            )
        )
        state.init_ref, state.counters.seq, state.facts = prep.init_ref, prep.next_seq - 1, prep.facts
        state.cell_outputs[1] = _shown_preview(prep.preview)
        state.phase = "thinking"
        return prep

    def _ended(self, out: ReflectorOutput) -> ReflectorOutput:
        """Upsert the stop reason and totals (where the namespace has rr's search attributes)."""
        if self.state.inp.search_attributes and patch_on(SEARCH_ATTRIBUTES_PATCH):
            rt, usage = out.raw.get("rr_trace", {}), out.raw.get("usage", {})
            workflow.upsert_search_attributes(
                sa.end_updates(
                    str(rt.get("stop_reason", "completed")),
                    requests=int(usage.get("requests", 0)),
                    tokens=int(usage.get("total_tokens", 0)),
                    children=len(rt.get("subagent_calls", [])),
                )
            )
        return out

    async def _close(self) -> None:
        await _despite_cancel(
            workflow.start_local_activity(
                CLOSE_ACTIVITY,
                CloseSessionInput(session_id=self.state.session_id),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=CELL_RETRY,
                summary="close sandbox",
            )
        )
        if local_model_requests() and (self.state.responses_cached or not patch_on(FORGET_ONLY_CACHED_PATCH)):
            # A regular activity: scheduling it ends the workflow task, which records every model
            # response in the history before the response cache is deleted. Only where a request of the
            # session was cached (in-process models): a provider model's are recorded by their own activities.
            await _despite_cancel(
                workflow.start_activity(
                    FORGET_ACTIVITY,
                    self.state.session_id,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=CELL_RETRY,
                    summary="forget cached model responses",
                )
            )

    async def _synthesise(self, messages: list[ModelMessage]) -> ReflectionDraft | None:
        """One last, budgeted request that turns the findings so far into a reflection."""
        state = self.state
        if state.ledger.remaining_requests() < 1 or state.ledger.remaining_tokens() <= 0:
            return None
        outputs = [
            str(p.content)
            for m in messages
            for p in m.parts
            if isinstance(p, ToolReturnPart) and p.tool_name == EXECUTE_CODE_TOOL
        ]
        findings = "\n---\n".join(outputs)[-SYNTHESIS_FINDINGS_CHARS:] or "(no cell output)"
        notes = "\n".join(t["thought"] for t in state.thoughts)[-2_000:]
        prompt = (
            f"Question: {prompts.task_field(state.inp.question, state.facts.question, key='question', none='(none)')}\n"
            f"Ground truth: {prompts.task_field(state.inp.ground_truth, state.facts.ground_truth, key='ground_truth', none='(none)')}\n"
            f"Cell outputs so far:\n{findings}\nNotes:\n{notes}"
        )
        state.phase = "synthesising"
        draft: ReflectionDraft | None = None
        with capture_run_messages() as synth_messages:
            try:
                result = await synthesis_agent.run(
                    prompt,
                    model=state.inp.config.model,
                    model_settings=_model_settings(state.inp.config, state.session_id),
                    usage_limits=UsageLimits(request_limit=1),
                )
                draft = result.output.model_copy(
                    update={
                        "reasoning": f"PARTIAL (synthesised after the budget ran out): {result.output.reasoning}"
                    }
                )
            except (UnexpectedModelBehavior, AgentRunError):
                draft = None
        # charged whether or not the answer was usable: the request was made
        for response in synth_messages:
            if isinstance(response, ModelResponse):
                state.charge(
                    "synthesis",
                    response.model_name,
                    response.usage.input_tokens,
                    response.usage.output_tokens,
                    cache_read_tokens=response.usage.cache_read_tokens,
                    cache_write_tokens=response.usage.cache_write_tokens,
                )
        return draft

    def _task_prompt(self, prep: PrepareSessionResult) -> str:
        inp = self.state.inp
        preview = _shown_preview(prep.preview)
        skillbook_line = ""
        if inp.skillbook_ref is not None:  # the prepare activity read the blob: the first ids and the count
            skillbook_line = (
                f"A skillbook ({inp.skillbook_ref.chars} chars) is in the variable `skillbook`.\n"
            )
            if inp.mode == "online":
                listed = ", ".join(f"[{sid}]" for sid in prep.skill_ids[:SKILL_IDS_SHOWN])
                more = prep.skill_count - min(len(prep.skill_ids), SKILL_IDS_SHOWN)
                shown = listed + (f" (+{more} more)" if more > 0 else "")
                skillbook_line += prompts.ONLINE + f"{IDS_LINE} {shown or '(none found)'}\n"
        elif inp.skillbook.strip():
            skillbook_line = f"A skillbook ({len(inp.skillbook)} chars) is in the variable `skillbook`.\n"
            if inp.mode == "online":
                ids = [f"[{skill.id}]" for skill in parse_skillbook(inp.skillbook)]
                shown = ", ".join(ids[:200]) + (f" (+{len(ids) - 200} more)" if len(ids) > 200 else "")
                skillbook_line += prompts.ONLINE + f"{IDS_LINE} {shown or '(none found)'}\n"
        facts = prep.facts
        if inp.depth > 0:  # a child's question is its parent's sub-question; the agent's is in the trace
            question_line = (
                f"Sub-question from the parent session: {inp.question}\nQuestion given to the agent: "
                + prompts.task_field(None, facts.question, key="question", none="(see `traces`)")
            )
        else:
            question_line = "Question given to the agent: " + prompts.task_field(
                inp.question,
                facts.question,
                key="question",
                none="(none in the task or at the trace's top level; in a batch each run has its own)",
            )
        if facts.actions_checked or inp.trace.format == "tau-bench":
            truth_none = "none as text: the trace carries the task's expected actions (see " + (
                "expected_actions(traces))"
                if facts.actions_checked
                else "expected_actions(traces['runs'][i]))"
            )
        else:
            truth_none = (
                "(none in the trace or the task: judge the outcome from the steps, errors and feedback)"
            )
        return prompts.render(
            prompts.TASK,
            format=inp.trace.format,
            size=inp.trace.size,
            question_line=question_line,
            ground_truth=prompts.task_field(
                inp.ground_truth, facts.ground_truth, key="ground_truth", none=truth_none
            ),
            feedback=prompts.task_field(inp.feedback, facts.feedback, key="feedback", none="(none)"),
            mode=inp.mode,
            skillbook_line=skillbook_line,
            strategy=prompts.strategy(inp.trace.size, _may_recurse(inp) and inp.depth < inp.config.max_depth),
            preview=preview,
        )

    def _output(
        self,
        draft: ReflectionDraft | None,
        messages: list[ModelMessage],
        stop_reason: StopReason,
        error: str,
        context_error: str | None = None,
    ) -> ReflectorOutput:
        state = self.state
        if draft is None:
            draft = fallback_draft(state, messages, stop_reason, error)
        raw: dict[str, Any] = {
            "rr_trace": RunTrace(
                total_iterations=state.counters.iterations,
                subagent_calls=list(state.subagent_calls),
                timed_out=stop_reason != "completed",
                compactions=state.counters.compactions,
                microcompactions=state.counters.microcompactions,
                depth=state.inp.depth,
                stop_reason=stop_reason,
                cells=state.counters.cells,
                failed_cells=state.counters.failed_cells,
                continued_as_new=state.counters.runs - 1,
            ).model_dump(),
            "usage": state.ledger.spent().model_dump(),
            "usage_records": [r.model_dump() for r in state.ledger.records],
            "thoughts": list(state.thoughts),
            "workflow_id": state.session_id,
            "model": state.inp.config.model,
        }
        rerun = rerun_raw(state)
        if rerun is not None:
            raw["rerun"] = rerun
        if state.facts.answer_correct is not None:
            raw["answer_correct"] = state.facts.answer_correct
        if error:
            raw["error"] = error
        if context_error is not None:
            raw["context_error"] = context_error
        citations = check_citations(draft.extracted_learnings, state.cell_outputs)
        return ReflectorOutput(**draft.model_dump(), raw=raw, citations=citations)


def _shown_preview(preview: str) -> str:
    """The prefill's output as the task prompt shows it (cell 1 of every session)."""
    return prompts.shown_preview(preview, PREVIEW_CHARS)


def _may_recurse(inp: ReflectionInput) -> bool:
    """Whether the strategy lets this session split (`recurse` is offered below max_depth): a large trace, or
    `recursion="always"`. Recorded before this rule, and a rerun whose reused prefix started children: as then."""
    if not patch_on(RECURSE_BY_STRATEGY_PATCH):
        return True
    return prompts.may_split(inp.trace.size, inp.config.recursion) or (
        inp.rerun is not None and inp.rerun.children > 0
    )


def _reused_steps(inp: ReflectionInput) -> int:
    return inp.rerun.steps if inp.rerun is not None and inp.depth == 0 else 0


async def _despite_cancel(handle: asyncio.Future[Any]) -> Any:
    """Close the session even when `rr cancel` arrives meanwhile: it is ending anyway, and a cancelled close
    would fail the workflow. (Recorded before the cancel patch: the activity is cancelled, as it was.)"""
    try:
        return await asyncio.shield(handle)
    except asyncio.CancelledError:
        if patch_on(CANCEL_PATCH):
            clear_cancellation()
        else:
            handle.cancel()
        return await handle


def _model_settings(config: ReflectionConfig, session_id: str) -> ModelSettings:
    """Temperature 0.0 unless the caller passed settings (then theirs), with the provider's prompt caching on
    unless those settings say otherwise (`reflector.analysis.prompt_cache`; an OpenAI cache key per session)."""
    settings: dict[str, Any] = dict(config.model_settings) if config.model_settings else {"temperature": 0.0}
    if caches(config.model) and patch_on(PROMPT_CACHE_PATCH):
        settings = with_prompt_cache(config.model, settings, session_id=session_id) or settings
    return cast(ModelSettings, settings)
