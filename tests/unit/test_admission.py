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
class _WorkflowSlot:
    is_sticky: bool
    workflow_type: str = "w"


@dataclass
class _Used:
    permit: object
    slot_info: object = None


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


async def test_new_runs_wait_while_the_runs_alive_reach_the_live_limit() -> None:
    """Slots bound work in progress; `live_limit` bounds the runs alive in the worker (a reflection waiting on
    its provider holds no slot): gated polls wait at it, sticky ones (continuing runs) do not, and a run that
    ends (on an activation thread) lets the next one in."""
    a = AdmissionControl(initial=100, minimum=1, interval_s=60, live_initial=2, live_minimum=1)
    for _ in range(2):
        permit = await a.reserve_slot(_Ctx())  # type: ignore[arg-type]
        a.run_started()
        a.release_slot(_Release(permit))  # type: ignore[arg-type]  # its first task is done; the run is alive
    assert a.stats.in_use == 0 and a.stats.live == 2
    waiting = asyncio.create_task(a.reserve_slot(_Ctx()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not waiting.done(), (
        "two runs alive at a live limit of 2: a new one waits though every slot is free"
    )
    sticky = await asyncio.wait_for(a.reserve_slot(_Ctx(is_sticky=True)), 1)  # type: ignore[arg-type]
    assert sticky is not None
    ended = asyncio.get_running_loop().run_in_executor(None, a.run_ended)  # as an activation thread does
    await ended
    await asyncio.wait_for(waiting, 1)
    assert a.stats.live == 1 and a.stats.peak_live == 2


def test_the_live_limit_follows_the_backlog_of_the_work_the_runs_ask_for() -> None:
    """Raised while the loop keeps up, nothing waits to begin and a poll waited for it; cut once any activity
    (a provider request included: `observe_backlog`) waits in the worker past `live_high_s` before it begins,
    or the loop itself is that late."""
    a = AdmissionControl(initial=100, live_initial=32, live_minimum=8)
    for _ in range(40):
        a.run_started()
    a._wanted_live = True
    a.adjust(0.001)
    assert a.stats.live_limit == 36  # quiet: raised by 1/8
    a.adjust(0.001)
    assert a.stats.live_limit == 36, "no poll waited for it: no reason to raise"
    a._wanted_live = True
    a.observe_backlog(0.5)
    a.adjust(0.001)
    assert a.stats.live_limit == 36, "requests begin 0.5 s late: between the thresholds, hold"
    a.observe_backlog(3.0)
    a.adjust(0.001)  # a quiet loop, but provider requests begin 3 s late: cut to 90 % of the 40 alive
    assert a.stats.live_limit == 36
    for _ in range(20):
        a.run_ended()
    a.adjust(1.5)  # the loop itself 1.5 s late
    assert a.stats.live_limit == 18
    for _ in range(18):
        a.run_ended()
    a.observe_backlog(2.0)
    a.adjust(0.001)
    assert a.stats.live_limit == 8, "never below live_minimum"
    assert AdmissionControl().stats.live_limit == 0  # off unless asked for (the activity slots)
    with pytest.raises(ValueError, match="live_minimum"):
        AdmissionControl(live_initial=4, live_minimum=8)


async def test_a_received_new_task_counts_as_alive_before_its_run_begins() -> None:
    """On a busy worker a new run's activation begins seconds after its task arrived: the task counts from
    arrival, or the gated polls admit runs past the limit in that time."""
    a = AdmissionControl(initial=100, minimum=1, interval_s=60, live_initial=1, live_minimum=1)
    # the slot was reserved by a sticky poll, the task is a shared-queue one (the core does hand them out so)
    first = await a.reserve_slot(_Ctx(is_sticky=True))  # type: ignore[arg-type]
    a.mark_slot_used(_Used(first, _WorkflowSlot(is_sticky=False)))  # type: ignore[arg-type]  # no activation yet
    waiting = asyncio.create_task(a.reserve_slot(_Ctx()))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not waiting.done() and a.stats.live == 0
    a.run_started()  # the activation begins ...
    a.release_slot(_Release(first))  # type: ignore[arg-type]  # ... and completes its task: still one alive
    await asyncio.sleep(0.05)
    assert not waiting.done()
    a.run_ended()
    await asyncio.wait_for(waiting, 1)
