"""What passes between the worker and a host: length-prefixed JSON frames, and the environment it starts in.

Why length-prefixed: the protocol runs over private pipe fds, and a frame is read in exactly two
reads (header, body) with no delimiter scanning, so a 50 KB result costs the same as a tiny one.

The host encodes frames right after model code ran in the same interpreter, so encoding must not
depend on anything a cell can change: the encoder and decoder are private instances of private
subclasses whose methods are pinned at import (a cell cannot reach them; even a changed
`json.JSONEncoder.encode` would not be used here). Text with lone surrogates (`print('\\ud800')`, a
trace with the JSON escape "\\ud800") is not UTF-8: such characters are sent as the six visible
characters `\\ud800`, so encoding never fails and the other side always gets valid UTF-8.

The host's environment (`host_env`) is built from scratch by the worker, so no secret of the worker
leaks in; the variables named here are the host's private channel from the worker (read by
`sandbox.host.main`, set only by `host_env`).
"""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Any

from sandbox.isolation import CGROUP_ENV, ISOLATION_ENV, IsolationMode

__all__ = [
    "HEADER",
    "MAX_FRAME_BYTES",
    "encode",
    "decode",
    "read_frame_fd",
    "write_frame_fd",
    "read_exact",
    "host_env",
    "SAFE_PATH",
    "WORKDIR_PREFIX",
    "TEST_UNGUARDED_ENV",
    "TEST_MISSING_ENV",
]

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024**2


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
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("protocol channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


read_exact = _read_exact


def read_frame_fd(fd: int) -> Any:
    """Blocking read of one frame from a raw fd (host side)."""
    (size,) = HEADER.unpack(_read_exact(fd, HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame too large: {size}")
    return decode(_read_exact(fd, size))


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
