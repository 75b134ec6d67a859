"""A plan-driven scripted model whose sessions can be held still at a gate (a file the test creates).

Like `scripted-plan` (reflector/testing/scripted.py): the task carries `PLAN:{json}`. A plan node (the
root's or a child's) with `"wait": "<path>"` makes its session wait, before its model request after
`wait_after` cells (default 1), until that file exists: a test can then look at a running tree (a root
waiting for its child, the child in the middle of its own session) for as long as it needs.

Import it to register the model in this process; name it in `RR_PLUGINS` for a worker subprocess.
"""

from __future__ import annotations

import asyncio
import os

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.contract import EXECUTE_CODE_TOOL
from reflector.runtime.models import register_model
from reflector.testing.scripted import _plan, plan_script, synthesis_aware

MODEL = "status-gated-plan"


def _cells_done(messages: list[ModelMessage]) -> int:
    return sum(
        1
        for m in messages
        for p in m.parts
        if type(p).__name__ == "ToolReturnPart" and getattr(p, "tool_name", None) == EXECUTE_CODE_TOOL
    )


async def gated(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    plan = _plan(messages)
    gate = plan.get("wait")
    if gate and _cells_done(messages) >= int(plan.get("wait_after", 1)):
        while not os.path.exists(gate):
            await asyncio.sleep(0.05)
    return synthesis_aware(plan_script)(messages, info)


register_model(MODEL, lambda: FunctionModel(gated, model_name=MODEL))
