"""A call's Temporal core runtime is released when the call ends, even where the core's own threads dropped
their last Python objects off the GIL (`reflector.client.api_core._wait_core_threads_gone`).

PyO3 only queues a reference drop made without the GIL and applies it the next time any thread enters PyO3.
The core's task that delivered the worker's last poll result dropped that asyncio future so, after the call's
last entry into the core on a loaded machine (about one call in 40): the future's exception reached the worker,
its client and the runtime, and 2-5 core threads stayed until the process exited, `gc.collect()` or not
(tests/e2e/test_api_clean_exit.py showed it). The wait now enters PyO3 before each look.
"""

from __future__ import annotations

import gc
import time

import pytest

from reflector.client import api_core as api


def test_the_installed_bridge_can_be_entered_to_apply_queued_drops() -> None:
    # the release depends on it: a temporalio without this bridge object would silently lose the fix
    assert api._apply_deferred_core_drops() is True


def _record(monkeypatch: pytest.MonkeyPatch, left: list[list[str]]) -> list[str]:
    """Record the wait's entries into PyO3 and its collections; `left`: what each look finds (then none)."""
    calls: list[str] = []

    def enter_pyo3() -> bool:
        calls.append("pyo3")
        return True

    def collect(*_args: object) -> int:
        calls.append("gc")
        return 0

    def threads_left(_before: set[str]) -> list[str]:
        calls.append("look")
        return left.pop(0) if left else []

    monkeypatch.setattr(api, "_apply_deferred_core_drops", enter_pyo3)
    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(api, "_core_threads_left", threads_left)
    return calls


def test_every_look_for_left_core_threads_first_applies_the_queued_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _record(monkeypatch, [])
    api._wait_core_threads_gone(
        set()
    )  # threads gone at the first look: no collection (the call's end made one)
    assert calls == ["pyo3", "look"]


def test_a_wait_whose_threads_stay_collects_after_a_while_not_at_every_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api, "_FIRST_COLLECTION_S", 0.03)
    monkeypatch.setattr(api, "_COLLECTION_EVERY_S", 10.0)
    calls = _record(monkeypatch, [["t1"]] * 8)  # a cycle holds the runtime until a collection
    api._wait_core_threads_gone(set())
    looks_before_gc = calls.index("gc")
    assert calls[:2] == ["pyo3", "look"] and calls.count("gc") == 1, calls  # ~0.1 s of CPU each: one here
    assert calls[looks_before_gc - 1] == "pyo3"  # the collection follows an entry into PyO3, then a look
    assert all(c != "look" or calls[i - 1] in ("pyo3", "gc") for i, c in enumerate(calls))


async def test_an_areflect_wait_collects_at_its_first_look(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record(monkeypatch, [])
    await api._await_core_threads_gone(
        set()
    )  # the call's end left the collection to it: timers dropped first
    assert calls == ["pyo3", "gc", "look"]


async def test_the_cancelled_timers_of_a_loop_that_goes_on_no_longer_hold_the_calls_objects() -> None:
    """An activity's timers keep its context (and through it the call's client and core runtime) in the loop's heap
    until their time would have come, cancelled or not: an `areflect` on a loop that goes on drops them."""
    import asyncio
    import contextvars
    import weakref

    class Held:
        pass

    var: contextvars.ContextVar[Held] = contextvars.ContextVar("held")
    loop = asyncio.get_running_loop()
    held = Held()
    ref = weakref.ref(held)

    def in_activity(value: Held) -> tuple[asyncio.TimerHandle, asyncio.TimerHandle]:
        var.set(value)
        return loop.call_later(60, lambda: None), loop.call_later(60, lambda: None)

    done, live = contextvars.copy_context().run(in_activity, held)
    done.cancel()  # as `asyncio.wait_for` cancels its timeout once the awaited call returned
    del held
    gc.collect()
    assert ref() is not None  # the cancelled timer still holds the context
    heap: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    live_before = {id(h) for h in heap if not h.cancelled()}
    api._drop_cancelled_timers()
    heap = loop._scheduled  # type: ignore[attr-defined]
    assert not [h for h in heap if h.cancelled()]
    assert {id(h) for h in heap} == live_before  # the others stay
    live.cancel()
    api._drop_cancelled_timers()
    del done, live, heap, live_before
    gc.collect()
    assert ref() is None


def test_no_running_loop_no_timers_to_drop() -> None:
    api._drop_cancelled_timers()  # `reflect()`: its loop is closed with its timers; nothing to do, no error


async def test_an_areflect_on_a_loop_that_goes_on_lets_the_loop_free_the_runtime() -> None:
    """The wait at the end of an `areflect` yields to its loop: a callback the call's activities queued holds the
    runtime through its context until the loop runs it (a wait that blocked the loop kept the runtime, and its
    threads, for the whole wait)."""
    import asyncio
    import contextvars

    from temporalio.runtime import Runtime, TelemetryConfig

    before = api._threads()
    assert before is not None
    held: contextvars.ContextVar[Runtime] = contextvars.ContextVar("held")
    loop = asyncio.get_running_loop()

    def in_activity() -> None:
        held.set(Runtime(telemetry=TelemetryConfig()))  # a core runtime: its tokio threads start
        loop.call_soon(lambda: None)  # queued with this context: the only reference to the runtime

    contextvars.copy_context().run(in_activity)
    time.sleep(0.2)  # tokio names its threads as they start (the loop must not run the callback yet)
    gc.collect()
    assert api._core_threads_left(before), "the runtime started no thread to wait for"
    await api._await_core_threads_gone(before)
    assert not api._core_threads_left(before)
