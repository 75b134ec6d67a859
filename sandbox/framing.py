"""Length-prefixed JSON frames between the executor and the host.

Why length-prefixed: the protocol runs over private pipe fds, and a frame is read in exactly two
reads (header, body) with no delimiter scanning, so a 50 KB result costs the same as a tiny one.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

__all__ = ["HEADER", "MAX_FRAME_BYTES", "encode", "decode", "read_frame_fd", "write_frame_fd", "read_exact"]

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024**2


def encode(obj: Any) -> bytes:
    """Serialise one message to a frame (header + UTF-8 JSON body)."""
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=repr).encode("utf-8")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    """Parse a frame body."""
    return json.loads(body.decode("utf-8"))


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
