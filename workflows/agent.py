"""The reflector agent: a pydantic-ai `Agent` made durable by `TemporalDurability`.

Names here are the durable contract (activity names are derived from them): the agent is
`rr_reflector`, its toolset `rr_tools`, its tools `execute_code`, `think`, `recurse`,
`list_skill_sections`, `get_skill`, `search_skills`, the output tool `final_result`; the
synthesis agent is `rr_synthesizer`. Renaming any of them breaks in-flight workflows.

All tools run in workflow code (`temporal: False`): `execute_code` schedules a local activity on
the worker that owns the session's sandbox host, `recurse` starts a child workflow, the others are
pure. Model requests are local activities (`LocalModelDurability`, a `TemporalDurability` that
schedules pydantic-ai's model request on the workflow's worker, with a response cache that keeps it
paid once); the `SessionControl` capability enforces the budget ledger and compacts the context
before each of them.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ValidationError
from pydantic_ai import Agent, ModelRetry, RunContext, ToolOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig, ParentClosePolicy

from reflector import prompts
from reflector.compaction import (
    SUMMARISE_ACTIVITY,
    SummariseInput,
    SummariseResult,
    compacted_history,
    message_chars,
    microcompact,
    transcript_json,
)
from reflector.models import HEURISTIC, model_resolver
from reflector.skillbook import parse_skillbook
from reflector.types import WORKFLOW_NAME, ReflectionDraft, ReflectorOutput, UsageRecord
from workflows.durability import LocalModelDurability, local_model_activities
from workflows.session import SessionEnded, SessionState, await_cancel_safe, current_state

__all__ = [
    "ReflectorDeps",
    "reflector_agent",
    "synthesis_agent",
    "AGENT_NAME",
    "TOOLSET_ID",
    "OUTPUT_TOOL",
    "continue_as_new",
    "MODEL_ACTIVITIES",
]

AGENT_NAME = "rr_reflector"
SYNTH_AGENT_NAME = "rr_synthesizer"
TOOLSET_ID = "rr_tools"
OUTPUT_TOOL = "final_result"
COMPACT_THRESHOLD = 0.85

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
)
# pydantic-ai heartbeats model requests in the background (every half of this); a dead worker's in-flight
# provider request is retried elsewhere once this expires. Not shorter: the clock starts when the worker
# polls the task, and a loaded Python worker begins the activities it polled one event-loop turn at a
# time, so a burst of them can wait seconds before their first heartbeat; a timed-out attempt whose
# request is already on the wire is then paid twice (3 s: 35 paid twice at 500 reflections in flight
# with a 3 s model; 10 s: 10 at 500 with a 200 ms model, start delays up to 13 s; bench/throughput.py).
# 30 s is pydantic-ai's default. In-process models run as local activities and never heartbeat.
MODEL_HEARTBEAT = timedelta(seconds=30)
MODEL_ACTIVITY = ActivityConfig(start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=MODEL_HEARTBEAT)
BASE_ACTIVITY = ActivityConfig(start_to_close_timeout=timedelta(minutes=5), retry_policy=MODEL_RETRY)


class ReflectorDeps(BaseModel):
    """Small, serialisable run dependencies (they ride along every model-request activity)."""

    workflow_id: str
    depth: int = 0
    max_depth: int = 2
    max_tokens: int = 500_000
    max_requests: int = 50
    has_skillbook: bool = False


toolset: FunctionToolset[ReflectorDeps] = FunctionToolset(id=TOOLSET_ID)


# ------------------------------------------------------------------------------------ sandbox tools


@toolset.tool(metadata={"temporal": False})
async def execute_code(ctx: RunContext[ReflectorDeps], code: str) -> str:
    """Run Python in the sandbox where the trace is the variable `traces`; variables persist.

    Args:
        code: Python source. Print what you want to see; output is truncated (head and tail).
    """
    state = current_state()
    limit = state.inp.config.max_consecutive_cell_errors
    refusal = state.loop_guard(code)
    if refusal is not None:
        state.consecutive_failures += 1
        if state.consecutive_failures >= limit:
            raise SessionEnded("error", f"the model kept repeating a failing cell: {refusal}")
        return refusal
    outcome = await state.run_cell(code)
    if outcome.ok and outcome.submitted is not None:
        return _accept_submission(outcome.submitted, outcome.output)
    if state.consecutive_failures >= limit:
        raise SessionEnded("error", f"{limit} consecutive cells failed; last error: {outcome.error}")
    if outcome.ok and not outcome.output.strip():
        return "(cell ran; it printed nothing - print() what you want to see)"
    return outcome.output


def _accept_submission(value: object, output: str) -> str:
    """A final answer submitted from code ends the run if it validates; else the model sees why."""
    try:
        draft = ReflectionDraft.model_validate(value)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:8])
        return (output + "\n" if output else "") + (
            f"FINAL_ANSWER was not accepted ({errors}). Fix the value (fields: reasoning, "
            "error_identification, root_cause_analysis, correct_approach, key_insight, "
            "extracted_learnings[{learning, atomicity_score, evidence, justification}], skill_tags) and submit again."
        )
    raise SessionEnded("completed", "final answer submitted from code", draft=draft)


@toolset.tool(metadata={"temporal": False})
async def think(ctx: RunContext[ReflectorDeps], thought: str, evidence_refs: list[str] | None = None) -> str:
    """Record a reasoning note (kept for the audit trail; never turned into a learning).

    Args:
        thought: What you concluded or plan next.
        evidence_refs: Where it comes from, e.g. ["cell 3", "step 12"].
    """
    state = current_state()
    state.thoughts.append({"thought": thought, "evidence_refs": list(evidence_refs or []), "after_cell": state.seq})
    return "noted"


# ------------------------------------------------------------------------------------ recursion


async def _below_max_depth(ctx: RunContext[ReflectorDeps], tool_def: ToolDefinition) -> ToolDefinition | None:
    return tool_def if ctx.deps.depth < ctx.deps.max_depth else None


@toolset.tool(metadata={"temporal": False}, prepare=_below_max_depth)
async def recurse(ctx: RunContext[ReflectorDeps], prompt: str, context_code: str = "") -> str:
    """Delegate a sub-question to a child reflection session with a share of the remaining budget.

    The child's sandbox starts with a copy of your variables and helpers (changes it makes never
    reach yours), then runs `context_code` there (e.g. to narrow `traces` to a slice).

    Args:
        prompt: The sub-question for the child.
        context_code: Python run in the child's sandbox before its first turn.
    """
    state = current_state()
    async with state.recurse_lock:  # one child at a time: at most one request of the tree in flight
        return await _run_child(state, prompt, context_code)


async def _run_child(state: SessionState, prompt: str, context_code: str) -> str:
    cfg = state.inp.config
    alloc = state.ledger.child_allocation(cfg.child_budget_fraction)
    if alloc is None:
        return "REFUSED: the budget is spent; no child session can be started. Give your final answer."
    export = await state.export_namespace()
    state.recursions += 1
    child_id = f"{state.session_id}.r{state.recursions}"
    child_inp = state.inp.model_copy(
        update={
            "question": prompt,
            "config": cfg.model_copy(update={"max_tokens": alloc.tokens, "max_requests": alloc.requests}),
            "depth": state.inp.depth + 1,
            "parent_workflow_id": state.session_id,
            "inherit_ref": export.export_ref,
            "context_code": context_code,
            "continuation": None,
        }
    )
    state.phase, state.last_event = "waiting for child", child_id
    handle = await workflow.start_child_workflow(
        WORKFLOW_NAME,
        child_inp,
        id=child_id,
        result_type=ReflectorOutput,
        parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
        task_timeout=workflow.info().task_timeout,
    )
    out: ReflectorOutput = await await_cancel_safe(handle)
    state.phase = "thinking"
    records = [UsageRecord.model_validate(r) for r in out.raw.get("usage_records", [])]
    state.ledger.charge(*records)
    rt = out.raw.get("rr_trace", {})
    state.subagent_calls.append(
        {
            "prompt": prompt,
            "child_workflow_id": child_id,
            "depth": state.inp.depth + 1,
            "allocation": alloc.model_dump(),
            "usage": out.raw.get("usage", {}),
            "cut_short": bool(rt.get("timed_out")),
            "stop_reason": rt.get("stop_reason"),
            "skipped_variables": export.skipped,
        }
    )
    if out.raw.get("context_error"):
        raise ModelRetry(f"context_code failed in the child session: {out.raw['context_error']}")
    return _render_child(child_id, out)


def _render_child(child_id: str, out: ReflectorOutput) -> str:
    rt, usage = out.raw.get("rr_trace", {}), out.raw.get("usage", {})
    lines = [
        f"Child reflection {child_id} (stop: {rt.get('stop_reason')}, requests {usage.get('requests', 0)}, "
        f"tokens {usage.get('total_tokens', 0)}):",
        f"- what went wrong: {out.error_identification}",
        f"- root cause: {out.root_cause_analysis}",
        f"- key insight: {out.key_insight}",
    ]
    for i, learning in enumerate(out.extracted_learnings, 1):
        lines.append(f"- learning {i}: {learning.learning} (evidence: {learning.evidence})")
    return "\n".join(lines)[:6_000]


# ------------------------------------------------------------------------------------ skillbook


async def _has_skillbook(ctx: RunContext[ReflectorDeps], tool_def: ToolDefinition) -> ToolDefinition | None:
    return tool_def if ctx.deps.has_skillbook else None


@toolset.tool(metadata={"temporal": False}, prepare=_has_skillbook)
async def list_skill_sections(ctx: RunContext[ReflectorDeps]) -> str:
    """List the skillbook's sections with their skill ids."""
    sections: dict[str, list[str]] = {}
    for skill in parse_skillbook(current_state().inp.skillbook):
        sections.setdefault(skill.section or "(no section)", []).append(skill.id)
    return "\n".join(f"{name}: {', '.join(ids)}" for name, ids in sections.items()) or "(no skills)"


