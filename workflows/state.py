"""Workflow-side state of one reflection session (deterministic, no I/O).

Tools and capability hooks that run in workflow code reach this object through
`workflow.instance().state`; it is never serialised into activity payloads (continue-as-new
carries a `Continuation` built from it).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import anyio
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reflector.analysis.ledger import Ledger, UsageRecord
    from reflector.contract import (
        EXPORT_ACTIVITY,
        RUN_CELL_ACTIVITY,
        CellInput,
        CellOutcome,
        ChildProgress,
        Continuation,
        Counters,
        ExportInput,
        ExportResult,
        LimitsInput,
        Progress,
        ReflectionDraft,
        ReflectionInput,
        TraceFacts,
    )

from workflows.activity_options import CELL_RETRY, REBUILD_ALLOWANCE_S

__all__ = ["SessionState", "SessionEnded", "current_state", "await_cancel_safe", "clear_cancellation"]

T = TypeVar("T")


class SessionEnded(Exception):
    """Raised from workflow-side tools or hooks to end the agent run (caught by the workflow).

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
    ledger: Ledger
    init_ref: str = ""
    counters: Counters = field(default_factory=Counters)  # carried across continue-as-new
    consecutive_failures: int = 0
    last_failed_code: str | None = None
    same_failure_repeats: int = 0
    last_request_chars: int = 0
    thoughts: list[dict[str, Any]] = field(default_factory=list)
    subagent_calls: list[dict[str, Any]] = field(default_factory=list)
    facts: TraceFacts = field(default_factory=TraceFacts)
    cell_outputs: dict[int, str] = field(default_factory=dict)  # what each cell showed the model, by cell id
    phase: str = "starting"
    last_event: str = ""
    last_tool: str = ""  # what the model called in its latest response (the progress query shows it)
    continue_after_summary: bool = False
    # an in-process model request's response is in the cache (carried across runs; the last run forgets them)
    responses_cached: bool = False
    recurse_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def create(cls, inp: ReflectionInput, session_id: str) -> SessionState:
        c = inp.continuation
        if c is None:
            ledger = Ledger(max_tokens=inp.config.max_tokens, max_requests=inp.config.max_requests)
            return cls(inp=inp, session_id=session_id, ledger=ledger)
        counters = Counters.model_validate(c.model_dump(include=set(Counters.model_fields)))
        return cls(
            inp=inp,
            session_id=session_id,
            ledger=c.ledger,
            init_ref=c.init_ref,
            counters=counters.model_copy(update={"runs": c.runs + 1}),
            thoughts=list(c.thoughts),
            subagent_calls=list(c.subagent_calls),
            facts=TraceFacts.model_validate(c.facts),
            cell_outputs=dict(c.cell_outputs),
            responses_cached=c.responses_cached,
        )

    def continuation(self, messages_json: str) -> Continuation:
        return Continuation(
            **self.counters.model_dump(),
            messages_json=messages_json,
            ledger=self.ledger,
            init_ref=self.init_ref,
            thoughts=self.thoughts,
            subagent_calls=self.subagent_calls,
            facts=self.facts.model_dump(),
            cell_outputs=self.cell_outputs,
            responses_cached=self.responses_cached,
        )

    @property
    def limits(self) -> LimitsInput:
        c = self.inp.config
        return LimitsInput(cell_timeout_s=c.cell_timeout_s, max_output_chars=c.max_output_chars)

    @property
    def reserve_requests(self) -> int:
        """One request is kept back for the final synthesis when the budget allows it."""
        return 1 if self.inp.config.max_requests >= 3 else 0

    def charge(
        self,
        kind: str,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
    ) -> None:
        """Charge one model request of this session (a turn, a summary or the synthesis) to the ledger."""
        self.ledger.charge(
            UsageRecord(
                kind=kind,
                model=model or self.inp.config.model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                depth=self.inp.depth,
                workflow_id=self.session_id,
                cache_read_tokens=cache_read_tokens,
                cache_write_tokens=cache_write_tokens,
            )
        )

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

    def _activity_timeout(self) -> timedelta:
        return timedelta(seconds=self.inp.config.cell_timeout_s + REBUILD_ALLOWANCE_S)

    async def run_cell(self, code: str, *, internal: bool = False) -> CellOutcome:
        """Run a cell as a local activity; `internal` cells (workflow-written) are not counted."""
        self.counters.seq += 1
        self.phase = "running cell"
        self.last_event = f"cell {self.counters.seq}"
        from workflows import rerun  # imported here: workflows.rerun imports this module

        # `rr rerun`: a cell the origin ran before the first live step returns its recorded outcome
        reuse = rerun.reusing_cell(self, self.counters.seq)
        outcome: CellOutcome = (
            await rerun.reused_cell(self, self.counters.seq, code)
            if reuse
            else await await_cancel_safe(
                workflow.start_local_activity(
                    RUN_CELL_ACTIVITY,
                    CellInput(
                        session_id=self.session_id,
                        seq=self.counters.seq,
                        code=code,
                        trace=self.inp.trace,
                        init_ref=self.init_ref,
                        limits=self.limits,
                        inherit_ref=self.inp.inherit_ref,
                    ),
                    result_type=CellOutcome,
                    start_to_close_timeout=self._activity_timeout(),
                    retry_policy=CELL_RETRY,
                    summary=f"cell {self.counters.seq}",
                )
            )
        )
        self.phase = "thinking"
        if not internal:
            self.record_cell(code, outcome.ok)
        return outcome

    def record_cell(self, code: str, ok: bool) -> None:
        """Count a model-written cell, and the streak of identical failing cells the loop guard reads."""
        self.counters.cells += 1
        if ok:
            self.counters.ok_cells += 1
            self.consecutive_failures = 0
            self.last_failed_code = None
            self.same_failure_repeats = 0
        else:
            self.counters.failed_cells += 1
            self.consecutive_failures += 1
            if code == self.last_failed_code:
                self.same_failure_repeats += 1
            else:
                self.last_failed_code, self.same_failure_repeats = code, 1

    async def export_namespace(self) -> ExportResult:
        """Export the namespace as it is after the last cell, for a child session."""
        result: ExportResult = await await_cancel_safe(
            workflow.start_local_activity(
                EXPORT_ACTIVITY,
                ExportInput(
                    session_id=self.session_id,
                    seq=self.counters.seq,
                    trace=self.inp.trace,
                    init_ref=self.init_ref,
                    limits=self.limits,
                    inherit_ref=self.inp.inherit_ref,
                ),
                result_type=ExportResult,
                start_to_close_timeout=self._activity_timeout(),
                retry_policy=CELL_RETRY,
                summary="export namespace",
            )
        )
        return result

    def progress(self) -> Progress:
        spent, c, cfg = self.ledger.spent(), self.counters, self.inp.config
        # `recurse` counts a child before starting it and records it in `subagent_calls` when it returns
        running = c.recursions > len(self.subagent_calls) and self.phase == "waiting for child"
        running_id = f"{self.session_id}.r{c.recursions}" if running else ""
        children = [
            ChildProgress(
                workflow_id=str(call.get("child_workflow_id", "")),
                done=True,
                requests=int(call.get("usage", {}).get("requests", 0)),
                total_tokens=int(call.get("usage", {}).get("total_tokens", 0)),
                stop_reason=call.get("stop_reason"),
            )
            for call in self.subagent_calls
        ] + ([ChildProgress(workflow_id=running_id)] if running else [])
        return Progress(
            phase=self.phase,
            iterations=c.iterations,
            cells=c.cells,
            failed_cells=c.failed_cells,
            requests=spent.requests,
            total_tokens=spent.total_tokens,
            last_event=self.last_event,
            model=cfg.model,
            depth=self.inp.depth,
            max_depth=cfg.max_depth,
            max_requests=self.ledger.max_requests,
            max_tokens=self.ledger.max_tokens,
            last_cell=c.seq
            if self.init_ref
            else 0,  # the prepare cells (prefill = cell 1) ran once init_ref is set
            last_tool=self.last_tool,
            compactions=c.compactions,
            microcompactions=c.microcompactions,
            children_started=c.recursions,
            children_done=len(self.subagent_calls),
            child_running=running_id,
            children=children,
            continued_as_new=c.runs - 1,
        )


async def await_cancel_safe(handle: asyncio.Future[T]) -> T:
    """Await an activity or child-workflow handle from inside the agent graph's anyio cancel scopes.

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


def clear_cancellation() -> None:
    """After catching the workflow's cancellation (`rr cancel`) to finish cleanly: forget it, so the
    activities that close the session are not taken for cancelled as well (Python >= 3.11 counts cancels)."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


def current_state() -> SessionState:
    state = getattr(workflow.instance(), "state", None)
    if not isinstance(state, SessionState):
        raise RuntimeError("reflector tools must run inside ReflectionWorkflow")
    return state
