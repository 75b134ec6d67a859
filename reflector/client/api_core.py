"""Temporal's core runtime for the calls of the Python API: each call in progress runs on a core runtime of
its own, installed as temporalio's default, released with its threads when the last call ends
(`reflector.client.api` says why)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

log = logging.getLogger("rr.api")


_core_lock = threading.Lock()


_core_users = 0


_core_previous: Any = None  # temporalio.runtime.Runtime: the default before the first call in progress


_core_threads_before: set[str] | None = None


_THREADS_GONE_WAIT_S = 5.0  # a wait only where threads are left; their exit can lag on a loaded machine
_FIRST_COLLECTION_S = 0.05  # a wait's first garbage collection, after the call's own (`_Collections`)
_COLLECTION_EVERY_S = 0.25


@contextlib.contextmanager
def _call_core_runtime() -> Iterator[None]:
    """Install a core runtime of the calls in progress as temporalio's default; when the last call ends,
    restore the previous default, collect the call's clients and worker, and with them the runtime, and wait
    for its threads to end (see the module docstring). Its core logs go through Python logging
    (`temporalio.core`), as the CLI's do (`reflector.client.configure_core_logging`).

    For `reflect()`, whose event loop is closed by then; `areflect` uses `_acall_core_runtime`."""
    _enter()
    try:
        yield
    finally:
        last, before = _leave()
        gc.collect()  # clients and workers in reference cycles would keep the runtime alive
        if (
            last and before is not None
        ):  # (and so would the core's deferred drops: see _wait_core_threads_gone)
            _wait_core_threads_gone(before)


@contextlib.asynccontextmanager
async def _acall_core_runtime() -> AsyncIterator[None]:
    """`_call_core_runtime` for a call on the caller's event loop (`areflect`), which goes on after the call
    (ACE's pipeline, `asyncio.gather` in a script, a notebook): the wait for the runtime's threads lets the loop
    run meanwhile (`_await_core_threads_gone`)."""
    _enter()
    try:
        yield
    finally:
        last, before = _leave()
        if last and before is not None:
            # no collection here: the wait's first look makes it, once the loop's cancelled timers are dropped
            await _await_core_threads_gone(before)
        else:
            gc.collect()


def _enter() -> None:
    global _core_users, _core_previous, _core_threads_before
    from temporalio.runtime import Runtime

    from reflector.client import configure_core_logging

    with _core_lock:
        if _core_users == 0:
            _core_previous = Runtime.default()
            _core_threads_before = _threads()
            configure_core_logging(worker_warnings=True)  # a new runtime, the default from now on
        _core_users += 1


def _leave() -> tuple[bool, set[str] | None]:
    """(whether this was the last call in progress, the threads before the first one: None if not last)."""
    global _core_users, _core_previous, _core_threads_before
    from temporalio.runtime import Runtime

    with _core_lock:
        _core_users -= 1
        if _core_users:
            return False, None
        Runtime.set_default(_core_previous, error_if_already_set=False)
        before, _core_previous, _core_threads_before = _core_threads_before, None, None
        return True, before


async def _await_core_threads_gone(before: set[str]) -> None:
    """`_wait_core_threads_gone` on the event loop the call ran on, which stays in use after the call.

    On such a loop the call's runtime is still held, after the call returned, by what the loop keeps of its
    activities: the cancelled timers they scheduled (a cell's 60 s timeout) stay in the loop's heap until their
    time would have come, and callbacks they queued wait for the loop's next turn, each with the context it was
    scheduled in, which holds the activity's `temporalio.activity` context and so the call's client and
    runtime. A wait that blocked the loop (as `reflect()`'s may: its loop is closed) kept those callbacks from
    running and the runtime alive for the whole `_THREADS_GONE_WAIT_S`, collecting all the while (5 s and as
    much CPU per ACE `RRStep` call). So each look first drops the loop's cancelled timers and the wait between
    looks yields to the loop. A call that starts on this loop meanwhile owns the runtime from then on: the
    wait ends (that call's end waits for its threads)."""
    import asyncio

    deadline = time.monotonic() + _THREADS_GONE_WAIT_S
    pause = 0.0
    collect = _Collections(first_after=0.0)  # the call's end did not collect: what held the runtime is in the
    # cancelled timers this first look drops
    while True:
        _drop_cancelled_timers()
        _apply_deferred_core_drops()
        collect.if_due()
        left = _core_threads_left(before)
        with _core_lock:
            busy = _core_users > 0
        if not left or busy:
            return
        if time.monotonic() > deadline:
            log.debug(
                "%d Temporal core threads still running %.0f s after the call's runtime was released",
                len(left),
                _THREADS_GONE_WAIT_S,
            )
            return
        await asyncio.sleep(pause)  # the loop runs what it queued (first at once, then up to 50 ms apart)
        pause = min(0.05, pause * 2 or 0.005)


def _drop_cancelled_timers() -> None:
    """Remove the cancelled timers from the heap of the event loop running here (none: nothing to do).

    asyncio leaves a cancelled timer in the heap until its time would have come (or until cancelled ones are
    most of a heap of over 100), holding the context it was scheduled in (`_await_core_threads_gone` says
    why that matters). This is what `BaseEventLoop._run_once` does itself when cancelled timers are many; a
    loop without that heap (uvloop) is left alone: its timers then free the runtime when their time comes."""
    import asyncio
    import heapq

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # `reflect()`: its loop is closed, with its timers
        return
    scheduled = getattr(loop, "_scheduled", None)
    if not isinstance(scheduled, list) or not hasattr(loop, "_timer_cancelled_count"):
        return
    kept = [h for h in scheduled if not (isinstance(h, asyncio.TimerHandle) and h.cancelled())]
    if len(kept) == len(scheduled):
        return
    for h in scheduled:
        if isinstance(h, asyncio.TimerHandle) and h.cancelled():
            setattr(h, "_scheduled", False)  # as `_run_once` marks the ones it drops  # noqa: B010
    heapq.heapify(kept)
    scheduled[:] = kept
    setattr(loop, "_timer_cancelled_count", 0)  # noqa: B010


def _threads() -> set[str] | None:
    """This process's thread ids (Linux: /proc), None where they cannot be listed."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return None


class _Collections:
    """When a wait for the runtime's threads collects garbage: a full collection costs ~0.1 s of CPU in a
    process with pydantic-ai loaded (more in a larger one), and `reflect()`'s end has just made one (an
    `areflect` wait makes its first at its first look, after dropping the loop's cancelled timers). Usually the
    threads are gone a few milliseconds later; only where they are not, something in a reference cycle made
    since (a deferred drop just applied, a callback the loop just ran) may still hold the runtime: collect
    then, after `_FIRST_COLLECTION_S`, and again at most every `_COLLECTION_EVERY_S`."""

    def __init__(self, first_after: float = _FIRST_COLLECTION_S) -> None:
        self.due = time.monotonic() + first_after

    def if_due(self) -> None:
        if time.monotonic() >= self.due:
            gc.collect()
            self.due = time.monotonic() + _COLLECTION_EVERY_S


def _wait_core_threads_gone(before: set[str]) -> None:
    """Wait until the core runtime threads started since `before` have ended: dropping the runtime stops
    them, and the last ones exit a few milliseconds after the drop returns.

    The runtime is dropped only once nothing holds it, and the core's own threads can hold it through Python:
    a core task that ends drops its Python objects (the asyncio future of a poll, the context it ran in)
    without the GIL, and PyO3 then only *queues* those reference drops, applied the next time any thread
    enters PyO3 (`_apply_deferred_core_drops`). The last poll's future ends with the worker's shutdown
    error, whose traceback reaches the worker, its client and so the runtime: when that queued drop came
    after the call's last entry into the core (a loaded machine, about one call in 40), nothing applied it
    and the runtime with its threads stayed until the process exited, `gc.collect()` or not. So every
    look is preceded by an entry into PyO3, and by a collection where one is due (`_Collections`)."""
    deadline = time.monotonic() + _THREADS_GONE_WAIT_S
    collect = _Collections()
    while True:
        _apply_deferred_core_drops()
        collect.if_due()
        left = _core_threads_left(before)
        if not left:
            return
        if time.monotonic() > deadline:
            log.debug(
                "%d Temporal core threads still running %.0f s after the call's runtime was released",
                len(left),
                _THREADS_GONE_WAIT_S,
            )
            return
        time.sleep(0.01)


def _core_threads_left(before: set[str]) -> list[str]:
    """The core runtime (tokio) threads of this process started since `before` and still running."""
    left = []
    for tid in (_threads() or set()) - before:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("tokio"):
                    left.append(tid)
        except OSError:  # it has just ended
            pass
    return left


def _apply_deferred_core_drops() -> bool:
    """Enter PyO3 once (build and drop an empty bridge object): PyO3 applies the reference drops that the
    core's threads queued while they did not hold the GIL (see `_wait_core_threads_gone`). False where the
    bridge has no such object (another temporalio: then only the collection helps)."""
    try:
        from temporalio.bridge.temporal_sdk_bridge import CustomSlotSupplier

        CustomSlotSupplier(None)
    except Exception:
        log.debug(
            "could not enter Temporal's core bridge to apply its deferred reference drops", exc_info=True
        )
        return False
    return True