@toolset.tool(metadata={"temporal": False}, prepare=_has_skillbook)
async def get_skill(ctx: RunContext[ReflectorDeps], skill_id: str) -> str:
    """Get one skill by its exact id (e.g. `section-00001`, without brackets).

    Args:
        skill_id: The exact skill id.
    """
    wanted = skill_id.strip().strip("[]")
    for skill in parse_skillbook(current_state().inp.skillbook):
        if skill.id == wanted:
            return f"[{skill.id}] ({skill.section}) {skill.text}"
    return f"NOT FOUND: no skill has the exact id {wanted!r}."


@toolset.tool(metadata={"temporal": False}, prepare=_has_skillbook)
async def search_skills(ctx: RunContext[ReflectorDeps], query: str) -> str:
    """Search skills whose text contains every word of `query` (case-insensitive).

    Args:
        query: Words to look for.
    """
    words = query.lower().split()
    hits = [
        f"[{s.id}] {s.text}"
        for s in parse_skillbook(current_state().inp.skillbook)
        if all(w in s.text.lower() for w in words)
    ]
    return "\n".join(hits[:20]) or "(no skill matches)"


# ------------------------------------------------------------------------------------ session control


class SessionControl(AbstractCapability[ReflectorDeps]):
    """Budget ledger, compaction and metering around every model request (workflow-side only)."""

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
            state.iterations += 1
            state.last_event = f"model response {state.iterations}"
            state.charge("turn", response.model_name, response.usage.input_tokens, response.usage.output_tokens)
            if response.usage.input_tokens > 0 and state.last_request_chars > 0:
                state.chars_per_token = max(0.5, state.last_request_chars / response.usage.input_tokens)
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
    if message_chars(messages) / state.chars_per_token <= threshold:
        return messages
    compacted, replaced = microcompact(messages, cfg.microcompact_keep_recent)
    if replaced:
        state.microcompactions += 1
        state.last_event = f"microcompacted {replaced} cell outputs"
    if message_chars(compacted) / state.chars_per_token <= threshold:
        return compacted
    if state.compactions >= cfg.max_compactions:
        raise SessionEnded("max_compactions", f"the context needed a summary after {state.compactions} summaries")
    _enforce_budget(state)
    state.phase = "summarising"
    result: SummariseResult = await await_cancel_safe(
        workflow.start_activity(
            SUMMARISE_ACTIVITY,
            SummariseInput(
                model=cfg.model, transcript_json=transcript_json(messages), workflow_id=state.session_id,
                depth=state.inp.depth,
            ),
            result_type=SummariseResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=MODEL_HEARTBEAT,
            retry_policy=MODEL_RETRY,
            summary="summarise",
        )
    )
    state.charge("summary", result.model, result.input_tokens, result.output_tokens)
    await state.run_cell(f'history.extend(ARCHIVE("{result.archive_ref}"))', internal=True)
    state.compactions += 1
    state.continue_after_summary = True
    state.last_event = f"summary {state.compactions}"
    return compacted_history(messages, result.summary)


