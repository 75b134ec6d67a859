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
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandbox import isolation as isolation_defaults
from sandbox.archive import check_archive_name, not_archived, read_archive_blob
from sandbox.host.output import truncate
from sandbox.isolation import IsolationMode
from sandbox.protocol import CellResult, ErrorKind, SandboxLimits
from sandbox.wire import HEADER, WORKDIR_PREFIX, decode, encode, host_env
from sandbox.zygote_client import _ForkedProcess, _zygote

if TYPE_CHECKING:
    from sandbox.pool import HostPool

__all__ = [
    "SubprocessExecutor",
    "DEFAULT_RESTART_NOTE",
    "START_TIMEOUT_S",
]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # loading a large trace can take a while; cells have their own timeout
SNAPSHOT_TIMEOUT_S = 120.0  # pickling / restoring a large namespace (cells keep their own timeout)
CLOSE_GRACE_S = 1.0
STDERR_TAIL_BYTES = 4096
DEFAULT_RESTART_NOTE = "the host was restarted with a fresh namespace (variables from earlier cells are gone)"
# Every frame from a host is untrusted input (a breached host writes whatever it likes on its
# protocol fd): replies are bounded, must be JSON objects answering the request they follow (`n`),
# and anything else stops that host and fails that request only.
MAX_REPLY_BYTES = 16 * 1024**2  # a cell reply: stdout (<= max_output_chars), error, a FINAL_ANSWER
MAX_BLOB_BYTES = 8 * 1024**3  # snapshot / export bytes; also never more than the host's memory limit
MAX_ASKS = 64  # questions (ARCHIVE reads) a host may ask during one request
_ERROR_KINDS = frozenset({"syntax", "guard", "runtime", "timeout", "memory", "crash", "output"})
_request_ids = itertools.count(1)
Answer = Callable[[Any], Awaitable[tuple[dict[str, Any], bytes]]]


class _HostDied(Exception):
    pass


class _ProtocolError(_HostDied):
    """A reply that breaks the protocol: the host is alive but can no longer be trusted."""


HostProcess = asyncio.subprocess.Process | _ForkedProcess


@dataclass
class _HostProc:
    proc: HostProcess
    workdir: str
    stderr_path: str


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


async def _launch(
    python: str,
    limits_arg: str | None,
    isolation: IsolationMode = "auto",
    unguarded: bool = False,
    missing: tuple[str, ...] = (),
    *,
    zygote: bool = True,
) -> _HostProc:
    """Spawn `python -m sandbox.host` in a fresh empty directory with a scrubbed environment.

    Without `limits_arg` (pooled hosts) the host applies the OS limits from its `start` request.
    With `zygote` the host is forked from the worker's fork server if it can be (`sandbox.zygote`).
    """
    workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
    stderr_path = os.path.join(workdir, "host.stderr")
    # -S: no `site` (the host needs only the standard library and this project, on PYTHONPATH): ~10% of
    # a host's start-up CPU, and site-packages stays off its sys.path (and off its Landlock read list)
    args = [python, "-S", "-s", "-B", "-m", "sandbox.host"] + ([limits_arg] if limits_arg is not None else [])
    env = host_env(workdir, isolation, unguarded=unguarded, missing=missing)
    server = await _zygote(python) if zygote else None
    if server is not None:
        try:
            forked = await server.spawn(["sandbox.host", *args[6:]], env, workdir, stderr_path, START_TIMEOUT_S)
            return _HostProc(forked, workdir, stderr_path)
        except (OSError, RuntimeError) as exc:
            log.warning("sandbox: the host fork server failed (%s); starting this host directly", exc)
    try:
        with open(stderr_path, "wb") as log_fh:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fh,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return _HostProc(proc, workdir, stderr_path)


