"""Admission control: how many reflections one worker process advances at once, decided by how late
its event loop runs, not by a fixed count.

Why: a reflection holds its workflow task (one slot) while its model requests and cells run as local
activities, so the slot count is the number of reflections in progress. A fixed count is wrong at
every latency but one: with a 200 ms model, 30 slots saturate two cores; with a 3 s model, 30 slots
leave the worker idle while hundreds of reflections wait; and raised to 300, the worker collapses
(bench/throughput.py, 3 s model, 300 in flight: 9.4 steps/s and 161 ms of CPU per step, against
29 steps/s and 16 ms at 100). The collapse: past the CPU the worker has, activations queue behind each
other (they share one GIL), an open workflow task's heartbeat (the SDK completes it every 0.8 x task
timeout while local activities run) waits for the activation in progress, the task times out, the
server hands it out again, the worker replays the whole history — more CPU, more timeouts.

So the worker admits *new* work only while it keeps up. A ticker on the worker's event loop measures
how late it wakes (the loop shares the GIL with the workflow activations: when they queue, the ticker
is late by about as long); every control interval the limit on workflow-task slots grows while the
lag stays under `low_lag_s` and there is demand (a poll waited for a slot), and drops to below the
slots in use when the lag passes `high_lag_s` (AIMD, as in TCP congestion control). Slots are never
taken back: reflections already admitted keep running, and the ones not admitted wait, at no cost,
in the server's task queue. Only polls of the shared task queue (new reflections, or workflows not in
this worker's cache) are gated: sticky polls and eager tasks continue work already admitted here, and
holding them back would let their tasks fall back to the shared queue and be replayed from scratch.

`RR_MAX_CONCURRENT_WORKFLOW_TASKS=N` replaces this with a fixed count (temporalio's
`FixedSizeSlotSupplier`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field

from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)

__all__ = ["AdmissionControl", "AdmissionStats"]

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
        self.stats = AdmissionStats(limit=initial, rate=initial_rate)
        self.max_rate = max_rate
        self._tokens = initial_rate
        self._keep_history = keep_history
        self._outstanding = 0
        self._wanted_slots = False  # a gated poll waited for a slot during this interval
        self._wanted_tokens = False  # ... or for the rate limit
        self._changed: asyncio.Condition | None = None
        self._ticker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------ the SDK's API

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        self._ensure_started()
        assert self._changed is not None
        if not ctx.is_sticky:
            async with self._changed:
                if not self._may_admit():
                    self.stats.gated_waits += 1
                    self._note_demand()
                    await self._changed.wait_for(self._may_admit)
                if self.stats.rate:
                    self._tokens -= 1
        return self._grant()

    def _may_admit(self) -> bool:
        if self._outstanding >= self.stats.limit or (self.stats.rate and self._tokens <= 0):
            self._note_demand()  # also called by the condition while a poll waits
            return False
        return True

    def _note_demand(self) -> None:
        if self._outstanding >= self.stats.limit:
            self._wanted_slots = True
        else:
            self._wanted_tokens = True

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        # eager tasks are the continuation of work admitted here (see the module doc)
        return self._grant()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        return None

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        self._outstanding = max(0, self._outstanding - 1)
        self.stats.in_use = self._outstanding
        self._notify()

    # ----------------------------------------------------------------------------- the controller

    def _grant(self) -> SlotPermit:
        self._outstanding += 1
        self.stats.granted += 1
        self.stats.in_use = self._outstanding
        return SlotPermit()

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
            self._changed = asyncio.Condition()
            self._ticker = asyncio.get_running_loop().create_task(self._control(), name="rr-admission")

    def adjust(self, lag_s: float) -> int:
        """One control step for the worst lag seen in the last interval; returns the new limit."""
        s = self.stats
        s.last_lag_s, s.max_lag_s = lag_s, max(s.max_lag_s, lag_s)
        s.window_max_lag_s = max(s.window_max_lag_s, lag_s)
        if lag_s > self.high_lag_s:
            # stop admitting until the work in progress drains below what the loop could carry
            cut = max(self.minimum, min(s.limit, math.floor(self._outstanding * 0.9)))
            if cut < s.limit:
                s.cuts += 1
                log.debug("admission: lag %.0f ms, limit %d -> %d", lag_s * 1000, s.limit, cut)
            s.limit = cut
            if s.rate:
                s.rate = max(1, s.rate // 2)
        elif lag_s < self.low_lag_s:
            if self._wanted_slots and s.limit < self.maximum:
                s.limit = min(self.maximum, s.limit + max(2, s.limit // 8))
                s.raises += 1
            if self._wanted_tokens and s.rate and s.rate < self.max_rate:
                s.rate = min(self.max_rate, s.rate + max(1, s.rate // 4))
                s.raises += 1
        self._wanted_slots = self._wanted_tokens = False
        self._tokens = s.rate
        if self._keep_history:
            s.history.append((lag_s, s.limit, self._outstanding))
            del s.history[: -self._keep_history]
        self._notify()
        return s.limit

    async def _control(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            worst, window_end = 0.0, loop.time() + self.interval_s
            while loop.time() < window_end:
                t = loop.time()
                await asyncio.sleep(self.tick_s)
                worst = max(worst, loop.time() - t - self.tick_s)
            self.adjust(worst)
