"""`SubprocessExecutor`: the worker-side handle of one sandbox host process.

Why a subprocess with a scrubbed environment: model code is untrusted, so it never runs in the
worker; the host gets no inherited secrets (the environment is built from scratch), a fresh empty
working directory, OS limits, and a hard wall-clock timeout enforced here by SIGKILL of its process
group (a cell that swallows every exception in `while True` cannot outlive it).

Why a pool: a new host costs ~110 ms before its first cell (interpreter start and importing the
trace normaliser), most of a session's first-cell latency. `HostPool` keeps a few *idle* hosts that
have done exactly that and nothing else (no limits applied yet, no trace, no cell); `start()` takes
one and only sends the trace path, the extra variables and the limits. A pooled host is used by one
session only and discarded with it, and has the same scrubbed environment and fixed hash seed as a
directly spawned one, so isolation and replay determinism are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.framing import HEADER, MAX_FRAME_BYTES, decode, encode
from sandbox.output import truncate
from sandbox.protocol import CellResult, SandboxLimits

__all__ = ["SubprocessExecutor", "HostPool", "host_env", "DEFAULT_RESTART_NOTE", "START_TIMEOUT_S"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # loading a large trace can take a while; cells have their own timeout
SNAPSHOT_TIMEOUT_S = 120.0  # pickling / restoring a large namespace (cells keep their own timeout)
CLOSE_GRACE_S = 1.0
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
STDERR_TAIL_BYTES = 4096
DEFAULT_RESTART_NOTE = "the host was restarted with a fresh namespace (variables from earlier cells are gone)"
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def host_env(workdir: str) -> dict[str, str]:
    """The host's whole environment: built from scratch so no secret of the worker leaks in."""
    return {
        "PATH": SAFE_PATH,
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": _PROJECT_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": workdir,
    }


class _HostDied(Exception):
    pass


@dataclass
class _HostProc:
    proc: asyncio.subprocess.Process
    workdir: str
    stderr_path: str


WORKDIR_PREFIX = "rr-sandbox-"


def sweep_stale_workdirs(root: str | None = None) -> int:
    """Remove host work dirs left by worker processes that died (SIGKILL skips every cleanup).

    A work dir is named `rr-sandbox-<worker pid>-<random>`; it is stale when that pid is gone.
    Returns how many were removed.
    """
    root = root or tempfile.gettempdir()
    removed = 0
    for entry in os.scandir(root):
        parts = entry.name[len(WORKDIR_PREFIX) :].split("-", 1) if entry.name.startswith(WORKDIR_PREFIX) else []
        if len(parts) != 2 or not parts[0].isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        if not os.path.exists(f"/proc/{parts[0]}"):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


async def _launch(python: str, limits_arg: str | None) -> _HostProc:
    """Spawn `python -m sandbox.host` in a fresh empty directory with a scrubbed environment.

    Without `limits_arg` (pooled hosts) the host applies the OS limits from its `start` request.
    """
    workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
    stderr_path = os.path.join(workdir, "host.stderr")
    args = [python, "-s", "-B", "-m", "sandbox.host"] + ([limits_arg] if limits_arg is not None else [])
    try:
        with open(stderr_path, "wb") as log_fh:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fh,
                cwd=workdir,
                env=host_env(workdir),
                start_new_session=True,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return _HostProc(proc, workdir, stderr_path)


async def _exchange(
    proc: asyncio.subprocess.Process | None,
    obj: dict[str, Any],
    payload: bytes | None = None,
    *,
    expect_payload: bool = False,
) -> tuple[dict[str, Any], bytes | None]:
    """One request/response; optional raw bytes after the request or the response frame."""
    if proc is None or proc.stdin is None or proc.stdout is None:
        raise _HostDied()
    try:
        proc.stdin.write(encode(obj))
        if payload is not None:
            proc.stdin.write(payload)
        await proc.stdin.drain()
        header = await proc.stdout.readexactly(HEADER.size)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise _HostDied()
        body = await proc.stdout.readexactly(size)
        result: dict[str, Any] = decode(body)
        blob = None
        if expect_payload and result.get("ok") and isinstance(result.get("size"), int):
            blob = await proc.stdout.readexactly(result["size"])
    except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
        raise _HostDied() from None
    return result, blob


