"""Activity heartbeats only when one is due (reflector.runtime.lean_heartbeats).

pydantic-ai's `heartbeating()` beats at the start of every durable activity, which temporalio sends to
the server at once: one more RPC and one more mutable-state write per model request. rr's replacement
sends the first beat half the heartbeat timeout after the attempt started, and keeps pydantic-ai's
cadence and its error semantics after that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from reflector.runtime import lean_heartbeats
from reflector.runtime.lean_heartbeats import first_beat_delay, heartbeating_when_due


def _env(timeout_s: float | None, started_ago_s: float = 0.0) -> tuple[ActivityEnvironment, list[float]]:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        heartbeat_timeout=timedelta(seconds=timeout_s) if timeout_s is not None else None,
        started_time=datetime.now(UTC) - timedelta(seconds=started_ago_s),
    )
    beats: list[float] = []
    env.on_heartbeat = lambda *_: beats.append(asyncio.get_running_loop().time())
    return env, beats


async def _body(seconds: float, raise_after: BaseException | None = None) -> float:
    t0 = asyncio.get_running_loop().time()
    async with heartbeating_when_due():
        await asyncio.sleep(seconds)
        if raise_after is not None:
            raise raise_after
    return t0


def test_the_first_beat_is_due_half_the_timeout_after_the_attempt_started() -> None:
    env = ActivityEnvironment()
    info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=30))
    now = datetime.now(UTC)
    assert first_beat_delay(dataclasses.replace(info, started_time=now)) == pytest.approx(15, abs=0.5)
    # a body that began late (a loaded worker) beats sooner, at once when half the timeout is past
    assert first_beat_delay(
        dataclasses.replace(info, started_time=now - timedelta(seconds=10))
    ) == pytest.approx(5, abs=0.5)
    assert first_beat_delay(dataclasses.replace(info, started_time=now - timedelta(seconds=40))) == 0.0
    # a worker clock behind the server's never pushes the beat past half the timeout
    assert first_beat_delay(dataclasses.replace(info, started_time=now + timedelta(seconds=60))) == 15.0
    # no heartbeat timeout: pydantic-ai's 5 s cadence, first beat after it too
    untimed = dataclasses.replace(info, heartbeat_timeout=None, started_time=now)
    assert first_beat_delay(untimed) == pytest.approx(lean_heartbeats.UNTIMED_INTERVAL_S, abs=0.5)


async def test_a_request_that_ends_before_a_beat_is_due_sends_none() -> None:
    env, beats = _env(timeout_s=2.0)
    await env.run(_body, 0.3)
    assert beats == []


async def test_a_long_request_beats_every_half_timeout_from_its_start() -> None:
    env, beats = _env(timeout_s=0.4)
    t0 = await env.run(_body, 0.9)
    # due at ~0.2, 0.4, 0.6, 0.8 s: none at the start, and more than one (a loaded machine may drop the last)
    assert len(beats) >= 2, beats
    assert beats[0] - t0 >= 0.15, beats[0] - t0


async def test_a_body_that_began_late_beats_at_once() -> None:
    env, beats = _env(timeout_s=2.0, started_ago_s=1.5)
    await env.run(_body, 0.2)  # the beat is due 0.5 s before the body began: it comes while the body runs
    assert len(beats) == 1, beats


async def test_the_bodys_exception_wins_and_a_crashed_beat_fails_the_activity() -> None:
    env, _ = _env(timeout_s=0.1)

    def broken(*_: object) -> None:
        raise RuntimeError("beat crashed")

    env.on_heartbeat = broken
    with pytest.raises(ValueError, match="body"):
        await env.run(_body, 0.2, ValueError("body"))
    with pytest.raises(RuntimeError, match="beat crashed"):
        await env.run(_body, 0.2)


def test_install_replaces_pydantic_ais_heartbeating_where_durable_operations_use_it() -> None:
    from workflows.local_model import use_heartbeats_when_due

    use_heartbeats_when_due()  # what build_worker does
    operations = sys.modules["pydantic_ai.durable_exec.temporal._operation_backend"]
    toolset = sys.modules["pydantic_ai.durable_exec.temporal._toolset"]
    assert operations.heartbeating is heartbeating_when_due  # model requests go through it
    assert toolset.heartbeating is heartbeating_when_due