def continue_as_new_now(state: SessionState, messages: list[ModelMessage]) -> None:
    """Continue as a new run carrying the (compacted) history, the ledger and the counters."""
    workflow.continue_as_new(
        state.inp.model_copy(update={"continuation": state.continuation(transcript_json(messages))})
    )


def continue_as_new(ctx: RunContext[ReflectorDeps]) -> None:
    """`TemporalDurability`'s handler for Temporal's continue-as-new suggestion."""
    continue_as_new_now(current_state(), list(ctx.messages))


# ------------------------------------------------------------------------------------ agents


def _instructions(ctx: RunContext[ReflectorDeps]) -> str:
    d = ctx.deps
    budget = (
        f"this session may spend at most {d.max_requests} model requests and {d.max_tokens:,} tokens, "
        "and that includes everything its child sessions spend: a child started with `recurse` gets "
        "half of what remains (at least 10,000 tokens) and its usage is charged back here. When the budget "
        "runs out the session stops and returns what it has."
        if d.depth < d.max_depth
        else f"at most {d.max_requests} model requests and {d.max_tokens:,} tokens for this session; "
        "when they run out the session stops and returns what it has."
    )
    return prompts.render(prompts.SYSTEM, budget_line=budget)


reflector_agent: Agent[ReflectorDeps, ReflectionDraft] = Agent(
    HEURISTIC,
    name=AGENT_NAME,
    deps_type=ReflectorDeps,
    output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL),
    instructions=_instructions,
    toolsets=[toolset],
    retries=3,
    capabilities=[
        model_resolver(),
        SessionControl(),
        LocalModelDurability(
            activity_config=BASE_ACTIVITY,
            model_activity_config=MODEL_ACTIVITY,
            continue_as_new=continue_as_new,
        ),
    ],
)


@reflector_agent.output_validator
async def _require_evidence(ctx: RunContext[ReflectorDeps], output: ReflectionDraft) -> ReflectionDraft:
    """Refuse a final answer until at least one model-written cell ran successfully."""
    if workflow.in_workflow() and current_state().ok_cells == 0:
        raise ModelRetry(
            "Run at least one successful execute_code cell that inspects `traces` before giving the final answer."
        )
    return output


synthesis_agent: Agent[None, ReflectionDraft] = Agent(
    HEURISTIC,
    name=SYNTH_AGENT_NAME,
    output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL),
    instructions=(
        "The reflection session ran out of budget. Write the final reflection now from the findings below. "
        "Use only what the findings show; say plainly what could not be determined."
    ),
    retries=0,
    capabilities=[
        model_resolver(),
        LocalModelDurability(
            activity_config=BASE_ACTIVITY,
            model_activity_config=MODEL_ACTIVITY,
        ),
    ],
)


MODEL_ACTIVITIES = local_model_activities(reflector_agent, synthesis_agent)
"""The agents' local model-request activities (pydantic-ai's own are registered by its plugin)."""
