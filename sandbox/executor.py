"""`SubprocessExecutor`: the worker-side handle of one sandbox host process.

Why a subprocess with a scrubbed environment: model code is untrusted, so it never runs in the
worker; the host gets no inherited secrets (the environment is built from scratch), a fresh empty
working directory, OS limits, and a hard wall-clock timeout enforced here by SIGKILL of its process
group (a cell that swallows every exception in `while True` cannot outlive it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandbox.framing import HEADER, MAX_FRAME_BYTES, decode, encode
from sandbox.output import truncate
from sandbox.protocol import CellResult, SandboxLimits

__all__ = ["SubprocessExecutor", "host_env", "DEFAULT_RESTART_NOTE", "START_TIMEOUT_S"]

START_TIMEOUT_S = 60.0  # loading a large trace can take a while; cells have their own timeout
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
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.restart_note = restart_note
        self._python = python
        self._start_timeout_s = start_timeout_s
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._workdir: str | None = None
        self._stderr_path: str | None = None
        self._start_args: tuple[str | None, str, dict[str, Any]] | None = None
        self.spawn_count = 0
        self.start_ms = 0.0

    # -- Executor protocol -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while the host process is running."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        """The host's pid (also its process-group id), for tests and diagnostics."""
        return self._proc.pid if self._proc is not None else None

    async def start(self, trace_path: str | None, trace_format: str, extra_vars: dict[str, Any]) -> None:
        """Spawn the host and load the trace; raises RuntimeError if the host cannot start."""
        async with self._lock:
            self._start_args = (trace_path, trace_format, dict(extra_vars))
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

    async def close(self) -> None:
        """Stop the host (EOF first, SIGKILL after a grace period) and remove its working directory."""
        async with self._lock:
            await self._stop()
            self._start_args = None

    # -- internals ---------------------------------------------------------------------------------
    def _limits_arg(self) -> str:
        return json.dumps(dataclasses.asdict(self.limits))

    async def _spawn(self) -> None:
        await self._stop()
        t0 = time.perf_counter()
        self._workdir = tempfile.mkdtemp(prefix="rr-sandbox-")
        self._stderr_path = os.path.join(self._workdir, "host.stderr")
        with open(self._stderr_path, "wb") as log:
            self._proc = await asyncio.create_subprocess_exec(
                self._python,
                "-s",
                "-B",
                "-m",
                "sandbox.host",
                self._limits_arg(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=self._workdir,
                env=host_env(self._workdir),
                start_new_session=True,
            )
        self.spawn_count += 1
        assert self._start_args is not None
        trace_path, trace_format, extra_vars = self._start_args
        req = {
            "op": "start",
            "trace_path": trace_path,
            "trace_format": trace_format,
            "extra_vars": extra_vars,
        }
        try:
            resp = await asyncio.wait_for(self._request(req), self._start_timeout_s)
        except (TimeoutError, _HostDied):
            tail = self._stderr_tail()
            await self._kill()
            raise RuntimeError(f"sandbox host failed to start: {tail or 'no output'}") from None
        if not resp.get("ok"):
            await self._kill()
            raise RuntimeError(str(resp.get("error")))
        self.start_ms = _ms(t0)

    async def _request(self, obj: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise _HostDied()
        try:
            proc.stdin.write(encode(obj))
            await proc.stdin.drain()
            header = await proc.stdout.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > MAX_FRAME_BYTES:
                raise _HostDied()
            body = await proc.stdout.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
            raise _HostDied() from None
        result: dict[str, Any] = decode(body)
        return result

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
