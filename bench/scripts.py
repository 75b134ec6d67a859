"""Scripted models for benchmarks: `bench-<steps>-<latency_ms>` (a cell per step, then the answer).

Driven only by the message history, with the model latency simulated by `asyncio.sleep` inside the
model request (as a provider round trip would be). Import this module, or put it in `RR_PLUGINS`,
to register the models.
"""

from __future__ import annotations

import asyncio

from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.models import register_model

STEPS = (20,)
LATENCIES_MS = (0, 200)


def _n_returns(messages: list[ModelMessage]) -> int:
    return sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart) and p.tool_name == "execute_code")


def script(steps: int, latency_ms: int):  # type: ignore[no-untyped-def]
    async def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        k = _n_returns(messages)
        if k < steps:
            code = f"v{k} = {k} * 2\nprint(v{k})"
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id=f"c{k}")])
        args = {
            "reasoning": f"{steps} cells ran",
            "error_identification": "none",
            "root_cause_analysis": "none",
            "correct_approach": "none",
            "key_insight": "none",
            "extracted_learnings": [],
            "skill_tags": [],
        }
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")])

    return fn


def model_name(steps: int, latency_ms: int) -> str:
    return f"bench-{steps}-{latency_ms}"


for _s in STEPS:
    for _l in LATENCIES_MS:
        register_model(model_name(_s, _l), lambda s=_s, latency=_l: FunctionModel(script(s, latency), model_name=model_name(s, latency)))
