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
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sandbox import isolation as isolation_defaults
from sandbox.archive import check_archive_name, not_archived, read_archive_blob
from sandbox.isolation import MODES, IsolationMode
from sandbox.protocol import CellResult, ErrorKind, SandboxLimits
from sandbox.wire import (
    CHANNEL_BROKEN_EXIT,
    FINAL_ANSWER_MAX_BYTES,
    HEADER,
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_NAMES,
    MAX_PAYLOAD_BYTES,
    NOTE_MAX_CHARS,
    WORKDIR_PREFIX,
    decode,
    encode,
    host_env,
)
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
# protocol fd): replies are bounded, must be JSON objects answering the request they follow (`n`,
# unguessable, so a frame written ahead of time or twice never answers a later request), every
# field is checked against the bound the host's side of the contract states (`_check_reply`), and
# anything else stops that host and fails that request only. Snapshot and export bytes stream to a
# file in `PAYLOAD_CHUNK` pieces: a host announcing gigabytes costs the worker one chunk of memory.
MAX_REPLY_BYTES = 16 * 1024**2  # a cell reply: stdout (<= max_output_chars), error, a FINAL_ANSWER
MAX_BLOB_BYTES = MAX_PAYLOAD_BYTES  # snapshot / export bytes; also never more than the host's memory limit
PAYLOAD_CHUNK = 1 << 20  # bytes of a snapshot / export held in worker memory at a time
MAX_ASKS = 64  # questions (ARCHIVE reads) a host may ask during one request
UNGUARDED_STDOUT_CHARS = 20_000  # the test-only unguarded op's own bound (`Host.unguarded`)
_ERROR_KINDS = frozenset({"syntax", "guard", "runtime", "timeout", "memory", "crash", "output"})
Answer = Callable[[Any], Awaitable[tuple[dict[str, Any], bytes]]]
Payload = bytes | IO[bytes]  # raw bytes sent after a request: in memory, or read from a file in chunks


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
    payload: Payload | None = None,
    *,
    sink: IO[bytes] | None = None,
    answer: Answer | None = None,
    max_payload: int = MAX_BLOB_BYTES,
    stdout_max: int = 0,
    max_reply: int = MAX_REPLY_BYTES,
) -> dict[str, Any]:
    """One request/response; optional raw bytes after the request (`payload`, bytes or a file read
    in chunks) or after an `ok` response frame (its `size` bytes, streamed into `sink`).

    The host may ask questions (`{"ask": ...}` frames) before it replies; `answer` handles them.
    Raises `_HostDied` when the channel closes and `_ProtocolError` for any reply that is not a
    bounded JSON object carrying this request's number with fields within their bounds
    (`_check_reply`; `stdout_max`: the characters of `stdout` it may hold), and for bytes the host
    wrote before it was asked anything.
    """
    if proc is None or proc.stdin is None or proc.stdout is None:
        raise _HostDied()
    if _buffered(proc.stdout):
        raise _ProtocolError("a frame nobody asked for (between requests)")
    number = secrets.randbits(62)
    try:
        proc.stdin.write(encode({**obj, "n": number}))
        await _send_payload(proc.stdin, payload, int(obj.get("size", 0)))
        await proc.stdin.drain()
        asks = 0
        while True:
            result = await _read_reply(proc.stdout, max_reply)
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
        _check_reply(result, stdout_max)
        if sink is not None and result.get("ok") is True:
            size = result.get("size")
            if type(size) is not int or not 0 <= size <= max_payload:
                raise _ProtocolError(f"a payload size out of bounds ({size!r}, limit {max_payload:,})")
            await _receive_payload(proc.stdout, size, sink)
    except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
        raise _HostDied() from None
    return result


def _buffered(stream: asyncio.StreamReader) -> bool:
    """Bytes already read from the host that no request asked for (a reply written twice, or ahead)."""
    return bool(getattr(stream, "_buffer", b""))


async def _send_payload(stdin: asyncio.StreamWriter, payload: Payload | None, size: int) -> None:
    """The `size` raw bytes after a request; a file is sent in `PAYLOAD_CHUNK` pieces (never held
    whole), exactly `size` of them (a file that changed under us raises OSError; the caller then
    stops the host, which is in the middle of reading them)."""
    if payload is None:
        return
    if isinstance(payload, bytes | bytearray | memoryview):
        stdin.write(payload)
        return
    while size:
        chunk = payload.read(min(size, PAYLOAD_CHUNK))
        if not chunk:
            raise OSError("the file being sent to the sandbox host ended early")
        stdin.write(chunk)
        size -= len(chunk)
        await stdin.drain()


