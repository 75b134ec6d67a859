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
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:

    pass

log = logging.getLogger("rr.api")


_core_lock = threading.Lock()


_core_users = 0


_core_previous: Any = None  # temporalio.runtime.Runtime: the default before the first call in progress


_core_threads_before: set[str] | None = None


_THREADS_GONE_WAIT_S = 2.0


@contextlib.contextmanager
def _call_core_runtime() -> Iterator[None]:
    """Install a core runtime of the calls in progress as temporalio's default; when the last call ends,
    restore the previous default, collect the call's clients and worker, and with them the runtime, and wait
    for its threads to end (see the module docstring). Its core logs go through Python logging
    (`temporalio.core`), as the CLI's do (`reflector.client.configure_core_logging`)."""
    global _core_users, _core_previous, _core_threads_before
    from temporalio.runtime import Runtime

    from reflector.client import configure_core_logging

    with _core_lock:
        if _core_users == 0:
            _core_previous = Runtime.default()
            _core_threads_before = _threads()
            configure_core_logging(worker_warnings=True)  # a new runtime, the default from now on
        _core_users += 1
    try:
        yield
    finally:
        before: set[str] | None = None
        with _core_lock:
            _core_users -= 1
            last = _core_users == 0
            if last:
                Runtime.set_default(_core_previous, error_if_already_set=False)
                before, _core_previous, _core_threads_before = _core_threads_before, None, None
        gc.collect()  # clients and workers in reference cycles would keep the runtime alive
        if last and before is not None:
            _wait_core_threads_gone(before)


def _threads() -> set[str] | None:
    """This process's thread ids (Linux: /proc), None where they cannot be listed."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _wait_core_threads_gone(before: set[str]) -> None:
    """Wait until the core runtime threads started since `before` have ended: dropping the runtime stops
    them, and the last ones exit a few milliseconds after the drop returns."""
    deadline = time.monotonic() + _THREADS_GONE_WAIT_S
    while True:
        left = []
        for tid in (_threads() or set()) - before:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().startswith("tokio"):
                        left.append(tid)
            except OSError:  # it has just ended
                pass
        if not left:
            return
        if time.monotonic() > deadline:
            log.debug("%d Temporal core threads still running %.0f s after the call's runtime was released",
                      len(left), _THREADS_GONE_WAIT_S)
            return
        time.sleep(0.01)
