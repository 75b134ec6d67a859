"""A cell's result as the worker reports it (`sandbox.executor` runs the host): a host's reply checked field
by field (the host is untrusted), and a host that broke the protocol or died, told in words the model
can act on (out of memory, out of CPU, a message broken off, a signal)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sandbox.hostproc import _ERROR_KINDS, _ProtocolError
from sandbox.protocol import CellResult, ErrorKind, SandboxLimits
from sandbox.wire import CHANNEL_BROKEN_EXIT

__all__ = ["death_result", "protocol_result", "reply_result", "stderr_tail"]

STDERR_TAIL_BYTES = 4096


def protocol_result(exc: _ProtocolError, restart_note: str, t0: float, restarted: bool) -> CellResult:
    """The result of a cell whose host broke the protocol (the caller has stopped it)."""
    return CellResult(
        ok=False,
        error_kind="crash",
        error=f"the sandbox host sent {exc} and was stopped; {restart_note}.",
        duration_ms=_ms(t0),
        host_restarted=restarted,
        meta={"protocol_error": str(exc)},
    )


def death_result(
    rc: int | None, tail: str, limits: SandboxLimits, restart_note: str, t0: float, restarted: bool
) -> CellResult:
    """The result of a cell whose host died (exit code `rc`, the tail of its stderr), by cause."""
    meta: dict[str, Any] = {"returncode": rc}
    if rc == CHANNEL_BROKEN_EXIT:
        return CellResult(
            ok=False,
            error_kind="crash",
            error=(
                "the sandbox host stopped itself: a message between it and the worker broke off half-way "
                "(most often the cell had used up its memory, e.g. while ARCHIVE() read a transcript); "
                f"{restart_note}. Free memory before reading archived transcripts (del large values) "
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
                f"cell exceeded its CPU budget of {limits.cpu_seconds_per_cell}s and was killed; "
                f"{restart_note}."
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
        error=f"the sandbox host {what} while running this cell; {restart_note}.",
        duration_ms=_ms(t0),
        host_restarted=restarted,
        meta=meta,
    )


def reply_result(resp: dict[str, Any], t0: float, restarted: bool) -> CellResult:
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


def stderr_tail(path: str | None) -> str:
    """The last `STDERR_TAIL_BYTES` of a host's stderr file ("" when there is none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - STDERR_TAIL_BYTES))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