async def _receive_payload(stdout: asyncio.StreamReader, size: int, sink: IO[bytes]) -> None:
    """Exactly `size` raw bytes from the host into `sink`, one bounded chunk in memory at a time."""
    while size:
        chunk = await stdout.readexactly(min(size, PAYLOAD_CHUNK))
        sink.write(chunk)
        size -= len(chunk)


async def _read_reply(stream: asyncio.StreamReader, max_bytes: int = MAX_REPLY_BYTES) -> dict[str, Any]:
    """One frame from the host: a JSON object of at most `max_bytes`, else `_ProtocolError`."""
    (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
    if size > max_bytes:
        raise _ProtocolError(f"a reply frame of {size:,} bytes (limit {max_bytes:,})")
    body = await stream.readexactly(size)
    try:
        result = decode(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _ProtocolError(f"a reply that is not valid JSON ({type(exc).__name__})") from None
    if type(result) is not dict:
        raise _ProtocolError("a reply that is not a JSON object")
    return result


# -- the bounds of a reply's fields (what the host's side of the contract promises) -------------------
_ERROR_MAX = MAX_ERROR_CHARS + NOTE_MAX_CHARS  # `sandbox.host.main` cuts every error text to this
# FINAL_ANSWER's bound is on the host's ASCII JSON; the wire spells a lone surrogate (`\ud800`, 6 bytes
# there) as 6 visible characters, 7 bytes in ASCII JSON here: each such spelling counts 6, as on the host.
_SURROGATE_SPELLING = re.compile(r"\\\\ud[89a-f][0-9a-f]{2}")
_NAME_MAX = MAX_NAME_CHARS  # a `skipped` / `shadowed` entry (`sandbox.host.main` cuts longer ones)
_NAMES_MAX = MAX_NAMES  # entries of one such list (likewise)
_COUNT_MAX = 1 << 53  # integer counters: vars, helpers, history, maxrss_kb, pid, landlock_abi, uid
_MS_MAX = 1e10  # durations in milliseconds (115 days)
_SCALAR_STR_MAX = 1000  # a field this version does not know: a small JSON scalar only
_BOOLS = frozenset({"ok", "truncated", "has_submission", "refused", "isolation_refused", "died"})
_COUNTS = frozenset({"size", "vars", "helpers", "history", "maxrss_kb", "pid"})
_DURATIONS = frozenset({"host_ms", "load_ms", "warm_ms"})
_NAME_LISTS = frozenset({"skipped", "shadowed"})


def _check_reply(resp: dict[str, Any], stdout_max: int) -> None:
    """Every field of a reply within the bound the host's side states, else `_ProtocolError`.

    Why all of them: the worker keeps, logs or hands on what a host says (a FINAL_ANSWER goes into
    the workflow's history), and a breached host says whatever it likes. `ok` is required."""
    if type(resp.get("ok")) is not bool:
        raise _ProtocolError("a reply without a boolean 'ok'")
    for key, value in resp.items():
        problem = _field_problem(key, value, stdout_max)
        if problem:
            raise _ProtocolError(f"a reply whose {key!r} {problem}")
    if resp.get("has_submission") is not True and resp.get("submitted") is not None:
        raise _ProtocolError("a reply with a submitted value but no submission")


def _field_problem(key: str, value: Any, stdout_max: int) -> str | None:
    """Why `value` is not a valid `key` field (None if it is)."""
    if key in _BOOLS:
        return None if type(value) is bool else "is not a boolean"
    if key == "n":
        return None
    if key in ("stdout", "error"):
        limit = stdout_max if key == "stdout" else _ERROR_MAX
        if value is None and key == "error":
            return None
        if type(value) is not str:
            return "is not text"
        return None if len(value) <= limit else f"has {len(value):,} characters (limit {limit:,})"
    if key == "error_kind":
        return None if value is None or value in _ERROR_KINDS else "is not a known kind"
    if key in _COUNTS:
        return None if type(value) is int and 0 <= value <= _COUNT_MAX else "is not a count"
    if key in _DURATIONS:
        ok = type(value) in (int, float) and math.isfinite(value) and 0 <= value <= _MS_MAX
        return None if ok else "is not a duration"
    if key in _NAME_LISTS:
        return _names_problem(value)
    if key == "submitted":
        return _submitted_problem(value)
    if key == "isolation":
        return _isolation_problem(value)
    if value is None or type(value) in (bool, int, float):
        return None
    if type(value) is str and len(value) <= _SCALAR_STR_MAX:
        return None
    return "is not a small scalar (unknown field)"


def _names_problem(value: Any) -> str | None:
    if type(value) is not list or len(value) > _NAMES_MAX:
        return f"is not a list of at most {_NAMES_MAX:,} names"
    if not all(type(v) is str and len(v) <= _NAME_MAX for v in value):
        return f"holds something other than names of at most {_NAME_MAX} characters"
    return None


def _submitted_problem(value: Any) -> str | None:
    if value is None:
        return None
    try:
        text = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return "cannot be serialised"
    size = len(text)
    if size > FINAL_ANSWER_MAX_BYTES:
        size -= len(_SURROGATE_SPELLING.findall(text))
    return None if size <= FINAL_ANSWER_MAX_BYTES else f"is {size:,} bytes as JSON (limit {FINAL_ANSWER_MAX_BYTES:,})"


def _isolation_problem(value: Any) -> str | None:
    """The shape `IsolationReport.as_dict` gives, with bounded names and reasons."""
    if type(value) is not dict or set(value) - {"mode", "layers", "missing", "landlock_abi", "uid"}:
        return "is not an isolation report"
    if value.get("mode") not in MODES:
        return "names an unknown mode"
    layers, missing = value.get("layers", []), value.get("missing", {})
    if type(layers) is not list or len(layers) > 32 or not all(type(v) is str and len(v) <= 200 for v in layers):
        return "has malformed layers"
    if type(missing) is not dict or len(missing) > 32 or not all(
        type(v) is str and len(k) <= 200 and len(v) <= 2000 for k, v in missing.items()
    ):
        return "has malformed missing layers"
    for key in ("landlock_abi", "uid"):
        number = value.get(key, 0)
        if type(number) is not int or not -1 <= number <= _COUNT_MAX:
            return f"has a malformed {key}"
    return None


@contextlib.contextmanager
def _payload_source(payload: bytes | os.PathLike[str]) -> Iterator[tuple[Payload, int]]:
    """(what to send, its size): bytes as they are, a file opened and sent in chunks."""
    if isinstance(payload, bytes):
        yield payload, len(payload)
        return
    with open(payload, "rb") as fh:
        yield fh, os.fstat(fh.fileno()).st_size


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
    _close_pipes(host.proc)  # first: see `SubprocessExecutor._kill`
    await host.proc.wait()


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
                    self._exchange({"op": "cell", "code": code}, answer=self._answer, stdout_max=self._stdout_max),
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
                resp = await asyncio.wait_for(
                    self._exchange({"op": "unguarded", "code": code}, answer=self._answer,
                                   stdout_max=UNGUARDED_STDOUT_CHARS),
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
            tail = self._stderr_tail()
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
            self._proc, obj, payload, sink=sink, answer=answer, max_payload=cap, stdout_max=stdout_max,
            max_reply=max_reply,
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
        if rc == CHANNEL_BROKEN_EXIT:
            return CellResult(
                ok=False,
                error_kind="crash",
                error=(
                    "the sandbox host stopped itself: a message between it and the worker broke off half-way "
                    "(most often the cell had used up its memory, e.g. while ARCHIVE() read a transcript); "
                    f"{self.restart_note}. Free memory before reading archived transcripts (del large values) "
                    "or work on smaller pieces."
                ),
                duration_ms=_ms(t0),
                host_restarted=restarted,
                meta={**meta, "channel_broken": True},
            )
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
        raw_stdout = resp.get("stdout")  # every field is within its bound already (`_check_reply`)
        stdout: str = raw_stdout if isinstance(raw_stdout, str) else ""
        error = resp.get("error")
        ok = resp.get("ok") is True and error is None
        kind: ErrorKind | None = resp.get("error_kind") if resp.get("error_kind") in _ERROR_KINDS else None
        if kind is None and not ok:
            kind = "crash"
        if not ok and error is None:
            error = "the sandbox host reported a failure without a message"
        truncated = resp.get("truncated") is True
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
