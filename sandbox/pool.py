"""`HostPool`: a few pre-spawned idle sandbox hosts, so a session's first cell does not wait for one.

Why a pool: a new host costs ~110 ms before its first cell (interpreter start and importing the
trace normaliser), most of a session's first-cell latency. `HostPool` keeps a few *idle* hosts that
have done exactly that and nothing else (no limits applied yet, no trace, no cell);
`SubprocessExecutor.start()` takes one and only sends the trace path, the extra variables and the
limits. A pooled host is used by one session only and discarded with it, and has the same scrubbed
environment and fixed hash seed as a directly spawned one, so isolation and replay determinism are
unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections import deque

from sandbox import isolation as isolation_defaults
from sandbox.hostproc import START_TIMEOUT_S, _exchange, _HostProc, _kill_host, _kill_sync, _launch
from sandbox.isolation import IsolationMode

__all__ = ["HostPool"]

log = logging.getLogger(__name__)


class HostPool:
    """A few pre-spawned idle hosts, refilled in the background after each take.

    An idle host has imported the trace normaliser (`warm`) and nothing else; each is handed out
    once. Bound to the event loop it was first used on (hosts of another loop are discarded).
    """

    def __init__(
        self,
        size: int = 2,
        *,
        python: str = sys.executable,
        warm_timeout_s: float = START_TIMEOUT_S,
        isolation: IsolationMode | None = None,
        zygote: bool = True,
    ) -> None:
        """`isolation`: the OS layer of its hosts (None: `sandbox.isolation.DEFAULT_MODE`, `auto`); `zygote`: fork them from the worker's
        fork server (`sandbox.zygote`) rather than starting each with `python -m sandbox.host`."""
        self.size = max(0, size)
        self.isolation: IsolationMode = isolation or isolation_defaults.DEFAULT_MODE
        self.zygote = zygote
        self._python = python
        self._warm_timeout_s = warm_timeout_s
        self._idle: deque[_HostProc] = deque()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self.hits = 0
        self.misses = 0

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def take(self) -> _HostProc | None:
        """An idle warm host, or None (the caller spawns one); schedules a refill either way.

        If none is idle but one is warming up, wait for it: it started earlier than a new spawn would.
        """
        if self.size <= 0:
            return None
        self._bind()
        host = self._pop()
        if host is None and self._task is not None and not self._task.done():
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), self._warm_timeout_s)
            host = self._pop()
        if host is None:
            self.misses += 1
        else:
            self.hits += 1
        self.fill()
        return host

    def _pop(self) -> _HostProc | None:
        while self._idle:
            candidate = self._idle.popleft()
            if candidate.proc.returncode is None:
                return candidate
            _kill_sync(candidate)
        return None

    def fill(self) -> None:
        """Start the background refill if it is not running (needs a running loop)."""
        if self.size <= 0:
            return
        self._bind()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._refill())

    async def wait_full(self) -> None:
        """Fill the pool and wait until every idle host is warm (benchmarks, tests, worker start)."""
        self.fill()
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
            if len(self._idle) < self.size:
                self.fill()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        while self._idle:
            await _kill_host(self._idle.popleft())

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            while self._idle:  # pipes of another (closed) loop: unusable
                _kill_sync(self._idle.popleft())
            self._task = None
            self._ready = asyncio.Event()
            self._loop = loop

    async def _refill(self) -> None:
        while len(self._idle) < self.size:
            host: _HostProc | None = None
            try:
                host = await _launch(self._python, None, self.isolation, zygote=self.zygote)
                resp = await asyncio.wait_for(_exchange(host.proc, {"op": "warm"}), self._warm_timeout_s)
                if not resp.get("ok"):
                    raise RuntimeError(str(resp))
            except asyncio.CancelledError:
                if host is not None:
                    await _kill_host(host)
                raise
            except Exception as exc:  # a failed warm-up only costs the pool hit
                log.warning("sandbox host pool: warm-up failed: %s", exc)
                if host is not None:
                    await _kill_host(host)
                return
            finally:
                self._ready.set()
            self._idle.append(host)
