"""`rr status`: the live progress of one reflection (and of its running children) or of a batch.

Client-side only. A running reflection answers its `progress` query; its running child (id
`<parent>.r<k>`, named by the parent's answer) is queried too, and so on down, because a child's usage
reaches its parent's ledger only when the child ends: the tree's total is the root's ledger plus the
running children's. A finished reflection's numbers come from its result (`raw.rr_trace`, `raw.usage`)
and its budget from its input (the first event of its history). Nothing is queried while no worker
takes the workflow's tasks (a query needs a worker): the status says so instead of waiting.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from reflector import client as c
from reflector.client.batch_render import render_batch_progress
from reflector.client.progress_view import ProgressDisplay, summary_line
from reflector.client.render import cells_text, clock, render_progress, used
from reflector.contract import (
    BATCH_WORKFLOW_NAME,
    PROGRESS_QUERY,
    WORKFLOW_NAME,
    BatchOutput,
    BatchProgress,
    ChildProgress,
    Progress,
    ReflectionConfig,
    ReflectionInput,
    ReflectorOutput,
)
from reflector.runtime import search_attributes as sa

__all__ = [
    "WorkflowStatus",
    "fetch_status",
    "running_chain",
    "ChainFollower",
    "final_progress",
    "render_status",
    "exit_code",
    "follow",
    "status_command",
    "MAX_CHAIN",
]

MAX_CHAIN = 16  # running children followed below one reflection (depth is bounded by max_depth anyway)


class WorkflowStatus(BaseModel):
    """What `rr status` reports about one workflow (`--json` prints it)."""

    workflow_id: str
    kind: Literal["reflection", "batch"] = "reflection"
    status: str  # Temporal's: running, completed, failed, canceled, terminated, timed_out, continued_as_new
    started: str | None = None  # ISO 8601, UTC: the start of the first run of a continue-as-new chain
    closed: str | None = None
    elapsed_s: float | None = None
    parent_workflow_id: str | None = None
    task_queue: str = ""
    store_id: str = ""  # the blob store its trace was uploaded to (`reflector.runtime.storage.identity`; "": not recorded)
    store: str = ""
    waiting_for_worker: bool = False  # its next step waits for a worker no one runs: nothing was queried
    note: str = ""
    # a reflection: the live answer of its `progress` query, or its final numbers rebuilt from its result
    progress: Progress | None = None
    stop_reason: str | None = None
    complete: bool | None = None  # a finished reflection stopped for "completed"
    cancelled: bool = (
        False  # `rr cancel`: it returned its findings so far (or Temporal closed it as canceled)
    )
    error: str | None = None
    tree_requests: int = 0  # its ledger plus its running children's (the tree's total)
    tree_tokens: int = 0
    running_children: list[WorkflowStatus] = Field(default_factory=list)
    batch: BatchProgress | None = None


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(UTC).isoformat() if t is not None else None


def _now() -> datetime:
    return datetime.now(UTC)  # noqa: TID251  (client side: the elapsed time of a workflow)


QUERY_RETRY_S = 0.3


def _refused_for_now(e: RPCError) -> bool:
    """The server buffers one query per workflow while a workflow task runs (its default), and refuses
    more until that task ends: another observer (`rr reflect`'s follower, a second `rr status`) asked first."""
    return e.status == RPCStatusCode.RESOURCE_EXHAUSTED or "query buffer is full" in str(e)


async def _query(handle: WorkflowHandle[Any, Any], result_type: type[Any]) -> Any:
    """The `progress` query, asked again while the server refuses it for now (within `QUERY_TIMEOUT`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + c.QUERY_TIMEOUT.total_seconds()
    while True:
        left = deadline - loop.time()
        try:
            return await handle.query(
                PROGRESS_QUERY, result_type=result_type, rpc_timeout=timedelta(seconds=max(1.0, left))
            )
        except RPCError as e:
            if not _refused_for_now(e) or loop.time() + QUERY_RETRY_S >= deadline:
                raise
        await asyncio.sleep(QUERY_RETRY_S)


async def _describe(client: Client, wf_id: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(wf_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise c.ReflectError(f"no reflection or batch with id {wf_id!r}") from None
        raise


async def _chain_start(client: Client, desc: WorkflowExecutionDescription) -> datetime:
    """The start of the first run of the workflow's continue-as-new chain (this run's when unknown)."""
    first = desc.raw_info.first_run_id
    if first and first != desc.run_id:
        try:
            return (await client.get_workflow_handle(desc.id, run_id=first).describe()).start_time
        except RPCError:  # the first run is gone (retention): this run's start
            pass
    return desc.start_time


async def _started_input(client: Client, handle: WorkflowHandle[Any, Any], input_type: type[Any]) -> Any:
    """The workflow's input, from the first event of its (last run's) history; None if unreadable."""
    try:
        async for event in handle.fetch_history_events(page_size=1):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [inp] = await client.data_converter.decode(payloads, [input_type])
            return inp
    except Exception:  # best effort: the budget is then shown without its limit
        return None
    return None


def final_progress(out: ReflectorOutput, config: ReflectionConfig | None = None) -> Progress:
    """A finished reflection's final numbers (tree totals: children's usage was charged to it) as a `Progress`."""
    rt: dict[str, Any] = out.raw.get("rr_trace", {})
    usage: dict[str, Any] = out.raw.get("usage", {})
    calls: list[dict[str, Any]] = list(rt.get("subagent_calls", []))
    children = [
        ChildProgress(
            workflow_id=str(call.get("child_workflow_id", "")),
            done=True,
            requests=int(call.get("usage", {}).get("requests", 0)),
            total_tokens=int(call.get("usage", {}).get("total_tokens", 0)),
            stop_reason=call.get("stop_reason"),
        )
        for call in calls
    ]
    return Progress(
        phase="done",
        iterations=int(rt.get("total_iterations", 0)),
        cells=int(rt.get("cells", 0)),
        failed_cells=int(rt.get("failed_cells", 0)),
        requests=int(usage.get("requests", 0)),
        total_tokens=int(usage.get("total_tokens", 0)),
        model=str(out.raw.get("model", "")),
        depth=int(rt.get("depth", 0)),
        max_depth=config.max_depth if config else 0,
        max_requests=config.max_requests if config else 0,
        max_tokens=config.max_tokens if config else 0,
        compactions=int(rt.get("compactions", 0)),
        microcompactions=int(rt.get("microcompactions", 0)),
        children_started=len(calls),
        children_done=len(calls),
        children=children,
        continued_as_new=int(rt.get("continued_as_new", 0)),
    )


async def running_chain(client: Client, p: Progress) -> list[Progress]:
    """The progress of `p`'s running child, of that child's running child, and so on (best effort:
    the chain stops at a child that cannot be queried now)."""
    chain: list[Progress] = []
    while p.child_running and len(chain) < MAX_CHAIN:
        handle = client.get_workflow_handle(p.child_running)
        try:
            if await c.waiting_for_worker(handle):
                break
            p = await _query(handle, Progress)
        except Exception:  # it may just have finished; progress is best effort
            break
        chain.append(p)
    return chain


CHAIN_BOUND_S = 5.0


class ChainFollower:
    """`running_chain` for a follower polling once a second: bounded by `bound_s` (a child busy in a long
    workflow task answers only when the task ends), and when the running child cannot answer this time,
    its last answer stands (the tree's total would otherwise drop and come back)."""

    def __init__(self, client: Client, bound_s: float = CHAIN_BOUND_S) -> None:
        self.client, self.bound_s = client, bound_s
        self._last: list[Progress] = []
        self._of = ""

    async def __call__(self, p: Progress) -> list[Progress]:
        if not p.child_running:
            self._last, self._of = [], ""
            return []
        try:
            chain = await asyncio.wait_for(running_chain(self.client, p), self.bound_s)
        except TimeoutError:
            chain = []
        if not chain and self._of == p.child_running:
            return self._last
        self._last, self._of = chain, p.child_running
        return chain


async def fetch_status(client: Client, wf_id: str, *, depth: int = 0) -> WorkflowStatus:
    """The status of the reflection or batch `wf_id` (`ReflectError` when there is none)."""
    desc = await _describe(client, wf_id)
    if desc.workflow_type not in (WORKFLOW_NAME, BATCH_WORKFLOW_NAME):
        raise c.ReflectError(f"{wf_id!r} is a {desc.workflow_type} workflow, not a reflection or a batch")
    handle = client.get_workflow_handle(wf_id)
    started = await _chain_start(client, desc)
    status = desc.status.name.lower() if desc.status is not None else "unknown"
    st = WorkflowStatus(
        workflow_id=wf_id,
        kind="batch" if desc.workflow_type == BATCH_WORKFLOW_NAME else "reflection",
        status=status,
        started=_iso(started),
        closed=_iso(desc.close_time),
        elapsed_s=((desc.close_time or _now()) - started).total_seconds(),
        parent_workflow_id=desc.parent_id,
        task_queue=desc.task_queue,
    )
    try:
        shown = sa.memo_of(await desc.memo())
    except Exception:  # a memo this client cannot decode is only display
        shown = {}
    st.store_id, st.store = str(shown.get("store_id", "")), str(shown.get("store", ""))
    if desc.status == WorkflowExecutionStatus.RUNNING:
        await _running(client, handle, st, depth)
    else:
        await _finished(client, handle, st)
    return st


async def _running(client: Client, handle: WorkflowHandle[Any, Any], st: WorkflowStatus, depth: int) -> None:
    if await c.waiting_for_worker(handle):
        st.waiting_for_worker = True
        st.note = (
            f"no worker is running it right now: its next step waits for a worker on task queue "
            f"{st.task_queue!r} (start `rr worker` with the same TEMPORAL_ADDRESS and RR_TASK_QUEUE)"
        )
        return
    try:
        if st.kind == "batch":
            st.batch = await _query(handle, BatchProgress)
            return
        p: Progress = await _query(handle, Progress)
    except Exception as e:  # the worker holding it did not answer in time (e.g. it just died)
        st.note = f"its progress query was not answered: {type(e).__name__}: {e}"
        return
    st.progress = p
    if p.child_running and depth < MAX_CHAIN:
        try:
            st.running_children.append(await fetch_status(client, p.child_running, depth=depth + 1))
        except c.ReflectError:  # named before it was started, or gone
            pass
    st.tree_requests = p.requests + sum(ch.tree_requests for ch in st.running_children)
    st.tree_tokens = p.total_tokens + sum(ch.tree_tokens for ch in st.running_children)


async def _finished(client: Client, handle: WorkflowHandle[Any, Any], st: WorkflowStatus) -> None:
    if (
        st.status == "continued_as_new"
    ):  # a handle without run id follows the chain: only an old run says this
        return
    try:
        out = await handle.result(rpc_timeout=c.QUERY_TIMEOUT)
    except Exception as e:  # failed, canceled, terminated, timed out: the reason is the error
        st.cancelled = st.status == "canceled"
        cause = getattr(e, "cause", None)
        st.error = str(getattr(cause, "message", None) or cause or e)
        return
    if st.kind == "batch":
        b = BatchOutput.model_validate(out)
        st.batch = BatchProgress(
            phase="done",
            total=b.n_runs,
            done=b.reflected,
            failed=b.failed,
            continued_as_new=b.continued_as_new,
        )
        st.complete = c.is_batch_complete(b) and not b.cancelled
        st.cancelled = b.cancelled
        return
    r = ReflectorOutput.model_validate(out)
    inp = await _started_input(client, handle, ReflectionInput)
    st.progress = final_progress(r, inp.config if inp is not None else None)
    st.stop_reason = str(r.raw.get("rr_trace", {}).get("stop_reason", "completed"))
    st.complete = c.is_complete(r)
    st.cancelled = c.is_cancelled(r)
    st.error = r.raw.get("error")
    st.tree_requests, st.tree_tokens = st.progress.requests, st.progress.total_tokens


def exit_code(st: WorkflowStatus) -> int:
    """`rr status --follow`'s exit code once the workflow has closed (like `rr result`'s)."""
    if st.cancelled:
        return c.EXIT_CANCELLED
    if st.status != "completed":
        return 1
    return 0 if st.complete else c.EXIT_INCOMPLETE


# ------------------------------------------------------------------------------------ rendering


def _head(st: WorkflowStatus) -> str:
    when = (
        ""
        if st.elapsed_s is None
        else (f" for {clock(st.elapsed_s)}" if st.status == "running" else f" after {clock(st.elapsed_s)}")
    )
    what = st.status + when
    if st.stop_reason and st.kind == "reflection":
        what += f", stop reason {st.stop_reason}" + ("" if st.complete else " (INCOMPLETE)")
    if st.cancelled:
        what += ", CANCELLED"
    parent = f", child of {st.parent_workflow_id}" if st.parent_workflow_id else ""
    return f"{st.kind} {st.workflow_id}: {what}{parent}"


def _child_line(ch: ChildProgress) -> str:
    if not ch.done:
        return f"{ch.workflow_id}: running"
    return (
        f"{ch.workflow_id}: done, stop reason {ch.stop_reason}, requests {ch.requests:,}, "
        f"tokens {ch.total_tokens:,}"
    )


def render_status(st: WorkflowStatus, indent: str = "") -> str:
    lines = [indent + _head(st)]
    pad = indent + "  "
    if not indent and st.task_queue:
        store = f"; store {st.store_id} ({st.store})" if st.store_id else ""
        lines.append(f"{pad}task queue: {st.task_queue}{store}")
    if st.note:
        lines.append(f"{pad}{st.note}")
    if st.error:
        lines.append(f"{pad}error: {st.error}")
    if st.batch is not None:
        b = st.batch
        pending = max(0, b.total - b.done - b.failed - b.running)
        lines.append(f"{pad}phase: {b.phase}")
        lines.append(
            f"{pad}runs: {b.done}/{b.total} reflected, {b.running} running, {b.failed} failed, "
            f"{pending} pending" + (f", continued as new {b.continued_as_new}x" if b.continued_as_new else "")
        )
        if b.last_event:
            lines.append(f"{pad}last: {b.last_event}")
    p = st.progress
    if p is not None:
        # a running child that did not answer its query (busy, see `_query`) is missing from the sum: say so
        silent = sum(1 for ch in st.running_children if ch.progress is None)
        scope = (
            f" (this session and its answered children: {silent} running child did not answer)"
            if silent
            else " (tree total)"
            if st.running_children
            else ""
        )
        lines += [
            f"{pad}phase: {p.phase}" + (f" (model {p.model})" if p.model else ""),
            f"{pad}requests: {used(st.tree_requests, p.max_requests)}{scope}",
            f"{pad}tokens: {used(st.tree_tokens, p.max_tokens)}{scope}",
            f"{pad}{cells_text(p.cells, p.failed_cells, p.last_cell).replace('cells ', 'cells: ', 1)}",
            f"{pad}depth: {p.depth}" + (f" (max {p.max_depth})" if p.max_depth else ""),
            f"{pad}children: {p.children_done} done"
            + (f", 1 running ({p.child_running})" if p.child_running else ""),
            f"{pad}compactions: {p.compactions}"
            + (f" (+{p.microcompactions} micro)" if p.microcompactions else ""),
        ]
        if p.last_tool:
            lines.append(f"{pad}last tool: {p.last_tool}")
        if p.continued_as_new:
            lines.append(f"{pad}continued as new: {p.continued_as_new}x")
        lines += [f"{pad}  {_child_line(ch)}" for ch in p.children if ch.done]
    for child in st.running_children:
        lines.append(render_status(child, pad + "  ").rstrip("\n"))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the command

FOLLOW_POLL_S = 1.0


def _summary(st: WorkflowStatus) -> str:
    if st.cancelled:
        outcome = "CANCELLED"
    elif st.status != "completed":
        outcome = st.status
    elif st.kind == "batch":
        outcome = "completed" if st.complete else "INCOMPLETE"
    else:
        outcome = "completed" if st.complete else f"INCOMPLETE ({st.stop_reason})"
    p: Progress | BatchProgress = st.batch if st.batch is not None else (st.progress or Progress())
    return summary_line(st.kind, st.workflow_id, outcome, st.elapsed_s or 0.0, p)


async def follow(
    client: Client, wf_id: str, display: ProgressDisplay, poll_s: float = FOLLOW_POLL_S
) -> WorkflowStatus:
    """Show `wf_id`'s progress on `display` until it closes; returns its final status."""
    st = await fetch_status(client, wf_id)
    display.start_clock(st.elapsed_s or 0.0)
    warned = False
    while st.status == "running":
        if st.waiting_for_worker:
            if not warned:
                display.note(f"rr: {st.kind} {wf_id}: {st.note}")
            warned = True
        else:
            if warned:
                display.note(f"rr: a worker took {st.kind} {wf_id}")
            warned = False
            shown: Progress | BatchProgress | None = st.batch if st.batch is not None else st.progress
            if shown is not None:
                display.update(shown, [ch.progress for ch in _chain(st) if ch.progress is not None])
        await asyncio.sleep(poll_s)
        st = await fetch_status(client, wf_id)
    display.finish(_summary(st))
    return st


def _chain(st: WorkflowStatus) -> list[WorkflowStatus]:
    chain, node = [], st
    while node.running_children:
        node = node.running_children[0]
        chain.append(node)
    return chain


async def status_command(
    client: Client, wf_id: str, *, as_json: bool = False, follow_it: bool = False
) -> int:
    """`rr status ID [--json] [--follow]`: prints the status (stdout); `--follow` shows the progress on
    stderr until the workflow closes, then prints its final status and exits like `rr result`."""
    if follow_it:
        probe = await fetch_status(client, wf_id)  # an unknown id fails here, before any display
        plain = render_batch_progress if probe.kind == "batch" else render_progress
        display = ProgressDisplay(plain, title=f"{probe.kind} {wf_id}")
        try:
            st = await follow(client, wf_id, display)
        finally:
            display.stop()
    else:
        st = await fetch_status(client, wf_id)
    print(
        st.model_dump_json(indent=2) if as_json else render_status(st),
        end="\n" if as_json else "",
        flush=True,
    )
    return exit_code(st) if follow_it else 0
