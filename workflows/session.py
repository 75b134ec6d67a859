"""Workflow-side state of one reflection session (deterministic, no I/O).

Tools that run in workflow code (`execute_code`, `think`) reach this object through
`workflow.instance().state`; it is never serialised into activity payloads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import anyio
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from reflector.cells import RUN_CELL_ACTIVITY, CellInput, CellOutcome, LimitsInput
    from reflector.types import Progress, ReflectionDraft, ReflectionInput

__all__ = ["SessionState", "SessionEnded", "current_state", "await_cancel_safe"]

T = TypeVar("T")

CELL_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)
# Rebuilding a namespace after a crash replays the journal: allow time for it beyond the cell's own limit.
REBUILD_ALLOWANCE_S = 120.0


class SessionEnded(Exception):
    """Raised by a tool to end the agent run from workflow code (caught by the workflow).

    `draft` is set when the model submitted a valid final answer from code (`FINAL_ANSWER(...)`);
    otherwise `stop_reason` says why the session stops early.
    """

    def __init__(self, stop_reason: str, detail: str, draft: ReflectionDraft | None = None) -> None:
        super().__init__(detail)
        self.stop_reason = stop_reason
        self.detail = detail
        self.draft = draft


@dataclass
class SessionState:
    inp: ReflectionInput
    session_id: str
    init_ref: str = ""
    seq: int = 1  # seq 1 is the prefill cell
    cells: int = 0
    ok_cells: int = 0
    failed_cells: int = 0
    consecutive_failures: int = 0
    last_failed_code: str | None = None
    same_failure_repeats: int = 0
    thoughts: list[dict[str, Any]] = field(default_factory=list)
    cell_log: list[dict[str, Any]] = field(default_factory=list)
    submitted: Any | None = None
    phase: str = "starting"
    iterations: int = 0
    usage: Any = None  # the run's live RunUsage, set by SessionMeter
    last_event: str = ""

    @property
    def limits(self) -> LimitsInput:
        c = self.inp.config
        return LimitsInput(cell_timeout_s=c.cell_timeout_s, max_output_chars=c.max_output_chars)

    def loop_guard(self, code: str) -> str | None:
        """Refuse the same failing cell repeated `max_failed_repeats` times (a model stuck in a loop)."""
        limit = self.inp.config.max_failed_repeats
        if code == self.last_failed_code and self.same_failure_repeats >= limit:
            return (
                f"REFUSED: this exact cell already failed {self.same_failure_repeats} times in a row. "
                "Change the code (inspect the error, print smaller pieces, check types with SHOW_VARS()) "
                "or give your final answer with what you have."
            )
        return None

    async def run_cell(self, code: str) -> CellOutcome:
        self.seq += 1
        self.phase = "running cell"
        self.last_event = f"cell {self.seq}"
        outcome: CellOutcome = await await_cancel_safe(workflow.start_local_activity(
            RUN_CELL_ACTIVITY,
            CellInput(
                session_id=self.session_id,
                seq=self.seq,
                code=code,
                trace=self.inp.trace,
                init_ref=self.init_ref,
                limits=self.limits,
            ),
            result_type=CellOutcome,
            start_to_close_timeout=timedelta(seconds=self.inp.config.cell_timeout_s + REBUILD_ALLOWANCE_S),
            retry_policy=CELL_RETRY,
            summary=f"cell {self.seq}",
        ))
        self.cells += 1
        if outcome.ok:
            self.ok_cells += 1
            self.consecutive_failures = 0
            self.last_failed_code = None
            self.same_failure_repeats = 0
        else:
            self.failed_cells += 1
            self.consecutive_failures += 1
            if code == self.last_failed_code:
                self.same_failure_repeats += 1
            else:
                self.last_failed_code, self.same_failure_repeats = code, 1
        self.cell_log.append(
            {"seq": self.seq, "ok": outcome.ok, "error_kind": outcome.error_kind, "chars": len(outcome.output)}
        )
        self.phase = "thinking"
        return outcome

    def progress(self, requests: int, total_tokens: int, iterations: int) -> Progress:
        return Progress(
            phase=self.phase,
            iterations=iterations,
            cells=self.cells,
            failed_cells=self.failed_cells,
            requests=requests,
            total_tokens=total_tokens,
            last_event=self.last_event,
        )


async def await_cancel_safe(handle: asyncio.Future[T]) -> T:
    """Await an activity handle from inside the agent graph's anyio cancel scopes without livelock.

    Same technique as pydantic-ai's own activity executor (`_activity_execution.py`): a cancelled
    anyio scope re-delivers `task.cancel()` every loop turn, and a bare activity handle swallows it
    and re-parks, so the workflow spins until the deadlock detector fires. Shielding the handle
    keeps cancellation on our task; we forward exactly one cancel and wait for its resolution.
    """
    try:
        return await asyncio.shield(handle)
    except asyncio.CancelledError:
        if not handle.done():
            handle.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([handle])
        raise


def current_state() -> SessionState:
    state = getattr(workflow.instance(), "state", None)
    if not isinstance(state, SessionState):
        raise RuntimeError("reflector tools must run inside ReflectionWorkflow")
    return state
