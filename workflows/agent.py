"""The reflector agent: a pydantic-ai `Agent` made durable by `TemporalDurability`.

Names here are the durable contract (activity names are derived from them): the agent is
`rr_reflector`, its toolset `rr_tools`, its tools `execute_code` and `think`, the output tool
`final_result`. Renaming any of them breaks in-flight workflows.

The tools run in workflow code (`temporal: False`): `execute_code` schedules a local activity on
the worker that owns the session's sandbox host; `think` only records a note. Model requests are
activities scheduled by `TemporalDurability`.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ValidationError
from pydantic_ai import Agent, ModelRetry, RunContext, ToolOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.toolsets import FunctionToolset
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig

from reflector import prompts
from reflector.models import HEURISTIC, model_resolver
from reflector.types import ReflectionDraft
from workflows.session import SessionEnded, current_state

__all__ = ["ReflectorDeps", "reflector_agent", "AGENT_NAME", "TOOLSET_ID", "OUTPUT_TOOL"]

AGENT_NAME = "rr_reflector"
TOOLSET_ID = "rr_tools"
OUTPUT_TOOL = "final_result"

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
)


class ReflectorDeps(BaseModel):
    """Small, serialisable run dependencies (they ride along every model-request activity)."""

    workflow_id: str
    depth: int = 0
    max_tokens: int = 500_000
    max_requests: int = 50


toolset: FunctionToolset[ReflectorDeps] = FunctionToolset(id=TOOLSET_ID)


@toolset.tool(metadata={"temporal": False})
async def execute_code(ctx: RunContext[ReflectorDeps], code: str) -> str:
    """Run Python in the sandbox where the trace is the variable `traces`; variables persist.

    Args:
        code: Python source. Print what you want to see; output is truncated (head and tail).
    """
    state = current_state()
    refusal = state.loop_guard(code)
    if refusal is not None:
        state.consecutive_failures += 1
        if state.consecutive_failures >= state.inp.config.max_consecutive_cell_errors:
            raise SessionEnded("error", f"the model kept repeating a failing cell: {refusal}")
        return refusal
    outcome = await state.run_cell(code)
    if outcome.ok and outcome.submitted is not None:
        return _accept_submission(outcome.submitted, outcome.output)
    limit = state.inp.config.max_consecutive_cell_errors
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


def _instructions(ctx: RunContext[ReflectorDeps]) -> str:
    d = ctx.deps
    budget = (
        f"at most {d.max_requests} model requests and {d.max_tokens:,} tokens for this session; "
        "when they run out the session stops and returns what it has."
    )
    return prompts.render(prompts.SYSTEM, budget_line=budget)


class SessionMeter(AbstractCapability[ReflectorDeps]):
    """Keeps the session's live usage visible to the `progress` query (workflow-side only)."""

    async def after_model_request(
        self, ctx: RunContext[ReflectorDeps], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        if workflow.in_workflow():
            state = current_state()
            state.usage = ctx.usage
            state.iterations += 1
            state.last_event = f"model response {state.iterations}"
        return response


durability: TemporalDurability[ReflectorDeps] = TemporalDurability(
    activity_config=ActivityConfig(start_to_close_timeout=timedelta(minutes=5), retry_policy=MODEL_RETRY),
    model_activity_config=ActivityConfig(
        start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=timedelta(seconds=5)
    ),
)

reflector_agent: Agent[ReflectorDeps, ReflectionDraft] = Agent(
    HEURISTIC,
    name=AGENT_NAME,
    deps_type=ReflectorDeps,
    output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL),
    instructions=_instructions,
    toolsets=[toolset],
    retries=3,
    capabilities=[model_resolver(), SessionMeter(), durability],
)


@reflector_agent.output_validator
async def _require_evidence(ctx: RunContext[ReflectorDeps], output: ReflectionDraft) -> ReflectionDraft:
    """Refuse a final answer until at least one model-written cell ran successfully."""
    if workflow.in_workflow() and current_state().ok_cells == 0:
        raise ModelRetry(
            "Run at least one successful execute_code cell that inspects `traces` before giving the final answer."
        )
    return output
