"""The agents: `rr_reflector` (the reflection session) and `rr_synthesizer` (the budget fallback).

Each is a pydantic-ai `Agent` made durable by `LocalModelDurability` (`workflows.local_model`): model
requests of in-process models are local activities, provider requests pydantic-ai's regular ones.
Their names are durable (`reflector.contract`): pydantic-ai derives activity names from them, and
renaming one breaks in-flight workflows.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext, ToolOutput
from pydantic_ai.capabilities import ResolveModelId
from pydantic_ai.models import Model
from temporalio import workflow

from reflector.analysis import prompts
from reflector.contract import AGENT_NAME, OUTPUT_TOOL, SYNTH_AGENT_NAME, ReflectionDraft, ReflectorDeps
from reflector.runtime.models import HEURISTIC, resolve_model, workflow_side_model
from workflows.activity_options import BASE_ACTIVITY, MODEL_ACTIVITY
from workflows.control import SessionControl, continue_as_new
from workflows.local_model import LocalModelDurability, local_model_activities
from workflows.state import current_state
from workflows.tools import recurse_offered, toolset

__all__ = ["reflector_agent", "synthesis_agent", "MODEL_ACTIVITIES", "model_resolver"]


async def _resolve(_ctx: Any, model_id: str) -> Model | None:
    if workflow.in_workflow():
        return workflow_side_model(model_id)
    return resolve_model(model_id)


def model_resolver() -> ResolveModelId[Any]:
    """The capability that lets `agent.run(model='heuristic')` and registered names resolve."""
    return ResolveModelId(_resolve)


def _budget(ctx: RunContext[ReflectorDeps]) -> str:
    d = ctx.deps
    return prompts.budget(d.max_requests, d.max_tokens, shared_with_children=recurse_offered(d))


reflector_agent: Agent[ReflectorDeps, ReflectionDraft] = Agent(
    HEURISTIC,
    name=AGENT_NAME,
    deps_type=ReflectorDeps,
    output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL, description=prompts.OUTPUT_TOOL_DESCRIPTION),
    instructions=[prompts.SYSTEM, _budget],  # the static prompt first: one cache entry for every session
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
    if workflow.in_workflow() and current_state().counters.ok_cells == 0:
        raise ModelRetry(
            "Run at least one successful execute_code cell that inspects `traces` before giving the final answer."
        )
    return output


synthesis_agent: Agent[None, ReflectionDraft] = Agent(
    HEURISTIC,
    name=SYNTH_AGENT_NAME,
    output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL, description=prompts.OUTPUT_TOOL_DESCRIPTION),
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
