"""ReflectionWorkflow against a local OpenAI-compatible HTTP server (real SDK, real HTTP, loopback only).

The in-process worker of `tests/workflows/conftest.py` runs in this process, so the provider
environment (`OPENAI_BASE_URL`, `OPENAI_API_KEY`) is set with monkeypatch before the model is first
resolved. `reflector.runtime.models` caches model objects per name, so every test uses a fresh model name.

Two protocols are covered, because the model string decides which one pydantic-ai speaks:
``openai-chat:NAME`` is `OpenAIChatModel` (``POST /v1/chat/completions``) and ``openai:NAME`` is
`OpenAIResponsesModel` (``POST /v1/responses``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory

import worker
from reflector import client as rr
from reflector.contract import PATCHES_FIRST_PATCH, ReflectionConfig, ReflectorOutput
from reflector.runtime import models
from reflector.runtime.settings import Settings
from reflector.testing.openai_server import CELL_CODE, OpenAIServer
from tests.support.fixtures import ACE_TRACE, completed_activities, write_trace
from workflows.patches import ASKED_AT_START, LIBRARY_PATCHES

API_KEY = "test-key"
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 20
N_STEPS = len(ACE_TRACE["steps"])

# model prefix -> the endpoint pydantic-ai's model class for it posts to
PROTOCOLS = {
    "openai-chat": "/v1/chat/completions",
    "openai": "/v1/responses",
}
# HTTP status -> (pydantic-ai error category, openai SDK error) in the activity failure's cause chain
protocols = pytest.mark.parametrize("prefix", list(PROTOCOLS), ids=["chat-completions", "responses"])


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    with OpenAIServer(prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        yield server


def _model_name(prefix: str) -> str:
    return f"{prefix}:rr-test-model-{uuid.uuid4().hex[:8]}"


async def _reflect(
    client: Client, tq: str, settings: Settings, trace: Path, model: str
) -> tuple[ReflectorOutput, WorkflowHistory]:
    ref = rr.upload_trace(trace, settings)
    inp = rr.build_input(
        ref, question="What is 17 * 24?", ground_truth="408", config=ReflectionConfig(model=model)
    )
    handle = await rr.start_reflection(client, inp, tq, f"t-oai-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    return out, await handle.fetch_history()


def _tool_names(prefix: str, body: dict[str, object]) -> set[str]:
    tools = body.get("tools") or []
    assert isinstance(tools, list)
    if prefix == "openai-chat":
        return {t["function"]["name"] for t in tools}
    return {t["name"] for t in tools}


def _sent_cell_outputs(prefix: str, body: dict[str, object]) -> list[str]:
    """What the request carried back as the result of the `execute_code` call."""
    if prefix == "openai-chat":
        msgs = body["messages"]
        assert isinstance(msgs, list)
        return [str(m["content"]) for m in msgs if m.get("role") == "tool"]
    items = body["input"]
    assert isinstance(items, list)
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output"]


def _sent_cell_calls(prefix: str, body: dict[str, object]) -> list[object]:
    """Arguments of the assistant's `execute_code` calls echoed back in the request."""
    if prefix == "openai-chat":
        msgs = body["messages"]
        assert isinstance(msgs, list)
        calls = [
            tc["function"] for m in msgs if m.get("role") == "assistant" for tc in m.get("tool_calls") or []
        ]
    else:
        items = body["input"]
        assert isinstance(items, list)
        calls = [i for i in items if i.get("type") == "function_call"]
    return [json.loads(c["arguments"]) for c in calls if c["name"] == "execute_code"]


def _model_attempts(history: WorkflowHistory) -> list[int]:
    """The attempt number of each model request that completed."""
    return [r.attempt for r in completed_activities(history.events) if r.is_model_request]


def _patches(history: WorkflowHistory) -> set[str]:
    """Patch ids recorded in the history (core_patch markers)."""
    out = set()
    for e in history.events:
        m = e.marker_recorded_event_attributes
        if e.HasField("marker_recorded_event_attributes") and m.marker_name == "core_patch":
            out.add(json.loads(m.details["patch-data"].payloads[0].data)["id"])
    return out


