"""Sandbox activities: prepare a session and run one cell in the session's sandbox host.

They are scheduled as *local* activities by the workflow-side `execute_code` tool, so they run on
the worker that holds the workflow (sticky), where the session's live host already is: one marker
event per cell, no extra server dispatch. When the workflow moved to another worker (crash,
eviction), the `SessionManager` rebuilds the namespace from the session's cell journal, so the
cell sees exactly the state an uncrashed run would have.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio import activity

from reflector.blobstore import BlobStore
from reflector.cells import (
    CLOSE_ACTIVITY,
    PREFILL_CODE,
    PREPARE_ACTIVITY,
    RUN_CELL_ACTIVITY,
    CellInput,
    CellOutcome,
    CloseSessionInput,
    LimitsInput,
    PrepareSessionInput,
    PrepareSessionResult,
)
from reflector.settings import Settings
from reflector.types import TraceRef
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager

__all__ = ["prepare_session", "run_cell", "close_session", "configure", "shutdown", "ACTIVITIES"]

@dataclass
class _Runtime:
    store: BlobStore
    sessions: SessionManager


_runtime: _Runtime | None = None


def configure(settings: Settings | None = None, *, max_live: int = 64) -> None:
    """Set up the worker-process-wide session manager (called once at worker start)."""
    global _runtime
    settings = settings or Settings.from_env()
    store = BlobStore(settings.blob_dir)
    _runtime = _Runtime(store=store, sessions=SessionManager(Path(settings.blob_dir) / "sessions", max_live=max_live))


async def shutdown() -> None:
    if _runtime is not None:
        await _runtime.sessions.close_all()


def _rt() -> _Runtime:
    if _runtime is None:
        configure()
    assert _runtime is not None
    return _runtime


def _limits(inp: LimitsInput) -> SandboxLimits:
    return SandboxLimits(cell_timeout_s=inp.cell_timeout_s, max_output_chars=inp.max_output_chars)


async def _run(session_id: str, seq: int, code: str, trace: TraceRef, init_ref: str, limits: LimitsInput) -> CellOutcome:
    rt = _rt()
    extra_vars = json.loads(rt.store.get_bytes(init_ref))
    result = await rt.sessions.run_cell(
        session_id,
        seq,
        code,
        trace_path=str(rt.store.path_for_uri(trace.uri)),
        trace_format=trace.format,
        extra_vars=extra_vars,
        limits=_limits(limits),
    )
    output = result.stdout
    if not result.ok:
        output = (output + "\n" if output else "") + f"ERROR ({result.error_kind}): {result.error}"
    return CellOutcome(
        ok=result.ok,
        output=output,
        error=result.error,
        error_kind=result.error_kind,
        duration_ms=result.duration_ms,
        truncated=result.truncated,
        submitted=result.submitted,
        host_restarted=result.host_restarted,
        cells_replayed=int(result.meta.get("cells_replayed", 0)),
    )


@activity.defn(name=PREPARE_ACTIVITY)
async def prepare_session(inp: PrepareSessionInput) -> PrepareSessionResult:
    """Store the session's initial variables by content hash and run the trace-shape prefill cell."""
    rt = _rt()
    init = {
        "task": {"question": inp.question, "ground_truth": inp.ground_truth, "feedback": inp.feedback},
        "skillbook": inp.skillbook,
    }
    init_ref = rt.store.put_bytes(json.dumps(init, sort_keys=True).encode())
    outcome = await _run(inp.session_id, 1, PREFILL_CODE, inp.trace, init_ref, inp.limits)
    return PrepareSessionResult(init_ref=init_ref, preview=outcome.output, preview_ok=outcome.ok)


@activity.defn(name=RUN_CELL_ACTIVITY)
async def run_cell(inp: CellInput) -> CellOutcome:
    """Run one model-written cell (sequence number `seq`) in the session's sandbox host."""
    return await _run(inp.session_id, inp.seq, inp.code, inp.trace, inp.init_ref, inp.limits)


@activity.defn(name=CLOSE_ACTIVITY)
async def close_session(inp: CloseSessionInput) -> None:
    """Stop the session's live host (its journal stays on disk for audit and resume)."""
    await _rt().sessions.close_session(inp.session_id)


ACTIVITIES: list[Callable[..., Any]] = [prepare_session, run_cell, close_session]
