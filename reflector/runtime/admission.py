"""Admission control: how much work one worker process takes on at once, decided by how late its
event loop runs, not by fixed counts.

Why: with an in-process model a reflection holds its workflow task (one slot) while its model requests
and cells run as local activities, and with a provider model each request holds an activity slot
while the provider thinks. A fixed count is wrong at every latency but one: 30 workflow-task slots
saturate two cores with a 200 ms model, and leave the worker idle with a 3 s one (9 steps/s, 200
reflections waiting); raised to 200 the worker collapses (bench/throughput.py, BENCHMARKS.md issue 11:
"Task not found when completing", tasks timing out and whole histories replayed). Past the CPU the
worker has, everything queues behind one GIL, an open task's renewal comes late, and a heartbeat comes
late: the server hands the task or the request to another attempt, and the work is done (or paid) twice.

So a worker admits new work only while it keeps up. A ticker on the event loop measures how late it
wakes (the loop shares the GIL with the workflow activations and the provider clients: when they
queue, the ticker is late by about as long). Every control interval the limit on slots grows while
the worst lag stays under `low_lag_s` and work waited for a slot, and drops to below the slots in use
when the lag passes `high_lag_s` (AIMD, as in TCP congestion control). Slots are never taken back:
work already admitted keeps running, and what is not admitted waits, at no cost, in the server's
queues (where another worker may take it).

For workflow tasks, polls of the shared task queue (new reflections, or workflows not in this
worker's cache) wait for the limit and, optionally, a rate; sticky polls continue work admitted here
and wait only for `maximum` (held back longer, their tasks would go back to the shared queue to be
replayed from scratch; not held back at all, a worker whose reflections hold their tasks through
local activities let them grow past any limit and time out); eager workflow tasks never wait. The
gated polls can be rate-limited (`initial_rate` grants per interval, raised and halved like the limit, never
below 1 so the shared queue always advances): each new reflection starts a sandbox host (~190 ms of
CPU), and 500 admitted at once held the loop 2 s late.

Slots bound the work in progress, not the reflections alive in the worker: with a provider model a
reflection holds no slot while its request is out, so every reflection in the queue was admitted (300 at
3 s x 300), and on a saturated worker their next workflow tasks waited on the sticky queue past its timeout
and went back to the shared queue, to be replayed from their first event (611 such fallbacks; temporalio's
default 10 s timeout hides this, rr's 1 s one is what makes recovery after a SIGKILL fast). So the gated
polls also wait while the runs alive in this worker (`LiveRuns` counts them: started, or restored into the
cache, and not yet ended or evicted; a shared-queue task counts from its arrival) reach `live_limit`, which follows the same lag: raised while the loop
keeps up and a poll waited for it, cut to below the runs alive when it does not. By Little's law a worker
needs only about (steps/s it can carry) x (seconds per step) runs alive to stay busy; the rest wait in the
server's queue, where waiting costs nothing and another worker may take them.

`RR_MAX_CONCURRENT_WORKFLOW_TASKS=N` / `RR_MAX_CONCURRENT_ACTIVITIES=N` replace this with a fixed
count (temporalio's `FixedSizeSlotSupplier`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    CustomSlotSupplier,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

__all__ = [
    "AdmissionControl",
    "AdmissionStats",
    "LiveRuns",
    "StartDelay",
    "WORKFLOW_TASK_POLLS",
    "start_delay_s",
]

# Workflow-task polls a worker keeps open (temporalio's default is 5, of which 4 on the sticky queue). Each poll
# first reserves a slot through this supplier, i.e. a turn of the worker's event loop; with 4 sticky polls and
# the loop 0.2-0.5 s late on a busy worker, the sticky queue drained more slowly than reflections continued,
# and tasks waited past the sticky schedule-to-start timeout (then 1 s) and went back to the shared queue: 16-66
# such fallbacks at 50 in flight on a loaded 2-core machine, 224 at 300 (bench/throughput.py). An open poll
# costs the server a parked request and this worker nothing; idle sticky polls are not counted against the
# admission limit (`AdmissionControl`), so more of them admit no more work.
WORKFLOW_TASK_POLLS = 16

log = logging.getLogger("rr.admission")


@dataclass
class AdmissionStats:
    """What the controller saw (for logs and tests)."""

    limit: int
    rate: int = 0  # gated grants allowed per interval (0: no rate limit)
    in_use: int = 0
    granted: int = 0
    gated_waits: int = 0
    raises: int = 0
    cuts: int = 0
    last_lag_s: float = 0.0
    max_lag_s: float = 0.0
    window_max_lag_s: float = 0.0  # worst lag since a reader last reset it
    history: list[tuple[float, int, int]] = field(default_factory=list)  # (lag, limit, in use) per interval
    live_limit: int = 0  # runs alive in the worker past which gated polls wait (0: no such limit)
    live: int = 0  # runs alive now (`LiveRuns`)
    peak_live: int = 0
    runs_started: int = 0  # runs begun here: new ones, and ones restored into the cache (a replay)
    shared_tasks: int = 0  # tasks that came through gated (shared-queue) polls


class _Permit(SlotPermit):
    """A granted slot; a sticky poll's permit counts as work only once a task used it."""

    def __init__(self, sticky: bool) -> None:
        self.sticky = sticky
        self.used = False
        self.new_task = False  # a shared-queue poll's permit that a task came with, not yet released