async def _exchange(
    proc: HostProcess | None,
    obj: dict[str, Any],
    payload: bytes | None = None,
    *,
    expect_payload: bool = False,
    answer: Answer | None = None,
    max_payload: int = MAX_BLOB_BYTES,
) -> tuple[dict[str, Any], bytes | None]:
    """One request/response; optional raw bytes after the request or the response frame.

    The host may ask questions (`{"ask": ...}` frames) before it replies; `answer` handles them.
    Raises `_HostDied` when the channel closes and `_ProtocolError` for any reply that is not a
    bounded JSON object carrying this request's number.
    """
    if proc is None or proc.stdin is None or proc.stdout is None:
        raise _HostDied()
    number = next(_request_ids)
    try:
        proc.stdin.write(encode({**obj, "n": number}))
        if payload is not None:
            proc.stdin.write(payload)
        await proc.stdin.drain()
        asks = 0
        while True:
            result = await _read_reply(proc.stdout)
            question = result.get("ask")
            if question is None:
                break
            asks += 1
            if answer is None or asks > MAX_ASKS:
                raise _ProtocolError("a question it may not ask here")
            reply, data = await answer(question)
            proc.stdin.write(encode(reply))
            proc.stdin.write(data)
            await proc.stdin.drain()
        if result.get("n") != number:
            raise _ProtocolError("a reply that does not answer the request")
        blob = None
        if expect_payload and result.get("ok") is True:
            size = result.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= max_payload:
                raise _ProtocolError("a payload size out of bounds")
            blob = await proc.stdout.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
        raise _HostDied() from None
    return result, blob


