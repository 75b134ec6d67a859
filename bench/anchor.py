"""The anchor: a plain pydantic-ai `TemporalDurability` agent with the same script and tool.

Its `execute_code` is pydantic-ai's default tool activity running the cell with in-process `exec`
(no sandbox host): the textbook integration the architecture measured (≈30 steps/s, B/A ≈ 1.25).
Also the in-process agent (A) of the overhead benchmark: the same agent, run outside Temporal.
"""

from __future__ import annotations

import contextlib
import io

from pydantic_ai import Agent, ToolOutput
from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow, TemporalDurability
from pydantic_ai.toolsets import FunctionToolset
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import bench.scripts  # noqa: F401  (registers the bench models)
    from reflector.contract import ReflectionDraft
    from reflector.runtime.models import HEURISTIC
    from workflows.agents import model_resolver

anchor_tools: FunctionToolset[None] = FunctionToolset(id="anchor_tools")
_namespaces: dict[str, dict[str, object]] = {}


@anchor_tools.tool_plain
async def execute_code(code: str) -> str:
    """Run a cell with in-process exec (one namespace per process: benchmark only, not a sandbox)."""
    ns = _namespaces.setdefault("ns", {})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, ns)  # benchmark anchor, trusted scripted code
    return buf.getvalue()


anchor_agent: Agent[None, ReflectionDraft] = Agent(
    HEURISTIC,
    name="bench_anchor",
    output_type=ToolOutput(ReflectionDraft, name="final_result"),
    toolsets=[anchor_tools],
    capabilities=[model_resolver(), TemporalDurability()],
)

plain_agent: Agent[None, ReflectionDraft] = Agent(
    HEURISTIC,
    name="bench_plain",
    output_type=ToolOutput(ReflectionDraft, name="final_result"),
    toolsets=[anchor_tools],
    capabilities=[model_resolver()],
)


@workflow.defn(name="BenchAnchorWorkflow")
class AnchorWorkflow(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [anchor_agent]

    @workflow.run
    async def run(self, model: str) -> int:
        result = await anchor_agent.run("go", model=model)
        return result.usage.requests