class AdmissionControl(CustomSlotSupplier):
    """A workflow-task slot supplier whose limit follows the event loop's lag (see the module doc)."""

    def __init__(
        self,
        *,
        initial: int = 16,
        minimum: int = 4,
        maximum: int = 2000,
        low_lag_s: float = 0.05,
        high_lag_s: float = 0.25,
        tick_s: float = 0.02,
        interval_s: float = 0.5,
        keep_history: int = 0,
        initial_rate: int = 0,
        max_rate: int = 1000,
        growth: int = 8,
        live_initial: int = 0,
        live_minimum: int = 8,
        live_low_s: float = 0.25,
        live_high_s: float = 1.0,
    ) -> None:
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError(f"need 1 <= minimum ({minimum}) <= initial ({initial}) <= maximum ({maximum})")
        if not 0 < low_lag_s < high_lag_s:
            raise ValueError(f"need 0 < low_lag_s ({low_lag_s}) < high_lag_s ({high_lag_s})")
        self.minimum, self.maximum = minimum, maximum
        self.low_lag_s, self.high_lag_s = low_lag_s, high_lag_s
        self.tick_s, self.interval_s = tick_s, interval_s
        if initial_rate < 0 or (initial_rate and max_rate < initial_rate):
            raise ValueError(f"need 0 <= initial_rate ({initial_rate}) <= max_rate ({max_rate})")
        if live_initial and not 1 <= live_minimum <= live_initial:
            raise ValueError(f"need 1 <= live_minimum ({live_minimum}) <= live_initial ({live_initial})")
        self.stats = AdmissionStats(limit=initial, rate=initial_rate, live_limit=live_initial)
        self.live_minimum = live_minimum
        self.live_low_s, self.live_high_s = live_low_s, live_high_s
        self._backlog = 0.0  # worst start delay of any activity of this worker during this interval
        # runs alive, counted by `LiveRuns` from the threads that run workflow activations
        self._live = 0
        self._arriving = 0  # shared-queue tasks received and not yet done (runs about to be alive)
        self._live_lock = threading.Lock()
        self._wanted_live = False  # a gated poll waited for `live_limit` during this interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self.max_rate = max_rate
        self.growth = max(1, growth)  # a raise adds limit // growth (at least 1)
        self._tokens = initial_rate
        self._keep_history = keep_history
        self._outstanding = 0  # slots granted and not released (polls waiting for a task included)
        self._idle_sticky = (
            0  # ... of which sticky polls that have no task yet (not work: not held to the limit)
        )
        self._wanted_slots = False  # a gated poll waited for a slot during this interval
        self._wanted_tokens = False  # ... or for the rate limit
        self._observed = 0.0  # worst start delay reported (`observe`) during this interval
        self._changed: asyncio.Condition | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._reserving = (
            0  # reserve_slot calls in progress (the ticker runs while any is, or a slot is held)
        )

    # ------------------------------------------------------------------------------ the SDK's API

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        self._ensure_started()
        self._reserving += 1
        try:
            return await self._reserve(ctx)
        finally:
            self._reserving -= 1

    async def _reserve(self, ctx: SlotReserveContext) -> SlotPermit:
        assert self._changed is not None
        async with self._changed:
            if ctx.is_sticky:
                # continuing work: neither rate-limited nor held to the adaptive limit (waiting past the
                # sticky schedule-to-start timeout sends the task back to the shared queue, to be replayed
                # from scratch: 1085 such fallbacks at 500 in flight with a 3 s model when sticky polls
                # waited for the limit, 314 when they did not), but bounded by `maximum`. Unbounded, sticky
                # polls let held tasks grow past any limit (a reflection with an in-process model holds its
                # task for its whole session) and they timed out: 73 held-task timeouts at a limit of 16,
                # bench/throughput.py --transport function, 200 in flight.
                if self._outstanding >= self.maximum:
                    self.stats.gated_waits += 1
                    await self._changed.wait_for(self._below_maximum)
            else:
                if not self._may_admit():
                    self.stats.gated_waits += 1
                    self._note_demand()
                    await self._changed.wait_for(self._may_admit)
                if self.stats.rate:
                    self._tokens -= 1
        return self._grant(sticky=ctx.is_sticky)

    def _below_maximum(self) -> bool:
        return self._outstanding < self.maximum

    def _working(self) -> int:
        """Slots that hold work, or a poll that may bring new work (idle sticky polls bring only work already
        admitted here)."""
        return self._outstanding - self._idle_sticky

    def _may_admit(self) -> bool:
        if (
            self._working() >= self.stats.limit
            or (self.stats.rate and self._tokens <= 0)
            or self._live_capped()
        ):
            self._note_demand()  # also called by the condition while a poll waits
            return False
        return True

    def _live_capped(self) -> bool:
        return 0 < self.stats.live_limit <= self._live + self._arriving

    def _note_demand(self) -> None:
        if self._working() >= self.stats.limit:
            self._wanted_slots = True
        elif self._live_capped():
            self._wanted_live = True
        else:
            self._wanted_tokens = True

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        # An eager workflow task continues work admitted here (see the module doc). An eager activity
        # (handed back with the workflow task that scheduled it) is new work like a polled one: refused
        # at the limit, it goes through the task queue instead. Granting them all let 470 provider
        # requests in at a limit of 14, whose bodies then began 24 s late (bench/throughput.py).
        if ctx.slot_type == "activity" and not self._may_admit():
            self._note_demand()
            return None
        if ctx.slot_type == "activity" and self.stats.rate:
            self._tokens -= 1
        return self._grant()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        permit = ctx.permit
        if not isinstance(permit, _Permit):
            return
        if permit.sticky and not permit.used:
            permit.used = True
            self._idle_sticky = max(0, self._idle_sticky - 1)
            self.stats.in_use = self._working()
        if getattr(ctx.slot_info, "is_sticky", True) is False and not permit.new_task:
            # a shared-queue workflow task: most often a new run, which `LiveRuns` counts only once its
            # activation begins, seconds later on a busy worker; counted from now until its task is done. Told
            # by the task, not by the permit: the core also hands shared-queue tasks to polls whose slot was
            # reserved as sticky (3 s x 300: 272 of 339 new runs came that way), so those runs pass the gate.
            permit.new_task = True
            with self._live_lock:
                self._arriving += 1
                self.stats.shared_tasks += 1

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        permit = ctx.permit
        if isinstance(permit, _Permit):
            if permit.sticky and not permit.used:
                permit.used = True  # released without a task: no longer an idle poll either
                self._idle_sticky = max(0, self._idle_sticky - 1)
            if permit.new_task:
                permit.new_task = False
                with self._live_lock:
                    self._arriving = max(0, self._arriving - 1)
        self._outstanding = max(0, self._outstanding - 1)
        self.stats.in_use = self._working()
        self._notify()

    # ------------------------------------------------------------------------- runs alive (LiveRuns)

    def run_started(self) -> None:
        """A workflow run began executing in this worker (new, or restored into its cache by a replay)."""
        with self._live_lock:
            self._live += 1
            self.stats.runs_started += 1
            self.stats.live = self._live
            self.stats.peak_live = max(self.stats.peak_live, self._live)

    def run_ended(self) -> None:
        """A run ended here (completed, failed, continued as new, or evicted from the cache)."""
        with self._live_lock:
            was_capped = self._live_capped()
            self._live = max(0, self._live - 1)
            self.stats.live = self._live
        loop = self._loop  # called from an activation thread: wake the gated polls on the worker's loop
        if was_capped and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker has stopped
                loop.call_soon_threadsafe(self._notify)

    # ----------------------------------------------------------------------------- the controller

    def _grant(self, sticky: bool = False) -> SlotPermit:
        self._outstanding += 1
        if sticky:
            self._idle_sticky += 1
        self.stats.granted += 1
        self.stats.in_use = self._working()
        return _Permit(sticky)

    def _notify(self) -> None:
        cond = self._changed
        if cond is None:
            return

        async def wake() -> None:
            async with cond:
                cond.notify_all()

        try:
            asyncio.get_running_loop().create_task(wake())
        except RuntimeError:  # no running loop (worker shut down)
            pass

    def _ensure_started(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Condition()
            self._ticker = asyncio.get_running_loop().create_task(self._control(), name="rr-admission")

    def observe(self, delay_s: float) -> None:
        """Report how long admitted work waited inside this worker before it began (`StartDelay`): the
        next control step treats it like loop lag. A backlog of activity tasks the worker polled but
        has not begun shows here, not in the loop's lag."""
        self._observed = max(self._observed, delay_s)

    def adjust(self, lag_s: float) -> int:
        """One control step for the worst lag seen in the last interval; returns the new limit."""
        lag_s, self._observed = max(lag_s, self._observed), 0.0
        s = self.stats
        s.last_lag_s, s.max_lag_s = lag_s, max(s.max_lag_s, lag_s)
        s.window_max_lag_s = max(s.window_max_lag_s, lag_s)
        if lag_s > self.high_lag_s:
            # stop admitting until the work in progress drains below what the loop could carry
            cut = max(self.minimum, min(s.limit, math.floor(self._working() * 0.9)))
            if cut < s.limit:
                s.cuts += 1
                log.debug("admission: lag %.0f ms, limit %d -> %d", lag_s * 1000, s.limit, cut)
            s.limit = cut
            if s.rate:
                s.rate = max(1, s.rate // 2)
        elif lag_s < self.low_lag_s:
            if self._wanted_slots and s.limit < self.maximum:
                s.limit = min(self.maximum, s.limit + max(1, s.limit // self.growth))
                s.raises += 1
            if self._wanted_tokens and s.rate and s.rate < self.max_rate:
                s.rate = min(self.max_rate, s.rate + max(1, s.rate // 4))
                s.raises += 1
        self._adjust_live(max(lag_s, self._backlog))
        self._backlog = 0.0
        self._wanted_slots = self._wanted_tokens = self._wanted_live = False
        self._tokens = s.rate
        if self._keep_history:
            s.history.append((lag_s, s.limit, self._outstanding))
            del s.history[: -self._keep_history]
        self._notify()
        return s.limit

    def observe_backlog(self, delay_s: float) -> None:
        """Report an activity's start delay, provider requests' included (`StartDelay`): for `live_limit`,
        the runs alive are too many once the work they ask for waits in the worker before it begins."""
        self._backlog = max(self._backlog, delay_s)

    def _adjust_live(self, backlog_s: float) -> None:
        s = self.stats
        if not s.live_limit:
            return
        if backlog_s > self.live_high_s:
            # no new runs until those alive drain below what the worker carried
            alive = self._live + self._arriving
            s.live_limit = max(self.live_minimum, min(s.live_limit, math.floor(alive * 0.9)))
        elif backlog_s < self.live_low_s and self._wanted_live:
            s.live_limit += max(1, s.live_limit // self.growth)

    async def _control(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            worst, window_end = 0.0, loop.time() + self.interval_s
            while loop.time() < window_end:
                t = loop.time()
                await asyncio.sleep(self.tick_s)
                worst = max(worst, loop.time() - t - self.tick_s)
            self.adjust(worst)
            if not self._outstanding and not self._reserving:
                # Nothing held, nothing asked for: the worker has stopped (a running one always holds its
                # pollers' slots). A ticker left running woke every tick_s for as long as the caller's event
                # loop ran (two per `areflect` call) and, where that loop was closed without cancelling its
                # tasks, was destroyed pending ("Task was destroyed but it is pending ... rr-admission").
                # The next reserve_slot starts it again.
                return


class LiveRuns(Interceptor):
    """Counts the workflow runs alive in this worker for an `AdmissionControl` (`live_limit`): a run counts
    from the start of its execution (a new run, or one restored into the cache by replaying its history)
    to its end, eviction included (an evicted run's tasks are cancelled, so its `finally` runs)."""

    def __init__(self, admission: AdmissionControl) -> None:
        self._admission = admission

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        admission = self._admission

        class _Counted(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                admission.run_started()
                try:
                    return await self.next.execute_workflow(input)
                finally:
                    admission.run_ended()

        return _Counted


def start_delay_s(info: activity.Info) -> float | None:
    """How long an activity attempt waited in this worker, from being handed to it to its body beginning."""
    started = info.started_time
    if started is None:
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - started).total_seconds())


class StartDelay(Interceptor):
    """Reports each activity's start delay (from the moment its attempt started, i.e. was handed to
    this worker, to its body beginning) to an `AdmissionControl`: regular activities to `activities`,
    local ones (cells, in-process model requests) to `local`. Without it, a worker could poll hundreds
    of provider requests whose bodies then waited seconds for the event loop: their heartbeats came
    late and the server timed them out (bench/throughput.py, 200 ms model, 500 in flight).
    """

    def __init__(
        self,
        *,
        activities: AdmissionControl | None,
        local: AdmissionControl | None,
        backlog: AdmissionControl | None = None,
    ) -> None:
        self._activities, self._local, self._backlog = activities, local, backlog

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StartDelayInbound(next, self)


class _StartDelayInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: StartDelay) -> None:
        super().__init__(next)
        self._owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        target = self._owner._local if info.is_local else self._owner._activities
        if (target is not None or self._owner._backlog is not None) and (
            delay := start_delay_s(info)
        ) is not None:
            if target is not None:
                target.observe(delay)
            if self._owner._backlog is not None:
                self._owner._backlog.observe_backlog(delay)
        return await self.next.execute_activity(input)
