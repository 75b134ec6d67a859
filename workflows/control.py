"""Session control around every model request: the budget ledger, compaction, continue-as-new.

`SessionControl` is a pydantic-ai capability whose hooks run in workflow code before and after each
model request: it refuses a request the budget cannot pay for (keeping one back for the final
synthesis), microcompacts and then summarises the context when it nears the model's window (the
summary is an activity, charged like a turn), continues as new after a summary, and meters every
response into the ledger (calibrating characters per token on the provider's own counts).
"""

from __future__ import annotations

from dataclasses import replace

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import ToolDefinition
from temporalio import workflow

from reflector.analysis import prompts
from reflector.analysis.compaction import compacted_history, message_chars, microcompact, transcript_json
from reflector.contract import OUTPUT_TOOL, SUMMARISE_ACTIVITY, ReflectorDeps, SummariseInput, SummariseResult
from workflows.activity_options import MODEL_HEARTBEAT, MODEL_RETRY, SUMMARISE_TIMEOUT
from workflows.rerun import reused_summary, reusing_step, reusing_summary
from workflows.state import SessionEnded, SessionState, await_cancel_safe, current_state

__all__ = ["SessionControl", "COMPACT_THRESHOLD", "continue_as_new", "continue_as_new_now"]

COMPACT_THRESHOLD = 0.85


class SessionControl(AbstractCapability[ReflectorDeps]):
    """Budget ledger, compaction and metering around every model request (workflow-side only)."""

    async def prepare_output_tools(
        self, ctx: RunContext[ReflectorDeps], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        """Without a skillbook the output tool offers no `skill_tags`: nothing to tag, and every request would pay
        for its schema again (the answer is still validated by `ReflectionDraft`, which defaults it to empty)."""
        if ctx.deps.has_skillbook:
            return tool_defs
        return [
            replace(t, parameters_json_schema=prompts.without_skill_tags(t.parameters_json_schema))
            if t.name == OUTPUT_TOOL
            else t
            for t in tool_defs
        ]

    async def before_model_request(
        self, ctx: RunContext[ReflectorDeps], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if not workflow.in_workflow():
            return request_context
        state = current_state()
        _enforce_budget(state)
        messages = list(request_context.messages)
        compacted = await _compact(state, messages)
        if compacted is not messages:
            ctx.messages[:] = compacted
            request_context.messages = compacted.copy()
            _enforce_budget(state)  # the summary was charged
        if state.continue_after_summary:
            state.continue_after_summary = False
            continue_as_new_now(state, compacted)
        state.last_request_chars = message_chars(compacted)
        state.phase = "waiting for the model"
        return request_context

    async def after_model_request(
        self, ctx: RunContext[ReflectorDeps], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        if workflow.in_workflow():
            state = current_state()
            reused = reusing_step(state)  # `rr rerun`: the origin's response, paid by the origin
            state.counters.iterations += 1
            state.last_event = f"model response {state.counters.iterations}"
            called = [p.tool_name for p in response.parts if isinstance(p, ToolCallPart)]
            state.last_tool = ", ".join(dict.fromkeys(called)) or "(text, no tool)"
            if not reused:
                state.charge(
                    "turn",
                    response.model_name,
                    response.usage.input_tokens,
                    response.usage.output_tokens,
                    cache_read_tokens=response.usage.cache_read_tokens,
                    cache_write_tokens=response.usage.cache_write_tokens,
                )
            if response.usage.input_tokens > 0 and state.last_request_chars > 0:
                state.counters.chars_per_token = max(
                    0.5, state.last_request_chars / response.usage.input_tokens
                )
        return response


def _reserve_tokens(state: SessionState) -> int:
    return min(4_000, state.inp.config.max_tokens // 10) if state.reserve_requests else 0


def _enforce_budget(state: SessionState) -> None:
    reason = state.ledger.exhausted(state.reserve_requests, _reserve_tokens(state))
    if reason is not None:
        spent = state.ledger.spent()
        raise SessionEnded(
            reason,
            f"{reason}: spent {spent.requests}/{state.ledger.max_requests} requests and "
            f"{spent.total_tokens}/{state.ledger.max_tokens} tokens (tree total)",
        )


async def _compact(state: SessionState, messages: list[ModelMessage]) -> list[ModelMessage]:
    cfg = state.inp.config
    threshold = COMPACT_THRESHOLD * cfg.context_window
    if message_chars(messages) / state.counters.chars_per_token <= threshold:
        return messages
    compacted, replaced = microcompact(messages, cfg.microcompact_keep_recent)
    if replaced:
        state.counters.microcompactions += 1
        state.last_event = f"microcompacted {replaced} cell outputs"
    if message_chars(compacted) / state.counters.chars_per_token <= threshold:
        return compacted
    if state.counters.compactions >= cfg.max_compactions:
        raise SessionEnded(
            "max_compactions", f"the context needed a summary after {state.counters.compactions} summaries"
        )
    _enforce_budget(state)
    state.phase = "summarising"
    reuse = reusing_summary(state)  # `rr rerun`: the origin's summary, paid by the origin
    result: SummariseResult = (
        await reused_summary(state)
        if reuse
        else await await_cancel_safe(
            workflow.start_activity(
                SUMMARISE_ACTIVITY,
                SummariseInput(
                    model=cfg.model,
                    transcript_json=transcript_json(messages),
                    workflow_id=state.session_id,
                    depth=state.inp.depth,
                ),
                result_type=SummariseResult,
                start_to_close_timeout=SUMMARISE_TIMEOUT,
                heartbeat_timeout=MODEL_HEARTBEAT,
                retry_policy=MODEL_RETRY,
                summary="summarise",
            )
        )
    )
    if not reuse:
        state.charge("summary", result.model, result.input_tokens, result.output_tokens)
    await state.run_cell(f'history.extend(ARCHIVE("{result.archive_ref}"))', internal=True)
    state.counters.compactions += 1
    state.continue_after_summary = True
    state.last_event = f"summary {state.counters.compactions}"
    return compacted_history(messages, result.summary)


def continue_as_new_now(state: SessionState, messages: list[ModelMessage]) -> None:
    """Continue as a new run carrying the (compacted) history, the ledger and the counters."""
    workflow.continue_as_new(
        state.inp.model_copy(update={"continuation": state.continuation(transcript_json(messages))})
    )


def continue_as_new(ctx: RunContext[ReflectorDeps]) -> None:
    """`TemporalDurability`'s handler for Temporal's continue-as-new suggestion."""
    continue_as_new_now(current_state(), list(ctx.messages))
