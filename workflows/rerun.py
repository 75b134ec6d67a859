"""Workflow side of `rr rerun`: which request, cell, child and summary is reused from the origin.

Only sessions whose input carries `rerun` (`reflector.contract.RerunOf`, never set in histories
recorded before it existed, never handed to a child) reach the activities here, so no other
history changes. The decisions are pure (counters against the `RerunOf` counts); the answers come
from the prefix blob through local activities (`activities.rerun`), recorded in the history.

- A model request of the root session while fewer than `from_step - 1` steps were made: the origin's
  response of that step (not charged: nothing was paid for it).
- A cell whose sequence number is at most `cells_through`: the recorded outcome; its code is
  journaled for the new session (its sandbox is rebuilt from the journal before the first live cell).
- A `recurse` whose recursion number is at most `children`: the recorded child output (no new child).
- A summary while fewer than `summaries` compactions were made: the recorded summary.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import ModelResponse

    from reflector.contract import (
        RERUN_CELL_ACTIVITY,
        RERUN_CHILD_ACTIVITY,
        RERUN_RESPONSE_ACTIVITY,
        RERUN_SUMMARY_ACTIVITY,
        CellOutcome,
        RerunOf,
        ReusedCellInput,
        ReusedChild,
        ReusedItemInput,
        SummariseResult,
    )

from workflows.activity_options import CELL_RETRY
from workflows.state import SessionState, await_cancel_safe

__all__ = [
    "reusing_step",
    "reusing_cell",
    "reusing_child",
    "reusing_summary",
    "reused_response",
    "reused_cell",
    "reused_child",
    "reused_summary",
    "rerun_raw",
    "maybe_reused_response",
]

_TIMEOUT = timedelta(seconds=60)


def _rerun(state: SessionState) -> RerunOf | None:
    return state.inp.rerun if state.inp.depth == 0 else None


def reusing_step(state: SessionState) -> bool:
    """Whether the session's next model request is a reused step (its response comes from the prefix)."""
    r = _rerun(state)
    return r is not None and state.counters.iterations < min(r.steps, r.from_step - 1)


def reusing_cell(state: SessionState, seq: int) -> bool:
    r = _rerun(state)
    return r is not None and seq <= r.cells_through


def reusing_child(state: SessionState, number: int) -> bool:
    r = _rerun(state)
    return r is not None and number <= r.children


def reusing_summary(state: SessionState) -> bool:
    r = _rerun(state)
    return r is not None and state.counters.compactions < r.summaries


async def _local(state: SessionState, name: str, arg: object, result_type: type[Any], summary: str) -> Any:
    return await await_cancel_safe(
        workflow.start_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=_TIMEOUT,
            retry_policy=CELL_RETRY,
            summary=summary,
        )
    )


async def reused_response(state: SessionState) -> ModelResponse:
    r = _rerun(state)
    assert r is not None
    step = state.counters.iterations + 1
    state.last_event = f"reused step {step}"
    response: ModelResponse = await _local(
        state,
        RERUN_RESPONSE_ACTIVITY,
        ReusedItemInput(prefix_sha256=r.prefix_sha256, index=step - 1),
        ModelResponse,
        f"reused step {step} of {r.origin}",
    )
    state.counters.reused_requests += 1
    return response


async def reused_cell(state: SessionState, seq: int, code: str) -> CellOutcome:
    r = _rerun(state)
    assert r is not None
    outcome: CellOutcome = await _local(
        state,
        RERUN_CELL_ACTIVITY,
        ReusedCellInput(prefix_sha256=r.prefix_sha256, session_id=state.session_id, seq=seq, code=code),
        CellOutcome,
        f"reused cell {seq}",
    )
    state.counters.reused_cells += 1
    return outcome


async def reused_child(state: SessionState, number: int) -> ReusedChild:
    r = _rerun(state)
    assert r is not None
    child: ReusedChild = await _local(
        state,
        RERUN_CHILD_ACTIVITY,
        ReusedItemInput(prefix_sha256=r.prefix_sha256, index=number),
        ReusedChild,
        f"reused child {number}",
    )
    state.counters.reused_children += 1
    return child


async def reused_summary(state: SessionState) -> SummariseResult:
    r = _rerun(state)
    assert r is not None
    result: SummariseResult = await _local(
        state,
        RERUN_SUMMARY_ACTIVITY,
        ReusedItemInput(prefix_sha256=r.prefix_sha256, index=state.counters.compactions),
        SummariseResult,
        f"reused summary {state.counters.compactions + 1}",
    )
    state.counters.reused_summaries += 1
    return result


async def maybe_reused_response() -> ModelResponse | None:
    """For a model request of the root session's agent: the reused response, or None (ask the model)."""
    state = getattr(workflow.instance(), "state", None)
    if isinstance(state, SessionState) and reusing_step(state):
        return await reused_response(state)
    return None


def rerun_raw(state: SessionState) -> dict[str, Any] | None:
    """`raw["rerun"]` of a rerun's output (None otherwise): its origin and what it reused."""
    r = _rerun(state)
    if r is None:
        return None
    c = state.counters
    return {
        "origin": r.origin,
        "from_step": r.from_step,
        "origin_model": r.origin_model,
        "model": state.inp.config.model,
        "reused_requests": c.reused_requests,
        "reused_cells": c.reused_cells,
        "reused_children": c.reused_children,
        "reused_summaries": c.reused_summaries,
        # the reused cells' code is replayed in the sandbox host to rebuild its state: not a paid cell
        "sandbox_rebuilt_from_reused_cells": c.reused_cells > 0,
    }
