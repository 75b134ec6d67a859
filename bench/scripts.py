"""Scripted models for benchmarks: `bench-<steps>-<latency_ms>` (a cell per step, then the answer).

Driven only by the message history, with the model latency simulated by `asyncio.sleep` inside the
model request (as a provider round trip would be). Import this module, or put it in `RR_PLUGINS`,
to register the models.
"""

from __future__ import annotations

import asyncio
import os

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from reflector.runtime.models import register_model

STEPS = (10, 20)
LATENCIES_MS = (0, 200)  # what bench/overhead.py runs
GRID_LATENCIES_MS = (200, 1000, 3000)  # bench/throughput.py --grid


def _n_returns(messages: list[ModelMessage]) -> int:
    return sum(
        1
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == "execute_code"
    )


CALLS_FILE_ENV = "RR_BENCH_CALLS_FILE"


def count_call() -> None:
    """Append one byte to `$RR_BENCH_CALLS_FILE` per model call (a request paid twice shows up)."""
    path = os.environ.get(CALLS_FILE_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)


def calls_so_far() -> int:
    path = os.environ.get(CALLS_FILE_ENV)
    return os.path.getsize(path) if path and os.path.exists(path) else 0


def _usage(messages: list[ModelMessage]) -> RequestUsage:
    """Token counts as a provider reports them (else `FunctionModel` estimates them by walking the whole
    history at every request: CPU that no real model request costs the worker)."""
    return RequestUsage(input_tokens=100 * len(messages), output_tokens=30)


def script(steps: int, latency_ms: int):  # type: ignore[no-untyped-def]
    async def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        count_call()
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        k = _n_returns(messages)
        if k < steps:
            code = f"v{k} = {k} * 2\nprint(v{k})"
            return ModelResponse(
                parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id=f"c{k}")],
                usage=_usage(messages),
            )
        args = {
            "reasoning": f"{steps} cells ran",
            "error_identification": "none",
            "root_cause_analysis": "none",
            "correct_approach": "none",
            "key_insight": "none",
            "extracted_learnings": [],
            "skill_tags": [],
        }
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")],
            usage=_usage(messages),
        )

    return fn


def model_name(steps: int, latency_ms: int) -> str:
    return f"bench-{steps}-{latency_ms}"


for _s in STEPS:
    for _l in sorted({*LATENCIES_MS, *GRID_LATENCIES_MS}):
        register_model(
            model_name(_s, _l),
            lambda s=_s, latency=_l: FunctionModel(script(s, latency), model_name=model_name(s, latency)),
        )


# A long reflection for the history-size benchmark: `cells` cells printing `chars` characters each, then
# the answer. It survives compaction: the summary it writes says how many cells ran, and it resumes
# from that count when its context was replaced by [task, summary, continuation].
_DONE_RE = __import__("re").compile(r"bench summary: (\d+) cells")


def long_script(cells: int, chars: int):  # type: ignore[no-untyped-def]
    async def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        first = next(
            (str(p.content) for m in messages for p in m.parts if type(p).__name__ == "UserPromptPart"), ""
        )
        if first.startswith("SUMMARISE_TRANSCRIPT"):
            before = [int(x) for x in _DONE_RE.findall(first)]
            n = first.count("[ToolReturnPart execute_code]") + (before[-1] if before else 0)
            return ModelResponse(parts=[TextPart(f"bench summary: {n} cells ran")])
        summarised = [
            int(x)
            for m in messages
            for p in m.parts
            if isinstance(p, TextPart)
            for x in _DONE_RE.findall(p.content)
        ]
        k = _n_returns(messages) + (summarised[-1] if summarised else 0)
        if k < cells and info.function_tools:
            words = chars // 5
            code = f"w{k} = ' '.join(['word'] * {words})\nprint({k}, w{k})"
            return ModelResponse(parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id=f"c{k}")])
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, _ANSWER, tool_call_id="final")])

    return fn


_ANSWER = {
    "reasoning": "bench",
    "error_identification": "none",
    "root_cause_analysis": "none",
    "correct_approach": "none",
    "key_insight": "none",
    "extracted_learnings": [],
    "skill_tags": [],
}
register_model("bench-long-59", lambda: FunctionModel(long_script(59, 2_000), model_name="bench-long-59"))