async def _read_reply(stream: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
    if size > MAX_REPLY_BYTES:
        raise _ProtocolError(f"a reply frame of {size:,} bytes (limit {MAX_REPLY_BYTES:,})")
    body = await stream.readexactly(size)
    try:
        result = decode(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _ProtocolError(f"a reply that is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(result, dict):
        raise _ProtocolError("a reply that is not a JSON object")
    return result


async def _answer_archive(
    archive_root: str | None,
    question: Any,
    fetch: Callable[[str], object] | None = None,
    allowed: Callable[[str], bool] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Read one archived transcript for a host: by checked sha256 only, never by a host's path, and only
    one the session may read (`allowed`, the worker's own capability list, `sandbox.archive.ArchiveGrants`;
    None: none). A name outside it gets the error of a missing blob, and is never fetched.

    `fetch(sha256)` first brings the blob into `archive_root` when it may be elsewhere (a shared S3 store)."""
    if not isinstance(question, dict) or question.get("what") != "archive":
        return {"ok": False, "error": "unknown question"}, b""

    def read() -> bytes:
        name = check_archive_name(question.get("sha256"))
        if allowed is None or not allowed(name):
            raise not_archived(name)
        if fetch is not None:
            try:
                fetch(name)
            except FileNotFoundError:  # not there either: read_archive_blob says so
                pass
            except OSError:  # the shared store failed; its location is not the model's business
                log.warning("ARCHIVE %s: fetching from the shared blob store failed", name, exc_info=True)
                raise OSError(f"ARCHIVE: archived transcript {name} cannot be fetched now") from None
        return read_archive_blob(archive_root, name)

    try:
        data = await asyncio.to_thread(read)
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": str(exc).removeprefix("ARCHIVE: ")}, b""
    return {"ok": True, "size": len(data)}, data


def _kill_sync(host: _HostProc) -> None:
    if host.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(host.proc.pid, signal.SIGKILL)
    shutil.rmtree(host.workdir, ignore_errors=True)


async def _kill_host(host: _HostProc) -> None:
    _kill_sync(host)
    await host.proc.wait()
    _close_pipes(host.proc)


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
        self._inherit: bytes | None = None
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
                resp, _ = await asyncio.wait_for(
                    self._exchange({"op": "cell", "code": code}, answer=self._answer),
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
            return self._to_result(resp, t0, restarted)

    async def run_unguarded(self, code: str) -> CellResult:
        """Tests only: run `code` in the host with the language guards off (a simulated breach)."""
        if not self.unguarded_for_tests:
            raise RuntimeError("run_unguarded needs SubprocessExecutor(unguarded_for_tests=True)")
        async with self._lock:
            t0 = time.perf_counter()
            try:
                resp, _ = await asyncio.wait_for(
                    self._exchange({"op": "unguarded", "code": code}, answer=self._answer),
                    self.limits.cell_timeout_s,
                )
            except TimeoutError:
                await self._kill()
                return CellResult(ok=False, error_kind="timeout", error="unguarded code timed out")
            except _ProtocolError as exc:
                return await self._protocol_result(exc, t0, False)
            except _HostDied:
                return await self._death_result(t0, False)
            return self._to_result(resp, t0, False)

    async def _answer(self, question: Any) -> tuple[dict[str, Any], bytes]:
        return await _answer_archive(self.archive_root, question, self.archive_fetch, self.archive_allowed)

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
                resp, _ = await asyncio.wait_for(
                    self._exchange({"op": "inherit", "size": len(self._inherit)}, self._inherit),
                    max(self._start_timeout_s, SNAPSHOT_TIMEOUT_S),
                )
                self.inherit_info = resp
        except (TimeoutError, _HostDied):
            tail = self._stderr_tail()
            await self._kill()
            raise RuntimeError(f"sandbox host failed to start: {tail or 'no output'}") from None
        if isinstance(resp.get("isolation"), dict):
            self.isolation = resp["isolation"]
        if not resp.get("ok"):
            await self._kill()
            raise RuntimeError(str(resp.get("error"))[:2000])
        self.start_ms = _ms(t0)

    async def _request(self, obj: dict[str, Any]) -> dict[str, Any]:
        result, _ = await _exchange(self._proc, obj)
        return result

    async def _exchange(
        self,
        obj: dict[str, Any],
        payload: bytes | None = None,
        *,
        expect_payload: bool = False,
        answer: Answer | None = None,
    ) -> tuple[dict[str, Any], bytes | None]:
        # A legitimate snapshot or export cannot be larger than the memory the host may use.
        cap = min(MAX_BLOB_BYTES, self.limits.memory_bytes) if self.limits.memory_bytes else MAX_BLOB_BYTES
        return await _exchange(
            self._proc, obj, payload, expect_payload=expect_payload, answer=answer, max_payload=cap
        )

    async def _protocol_result(self, exc: _ProtocolError, t0: float, restarted: bool) -> CellResult:
        """A host that broke the protocol is stopped; only this cell fails (the session rebuilds)."""
        await self._kill()
        return CellResult(
            ok=False,
            error_kind="crash",
            error=f"the sandbox host sent {exc} and was stopped; {self.restart_note}.",
            duration_ms=_ms(t0),
            host_restarted=restarted,
            meta={"protocol_error": str(exc)},
        )

    async def _death_result(self, t0: float, restarted: bool) -> CellResult:
        proc = self._proc
        rc: int | None = None
        if proc is not None:
            try:  # the channel closed; a host that does not exit (stopped, or a liar) is killed
                rc = await asyncio.wait_for(proc.wait(), CLOSE_GRACE_S)
            except TimeoutError:
                await self._kill()
                rc = proc.returncode
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
        """A cell reply, checked field by field (the host is untrusted; see `MAX_REPLY_BYTES`)."""
        raw_stdout = resp.get("stdout")
        stdout: str = raw_stdout if isinstance(raw_stdout, str) else ""
        error = resp.get("error")
        error = error[:20_000] if isinstance(error, str) else (None if error is None else "malformed error")
        ok = resp.get("ok") is True and error is None
        kind: ErrorKind | None = resp.get("error_kind") if resp.get("error_kind") in _ERROR_KINDS else None
        if kind is None and not ok:
            kind = "crash"
        if not ok and error is None:
            error = "the sandbox host reported a failure without a message"
        truncated = bool(resp.get("truncated"))
        # The host already truncates; enforce the boundary here too (the note adds ~200 chars).
        if len(stdout) > self.limits.max_output_chars + 400:
            stdout, _ = truncate(stdout, self.limits.max_output_chars)
            truncated = True
        has_submission = resp.get("has_submission") is True
        return CellResult(
            ok=ok,
            stdout=stdout,
            error=error,
            error_kind=kind,
            duration_ms=_ms(t0),
            truncated=truncated,
            submitted=resp.get("submitted") if has_submission else None,
            host_restarted=restarted,
            meta={
                "host_ms": _number(resp.get("host_ms")),
                "maxrss_kb": _number(resp.get("maxrss_kb")),
                "has_submission": has_submission,
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


def _close_pipes(proc: HostProcess) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
