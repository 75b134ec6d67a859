"""Provider prompt caching through the real provider path (`reflector.analysis.prompt_cache`): what the requests carry,
and that the cached tokens a provider reports reach the reflection's usage.

Real SDK clients and HTTP against the local scripted servers (`reflector.testing.openai_server`,
`reflector.testing.anthropic_server`), the session's in-process worker: a config that says nothing about caching
gets it (OpenAI: one `prompt_cache_key` per session; Anthropic: cache points), a config with `cache: False`
gets none, and the servers' `cached_tokens` / `cache_write_tokens` end up in `raw["usage"]`, in every usage
record and in the rendered reflection.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from reflector import client as rr
from reflector.analysis.prompt_cache import cache_key
from reflector.client.render import render_reflection
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from reflector.testing.anthropic_server import AnthropicServer
from reflector.testing.openai_server import OpenAIServer
from tests.support.fixtures import write_trace

PROMPT, CACHED, WRITTEN, COMPLETION = 100, 60, 30, 20


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    yield monkeypatch


async def _reflect(
    client: Client,
    tq: str,
    settings: Settings,
    trace: Path,
    model: str,
    model_settings: dict[str, Any] | None = None,
) -> tuple[str, ReflectorOutput]:
    ref = rr.upload_trace(trace, settings)
    cfg = ReflectionConfig(
        model=f"{model}-{uuid.uuid4().hex[:8]}", max_requests=10, model_settings=model_settings
    )
    handle = await rr.start_reflection(
        client, rr.build_input(ref, config=cfg), tq, f"t-cache-{uuid.uuid4().hex[:10]}"
    )
    out = await handle.result()
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    return handle.id, out


@pytest.mark.parametrize("prefix", ["openai-chat", "openai"], ids=["chat-completions", "responses"])
async def test_openai_requests_share_a_session_cache_key_and_cached_tokens_are_counted(
    client, task_queue, settings, tmp_path, keys, prefix: str
) -> None:
    with OpenAIServer(prompt_tokens=PROMPT, completion_tokens=COMPLETION, cached_tokens=CACHED) as server:
        keys.setenv("OPENAI_BASE_URL", server.base_url)
        wf_id, out = await _reflect(client, task_queue, settings, write_trace(tmp_path), f"{prefix}:rr-cache")
    bodies = [r.body for r in server.ok_requests()]
    assert len(bodies) == 2  # one cell, then the answer
    assert {b.get("prompt_cache_key") for b in bodies} == {cache_key(wf_id)}
    assert wf_id not in json.dumps(bodies)  # the key is a hash: no workflow (trace) name reaches the provider
    usage = out.raw["usage"]
    assert (usage["input_tokens"], usage["cache_read_tokens"], usage["cache_write_tokens"]) == (
        2 * PROMPT,
        2 * CACHED,
        0,
    )
    assert [r["cache_read_tokens"] for r in out.raw["usage_records"]] == [CACHED, CACHED]
    assert f"{2 * CACHED:,} cache reads" in render_reflection(out)


async def test_anthropic_requests_carry_cache_points_and_cache_tokens_are_counted(
    client, task_queue, settings, tmp_path, keys
) -> None:
    with AnthropicServer(
        prompt_tokens=PROMPT, completion_tokens=COMPLETION, cached_tokens=CACHED, cache_write_tokens=WRITTEN
    ) as server:
        keys.setenv("ANTHROPIC_BASE_URL", server.sdk_base_url)
        _, out = await _reflect(client, task_queue, settings, write_trace(tmp_path), "anthropic:rr-cache")
    bodies = [r.body for r in server.ok_requests()]
    assert len(bodies) == 2
    for body in bodies:
        assert "cache_control" in body["tools"][-1], body["tools"][-1]  # the tool definitions
        assert any("cache_control" in block for block in body["system"]), body["system"]  # the instructions
        assert (
            "cache_control" in body
            or any(  # the conversation: automatic mode or a point on the last message
                isinstance(block, dict) and "cache_control" in block
                for block in body["messages"][-1]["content"]
                if isinstance(body["messages"][-1]["content"], list)
            )
        )
    usage = out.raw["usage"]
    # pydantic-ai's input tokens are Anthropic's uncached input plus the cache reads and writes
    assert (usage["input_tokens"], usage["cache_read_tokens"], usage["cache_write_tokens"]) == (
        2 * (PROMPT + CACHED + WRITTEN),
        2 * CACHED,
        2 * WRITTEN,
    )


async def test_cache_false_sends_no_cache_settings(client, task_queue, settings, tmp_path, keys) -> None:
    with OpenAIServer() as openai, AnthropicServer() as anthropic:
        keys.setenv("OPENAI_BASE_URL", openai.base_url)
        keys.setenv("ANTHROPIC_BASE_URL", anthropic.sdk_base_url)
        trace = write_trace(tmp_path)
        await _reflect(client, task_queue, settings, trace, "openai-chat:rr-nocache", {"cache": False})
        await _reflect(client, task_queue, settings, trace, "anthropic:rr-nocache", {"cache": False})
    assert openai.ok_requests() and anthropic.ok_requests()
    assert not any("prompt_cache_key" in r.body for r in openai.ok_requests())
    assert not any("cache_control" in json.dumps(r.body) for r in anthropic.ok_requests())
