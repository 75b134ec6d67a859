"""The host's side of the protocol channel: a request read whole, a reply bounded field by field and written
whole (`sandbox.wire` frames them), and the exit when the channel is broken."""

from __future__ import annotations

import os
from typing import Any, NoReturn

from sandbox.archive import ARCHIVE_MAX_BYTES
from sandbox.host.output import truncate
from sandbox.wire import (
    CHANNEL_BROKEN_EXIT,
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_NAMES,
    MAX_PAYLOAD_BYTES,
    NOTE_MAX_CHARS,
    read_exact,
    read_frame_fd,
    write_frame_fd,
)


def _channel_broken() -> NoReturn:
    """End the host now: a frame broke off half-way, so nothing more on the channel can be trusted
    to start where a frame starts. No cleanup, no message (either could fail or run cell code);
    the worker sees the exit status, stops the session's host and rebuilds it from the journal."""
    os._exit(CHANNEL_BROKEN_EXIT)


def _answer_size(reply: dict[str, Any]) -> int:
    """The byte count of an `ok` answer; a missing or impossible one is a broken frame."""
    size = reply.get("size")
    if type(size) is not int or not 0 <= size <= ARCHIVE_MAX_BYTES:
        raise ValueError(f"an answer with an impossible size {size!r}")
    return size


def _read_request(proto_in: int) -> tuple[dict[str, Any], bytes | None]:
    """One request and its raw bytes (restore, inherit); `EOFError` when the worker closed the channel
    between requests. Anything else that goes wrong (a malformed frame, a size out of bounds, a
    MemoryError) ends the host: the request is never half-read and acted on. Runs with the signals
    held (`main`), so no handler can raise in the middle."""
    try:
        req = read_frame_fd(proto_in)
        payload: bytes | None = None
        if req.get("op") in ("restore", "inherit"):
            size = req.get("size")
            if type(size) is not int or not 0 <= size <= MAX_PAYLOAD_BYTES:
                raise ValueError(f"a payload size out of bounds: {size!r}")
            payload = read_exact(proto_in, size)
    except EOFError:  # only between frames (`read_frame_fd`)
        raise
    except BaseException:
        _channel_broken()
    return req, payload


def _within_bounds(resp: dict[str, Any]) -> None:
    """Cut what the contract bounds (`sandbox.wire`) and the worker checks: an error text of any op
    (a SyntaxError quotes its whole line), and name lists (a variable name has no length limit)."""
    error = resp.get("error")
    if type(error) is str and len(error) > MAX_ERROR_CHARS + NOTE_MAX_CHARS:
        resp["error"] = truncate(error, MAX_ERROR_CHARS)[0]
    for key in ("skipped", "shadowed"):
        names = resp.get(key)
        if type(names) is list and (
            len(names) > MAX_NAMES or any(len(str(n)) > MAX_NAME_CHARS for n in names)
        ):
            cut = [
                str(n) if len(str(n)) <= MAX_NAME_CHARS else str(n)[: MAX_NAME_CHARS - 12] + "... (cut)"
                for n in names
            ]
            if len(cut) > MAX_NAMES:
                cut = [*cut[: MAX_NAMES - 1], f"... and {len(cut) - MAX_NAMES + 1:,} more"]
            resp[key] = cut


def _write_reply(proto_out: int, resp: dict[str, Any], out: bytes | None) -> None:
    """The reply frame and its raw bytes (snapshot, export), whole or not at all (then the host ends).
    Runs with the signals held (`main`)."""
    try:
        write_frame_fd(proto_out, resp)
        if out is not None:
            _write_all(proto_out, out)
    except BaseException:
        _channel_broken()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