def _kill_sync(host: _HostProc) -> None:
    if host.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(host.proc.pid, signal.SIGKILL)
    shutil.rmtree(host.workdir, ignore_errors=True)


async def _kill_host(host: _HostProc) -> None:
    _kill_sync(host)
    await host.proc.wait()
    _close_pipes(host.proc)


class HostPool:
    """A few pre-spawned idle hosts, refilled in the background after each take.

    An idle host has imported the trace normaliser (`warm`) and nothing else; each is handed out
    once. Bound to the event loop it was first used on (hosts of another loop are discarded).
    """

    def __init__(self, size: int = 2, *, python: str = sys.executable, warm_timeout_s: float = START_TIMEOUT_S) -> None:
        self.size = max(0, size)
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
                host = await _launch(self._python, None)
                resp, _ = await asyncio.wait_for(_exchange(host.proc, {"op": "warm"}), self._warm_timeout_s)
                if not resp.get("ok"):
                    raise RuntimeError(str(resp))
            except asyncio.CancelledError:
                if host is not None:
                    await _kill_host(host)
                raise
            except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs the pool hit
                log.warning("sandbox host pool: warm-up failed: %s", exc)
                if host is not None:
                    await _kill_host(host)
                return
            finally:
                self._ready.set()
            self._idle.append(host)


