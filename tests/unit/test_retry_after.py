"""How a provider's error becomes the model-request activity's failure: a 429's `Retry-After` is the
next retry's delay (capped at the retry policy's maximum interval), auth and unknown-model errors are
non-retryable, and the failure is small enough for the history to keep (`activities.provider_failures`).

The errors are the real SDK exceptions, mapped by pydantic-ai's own model code and turned into the
activity's `ApplicationError` by pydantic-ai's Temporal integration, inside an activity context whose
retry policy is the one our model requests run with (`workflows.activity_options.MODEL_RETRY`). The
same path end to end, over HTTP and through a workflow: tests/workflows/test_provider_faults.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.durable_exec.temporal._model_errors import model_errors_as_application_errors
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.models.anthropic._errors import map_api_errors as anthropic_errors
from pydantic_ai.models.openai._errors import map_api_errors as openai_errors
from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.provider_failures import compact_provider_failure
from workflows.activity_options import MODEL_RETRY
from workflows.agents import reflector_agent

HISTORY_FAILURE_LIMIT = 4 * 1024  # the server's limit.mutableStateActivityFailureSize.error default


def _openai_error(status: int, headers: Mapping[str, str], body: dict[str, Any]) -> Exception:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, request=request, headers=dict(headers), json={"error": body})
    cls = {
        429: openai.RateLimitError,
        401: openai.AuthenticationError,
        404: openai.NotFoundError,
        500: openai.InternalServerError,
    }[status]
    return cls(f"Error code: {status}", response=response, body=body)


def _anthropic_error(status: int, headers: Mapping[str, str], kind: str) -> Exception:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    body = {"type": "error", "error": {"type": kind, "message": f"scripted {kind}"}}
    response = httpx2.Response(status, request=request, headers=dict(headers), json=body)
    cls = {429: anthropic.RateLimitError, 401: anthropic.AuthenticationError, 404: anthropic.NotFoundError}[
        status
    ]
    return cls(f"Error code: {status}", response=response, body=body)


def _non_retryable() -> tuple[type[ModelAPIError], ...]:
    """The model errors the reflector agent's durability fails without retrying."""
    durability = TemporalDurability.from_agent(reflector_agent)
    assert durability is not None
    return durability._non_retryable_model_errors


