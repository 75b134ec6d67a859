"""A small pydantic-ai agent against the scripted local Chat Completions server: the request bodies it sent.

Shared by the tests of the worker's request shortcuts (`reflector.runtime.lean_openai`, `lean_schemas`), which
compare these bodies with and without the shortcut.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, ToolOutput
from pydantic_ai.models.openai import OpenAIChatModel

from reflector.contract import OUTPUT_TOOL, ReflectionDraft
from reflector.runtime import models
from reflector.testing.openai_server import OpenAIServer

__all__ = ["run_agent"]


async def run_agent(monkeypatch: pytest.MonkeyPatch, model_name: str) -> list[dict[str, Any]]:
    """Three Chat Completions requests of a pydantic-ai agent (two cells, then the answer): the bodies the
    local server received."""
    with OpenAIServer(cells=2) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        model = OpenAIChatModel(model_name, provider=models._no_retry_provider("openai-chat"))
        agent: Agent[None, ReflectionDraft] = Agent(
            model,
            output_type=ToolOutput(ReflectionDraft, name=OUTPUT_TOOL),
            instructions="Reflect on the trace.",
        )

        @agent.tool_plain
        def execute_code(code: str) -> str:
            """Run a cell."""
            return f"ran {len(code)} chars"

        result = await agent.run("go", model_settings={"temperature": 0.0})
        assert isinstance(result.output, ReflectionDraft)
        return [r.body for r in server.requests]
