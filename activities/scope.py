"""Which worker's resources an activity uses: its blob store, sandbox sessions and response cache.

A process can run several workers with different settings (the Python API's in-process worker next to a
program's own, the test suite's workers on several `RR_HOME`s). Module-level state set "at worker start"
is then whichever worker started last, and another worker's activities would read and write its blob
store: a cell that cannot find its trace, a response cached where the next worker never looks.

So each worker binds its own resources for its activities: `BindWorkerScope` is an activity interceptor
(temporalio runs regular and local activities through it) that sets the worker's values in context
variables around every activity it runs. Code that runs in the activity, including `asyncio.to_thread`
helpers (which copy the context), reads them with `ContextVar.get`; outside any worker (a direct call in
a tool or a test) each module falls back to its process default.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore
from reflector.runtime.storage.stores import open_store

__all__ = ["BindWorkerScope", "STORE", "current_store"]

STORE: ContextVar[BlobStore | None] = ContextVar("rr_worker_store", default=None)
"""The blob store of the worker running the current activity."""


def current_store() -> BlobStore:
    """The running worker's blob store; outside a worker, the store of the process's settings."""
    return STORE.get() or open_store(Settings.from_env())


class BindWorkerScope(Interceptor):
    """Run each of this worker's activities with `values` set (context variable -> this worker's value)."""

    def __init__(self, values: Mapping[ContextVar[Any], Any]) -> None:
        self._values = dict(values)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Bound(next, self._values)


class _Bound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, values: dict[ContextVar[Any], Any]) -> None:
        super().__init__(next)
        self._values = values

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        tokens = [(var, var.set(value)) for var, value in self._values.items()]
        try:
            return await self.next.execute_activity(input)
        finally:
            for var, token in reversed(tokens):
                var.reset(token)
