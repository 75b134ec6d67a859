"""A reflection's run: start it, follow its progress, wait for and fetch its output, and read how it ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio.api.enums.v1 import PendingWorkflowTaskState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from reflector.client.temporal import QUERY_TIMEOUT, ReflectError, task_timeout_for
from reflector.client.upload import check_id, new_workflow_id
from reflector.contract import (
    PROGRESS_QUERY,
    WORKFLOW_NAME,
    Progress,
    ReflectionInput,
    ReflectorOutput,
)


async def start_reflection(
    client: Client,
    inp: ReflectionInput,
    task_queue: str,
    workflow_id: str | None = None,
    *,
    trace_name: str = "",
) -> WorkflowHandle[object, ReflectorOutput]:
    """Start `ReflectionWorkflow`; with rr's search attributes set where the namespace has them registered
    (`reflector.runtime.search_attributes`), and a memo naming the trace (`trace_name`: its file name) for `rr list`."""
    from reflector.runtime import search_attributes as sa

    check_id(workflow_id)
    wf_id = workflow_id or new_workflow_id(inp.trace)
    attrs = None
    if not await sa.missing(client):
        inp = inp.model_copy(update={"search_attributes": True})
        attrs = sa.start_attributes(
            inp.config.model, trace_sha256=inp.trace.sha256, parent=inp.parent_workflow_id
        )
    try:
        handle: WorkflowHandle[object, ReflectorOutput] = await client.start_workflow(
            WORKFLOW_NAME,
            inp,
            id=wf_id,
            task_queue=task_queue,
            task_timeout=task_timeout_for(inp.config.model),
            result_type=ReflectorOutput,
            search_attributes=attrs,
            memo={**sa.memo(inp.trace, trace_name), **_rerun_memo(inp)},
        )
    except WorkflowAlreadyStartedError:
        raise ReflectError(
            f"a reflection with id {wf_id!r} is already running: follow it with `rr result {wf_id}`, "
            "or choose another --id"
        ) from None
    return handle


def _rerun_memo(inp: ReflectionInput) -> dict[str, Any]:
    """`rr rerun`: the memo names the origin and the first live step (for `rr list`, `rr status`, the Web UI)."""
    r = inp.rerun
    return (
        {}
        if r is None
        else {"rr_rerun": {"origin": r.origin, "from_step": r.from_step, "origin_model": r.origin_model}}
    )


async def waiting_for_worker(handle: WorkflowHandle[Any, Any]) -> bool:
    """True when the reflection's next workflow task is scheduled and no worker has started it.

    That is what "no live worker" means for this reflection, whatever the task queue's poller list says
    (the server lists an exited worker as a poller for about a minute after its last poll).
    """
    desc = await handle.describe()
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return False
    raw = desc.raw_description
    return raw.HasField("pending_workflow_task") and (
        raw.pending_workflow_task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED
    )


async def wait_for_result(
    handle: WorkflowHandle[object, ReflectorOutput],
    on_progress: Callable[[Progress], Awaitable[None] | None] | None = None,
    poll_s: float = 1.0,
    *,
    on_no_worker: Callable[[float], None] | None = None,
    on_worker_back: Callable[[], None] | None = None,
    no_worker_after_s: float = 15.0,
) -> ReflectorOutput:
    """Wait for the result, reporting progress from the workflow's `progress` query meanwhile.

    When the reflection's next step has waited `no_worker_after_s` for a worker (its workflow task
    scheduled, started by nobody: no live worker polls the queue), `on_no_worker(seconds)` is called once,
    and `on_worker_back()` when a worker takes it again; progress is not queried meanwhile (a query
    needs a worker and would only time out).
    """
    return await _follow(
        handle,
        Progress,
        on_progress,
        poll_s,
        on_no_worker=on_no_worker,
        on_worker_back=on_worker_back,
        no_worker_after_s=no_worker_after_s,
    )


_R = TypeVar("_R")


_P = TypeVar("_P", bound=BaseModel)


async def _follow(
    handle: WorkflowHandle[Any, _R],
    progress_type: type[_P],
    on_progress: Callable[[_P], Awaitable[None] | None] | None,
    poll_s: float,
    *,
    on_no_worker: Callable[[float], None] | None,
    on_worker_back: Callable[[], None] | None,
    no_worker_after_s: float,
) -> _R:
    """`wait_for_result` for any workflow whose `progress` query answers a `progress_type`."""
    result_task = asyncio.ensure_future(handle.result(rpc_timeout=None))
    waiting_since: float | None = None
    warned = False
    try:
        while not result_task.done():
            done, _ = await asyncio.wait({result_task}, timeout=poll_s)
            if done:
                continue
            if on_no_worker is not None:
                try:
                    waiting = await waiting_for_worker(handle)
                except Exception:  # best effort, like progress
                    waiting = False
                now = time.monotonic()
                if not waiting:
                    if warned and on_worker_back is not None:
                        on_worker_back()
                    waiting_since, warned = None, False
                else:
                    waiting_since = waiting_since if waiting_since is not None else now
                    if not warned and now - waiting_since >= no_worker_after_s:
                        warned = True
                        on_no_worker(now - waiting_since)
                    continue
            if on_progress is None:
                continue
            try:
                # The server answers a query when the workflow task in progress ends: the session's
                # task is renewed every 0.8 x task timeout, so allow a little more than one task.
                prog = await handle.query(
                    PROGRESS_QUERY, result_type=progress_type, rpc_timeout=QUERY_TIMEOUT
                )
            except Exception:  # a query can fail while no worker holds the workflow; progress is best effort
                continue
            maybe = on_progress(prog)
            if maybe is not None:
                await maybe
        result: _R = result_task.result()
        return result
    finally:
        if not result_task.done():
            result_task.cancel()


async def fetch_result(client: Client, workflow_id: str) -> ReflectorOutput:
    handle = client.get_workflow_handle(workflow_id, result_type=ReflectorOutput)
    out: ReflectorOutput = await handle.result()
    return out


def is_cancelled(out: ReflectorOutput) -> bool:
    """True for a reflection cancelled by `rr cancel` (its text is built from the findings so far)."""
    return bool(out.raw.get("rr_trace", {}).get("stop_reason") == "cancelled")


def is_complete(out: ReflectorOutput) -> bool:
    """False for a reflection that stopped early (budget, compaction limit, loop guard, error): its text is
    a partial synthesis or the deterministic fallback (the CLI exits with `EXIT_INCOMPLETE`)."""
    stop = out.raw.get("rr_trace", {}).get("stop_reason", "completed")
    return bool(stop == "completed")
