"""`SubprocessExecutor`: the worker-side handle of one sandbox host process.

Why a subprocess with a scrubbed environment: model code is untrusted, so it never runs in the
worker; the host gets no inherited secrets (the environment is built from scratch), a fresh empty
working directory, OS limits, and a hard wall-clock timeout enforced here by SIGKILL of its process
group (a cell that swallows every exception in `while True` cannot outlive it).

A pool of idle pre-started hosts (`sandbox.pool.HostPool`) can be given to the executor: `start()`
then takes one and only sends the trace path, the extra variables and the limits.

Why a zygote: starting a host with `python -m sandbox.host` costs ~190 ms of CPU (measured under the
default isolation); with many short sessions that was a third of the worker side's CPU per step. Hosts
are therefore forks of one per-worker fork server (`sandbox.zygote`, ~25 ms per host including its
first cell; its worker end is `sandbox.zygote_client`) that did the imports once; the child runs the
same `sandbox.host.main.main` a started host runs, so its lockdown is the same. If the zygote cannot be
started or dies, hosts are started directly (`zygote=False` forces that; the worker's
`RR_SANDBOX_ZYGOTE=0`).
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sandbox import isolation as isolation_defaults
from sandbox.hostproc import (
    MAX_BLOB_BYTES,
    MAX_REPLY_BYTES,
    START_TIMEOUT_S,
    Answer,
    HostProcess,
    Payload,
    _answer_archive,
    _close_pipes,
    _exchange,
    _HostDied,
    _launch,
    _payload_source,
    _ProtocolError,
)
from sandbox.isolation import IsolationMode
from sandbox.protocol import CellResult, SandboxLimits
from sandbox.results import _ms, death_result, protocol_result, reply_result, stderr_tail
from sandbox.wire import (
    NOTE_MAX_CHARS,
)

if TYPE_CHECKING:
    from sandbox.pool import HostPool

__all__ = [
    "SubprocessExecutor",
    "DEFAULT_RESTART_NOTE",
    "START_TIMEOUT_S",
]

log = logging.getLogger(__name__)


SNAPSHOT_TIMEOUT_S = 120.0  # pickling / restoring a large namespace (cells keep their own timeout)


CLOSE_GRACE_S = 1.0


DEFAULT_RESTART_NOTE = "the host was restarted with a fresh namespace (variables from earlier cells are gone)"


UNGUARDED_STDOUT_CHARS = 20_000  # the test-only unguarded op's own bound (`Host.unguarded`)


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
        archive_fetch: Callable[[str], object] | None = None,
        archive_allowed: Callable[[str], bool] | None = None,
        isolation: IsolationMode | None = None,
        zygote: bool = True,
        unguarded_for_tests: bool = False,
        missing_for_tests: tuple[str, ...] = (),
    ) -> None:
        """`archive_root`: the blob store the preloaded `ARCHIVE()` reads archived transcripts from (the
        worker reads them for the host, see `_answer_archive`); `archive_allowed(sha256)`: whether this
        session may read that one (`SessionManager` sets its grants; None: no archive can be read).

        `isolation`: the OS layer the host must apply (`sandbox.isolation`; None: `sandbox.isolation.DEFAULT_MODE`, `auto`; the worker
        passes its `RR_SANDBOX_ISOLATION`). `zygote`: fork hosts from the worker's fork server
        (`sandbox.zygote`) rather than starting each with `python -m sandbox.host` (the worker passes
        its `RR_SANDBOX_ZYGOTE`). `unguarded_for_tests`: let `run_unguarded` run code with
        the language guards off, to prove what the OS layer holds (tests only); `missing_for_tests`:
        isolation layers the host treats as unavailable (tests of the refusal paths).
        """
        self.missing_for_tests = tuple(missing_for_tests)
        self.limits = limits or SandboxLimits()
        self.isolation_mode: IsolationMode = isolation or isolation_defaults.DEFAULT_MODE
        self.zygote = zygote
        self.unguarded_for_tests = unguarded_for_tests
        self.isolation: dict[str, Any] = {}  # what the last started host reported (`IsolationReport`)
        self.restart_note = restart_note
        self._python = python
        self._start_timeout_s = start_timeout_s
        self._lock = asyncio.Lock()
        self._proc: HostProcess | None = None
        self._workdir: str | None = None
        self._stderr_path: str | None = None
        self._start_args: tuple[str | None, str, dict[str, Any]] | None = None
        self._inherit: bytes | os.PathLike[str] | None = None
        self.archive_root = str(archive_root) if archive_root is not None else None
        self.archive_fetch = archive_fetch
        # which archived transcripts the host may read (the session's grants; None: none, fail closed)
        self.archive_allowed = archive_allowed
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
        """The pid of the spawned process (the host's process group), for tests and diagnostics.

        With namespaces this is the host's supervisor; the host itself is `host_pid`.
        """
        return self._proc.pid if self._proc is not None else None

    @property
    def host_pid(self) -> int | None:
        """The worker-side pid of the process that runs the cells (diagnostics; Linux /proc)."""
        pid = self.pid
        if pid is None or self.isolation.get("mode") == "language-only":
            return pid
        if "namespaces" not in self.isolation.get("layers", ()):
            return pid
        for _ in range(2):  # supervisor -> reaper (PID 1 inside) -> host (PID 2 inside)
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return None
            if not children:
                return None
            pid = int(children[0])
        return pid

    async def start(
        self,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        *,
        inherit: bytes | os.PathLike[str] | None = None,
    ) -> None:
        """Spawn the host and load the trace; raises RuntimeError if the host cannot start.

        `inherit`: a parent's namespace export (`export_namespace`; bytes, or the path of the file
        holding them, sent in chunks), loaded right after the start; part of the starting point, so
        an internal restart of the host loads it again.
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
                    self._exchange(
                        {"op": "cell", "code": code}, answer=self._answer, stdout_max=self._stdout_max
                    ),
                    self.limits.cell_timeout_s,
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
            except _ProtocolError as exc:
                return await self._protocol_result(exc, t0, restarted)
            except _HostDied:
                return await self._death_result(t0, restarted)
            return reply_result(resp, t0, restarted)

    async def run_unguarded(self, code: str) -> CellResult:
        """Tests only: run `code` in the host with the language guards off (a simulated breach)."""
        if not self.unguarded_for_tests:
            raise RuntimeError("run_unguarded needs SubprocessExecutor(unguarded_for_tests=True)")
        async with self._lock:
            t0 = time.perf_counter()
            try:
                resp = await asyncio.wait_for(
                    self._exchange(
                        {"op": "unguarded", "code": code},
                        answer=self._answer,
                        stdout_max=UNGUARDED_STDOUT_CHARS,
                    ),
                    self.limits.cell_timeout_s,
                )
            except TimeoutError:
                await self._kill()
                return CellResult(ok=False, error_kind="timeout", error="unguarded code timed out")
            except _ProtocolError as exc:
                return await self._protocol_result(exc, t0, False)
            except _HostDied:
                return await self._death_result(t0, False)
            return reply_result(resp, t0, False)

    @property
    def _stdout_max(self) -> int:
        """The characters a cell's `stdout` may hold: the host cuts it to `max_output_chars` + a note."""
        return self.limits.max_output_chars + NOTE_MAX_CHARS

    async def _answer(self, question: Any) -> tuple[dict[str, Any], bytes]:
        return await _answer_archive(self.archive_root, question, self.archive_fetch, self.archive_allowed)

    async def snapshot_to(self, directory: str | os.PathLike[str]) -> tuple[Path | None, dict[str, Any]]:
        """Ask the host for a snapshot of its namespace, streamed into a new file in `directory`:
        (its path, or None if refused or failed; the response). The caller owns the file.

        A host that dies, hangs or breaks the protocol while snapshotting is killed (its state then
        comes from the journal)."""
        return await self._payload_to(directory, "snapshot", "taking a snapshot")

    async def export_to(self, directory: str | os.PathLike[str]) -> tuple[Path | None, dict[str, Any]]:
        """A copy of the namespace for a child session, streamed into a new file in `directory`:
        (its path, or None on failure; the response). The response's `skipped` names what was not
        carried. A host that dies, hangs or breaks the protocol is killed (`died` in the response)."""
        return await self._payload_to(directory, "export", "exporting")

    async def snapshot(self) -> tuple[bytes | None, dict[str, Any]]:
        """`snapshot_to` read back into bytes (tests and small states; the worker uses `snapshot_to`)."""
        return await self._payload_bytes(self.snapshot_to)

    async def export_namespace(self) -> tuple[bytes | None, dict[str, Any]]:
        """`export_to` read back into bytes (tests and small states; the worker uses `export_to`)."""
        return await self._payload_bytes(self.export_to)

    async def restore(self, blob: bytes | os.PathLike[str]) -> dict[str, Any]:
        """Load a snapshot (bytes, or the file holding them: sent in chunks) into a freshly started
        host; on failure the host must be discarded."""
        async with self._lock:
            if not self.alive:
                return {"ok": False, "error": "the host is not running"}
            try:
                with _payload_source(blob) as (source, size):
                    return await asyncio.wait_for(
                        self._exchange({"op": "restore", "size": size}, source),
                        max(self.limits.cell_timeout_s, SNAPSHOT_TIMEOUT_S),
                    )
            except (TimeoutError, _HostDied, OSError):
                await self._kill()
                return {"ok": False, "error": "the host died or hung while restoring a snapshot"}

    async def _payload_to(
        self, directory: str | os.PathLike[str], op: str, what: str
    ) -> tuple[Path | None, dict[str, Any]]:
        """Send `op` and stream the bytes after its `ok` reply into a new file in `directory`."""
        async with self._lock:
            if not self.alive:
                return None, {"ok": False, "error": "the host is not running", "died": True}
            fd, name = tempfile.mkstemp(dir=directory, prefix=f".{op}-", suffix=".incoming")
            path = Path(name)
            try:
                with os.fdopen(fd, "wb") as sink:
                    resp = await asyncio.wait_for(
                        self._exchange({"op": op}, sink=sink),
                        max(self.limits.cell_timeout_s, SNAPSHOT_TIMEOUT_S),
                    )
            except (TimeoutError, _HostDied) as exc:
                path.unlink(missing_ok=True)
                await self._kill()
                why = f": it sent {exc}" if isinstance(exc, _ProtocolError) else ""
                return None, {"ok": False, "error": f"the host died or hung while {what}{why}", "died": True}
            except BaseException:
                path.unlink(missing_ok=True)
                raise
            if resp.get("ok") is not True:
                path.unlink(missing_ok=True)
                return None, resp
            return path, resp

    @staticmethod
    async def _payload_bytes(
        fetch: Callable[[str], Awaitable[tuple[Path | None, dict[str, Any]]]],
    ) -> tuple[bytes | None, dict[str, Any]]:
        with tempfile.TemporaryDirectory(prefix="rr-payload-") as directory:
            path, resp = await fetch(directory)
            return (path.read_bytes() if path is not None else None), resp

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
        pool = self._pool
        usable = (
            pool is not None
            and pool.isolation == self.isolation_mode
            and not self.unguarded_for_tests
            and not self.missing_for_tests
        )
        host = await pool.take() if pool is not None and usable else None
        self.pooled = host is not None
        if host is None:
            host = await _launch(
                self._python,
                self._limits_arg(),
                self.isolation_mode,
                self.unguarded_for_tests,
                self.missing_for_tests,
                zygote=self.zygote,
            )
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
                with _payload_source(self._inherit) as (source, size):
                    resp = await asyncio.wait_for(
                        self._exchange({"op": "inherit", "size": size}, source),
                        max(self._start_timeout_s, SNAPSHOT_TIMEOUT_S),
                    )
                self.inherit_info = resp
        except (TimeoutError, _HostDied, OSError) as exc:
            tail = stderr_tail(self._stderr_path)
            await self._kill()
            if isinstance(exc, _ProtocolError):
                raise RuntimeError(f"sandbox host failed to start: it sent {exc}") from None
            if isinstance(exc, OSError):
                raise RuntimeError(f"sandbox host failed to start: the inherited namespace: {exc}") from None
            raise RuntimeError(f"sandbox host failed to start: {tail or 'no output'}") from None
        if isinstance(resp.get("isolation"), dict):
            self.isolation = resp["isolation"]
        if not resp.get("ok"):
            await self._kill()
            raise RuntimeError(str(resp.get("error"))[:2000])
        self.start_ms = _ms(t0)

    async def _request(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await _exchange(self._proc, obj)

    async def _exchange(
        self,
        obj: dict[str, Any],
        payload: Payload | None = None,
        *,
        sink: IO[bytes] | None = None,
        answer: Answer | None = None,
        stdout_max: int = 0,
    ) -> dict[str, Any]:
        # A legitimate snapshot or export cannot be larger than the memory the host may use.
        cap = min(MAX_BLOB_BYTES, self.limits.memory_bytes) if self.limits.memory_bytes else MAX_BLOB_BYTES
        # A reply frame holds stdout (up to 6 bytes a character as escaped JSON), an error, a FINAL_ANSWER.
        max_reply = MAX_REPLY_BYTES + 6 * stdout_max
        return await _exchange(
            self._proc,
            obj,
            payload,
            sink=sink,
            answer=answer,
            max_payload=cap,
            stdout_max=stdout_max,
            max_reply=max_reply,
        )

    async def _protocol_result(self, exc: _ProtocolError, t0: float, restarted: bool) -> CellResult:
        """A host that broke the protocol is stopped; only this cell fails (the session rebuilds)."""
        await self._kill()
        return protocol_result(exc, self.restart_note, t0, restarted)

    async def _death_result(self, t0: float, restarted: bool) -> CellResult:
        proc = self._proc
        rc: int | None = None
        if proc is not None:
            try:  # the channel closed; a host that does not exit (stopped, or a liar) is killed
                rc = await asyncio.wait_for(proc.wait(), CLOSE_GRACE_S)
            except TimeoutError:
                await self._kill()
                rc = proc.returncode
        tail = stderr_tail(self._stderr_path)
        await self._kill()
        return death_result(rc, tail, self.limits, self.restart_note, t0, restarted)

    async def _kill(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            # Close the pipes before waiting: asyncio's wait() also waits for the host's stdout to
            # reach EOF, which never comes while unread bytes (a breached host's oversized frame)
            # hold its reader paused.
            _close_pipes(proc)
            await proc.wait()
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
