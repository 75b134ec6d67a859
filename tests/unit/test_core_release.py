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

import pytest

from reflector.client import api_core as api


def test_the_installed_bridge_can_be_entered_to_apply_queued_drops() -> None:
    # the release depends on it: a temporalio without this bridge object would silently lose the fix
    assert api._apply_deferred_core_drops() is True


def test_every_look_for_left_core_threads_first_applies_the_queued_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def enter_pyo3() -> bool:
        calls.append("pyo3")
        return True

    def collect(*_args: object) -> int:
        calls.append("gc")
        return 0

    monkeypatch.setattr(api, "_apply_deferred_core_drops", enter_pyo3)
    monkeypatch.setattr(gc, "collect", collect)
    before = api._threads()
    assert before is not None  # Linux: /proc
    api._wait_core_threads_gone(before)  # nothing started since `before`: one look, and it returns
    assert calls == ["pyo3", "gc"]  # the drops applied, then a collection, then the look
