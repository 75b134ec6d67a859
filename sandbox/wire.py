"""What passes between the worker and a host: length-prefixed JSON frames, and the environment it starts in.

Why length-prefixed: the protocol runs over private pipe fds, and a frame is read in exactly two
reads (header, body) with no delimiter scanning, so a 50 KB result costs the same as a tiny one.

The host encodes frames right after model code ran in the same interpreter, so encoding must not
depend on anything a cell can change: the encoder and decoder are private instances of private
subclasses whose methods are pinned at import (a cell cannot reach them; even a changed
`json.JSONEncoder.encode` would not be used here). Text with lone surrogates (`print('\\ud800')`, a
trace with the JSON escape "\\ud800") is not UTF-8: such characters are sent as the six visible
characters `\\ud800`, so encoding never fails and the other side always gets valid UTF-8.

A frame is all or nothing: a reader that fails half-way through one (a short read, a size over the
bound, a body that is not a JSON object, or an exception such as MemoryError between its reads)
cannot know where the next frame starts, so the channel is out of step for good. The host's reads
raise `FrameError` for all of these and the host then ends itself at once with `CHANNEL_BROKEN_EXIT`
(`sandbox.host.main`): bytes that were meant as data (an archived transcript, a snapshot) are never
read as a request. `held_signals` keeps signal handlers (a CPU budget, an alarm) from raising in the
middle of a frame: the signals stay pending until the frame is whole.

The host's environment (`host_env`) is built from scratch by the worker, so no secret of the worker
leaks in; the variables named here are the host's private channel from the worker (read by
`sandbox.host.main`, set only by `host_env`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import struct
from collections.abc import Iterator
from typing import Any

from sandbox.host.output import truncation_note
from sandbox.isolation import CGROUP_ENV, ISOLATION_ENV, IsolationMode

__all__ = [
    "HEADER",
    "MAX_FRAME_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_ERROR_CHARS",
    "NOTE_MAX_CHARS",
    "FINAL_ANSWER_MAX_BYTES",
    "MAX_NAME_CHARS",
    "MAX_NAMES",
    "encode",
    "decode",
    "read_frame_fd",
    "write_frame_fd",
    "read_exact",
    "FrameError",
    "CHANNEL_BROKEN_EXIT",
    "held_signals",
    "hold_signals",
    "released_signals",
    "host_env",
    "SAFE_PATH",
    "WORKDIR_PREFIX",
    "TEST_UNGUARDED_ENV",
    "TEST_MISSING_ENV",
]

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024**2
MAX_PAYLOAD_BYTES = 8 * 1024**3  # raw bytes after a frame (snapshot, export); also <= the host's memory limit
# Bounds of reply fields, stated here so both sides apply the same ones (`sandbox.executor` checks them).
MAX_ERROR_CHARS = 4000  # an error text (head + tail): the host cuts every reply's `error` to this
NOTE_MAX_CHARS = len(truncation_note(10**30))  # what a truncation note adds to a cut text, at most
FINAL_ANSWER_MAX_BYTES = 1024**2  # `sandbox.host.namespace.FINAL_ANSWER_MAX_BYTES` (a test keeps them equal)
MAX_NAME_CHARS = 1000  # one entry of a reply's name list (`skipped`, `shadowed`): longer ones are cut
MAX_NAMES = 10_000  # entries of such a list: the rest are summarised in a last entry
# The exit status of a host that ended itself because a frame broke off half-way (see the module doc);
# the worker names it in the cell's error. Not a status Python or a signal gives (1, 2, 120, 128+n).
CHANNEL_BROKEN_EXIT = 86
# Signals whose handlers could raise into a frame read or write: held (blocked) for the frame's
# duration, delivered right after. Faults (SEGV, BUS, FPE, ILL, TRAP, SYS, ABRT) are never held.
_HELD_SIGNALS = frozenset(
    getattr(signal, name)
    for name in (
        "SIGXCPU",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGINT",
        "SIGTERM",
        "SIGHUP",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGCHLD",
        "SIGPIPE",
        "SIGWINCH",
        "SIGURG",
        "SIGIO",
        "SIGXFSZ",
    )
    if hasattr(signal, name)
)
_SIGMASK = getattr(signal, "pthread_sigmask", None)


class FrameError(Exception):
    """A frame that cannot be read whole and well-formed: the channel is out of step and must end."""


class _Encoder(json.JSONEncoder):
    encode = json.JSONEncoder.encode
    iterencode = json.JSONEncoder.iterencode


class _Decoder(json.JSONDecoder):
    decode = json.JSONDecoder.decode
    raw_decode = json.JSONDecoder.raw_decode


_ENCODER = _Encoder(ensure_ascii=False, separators=(",", ":"), default=repr)
_DECODER = _Decoder()
_SURROGATE = re.compile("[\\ud800-\\udfff]")
_UTF8_ENCODE = str.encode
_UTF8_DECODE = bytes.decode


def _escape_surrogate(m: re.Match[str]) -> str:
    # Only inside JSON strings (the encoder leaves no such character elsewhere): an escaped backslash
    # and 'ud800', which decode to the six characters of the code point's escape.
    return f"\\\\u{ord(m.group()):04x}"


def encode(obj: Any) -> bytes:
    """Serialise one message to a frame (header + UTF-8 JSON body); never fails on lone surrogates."""
    text = _ENCODER.encode(obj)
    try:
        body = _UTF8_ENCODE(text, "utf-8")
    except UnicodeEncodeError:
        body = _UTF8_ENCODE(_SURROGATE.sub(_escape_surrogate, text), "utf-8")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    """Parse a frame body."""
    return _DECODER.decode(_UTF8_DECODE(body, "utf-8"))


def _read_exact(fd: int, n: int) -> bytes:
    """Exactly `n` bytes; `FrameError` if the channel closes first (the caller is inside a frame)."""
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise FrameError("the protocol channel closed in the middle of a frame")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


read_exact = _read_exact


def read_frame_fd(fd: int, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """Blocking read of one frame (a JSON object) from a raw fd (host side).

    `EOFError` only when the channel closed cleanly between frames; `FrameError` for anything else
    that is not one whole frame of at most `max_bytes` holding a JSON object.
    """
    first = os.read(fd, HEADER.size)
    if not first:
        raise EOFError("protocol channel closed")
    header = first + _read_exact(fd, HEADER.size - len(first)) if len(first) < HEADER.size else first
    (size,) = HEADER.unpack(header)
    if size > max_bytes:
        raise FrameError(f"a frame of {size:,} bytes (limit {max_bytes:,})")
    try:
        obj = decode(_read_exact(fd, size))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise FrameError(f"a frame that is not valid JSON ({type(exc).__name__})") from None
    if type(obj) is not dict:
        raise FrameError("a frame that is not a JSON object")
    return obj


def hold_signals() -> None:
    """Hold the asynchronous signals from now on (the host's request loop: see `released_signals`)."""
    if _SIGMASK is not None:
        _SIGMASK(signal.SIG_BLOCK, _HELD_SIGNALS)


@contextlib.contextmanager
def released_signals() -> Iterator[None]:
    """Deliver the held signals while the block runs (a request being handled), hold them again after.

    The host's loop holds signals all the time frames pass and it waits for the next request, and
    releases them only while it handles one: two syscalls per request rather than four."""
    if _SIGMASK is None:
        yield
        return
    _SIGMASK(signal.SIG_UNBLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        _SIGMASK(signal.SIG_BLOCK, _HELD_SIGNALS)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold the asynchronous signals while a frame is read or written (see the module doc).

    A handler can then only run before or after the frame, never between two of its reads."""
    if _SIGMASK is None:
        yield
        return
    previous = _SIGMASK(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        _SIGMASK(signal.SIG_SETMASK, previous)


def write_frame_fd(fd: int, obj: Any) -> None:
    """Blocking write of one frame to a raw fd (host side)."""
    data = memoryview(encode(obj))
    while data:
        written = os.write(fd, data)
        data = data[written:]


# -- the host's environment -------------------------------------------------------------------------
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# os.path, not pathlib: the host imports this module, and pathlib is not otherwise loaded there yet
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# A host's (and the zygote's) working directory: `rr-sandbox-<worker pid>-<random>` in the temp dir.
WORKDIR_PREFIX = "rr-sandbox-"
TEST_UNGUARDED_ENV = "RR_SANDBOX_TEST_UNGUARDED"  # tests only: see `sandbox.host.main.Host.unguarded`
TEST_MISSING_ENV = "RR_SANDBOX_TEST_MISSING"  # tests only: layers to treat as unavailable (comma list)


def host_env(
    workdir: str, isolation: IsolationMode = "auto", *, unguarded: bool = False, missing: tuple[str, ...] = ()
) -> dict[str, str]:
    """The host's whole environment: built from scratch so no secret of the worker leaks in."""
    env = {
        "PATH": SAFE_PATH,
        "PYTHONHASHSEED": "0",
        "PYTHONPATH": _PROJECT_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": workdir,
        ISOLATION_ENV: isolation,
    }
    if os.environ.get(CGROUP_ENV):  # the worker's delegated cgroup v2 (`sandbox.isolation.enter_cgroup`)
        env[CGROUP_ENV] = os.environ[CGROUP_ENV]
    if unguarded:
        env[TEST_UNGUARDED_ENV] = "1"
    if missing:
        env[TEST_MISSING_ENV] = ",".join(missing)
    return env
