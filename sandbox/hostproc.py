"""A host process from the worker's side (`sandbox.executor.SubprocessExecutor` drives it): launch, the request /
reply exchange with every reply field bounded, snapshot and export bytes streamed in chunks, ARCHIVE
questions answered, kill."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from sandbox.archive import check_archive_name, not_archived, read_archive_blob
from sandbox.isolation import MODES, IsolationMode
from sandbox.wire import (
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
    pass

log = logging.getLogger("sandbox.executor")  # the executor's log: this is its side of the channel

START_TIMEOUT_S = 60.0  # loading a large trace can take a while; cells have their own timeout


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
        parts = (
            entry.name[len(WORKDIR_PREFIX) :].split("-", 1) if entry.name.startswith(WORKDIR_PREFIX) else []
        )
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
            forked = await server.spawn(
                ["sandbox.host", *args[6:]], env, workdir, stderr_path, START_TIMEOUT_S
            )
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
    return (
        None
        if size <= FINAL_ANSWER_MAX_BYTES
        else f"is {size:,} bytes as JSON (limit {FINAL_ANSWER_MAX_BYTES:,})"
    )


def _isolation_problem(value: Any) -> str | None:
    """The shape `IsolationReport.as_dict` gives, with bounded names and reasons."""
    if type(value) is not dict or set(value) - {"mode", "layers", "missing", "landlock_abi", "uid"}:
        return "is not an isolation report"
    if value.get("mode") not in MODES:
        return "names an unknown mode"
    layers, missing = value.get("layers", []), value.get("missing", {})
    if (
        type(layers) is not list
        or len(layers) > 32
        or not all(type(v) is str and len(v) <= 200 for v in layers)
    ):
        return "has malformed layers"
    if (
        type(missing) is not dict
        or len(missing) > 32
        or not all(type(v) is str and len(k) <= 200 and len(v) <= 2000 for k, v in missing.items())
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


def _close_pipes(proc: HostProcess) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