async def _activity_failure(raise_sdk_error: Callable[[], None], mapper: Any) -> ApplicationError:
    """What a model-request activity raises for the SDK error, run as an activity with MODEL_RETRY."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, retry_policy=MODEL_RETRY)

    async def request() -> None:
        with model_errors_as_application_errors(_non_retryable()), mapper("rr-test-model"):
            raise_sdk_error()

    with pytest.raises(ApplicationError) as caught:
        await env.run(request)
    return caught.value


def _raiser(error: Exception) -> Callable[[], None]:
    def go() -> None:
        raise error

    return go


RATE_LIMIT = {"message": "Rate limit reached", "type": "rate_limit_exceeded", "code": "rate_limit_exceeded"}


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        ({"retry-after": "7"}, timedelta(seconds=7)),
        ({"retry-after-ms": "1500"}, timedelta(milliseconds=1500)),  # what OpenAI and Anthropic also send
        ({"retry-after": "3600"}, MODEL_RETRY.maximum_interval),  # capped: never parked beyond the policy
        ({"retry-after": "0"}, timedelta(0)),
    ],
    ids=["seconds", "milliseconds", "capped", "zero"],
)
async def test_openai_429_retry_after_is_the_next_retry_delay(
    headers: dict[str, str], delay: timedelta
) -> None:
    failure = await _activity_failure(_raiser(_openai_error(429, headers, RATE_LIMIT)), openai_errors)
    assert not failure.non_retryable
    assert failure.next_retry_delay == delay
    assert failure.type == "ModelHTTPError"


async def test_anthropic_429_retry_after_is_the_next_retry_delay() -> None:
    error = _anthropic_error(429, {"retry-after": "5"}, "rate_limit_error")
    failure = await _activity_failure(_raiser(error), anthropic_errors)
    assert not failure.non_retryable and failure.next_retry_delay == timedelta(seconds=5)


async def test_without_retry_after_the_policy_backs_off() -> None:
    body = {"message": "boom", "type": "server_error", "code": "server_error"}
    failure = await _activity_failure(_raiser(_openai_error(500, {}, body)), openai_errors)
    assert not failure.non_retryable and failure.next_retry_delay is None
    assert MODEL_RETRY.backoff_coefficient == 2.0 and MODEL_RETRY.initial_interval == timedelta(
        milliseconds=500
    )


@pytest.mark.parametrize(
    "error",
    [
        _openai_error(
            401,
            {},
            {
                "message": "Incorrect API key provided",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            },
        ),
        _openai_error(
            404,
            {},
            {
                "message": "The model `x` does not exist",
                "type": "invalid_request_error",
                "code": "model_not_found",
            },
        ),
    ],
    ids=["openai-401", "openai-404-model-not-found"],
)
async def test_openai_auth_and_unknown_model_are_not_retried(error: Exception) -> None:
    failure = await _activity_failure(_raiser(error), openai_errors)
    assert failure.non_retryable
    assert failure.next_retry_delay is None


@pytest.mark.parametrize(("status", "kind"), [(401, "authentication_error"), (404, "not_found_error")])
async def test_anthropic_auth_and_unknown_model_are_not_retried(status: int, kind: str) -> None:
    failure = await _activity_failure(
        _raiser(_anthropic_error(status, {"retry-after": "9"}, kind)), anthropic_errors
    )
    assert failure.non_retryable  # and so no Retry-After either: there is no next attempt
    assert failure.next_retry_delay is None


async def test_compacted_failure_fits_the_history_and_keeps_the_retry_delay() -> None:
    def deep(n: int) -> None:  # a provider error raised under many frames, as in an agent run
        if n == 0:
            raise _openai_error(429, {"retry-after": "2"}, RATE_LIMIT)
        deeper(n - 1)

    def deeper(n: int) -> None:  # alternating frames: Python's tracebacks fold only repeated identical ones
        deep(n)

    def failure_of(error: BaseException) -> Failure:
        out = Failure()
        DataConverter.default.failure_converter.to_failure(
            error, DataConverter.default.payload_converter, out
        )
        return out

    error = await _activity_failure(lambda: deep(30), openai_errors)
    before = failure_of(error)
    assert (
        before.ByteSize() > HISTORY_FAILURE_LIMIT
    )  # what the server would replace by "Failure exceeds size limit."
    assert compact_provider_failure(error)
    after = failure_of(error)
    assert after.ByteSize() < HISTORY_FAILURE_LIMIT
    assert after.message == before.message and after.cause.message == before.cause.message
    assert after.application_failure_info.next_retry_delay.ToTimedelta() == timedelta(seconds=2)
    assert after.application_failure_info.details == before.application_failure_info.details
    assert not after.stack_trace and not after.cause.stack_trace


def test_only_provider_failures_are_compacted() -> None:
    try:
        raise ApplicationError("a cell crashed")
    except ApplicationError as e:
        plain = e
    assert not compact_provider_failure(plain)
    assert plain.__traceback__ is not None


async def test_worker_log_line_is_one_line() -> None:
    import logging

    from activities.provider_failures import ProviderFailureLogLine

    retried = await _activity_failure(
        _raiser(_openai_error(429, {"retry-after": "2"}, RATE_LIMIT)), openai_errors
    )
    refused = await _activity_failure(
        _raiser(_openai_error(401, {}, {"message": "Incorrect API key provided", "code": "invalid_api_key"})),
        openai_errors,
    )

    def record(error: BaseException) -> logging.LogRecord:
        r = logging.LogRecord(
            "temporalio.activity",
            logging.WARNING,
            __file__,
            1,
            "Completing activity as failed",
            None,
            (type(error), error, error.__traceback__),
        )
        r.temporal_activity = {"workflow_id": "wf-1", "attempt": 3}
        return r

    line = ProviderFailureLogLine()
    r = record(retried)
    assert line.filter(r) and r.exc_info is None and r.levelno == logging.WARNING
    assert r.getMessage() == (
        "model request of workflow wf-1 failed at attempt 3 (Temporal retries it): "
        "rate limited (HTTP 429): Rate limit reached [rate_limit_exceeded] (model 'rr-test-model')"
    )
    r = record(refused)
    logging.getLogger("temporalio.activity").setLevel(logging.WARNING)
    try:
        assert not line.filter(r)  # the reflection reports it: not a second line at WARNING
    finally:
        logging.getLogger("temporalio.activity").setLevel(logging.NOTSET)
    assert r.levelno == logging.INFO and "(not retried): authentication failed (HTTP 401)" in r.getMessage()
    other = logging.LogRecord("temporalio.activity", logging.WARNING, __file__, 1, "x", None, None)
    assert line.filter(other) and other.getMessage() == "x"


def test_provider_clients_take_rr_provider_timeout_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from reflector.runtime import models
    from reflector.runtime.settings import DEFAULT_PROVIDER_TIMEOUT_S, SettingError, Settings

    def built(name: str) -> Any:
        monkeypatch.setattr(models, "_instances", {})
        model: Any = models.resolve_model(name)
        return model.client

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.delenv("RR_PROVIDER_TIMEOUT_S", raising=False)
    assert DEFAULT_PROVIDER_TIMEOUT_S < 300  # below the model-request activity's start-to-close limit
    assert built("openai-chat:gpt-4o").timeout == DEFAULT_PROVIDER_TIMEOUT_S
    monkeypatch.setenv("RR_PROVIDER_TIMEOUT_S", "7.5")
    for name in ("openai:gpt-4o", "openai-chat:gpt-4o", "anthropic:claude-sonnet-4-5"):
        client = built(name)
        assert client.timeout == 7.5 and client.max_retries == 0, name
    monkeypatch.setenv("RR_PROVIDER_TIMEOUT_S", "soon")
    with pytest.raises(SettingError, match="RR_PROVIDER_TIMEOUT_S"):
        Settings.from_env()
