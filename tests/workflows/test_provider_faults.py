"""Provider faults through the real provider path: real SDK clients, real HTTP, real workflow and worker.

The local scripted servers (`reflector.testing.openai_server`, `reflector.testing.anthropic_server`)
inject each fault into the first model request of a reflection (one test: into the request after a
cell); the reflection must still complete,
through Temporal's activity retries (the SDKs retry nothing: `reflector.runtime.models`), and the server must
never have answered the same request twice (`completed`: a key counted twice would be paid twice).
Authentication errors and unknown models must fail fast: one HTTP request, no retry, a clear error.

Three protocols: ``openai-chat:`` (Chat Completions), ``openai:`` (Responses) and ``anthropic:``
(Messages). The worker is the session's in-process one (`tests/workflows/conftest.py`), so the
provider environment is set with monkeypatch before a model is first resolved, and every test uses a
fresh model name (`reflector.runtime.models` caches the model objects, and with them the client's timeout).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory

from reflector import client as rr
from reflector.cli import common as cli
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from reflector.testing.anthropic_server import AnthropicServer
from reflector.testing.openai_server import OpenAIServer
from reflector.testing.scripted_http import NO_REPLY, Fault, ScriptedServer
from tests.support.fixtures import ACE_TRACE, completed_activities, write_trace
from workflows.activity_options import MODEL_RETRY

API_KEY = "test-key"
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 20
N_STEPS = len(ACE_TRACE["steps"])
PROVIDER_TIMEOUT_S = 1.0  # RR_PROVIDER_TIMEOUT_S for these tests: a held reply fails its attempt quickly
RETRY_AFTER_S = 2  # well above the policy's first backoff (0.5 s; ~1 s as the server's timers fire): it shows


@dataclass(frozen=True)
class Protocol:
    prefix: str  # the model string's provider prefix
    endpoint: str  # the path the SDK posts to
    server: type[ScriptedServer]


PROTOCOLS = {
    "chat-completions": Protocol("openai-chat", "/v1/chat/completions", OpenAIServer),
    "responses": Protocol("openai", "/v1/responses", OpenAIServer),
    "anthropic-messages": Protocol("anthropic", "/v1/messages", AnthropicServer),
}
protocols = pytest.mark.parametrize("proto", list(PROTOCOLS.values()), ids=list(PROTOCOLS))


@pytest.fixture
def provider_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("RR_PROVIDER_TIMEOUT_S", str(PROVIDER_TIMEOUT_S))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    yield monkeypatch


@contextmanager
def _serve(proto: Protocol, monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    """The protocol's scripted server, running, with the SDK's base URL pointed at it."""
    with proto.server(prompt_tokens=PROMPT_TOKENS, completion_tokens=COMPLETION_TOKENS) as server:
        if isinstance(server, AnthropicServer):
            monkeypatch.setenv("ANTHROPIC_BASE_URL", server.sdk_base_url)
        else:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        yield server


def _model_name(proto: Protocol) -> str:
    return f"{proto.prefix}:rr-test-model-{uuid.uuid4().hex[:8]}"


async def _reflect(
    client: Client, tq: str, settings: Settings, trace: Path, model: str
) -> tuple[ReflectorOutput, WorkflowHistory]:
    ref = rr.upload_trace(trace, settings)
    inp = rr.build_input(
        ref,
        question="What is 17 * 24?",
        ground_truth="408",
        config=ReflectionConfig(model=model, max_requests=10),
    )
    handle = await rr.start_reflection(client, inp, tq, f"t-fault-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    return out, await handle.fetch_history()


def _model_attempts(history: WorkflowHistory) -> list[int]:
    """The attempt number of each model request that completed."""
    return [r.attempt for r in completed_activities(history.events) if r.is_model_request]


def _retried_failures(history: WorkflowHistory) -> list[HistoryEvent]:
    """The `ActivityTaskStarted` events of retried activities (they carry the previous attempt's failure)."""
    return [
        e
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
        and e.activity_task_started_event_attributes.HasField("last_failure")
    ]


def _assert_nothing_paid_twice(server: ScriptedServer) -> None:
    assert server.completed, "the server answered nothing"
    assert max(server.completed.values()) == 1, server.duplicated_completions()


# fault -> what the attempt's failure, recorded in the history, says
FAULTS = {
    "429-retry-after": (Fault.rate_limited(RETRY_AFTER_S), "status_code: 429"),
    "500": (Fault.server_error(), "status_code: 500"),
    "timeout": (Fault.timeout(hold_s=10 * PROVIDER_TIMEOUT_S), "timed out"),
    "truncated-body": (Fault.truncated(), "Connection error"),
    "malformed-json": (Fault.malformed(), "Failed to decode response as JSON"),
}


@pytest.mark.parametrize(("fault", "failure"), list(FAULTS.values()), ids=list(FAULTS))
@protocols
async def test_reflection_completes_through_a_provider_fault(
    client, task_queue, settings, tmp_path, provider_env, proto: Protocol, fault: Fault, failure: str
) -> None:
    with _serve(proto, provider_env) as server:
        server.faults.append(fault)  # the first model request meets the fault
        out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), _model_name(proto))

    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "completed" and rt["cells"] == 1, out.raw
    assert f"steps {N_STEPS}" in out.error_identification  # the model read the cell's output
    # the server's log: the faulted request, the same request sent again, then the next step's request
    expected = NO_REPLY if fault.kind == "timeout" else fault.status
    assert [r.status for r in server.requests] == [expected, 200, 200]
    assert server.statuses() == [fault.status if fault.kind == "http" else fault.kind, 200, 200]
    assert [r.path.split("?")[0] for r in server.requests] == [proto.endpoint] * 3
    assert server.requests[0].body == server.requests[1].body
    # each attempt is one request of the SDK (its own retries are off), with RR_PROVIDER_TIMEOUT_S as its timeout
    assert {r.headers.get("x-stainless-retry-count") for r in server.requests} == {"0"}
    assert {r.headers.get("x-stainless-read-timeout") for r in server.requests} == {str(PROVIDER_TIMEOUT_S)}
    # no completed request repeated: every request answered at most once, i.e. paid once
    _assert_nothing_paid_twice(server)
    assert sum(server.completed.values()) == 2
    # Temporal's retry, one HTTP request per attempt (the SDK retried nothing): the faulted model request
    # completed at its second attempt, the next one at its first
    assert _model_attempts(history) == [2, 1]
    [retried] = _retried_failures(history)
    last = retried.activity_task_started_event_attributes.last_failure
    # the history says which fault the attempt survived (a truncated body: the SDK's "Connection error", or the
    # transport's own words when the SDK reads the body after the headers, as anthropic's 2.17 does)
    words = (
        (failure, "peer closed connection without sending complete message body")
        if fault.kind == "truncated"
        else (failure,)
    )
    assert any(w in last.message for w in words), last.message
    info = last.application_failure_info
    assert not info.non_retryable
    gap = server.requests[1].received - server.requests[0].received
    if fault.retry_after_s is not None:
        # Retry-After is honoured: the attempt's failure carries it as the next retry's delay, and the
        # server saw the retry no sooner (the retry policy's own first backoff is 0.5 s)
        assert info.next_retry_delay.ToTimedelta() == timedelta(seconds=fault.retry_after_s)
        assert gap >= fault.retry_after_s
    else:
        assert not info.HasField("next_retry_delay")  # the retry policy's backoff
        assert gap >= MODEL_RETRY.initial_interval.total_seconds()
    # the ledger charges the two answers only
    assert out.raw["usage"]["requests"] == 2
    assert out.raw["usage"]["input_tokens"] == 2 * PROMPT_TOKENS


