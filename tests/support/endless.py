"""A scripted model that never finishes on its own: it runs cell after cell until the reflection is cancelled.

Import it (or list `tests.support.endless` in `RR_PLUGINS`, with the repository on `PYTHONPATH`) to register
`scripted-endless`. Each request waits `PACE_S` first, so a reflection spans many workflow tasks. A task
whose question holds `RECURSE_MARK` runs one cell and then starts a child (question `CHILD_MARK`) that runs
cells forever too; every cell prints `finding <n>`.
"""

from __future__ import annotations

import asyncio

from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL
from reflector.runtime.models import register_model
from reflector.testing.scripted import synthesis_aware

MODEL = "scripted-endless"
RECURSE_MARK = "RECURSE-FIRST"
CHILD_MARK = "CHILD-ENDLESS"
PACE_S = 0.05


def _task(messages: list[ModelMessage]) -> str:
    return next(
        (str(p.content) for m in messages for p in m.parts if type(p).__name__ == "UserPromptPart"), ""
    )


def _cells(messages: list[ModelMessage]) -> int:
    return sum(
        1
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == EXECUTE_CODE_TOOL
    )


def _endless(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    n = _cells(messages)
    task = _task(messages)
    recursed = any(
        isinstance(p, ToolCallPart) and p.tool_name == RECURSE_TOOL for m in messages for p in m.parts
    )
    if RECURSE_MARK in task and CHILD_MARK not in task and n >= 1 and not recursed:
        args = {"prompt": f"{CHILD_MARK}: keep looking", "context_code": ""}
        return ModelResponse(parts=[ToolCallPart(RECURSE_TOOL, args, tool_call_id="child")])
    code = f"print('finding', {n})"
    return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"e{n}")])


async def _paced(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(PACE_S)
    return synthesis_aware(_endless)(messages, info)


register_model(MODEL, lambda: FunctionModel(_paced, model_name=MODEL))
