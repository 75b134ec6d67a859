"""The local model-request activity's response cache: a request is sent at most once per
(workflow run, local-activity id), also when an attempt is re-executed or runs concurrently."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse, TextPart
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import model_requests


@pytest.fixture(autouse=True)
def _cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_requests, "_default", model_requests.ResponseCache(tmp_path / "responses"))


def _env(workflow_id: str = "wf-1", run_id: str = "run-1", activity_id: str = "7") -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = activity.Info(
        **{
            **env.info.__dict__,
            "workflow_id": workflow_id,
            "workflow_run_id": run_id,
            "activity_id": activity_id,
            "is_local": True,
        }
    )
    return env


async def _run(act: Any, params: object, **env: str) -> ModelResponse:
    """Run the activity the way the workflow does: the request handed over in process, the key as input."""
    with model_requests.handed_over(params, None) as key:
        return await _env(**env).run(act, key)


def _counting(delay: float = 0.0) -> tuple[Any, list[object]]:
    calls: list[object] = []

    async def inner(params: Any, deps: Any) -> ModelResponse:
        calls.append(params)
        await asyncio.sleep(delay)
        return ModelResponse(parts=[TextPart(f"answer {len(calls)}")], model_name="m")

    return inner, calls


async def test_a_re_executed_request_returns_the_stored_response() -> None:
    inner, calls = _counting()
    act = model_requests.cached_request_activity(inner, "test_request_local")
    first = await _run(act, {"q": 1})
    again = await _run(act, {"q": 1})
    assert len(calls) == 1 and again == first
    assert (model_requests.response_dir("wf-1") / "run-1.7.json").is_file()
    # another request of the run (or another run) is a new request
    await _run(act, {"q": 2}, activity_id="8")
    await _run(act, {"q": 1}, run_id="run-2")
    assert len(calls) == 3


async def test_a_request_in_flight_is_awaited_not_sent_again() -> None:
    inner, calls = _counting(delay=0.2)
    act = model_requests.cached_request_activity(inner, "test_request_local")
    a, b = await asyncio.gather(_run(act, {}), _run(act, {}))
    assert len(calls) == 1 and a == b


async def test_a_cancelled_attempt_does_not_abandon_the_paid_request() -> None:
    inner, calls = _counting(delay=0.2)
    act = model_requests.cached_request_activity(inner, "test_request_local")
    attempt = asyncio.ensure_future(_run(act, {}))
    await asyncio.sleep(0.05)
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    response = await _run(act, {})  # the next attempt gets the response of the first request
    assert len(calls) == 1 and response.parts[0].content == "answer 1"


async def test_an_unreadable_entry_is_requested_again() -> None:
    inner, calls = _counting()
    act = model_requests.cached_request_activity(inner, "test_request_local")
    path = model_requests.response_dir("wf-1") / "run-1.7.json"
    path.parent.mkdir(parents=True)
    path.write_text("{truncated")
    await _run(act, {})
    assert len(calls) == 1


async def test_the_request_reaches_the_model_as_handed_over_and_a_missing_one_is_a_clear_error() -> None:
    inner, calls = _counting()
    act = model_requests.cached_request_activity(inner, "test_request_local")
    params = {"messages": ["the very objects"]}
    await _run(act, params)
    assert calls == [params] and calls[0] is params  # not a decoded copy
    assert all(
        p is not params for p, _ in model_requests._handed.values()
    )  # released when the workflow has its result
    with pytest.raises(ApplicationError, match="no model request was handed over") as e:
        await _env(activity_id="9").run(act, "gone")
    assert e.value.non_retryable and e.value.type == model_requests.NOT_HANDED_OVER_ERROR


async def test_forget_and_sweep(tmp_path: Path) -> None:
    inner, _ = _counting()
    act = model_requests.cached_request_activity(inner, "test_request_local")
    await _run(act, {}, workflow_id="done")
    await _run(act, {}, workflow_id="old")
    await _run(act, {}, workflow_id="fresh")
    model_requests.forget("done")
    assert not model_requests.response_dir("done").exists()
    old = model_requests.response_dir("old")
    stale = time.time() - model_requests.STALE_AFTER_S - 60
    os.utime(old, (stale, stale))
    assert model_requests.sweep() == 1
    assert not old.exists() and model_requests.response_dir("fresh").exists()
