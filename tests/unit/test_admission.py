"""Admission control (`reflector.runtime.admission`): the limit follows the event loop's lag, gated polls wait
for a slot, sticky polls and eager tasks never do, slots are never taken back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from reflector.runtime.admission import AdmissionControl


@dataclass
class _Ctx:
    is_sticky: bool = False
    slot_type: str = "workflow"
    task_queue: str = "q"
    worker_identity: str = "w"
    worker_build_id: str = ""
    worker_deployment_version: None = None


@dataclass
class _Used:
    permit: object
    slot_info: None = None


@dataclass
class _Release:
    permit: object
    slot_info: None = None


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="minimum"):
        AdmissionControl(initial=2, minimum=4)
    with pytest.raises(ValueError, match="low_lag_s"):
        AdmissionControl(low_lag_s=0.3, high_lag_s=0.2)


def test_limit_grows_only_with_demand_and_a_quiet_loop() -> None:
    a = AdmissionControl(initial=16, maximum=40)
    assert a.adjust(0.001) == 16  # quiet loop, but nobody waited for a slot: no reason to grow
    a._wanted_slots = True
    assert a.adjust(0.1) == 16  # demand, but the loop is between the thresholds: hold
    for _ in range(20):
        a._wanted_slots = True
        a.adjust(0.001)
    assert a.stats.limit == 40  # grew to the maximum, not past it
    assert a.stats.raises >= 3


def test_a_late_loop_cuts_below_the_slots_in_use_but_never_below_the_minimum() -> None:
    a = AdmissionControl(initial=100, minimum=4)
    for _ in range(50):
        a._grant()
    assert a.adjust(0.5) == 45  # 90% of the 50 in use: no new admission until the work drains
    assert a.stats.in_use == 50  # nothing is taken back
    for _ in range(50):
        a.release_slot(_Release(object()))  # type: ignore[arg-type]
    assert a.adjust(0.5) == 4


async def test_polls_wait_at_the_limit_sticky_ones_too_eager_tasks_do_not() -> None:
    a = AdmissionControl(initial=2, minimum=1, maximum=2, initial_rate=1)
    p1 = await a.reserve_slot(_Ctx())  # type: ignore[arg-type]
    waiting = asyncio.create_task(a.reserve_slot(_Ctx()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not waiting.done()  # a shared-queue poll waits for the rate (one per interval) ...
    sticky = await asyncio.wait_for(a.reserve_slot(_Ctx(is_sticky=True)), 1)  # type: ignore[arg-type]
    a.mark_slot_used(_Used(sticky))  # type: ignore[arg-type]  # its task came
    assert sticky is not None and a.stats.in_use == 2  # ... a sticky one does not
    blocked = asyncio.create_task(a.reserve_slot(_Ctx(is_sticky=True)))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not blocked.done()  # at the maximum sticky polls wait too: held tasks stay bounded
    assert a.try_reserve_slot(_Ctx()) is not None  # type: ignore[arg-type] # an eager workflow task continues its task
    assert a.stats.in_use == 3
    for _ in range(2):
        a.release_slot(_Release(p1))  # type: ignore[arg-type]
    await asyncio.wait_for(blocked, 1)  # below the limit again: the sticky poll gets its slot
    a.mark_slot_used(_Used(blocked.result()))  # type: ignore[arg-type]
    a.release_slot(_Release(p1))  # type: ignore[arg-type]
    await asyncio.wait_for(waiting, 2)  # and the gated one once the next interval grants its token
    assert a.stats.in_use == 2


async def test_the_ticker_sees_a_blocked_loop_and_stops_admitting() -> None:
    a = AdmissionControl(initial=8, minimum=1, interval_s=0.1, tick_s=0.01, keep_history=50)
    await a.reserve_slot(_Ctx())  # type: ignore[arg-type] # (starts the controller)
    for _ in range(5):
        await a.reserve_slot(_Ctx())  # type: ignore[arg-type]
    await asyncio.sleep(0.15)
    time.sleep(0.6)  # an activation hogging the GIL: the loop cannot run
    await asyncio.sleep(0.25)
    assert a.stats.max_lag_s > a.high_lag_s
    assert a.stats.cuts >= 1 and a.stats.limit < 6, a.stats.history


async def test_a_rate_limit_spreads_new_work_over_intervals() -> None:
    """With a rate, gated polls get at most `rate` slots per interval even with slots free: a burst of
    new reflections (each starts a sandbox host) is spread out instead of landing at once."""
    a = AdmissionControl(initial=100, initial_rate=3, interval_s=60)  # no automatic step in this test
    polls = [asyncio.create_task(a.reserve_slot(_Ctx())) for _ in range(7)]  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert sum(p.done() for p in polls) == 3
    assert a.try_reserve_slot(_Ctx()) is not None  # type: ignore[arg-type] # (eager tasks are not rate limited)
    a.adjust(0.001)  # next interval, quiet loop, demand: the rate grows
    assert a.stats.rate == 4
    await asyncio.sleep(0.05)
    assert sum(p.done() for p in polls) == 7
    a.adjust(0.5)  # a late loop halves it, never to 0 (work waiting on the shared queue always advances)
    assert a.stats.rate == 2
    a.adjust(0.5)
    a.adjust(0.5)
    assert a.stats.rate == 1
    for p in polls:
        p.cancel()


def test_a_reported_start_delay_counts_like_loop_lag() -> None:
    """Activities the worker polled but began late (`StartDelay`) cut the limit though the loop is quiet."""
    a = AdmissionControl(initial=40, minimum=1)
    for _ in range(20):
        a._grant()
    a.observe(0.1)
    a.observe(1.5)  # the worst of the interval counts
    assert a.adjust(0.001) == 18 and a.stats.last_lag_s == 1.5
    assert a.adjust(0.001) == 18  # consumed: the next interval starts clean (no demand: no raise)


def test_eager_activities_obey_the_limit() -> None:
    a = AdmissionControl(initial=2, minimum=1)
    assert a.try_reserve_slot(_Ctx(slot_type="activity")) is not None  # type: ignore[arg-type]
    assert a.try_reserve_slot(_Ctx(slot_type="activity")) is not None  # type: ignore[arg-type]
    assert a.try_reserve_slot(_Ctx(slot_type="activity")) is None  # type: ignore[arg-type] # (via the queue)
    assert a.try_reserve_slot(_Ctx(slot_type="workflow")) is not None  # type: ignore[arg-type]


def test_provider_request_slots_ride_out_lag_that_workflow_slots_do_not() -> None:
    """The default activity limit keeps its slots through up to 1 s of lag (its requests heartbeat with a
    30 s timeout); the workflow-task limit is cut above 250 ms (held tasks renew every 3.2 s)."""
    from worker import activity_admission, workflow_admission

    acts, wfts = activity_admission(), workflow_admission()
    assert acts.stats.limit == 100
    for sup in (acts, wfts):
        for _ in range(12):
            sup._grant()
    assert wfts.adjust(0.5) < 12  # cut to below what is in use
    assert acts.adjust(0.5) == 100  # held
    acts._wanted_slots = True
    assert acts.adjust(0.2) == 125  # quiet with demand: +25%
    assert acts.adjust(1.5) == 10  # past 1 s: cut to 0.9 x in use


async def test_sticky_polls_pass_a_cut_limit_up_to_the_maximum() -> None:
    a = AdmissionControl(initial=10, minimum=1, maximum=10)
    for _ in range(6):
        a._grant()
    assert a.adjust(0.5) == 5  # the lag cut the limit below the 6 in use
    permit = await asyncio.wait_for(a.reserve_slot(_Ctx(is_sticky=True)), 1)  # type: ignore[arg-type]
    a.mark_slot_used(_Used(permit))  # type: ignore[arg-type]
    assert a.stats.in_use == 7  # continuing work is not held to the cut limit (only to `maximum`)


async def test_the_ticker_stops_once_the_worker_holds_and_asks_for_nothing() -> None:
    # a stopped worker released every slot: its ticker used to wake every tick for as long as the caller's
    # loop ran (two per areflect call), and was destroyed pending where that loop closed without cancelling it
    a = AdmissionControl(initial=2, minimum=1, maximum=4, tick_s=0.005, interval_s=0.02)
    permit = await a.reserve_slot(_Ctx())  # type: ignore[arg-type]
    ticker = a._ticker
    assert ticker is not None
    await asyncio.sleep(0.1)
    assert not ticker.done()  # a held slot: the worker runs, the controller with it
    a.release_slot(_Release(permit))  # type: ignore[arg-type]
    await asyncio.wait_for(asyncio.shield(ticker), 2)
    assert ticker.done() and not ticker.cancelled()
    await asyncio.wait_for(a.reserve_slot(_Ctx()), 1)  # type: ignore[arg-type]
    assert a._ticker is not None and a._ticker is not ticker and not a._ticker.done()  # started again
    a._ticker.cancel()


async def test_idle_sticky_polls_do_not_hold_back_new_work() -> None:
    """A sticky poll waiting for a task holds a slot but is not work: new reflections are admitted up to the
    limit beside any number of idle sticky polls (below `maximum`), and a sticky poll counts once it has a task."""
    a = AdmissionControl(initial=2, minimum=1, maximum=32)
    idle = [await asyncio.wait_for(a.reserve_slot(_Ctx(is_sticky=True)), 1) for _ in range(12)]  # type: ignore[arg-type]
    assert a.stats.in_use == 0
    first = await asyncio.wait_for(a.reserve_slot(_Ctx()), 1)  # type: ignore[arg-type]
    await asyncio.wait_for(a.reserve_slot(_Ctx()), 1)  # type: ignore[arg-type]
    assert a.stats.in_use == 2
    with pytest.raises(TimeoutError):  # at the limit of 2: a third new reflection waits
        await asyncio.wait_for(a.reserve_slot(_Ctx()), 0.2)  # type: ignore[arg-type]
    a.mark_slot_used(_Used(idle[0]))  # type: ignore[arg-type]
    assert a.stats.in_use == 3  # a sticky poll with a task is work
    a.release_slot(_Release(first))  # type: ignore[arg-type]
    a.release_slot(_Release(idle[1]))  # type: ignore[arg-type]  # a poll that ended without a task
    assert a.stats.in_use == 2
    assert a._idle_sticky == 10
