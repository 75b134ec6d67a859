"""Activity heartbeats when one is due, not one at the start of every model request (server work per step).

pydantic-ai runs every durable operation's activity (model requests included) inside `heartbeating()`
(`pydantic_ai.durable_exec.temporal._toolset`), which heartbeats at once and then every half of the
heartbeat timeout. temporalio's core sends the first heartbeat of an attempt without delay, so every
model request costs the server one more `RecordActivityTaskHeartbeat` (frontend and history) and one more
write of the workflow's mutable state: 1.0 heartbeat per step, a quarter of rr's `UpdateWorkflowExecution`
writes at 0.2 s x 50 (`RR_BENCH_SERVER_RPCS=25 python -m bench.throughput`). A heartbeat at the start
tells the server nothing it needs: the heartbeat timeout already counts from the attempt's start, so
only a heartbeat before `started + timeout` keeps a long request alive.

`heartbeating_when_due()` keeps pydantic-ai's cadence and its supervision (a crashed beat fails the
activity once the body is done; the body's own exception wins) and moves the first beat to half the
timeout after the attempt started (`activity.info().started_time`): a request that ends sooner sends
none, a longer one beats at `started + timeout/2` and then every `timeout/2`; a body that begins late
(a loaded worker begins the activities it polled one event-loop turn at a time) beats at once, as
before. Worker and server clocks that disagree move the first beat by the skew, never past
`timeout/2` after the body began. What is given up: a cancellation that reaches an attempt before its
first beat is delivered at that beat or when the request ends (with pydantic-ai's cadence, after the
first beat the next one is ~0.8 x timeout later anyway, so this matters only for a cancellation requested
before the body began).

`install()` replaces `heartbeating` in the pydantic-ai modules that use it, only where it is still
pydantic-ai's own function (a version without it keeps what it has); `tests/unit/test_lean_heartbeats.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable
from contextlib import asynccontextmanager, suppress
from types import ModuleType
from typing import Any

from temporalio import activity

__all__ = ["install", "heartbeating_when_due", "first_beat_delay"]

UNTIMED_INTERVAL_S = 5.0  # pydantic-ai's cadence for an activity without a heartbeat timeout

_installed = False


def _interval_s(info: activity.Info) -> float:
    timeout = info.heartbeat_timeout
    return timeout.total_seconds() / 2 if timeout else UNTIMED_INTERVAL_S


def first_beat_delay(info: activity.Info) -> float:
    """Seconds from now until the first heartbeat is due: half the timeout after the attempt started,
    at once if that is past, never more than half the timeout (a worker clock behind the server's)."""
    from reflector.runtime.admission import start_delay_s

    interval = _interval_s(info)
    return min(interval, max(0.0, interval - (start_delay_s(info) or 0.0)))


@asynccontextmanager
async def heartbeating_when_due() -> AsyncGenerator[None]:
    """pydantic-ai's `heartbeating()` without the beat at the start (see the module doc)."""
    info = activity.info()
    interval, first = _interval_s(info), first_beat_delay(info)

    async def beat() -> None:
        await asyncio.sleep(first)
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    task = asyncio.create_task(beat())
    try:
        yield
    except BaseException:
        # the body's exception is already propagating; a heartbeat failure must not replace it
        task.cancel()
        with suppress(BaseException):
            await task
        raise
    else:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task  # anything but our own cancellation is a crash of beat(): it propagates


def install(original: Any, modules: Iterable[ModuleType]) -> int:
    """Use `heartbeating_when_due` in each of `modules` whose `heartbeating` is still `original` (pydantic-ai's
    own; `workflows.local_model.use_heartbeats_when_due` names them: rr's one home of pydantic-ai's private
    modules). Once per process; returns how many modules now use it."""
    global _installed
    if _installed:
        return 0
    replaced = 0
    for module in modules:
        if getattr(module, "heartbeating", None) is original:
            module.heartbeating = heartbeating_when_due  # type: ignore[attr-defined]
            replaced += 1
    _installed = True
    return replaced