# fault -> the start of the reflection's error
REJECTIONS = {
    "401-unauthorized": (
        Fault.unauthorized(),
        "authentication failed (HTTP 401): Incorrect API key provided",
    ),
    "404-model-not-found": (
        Fault.model_not_found("rr-missing"),
        "model not found (HTTP 404): The model `rr-missing` does not exist",
    ),
}


@pytest.mark.parametrize(("fault", "error"), list(REJECTIONS.values()), ids=list(REJECTIONS))
@pytest.mark.parametrize(
    "proto",
    [PROTOCOLS["chat-completions"], PROTOCOLS["anthropic-messages"]],
    ids=["chat-completions", "anthropic-messages"],
)  # Responses maps errors as Chat does
async def test_rejected_request_fails_fast_and_clearly(
    client, task_queue, settings, tmp_path, provider_env, capsys, proto: Protocol, fault: Fault, error: str
) -> None:
    with _serve(proto, provider_env) as server:
        server.faults.extend(
            [fault] * 6
        )  # every attempt would be refused: a retry would show as a second request
        model = _model_name(proto)
        out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), model)

    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "error", out.raw
    # the provider's complaint, one line, naming the model
    assert out.raw["error"].startswith(error), out.raw["error"]
    assert out.raw["error"].endswith(f"(model {model.split(':', 1)[1]!r})") and "\n" not in out.raw["error"]
    # one HTTP request, one attempt: non-retryable, no backoff loop
    assert [r.status for r in server.requests] == [fault.status]
    failed = [
        e.activity_task_failed_event_attributes
        for e in history.events
        if e.HasField("activity_task_failed_event_attributes")
    ]
    assert len(failed) == 1 and failed[0].failure.application_failure_info.non_retryable
    assert not _retried_failures(history) and _model_attempts(history) == []
    # the budget is not burned: nothing was answered, nothing is charged
    assert out.raw["usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "requests": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert not server.completed
    # `rr reflect` ends with one line saying why
    assert cli._finished(out) == rr.EXIT_INCOMPLETE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rr: the reflection is INCOMPLETE (stop reason: error: {error}"
    )


async def test_anthropic_messages_reflection(client, task_queue, settings, tmp_path, provider_env) -> None:
    """A normal reflection over the Anthropic Messages protocol: what the SDK sent, what was charged."""
    proto = PROTOCOLS["anthropic-messages"]
    with _serve(proto, provider_env) as server:
        model = _model_name(proto)
        out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), model)

    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    assert out.raw["model"] == model
    assert f"steps {N_STEPS}" in out.error_identification and "local Anthropic server" in out.reasoning
    assert server.statuses() == [200, 200]
    _assert_nothing_paid_twice(server)
    assert out.raw["usage"] == {
        "input_tokens": 2 * PROMPT_TOKENS,
        "output_tokens": 2 * COMPLETION_TOKENS,
        "total_tokens": 2 * (PROMPT_TOKENS + COMPLETION_TOKENS),
        "requests": 2,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert _model_attempts(history) == [1, 1]
    first, second = server.requests
    for r in (first, second):
        assert r.path.split("?")[0] == "/v1/messages"
        assert API_KEY in (
            r.headers.get("x-api-key"),
            r.headers.get("authorization", "").removeprefix("Bearer "),
        )
        assert "anthropic-version" in r.headers
        assert r.body["model"] == model.split(":", 1)[1]
        # a small trace: no `recurse` (its strategy does not split; tests/workflows/test_prompt_snapshot.py)
        assert {t["name"] for t in r.body["tools"]} == {"execute_code", "think", "final_result"}
    # the second request carried the server's execute_code call back with the cell's output
    blocks = [b for m in second.body["messages"] for b in m["content"] if isinstance(m["content"], list)]
    [call] = [b for b in blocks if b["type"] == "tool_use"]
    [result] = [b for b in blocks if b["type"] == "tool_result"]
    assert call["name"] == "execute_code" and result["tool_use_id"] == call["id"]
    assert f"steps {N_STEPS}" in str(result["content"])


async def test_fault_after_a_cell_retries_the_request_not_the_cell(
    client, task_queue, settings, tmp_path, provider_env
) -> None:
    """A fault on the second model request (the one carrying the cell's output): the request is sent again
    as it was, the cell is not run again, and nothing is answered twice."""
    proto = PROTOCOLS["chat-completions"]
    with _serve(proto, provider_env) as server:
        server.fault_at(2, Fault.truncated())
        out, history = await _reflect(client, task_queue, settings, write_trace(tmp_path), _model_name(proto))

    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "completed" and rt["cells"] == 1 and rt["failed_cells"] == 0, out.raw
    assert server.statuses() == [200, "truncated", 200]
    assert server.requests[1].body == server.requests[2].body  # the same tool result, not a re-run cell's
    _assert_nothing_paid_twice(server)
    assert _model_attempts(history) == [1, 2]
    cells = [
        r for r in completed_activities(history.events) if "model_request" not in r.name and r.attempt > 1
    ]
    assert cells == [], [(r.name, r.attempt) for r in cells]
    assert out.raw["usage"]["requests"] == 2