class SubprocessExecutor:
    """One live sandbox session backed by a `python -m sandbox.host` subprocess.

    Cells are serialised by an asyncio.Lock. After a timeout or a crash the next cell transparently
    starts a fresh host with the same trace and extra variables (state rebuild from the journal is
    `sandbox.sessions.SessionManager`'s job; `restart_note` tells the model what happened).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        restart_note: str = DEFAULT_RESTART_NOTE,
        python: str = sys.executable,
        start_timeout_s: float = START_TIMEOUT_S,
        pool: HostPool | None = None,
        index_data: bool = False,
        archive_root: str | os.PathLike[str] | None = None,
    ) -> None:
        """`archive_root`: the blob store the preloaded `ARCHIVE()` reads archived transcripts from."""
        self.limits = limits or SandboxLimits()
        self.restart_note = restart_note
        self._python = python
        self._start_timeout_s = start_timeout_s
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._workdir: str | None = None
        self._stderr_path: str | None = None
        self._start_args: tuple[str | None, str, dict[str, Any]] | None = None
        self._inherit: bytes | None = None
        self.archive_root = str(archive_root) if archive_root is not None else None
        self._pool = pool
        self.index_data = index_data  # the host fingerprints the preloaded data (needed for snapshots)
        self.spawn_count = 0
        self.start_ms = 0.0
        self.pooled = False
        self.inherit_info: dict[str, Any] = {}  # the host's answer to the last inherit (diagnostics)

    # -- Executor protocol -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while the host process is running."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        """The host's pid (also its process-group id), for tests and diagnostics."""
        return self._proc.pid if self._proc is not None else None

    async def start(
        self,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        *,
        inherit: bytes | None = None,
    ) -> None:
        """Spawn the host and load the trace; raises RuntimeError if the host cannot start.

        `inherit`: a parent's namespace export (`export_namespace`), loaded right after the start;
        part of the starting point, so an internal restart of the host loads it again.
        """
        async with self._lock:
            self._start_args = (trace_path, trace_format, dict(extra_vars))
            self._inherit = inherit
            await self._spawn()

    async def run_cell(self, code: str) -> CellResult:
        """Run one cell; never raises for model errors (they come back as `ok=False`)."""
        async with self._lock:
            restarted = False
            if not self.alive:
                if self._start_args is None:
                    raise RuntimeError("SubprocessExecutor.start() must be called first")
                await self._spawn()
                restarted = True
            t0 = time.perf_counter()
            try:
                resp = await asyncio.wait_for(
                    self._request({"op": "cell", "code": code}), self.limits.cell_timeout_s
                )
            except TimeoutError:
                await self._kill()
                return CellResult(
                    ok=False,
                    error_kind="timeout",
                    error=(
                        f"cell exceeded {self.limits.cell_timeout_s:g}s and was killed; {self.restart_note}. "
                        "Make the cell cheaper: work on a slice of the data, avoid unbounded loops."
                    ),
                    duration_ms=_ms(t0),
                    host_restarted=restarted,
                    meta={"killed": True},
                )
            except _HostDied:
                return await self._death_result(t0, restarted)
            return self._to_result(resp, t0, restarted)

    async def snapshot(self) -> tuple[bytes | None, dict[str, Any]]:
        """Ask the host for a snapshot of its namespace: (pickle bytes or None if refused, response).

        A host that dies or hangs while snapshotting is killed (its state then comes from the journal).
        """
        async with self._lock:
            if not self.alive:
                return None, {"ok": False, "error": "the host is not running"}
            try:
                resp, blob = await asyncio.wait_for(
                    self._exchange({"op": "snapshot"}, expect_payload=True),
                    max(self.limits.cell_timeout_s, SNAPSHOT_TIMEOUT_S),
                )
            except (TimeoutError, _HostDied):
                await self._kill()
                return None, {"ok": False, "error": "the host died or hung while taking a snapshot"}
            return (blob if resp.get("ok") else None), resp

    async def export_namespace(self) -> tuple[bytes | None, dict[str, Any]]:
        """A copy of the namespace for a child session: (export bytes or None on failure, response).

        The response's `skipped` names what was not carried. A host that dies or hangs is killed.
        """
        async with self._lock:
            if not self.alive:
                return None, {"ok": False, "error": "the host is not running", "died": True}
            try:
                resp, blob = await asyncio.wait_for(
                    self._exchange({"op": "export"}, expect_payload=True),
                    max(self.limits.cell_timeout_s, SNAPSHOT_TIMEOUT_S),
                )
            except (TimeoutError, _HostDied):
                await self._kill()
                return None, {"ok": False, "error": "the host died or hung while exporting", "died": True}
            return (blob if resp.get("ok") else None), resp

    async def restore(self, blob: bytes) -> dict[str, Any]:
        """Load a snapshot into a freshly started host; on failure the host must be discarded."""
        async with self._lock:
            if not self.alive:
                return {"ok": False, "error": "the host is not running"}
            try:
                resp, _ = await asyncio.wait_for(
                    self._exchange({"op": "restore", "size": len(blob)}, blob),
                    max(self.limits.cell_timeout_s, SNAPSHOT_TIMEOUT_S),
                )
            except (TimeoutError, _HostDied):
                await self._kill()
                return {"ok": False, "error": "the host died or hung while restoring a snapshot"}
            return resp

    async def close(self) -> None:
        """Stop the host (EOF first, SIGKILL after a grace period) and remove its working directory."""
        async with self._lock:
            await self._stop()
            self._start_args = None
            self._inherit = None

    # -- internals ---------------------------------------------------------------------------------
    def _limits_arg(self) -> str:
        return json.dumps(dataclasses.asdict(self.limits))

    async def _spawn(self) -> None:
        await self._stop()
        t0 = time.perf_counter()
        host = await self._pool.take() if self._pool is not None else None
        self.pooled = host is not None
        if host is None:
            host = await _launch(self._python, self._limits_arg())
        self._proc, self._workdir, self._stderr_path = host.proc, host.workdir, host.stderr_path
        self.spawn_count += 1
        assert self._start_args is not None
        trace_path, trace_format, extra_vars = self._start_args
        req = {
            "op": "start",
            "trace_path": trace_path,
            "trace_format": trace_format,
            "extra_vars": extra_vars,
            "limits": dataclasses.asdict(self.limits),
            "index_data": self.index_data,
            "archive_root": self.archive_root,
        }
        try:
            resp = await asyncio.wait_for(self._request(req), self._start_timeout_s)
            if resp.get("ok") and self._inherit is not None:
                resp, _ = await asyncio.wait_for(
                    self._exchange({"op": "inherit", "size": len(self._inherit)}, self._inherit),
                    max(self._start_timeout_s, SNAPSHOT_TIMEOUT_S),
                )
                self.inherit_info = resp
        except (TimeoutError, _HostDied):
            tail = self._stderr_tail()
            await self._kill()
            raise RuntimeError(f"sandbox host failed to start: {tail or 'no output'}") from None
        if not resp.get("ok"):
            await self._kill()
            raise RuntimeError(str(resp.get("error")))
        self.start_ms = _ms(t0)

    async def _request(self, obj: dict[str, Any]) -> dict[str, Any]:
        result, _ = await _exchange(self._proc, obj)
        return result

    async def _exchange(
        self, obj: dict[str, Any], payload: bytes | None = None, *, expect_payload: bool = False
    ) -> tuple[dict[str, Any], bytes | None]:
        return await _exchange(self._proc, obj, payload, expect_payload=expect_payload)

    async def _death_result(self, t0: float, restarted: bool) -> CellResult:
        proc = self._proc
        rc = await proc.wait() if proc is not None else None
        tail = self._stderr_tail()
        await self._kill()
        meta: dict[str, Any] = {"returncode": rc}
        if rc == -signal.SIGXCPU:
            return CellResult(
                ok=False,
                error_kind="timeout",
                error=(
                    f"cell exceeded its CPU budget of {self.limits.cpu_seconds_per_cell}s and was killed; "
                    f"{self.restart_note}."
                ),
                duration_ms=_ms(t0),
                host_restarted=restarted,
                meta=meta,
            )
        memoryish = "MemoryError" in tail or "Cannot allocate memory" in tail or "out of memory" in tail
        if memoryish:
            kind, what = "memory", "ran out of memory"
        elif rc is not None and rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            kind, what = "crash", f"was killed by signal {name}"
        else:
            kind, what = "crash", f"exited unexpectedly (code {rc})"
        return CellResult(
            ok=False,
            error_kind=kind,  # type: ignore[arg-type]
            error=f"the sandbox host {what} while running this cell; {self.restart_note}.",
            duration_ms=_ms(t0),
            host_restarted=restarted,
            meta=meta,
        )

    def _to_result(self, resp: dict[str, Any], t0: float, restarted: bool) -> CellResult:
        stdout = str(resp.get("stdout") or "")
        truncated = bool(resp.get("truncated"))
        # The host already truncates; enforce the boundary here too (the note adds ~200 chars).
        if len(stdout) > self.limits.max_output_chars + 400:
            stdout, _ = truncate(stdout, self.limits.max_output_chars)
            truncated = True
        return CellResult(
            ok=bool(resp.get("ok")),
            stdout=stdout,
            error=resp.get("error"),
            error_kind=resp.get("error_kind"),
            duration_ms=_ms(t0),
            truncated=truncated,
            submitted=resp.get("submitted") if resp.get("has_submission") else None,
            host_restarted=restarted,
            meta={
                "host_ms": resp.get("host_ms"),
                "maxrss_kb": resp.get("maxrss_kb"),
                "has_submission": bool(resp.get("has_submission")),
            },
        )

    def _stderr_tail(self) -> str:
        if not self._stderr_path:
            return ""
        try:
            with open(self._stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - STDERR_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    async def _kill(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            _close_pipes(proc)
        self._proc = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    async def _stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None and proc.stdin is not None:
            proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), CLOSE_GRACE_S)
        await self._kill()


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