@protocols
async def test_reflection_completes_over_local_openai_server(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer, prefix: str
) -> None:
    model = _model_name(prefix)
    out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), model)

    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "completed" and rt["cells"] == 1 and rt["failed_cells"] == 0, rt
    assert out.raw["model"] == model
    # the final answer quotes what the model's cell printed in the sandbox (server -> tool -> server)
    # (every cell output the model sees starts with the cell's id: cells 1 and 2 are the prefill's)
    assert f"cell said: [cell 3]\nsteps {N_STEPS}" == out.error_identification
    assert out.extracted_learnings[0].evidence == f"[cell 3]\nsteps {N_STEPS}"

    reqs = openai_server.requests
    assert [r.path for r in reqs] == [PROTOCOLS[prefix]] * 2
    assert all(r.status == 200 for r in reqs)
    # usage in raw is exactly what the server reported, summed over its two replies
    assert out.raw["usage"] == {
        "input_tokens": 2 * PROMPT_TOKENS,
        "output_tokens": 2 * COMPLETION_TOKENS,
        "total_tokens": 2 * (PROMPT_TOKENS + COMPLETION_TOKENS),
        "requests": 2,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    # one model-request activity per HTTP request, none retried; a provider model's requests are
    # pydantic-ai's regular activities (they hold no workflow task while the provider thinks)
    assert _model_attempts(history) == [1, 1]
    requests = [r for r in completed_activities(history.events) if r.is_model_request]
    assert [(r.name, r.local) for r in requests] == [("agent__rr_reflector__model_request", False)] * 2
    # and they are the only regular activities: nothing of a provider model's is cached, so no activity
    # forgets cached responses at the end (an in-process model's session has one: tests/workflows/test_reflection.py)
    assert [r.name for r in completed_activities(history.events) if not r.local] == [
        "agent__rr_reflector__model_request"
    ] * 2
    # the provider-model behaviour is implied by the one patch decided before the first command; the patches
    # added since are asked at start too
    assert _patches(history) == {PATCHES_FIRST_PATCH, *LIBRARY_PATCHES, *ASKED_AT_START}

    for r in reqs:
        assert r.headers["authorization"] == f"Bearer {API_KEY}"
        assert r.body["model"] == model.split(":", 1)[1]
        assert r.body["temperature"] == 0.0
        assert r.body.get("stream") in (None, False)
        # a small trace: no `recurse` (its strategy does not split; tests/workflows/test_prompt_snapshot.py)
        assert _tool_names(prefix, r.body) == {"execute_code", "think", "final_result"}
    # the first request carried no tool result; the second echoed the server's execute_code call and
    # carried the output of that cell, run in the sandbox against the uploaded trace
    assert _sent_cell_outputs(prefix, reqs[0].body) == []
    assert _sent_cell_calls(prefix, reqs[1].body) == [{"code": CELL_CODE}]
    assert [o.strip() for o in _sent_cell_outputs(prefix, reqs[1].body)] == [f"[cell 3]\nsteps {N_STEPS}"]


@pytest.mark.parametrize("status", [500, 429])
@protocols
async def test_sdk_retries_are_off_and_temporal_retries_the_activity(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer, prefix: str, status: int
) -> None:
    openai_server.fail_next(1, status=status)
    model = _model_name(prefix)
    out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), model)

    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    assert f"steps {N_STEPS}" in out.error_identification
    n_model = out.raw["usage"]["requests"]
    assert n_model == 2
    statuses = [r.status for r in openai_server.requests]
    assert statuses == [status, 200, 200], statuses
    assert len(openai_server.requests) == n_model + 1
    # usage counts only the replies that reached the agent
    assert out.raw["usage"]["input_tokens"] == n_model * PROMPT_TOKENS

    attempts = _model_attempts(history)
    assert len(attempts) == 2, "a retry is a new attempt of the same activity, not a new activity"
    # exactly one HTTP request per activity attempt: the SDK did not retry the error by itself (an SDK
    # retry would show as 3 HTTP requests in 2 attempts). Temporal records the attempt that succeeded,
    # not the failure of the one before.
    assert attempts == [2, 1], attempts
    assert sum(attempts) == len(openai_server.requests), (
        f"{len(openai_server.requests)} HTTP requests in {sum(attempts)} activity attempts: "
        "the provider SDK retried inside an attempt"
    )


@protocols
async def test_history_replays_without_credentials(
    client,
    task_queue,
    settings,
    tmp_path,
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    prefix: str,
) -> None:

    model = _model_name(prefix)
    out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), model)
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    n_http = len(openai_server.requests)

    # no provider configuration at all: without a base URL the SDK would not even accept a missing key
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    # forget every model object built while the key was set, so replay has to build its own
    monkeypatch.setattr(models, "_instances", {})
    monkeypatch.setattr(models, "_workflow_side", {})
    with pytest.raises(models.UnknownModelError):  # proof: a live client cannot be built now
        models.resolve_model(model)

    replayer = worker.make_replayer(Settings.from_env().blob_dir)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, repr(result.replay_failure)
    assert len(openai_server.requests) == n_http, "replay must not send model requests"


async def test_provider_retries_are_the_servers_and_hold_no_workflow_task(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer
) -> None:
    """A provider request is a regular activity: its retries (backoff 0.5 s, then 1 s) are scheduled by
    the server, with no workflow timer and no workflow task open while they wait."""
    openai_server.fail_next(2, status=500)
    out, history = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), _model_name("openai-chat")
    )
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    assert [r.status for r in openai_server.requests] == [500, 500, 200, 200]
    assert not [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert _model_attempts(history) == [3, 1]
