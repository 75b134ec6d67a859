"""`rr list` and `rr cancel`: reflections and batches as Temporal's visibility lists them, and cancelling one.

`list_reflections` asks the server's visibility store (`list_workflows` with a query on the workflow types,
`ParentWorkflowId IS NULL` for roots, the status, and rr's search attributes where they are registered)
and reads each row's attributes and memo. Where the attributes are missing (a namespace nobody ran
`rr setup` in, or a workflow started before) a finished row's stop reason and totals are read from its
result instead, and `--status completed|incomplete` is decided from that.

`cancel` asks the server to cancel a running reflection or batch (its children get the request from their
parent: `ParentClosePolicy.REQUEST_CANCEL`, and the parent cancels the one it waits for), then waits a
bounded time for it to close: the workflow returns its findings so far with stop reason `cancelled`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode

from reflector.contract import BATCH_WORKFLOW_NAME, WORKFLOW_NAME, BatchOutput, ReflectorOutput
from reflector.runtime import search_attributes as sa

__all__ = [
    "STATUSES",
    "Row",
    "Listing",
    "list_reflections",
    "render_rows",
    "CancelResult",
    "cancel",
    "render_cancel",
    "NotFound",
]

Status = Literal["running", "completed", "failed", "incomplete"]
STATUSES: tuple[Status, ...] = ("running", "completed", "failed", "incomplete")
_TYPES = {WORKFLOW_NAME: "reflection", BATCH_WORKFLOW_NAME: "batch"}
_FAILED = ("Failed", "TimedOut", "Terminated", "Canceled")  # closed without an output
# rows read past the limit when the stop reason has to come from results (a namespace without the attributes)
_SCAN_FACTOR = 20


class NotFound(LookupError):
    """No reflection or batch with that id."""


@dataclass
class Row:
    """One reflection or batch, as `rr list` shows it (`--json`: these fields)."""

    id: str
    kind: str  # reflection | batch
    status: str  # running, completed, failed, canceled, terminated, timed_out
    started: str  # ISO 8601, UTC
    closed: str | None
    duration_s: float | None
    trace: str = ""  # file name (batch: what it read)
    format: str = ""
    size: int | None = None
    runs: int | None = None  # batch: runs in the manifest
    model: str = ""
    stop_reason: str | None = None
    requests: int | None = None
    tokens: int | None = None
    children: int | None = None
    parent: str | None = None
    batch_id: str | None = None
    run_id: str = ""
    task_queue: str = ""
    store_id: str = (
        ""  # the blob store its trace was uploaded to (`reflector.runtime.storage.identity`; "" before ids)
    )
    store: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Listing:
    rows: list[Row]
    missing_attributes: list[str] = field(default_factory=list)  # rr's attributes the namespace lacks
    query: str = ""


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status is not None else "unknown"


def _query(status: Status | None, include_children: bool, registered: bool) -> str:
    types = ", ".join(f"'{t}'" for t in _TYPES)
    parts = [f"WorkflowType IN ({types})", "ExecutionStatus != 'ContinuedAsNew'"]  # one row per chain
    if not include_children:
        parts.append("ParentWorkflowId IS NULL")  # a system attribute: works without rr's attributes
    if status == "running":
        parts.append("ExecutionStatus = 'Running'")
    elif status == "failed":
        parts.append("ExecutionStatus IN (" + ", ".join(f"'{s}'" for s in _FAILED) + ")")
    elif status in ("completed", "incomplete"):
        parts.append("ExecutionStatus = 'Completed'")
        if registered:  # `!=` never matches a row without the attribute (started before it was registered)
            op = "=" if status == "completed" else "!="
            parts.append(f"{sa.STOP_REASON.name} {op} 'completed'")
    return " AND ".join(parts)


def _get(attrs: Any, key: SearchAttributeKey[Any]) -> Any:
    try:
        return attrs.get(key)
    except Exception:  # registered with another type
        return None


async def _row(wf: WorkflowExecution) -> Row:
    attrs = wf.typed_search_attributes
    try:
        shown = sa.memo_of(await wf.memo())
    except Exception:  # a memo this client cannot decode is only display
        shown = {}
    closed = wf.close_time
    end = closed or datetime.now(UTC)
    size = shown.get("size")
    runs = shown.get("runs")
    return Row(
        id=wf.id,
        kind=_TYPES.get(wf.workflow_type, wf.workflow_type),
        status=_status_name(wf.status),
        started=wf.start_time.isoformat(),
        closed=closed.isoformat() if closed else None,
        duration_s=round((end - wf.start_time).total_seconds(), 3),
        trace=str(shown.get("trace", "")),
        format=str(shown.get("format", "")),
        size=size if isinstance(size, int) else None,
        runs=runs if isinstance(runs, int) else None,
        model=_get(attrs, sa.MODEL) or "",
        stop_reason=_get(attrs, sa.STOP_REASON),
        requests=_get(attrs, sa.REQUESTS),
        tokens=_get(attrs, sa.TOKENS),
        children=_get(attrs, sa.CHILDREN),
        parent=_get(attrs, sa.PARENT) or wf.parent_id,
        batch_id=_get(attrs, sa.BATCH_ID),
        run_id=wf.run_id,
        task_queue=wf.task_queue or "",
        store_id=str(shown.get("store_id", "")),
        store=str(shown.get("store", "")),
    )


async def _fill_from_result(client: Client, row: Row) -> None:
    """A finished row without the end attributes: its stop reason and totals from its result."""
    try:
        if row.kind == "batch":
            bh = client.get_workflow_handle(row.id, run_id=row.run_id, result_type=BatchOutput)
            batch: BatchOutput = await bh.result(follow_runs=False)
            complete = batch.failed == 0 and batch.synthesis.incomplete_reflections == 0
            row.stop_reason = "cancelled" if batch.cancelled else "completed" if complete else "incomplete"
            row.children = batch.reflected + batch.failed
            row.model = row.model or batch.model
            return
        rh = client.get_workflow_handle(row.id, run_id=row.run_id, result_type=ReflectorOutput)
        out: ReflectorOutput = await rh.result(follow_runs=False)
    except Exception:  # unreadable (e.g. its payloads are in another blob store): left blank
        return
    rt, usage = out.raw.get("rr_trace", {}), out.raw.get("usage", {})
    row.stop_reason = str(rt.get("stop_reason", "completed"))
    row.requests, row.tokens = usage.get("requests"), usage.get("total_tokens")
    row.children = len(rt.get("subagent_calls", []))
    row.model = row.model or str(out.raw.get("model", ""))


async def list_reflections(
    client: Client, *, status: Status | None = None, limit: int = 20, include_children: bool = False
) -> Listing:
    """The newest `limit` reflections and batches (roots unless `include_children`), newest first."""
    missing = await sa.missing(client)
    registered = not missing
    query = _query(status, include_children, registered)
    client_side = status in ("completed", "incomplete") and not registered
    rows: list[Row] = []
    scanned = 0
    async for wf in client.list_workflows(query, page_size=min(1000, max(limit, 10))):
        scanned += 1
        row = await _row(wf)
        if row.status == "completed" and row.stop_reason is None:
            await _fill_from_result(client, row)
        if client_side and (row.stop_reason == "completed") != (status == "completed"):
            if scanned >= limit * _SCAN_FACTOR:
                break
            continue
        rows.append(row)
        if len(rows) >= limit:
            break
    rows.sort(key=lambda r: r.started, reverse=True)
    return Listing(rows=rows, missing_attributes=missing, query=query)


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return ""


def _duration(s: float | None) -> str:
    if s is None or math.isnan(s):
        return ""
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def render_rows(rows: Sequence[Row]) -> str:
    """A plain table, one reflection or batch per line."""
    header = (
        "ID",
        "STARTED",
        "DURATION",
        "STATUS",
        "STOP",
        "TRACE",
        "MODEL",
        "REQUESTS",
        "TOKENS",
        "CHILDREN",
        "QUEUE",
        "STORE",
    )
    table = [header]
    for r in rows:
        what = r.trace or ("(batch)" if r.kind == "batch" else "")
        detail = ", ".join(
            x for x in (r.format, _size(r.size), f"{r.runs} runs" if r.runs is not None else "") if x
        )
        table.append(
            (
                ("  " if r.parent else "") + r.id,
                r.started[:19].replace("T", " "),
                _duration(r.duration_s),
                r.status,
                r.stop_reason or "-",
                f"{what} ({detail})" if detail else what,
                r.model or "?",
                _count(r.requests),
                _count(r.tokens),
                _count(r.children),
                r.task_queue or "-",
                r.store_id or "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return (
        "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)
        + "\n"
    )


# ------------------------------------------------------------------------------------------- cancel

Outcome = Literal["cancelled", "already_closed", "cancel_requested", "finished"]


@dataclass
class CancelResult:
    """What `rr cancel` got: `cancelled` (closed, its output says so), `finished` (it ended on its own before
    seeing the request), `already_closed` (nothing to cancel), `cancel_requested` (not closed in time)."""

    workflow_id: str
    kind: str
    outcome: Outcome
    status: str
    output: ReflectorOutput | BatchOutput | None = None
    children: list[dict[str, Any]] = field(default_factory=list)  # id, status, stop_reason

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "kind": self.kind,
            "outcome": self.outcome,
            "status": self.status,
            "children": self.children,
            "output": self.output.model_dump(mode="json") if self.output is not None else None,
        }


def _said_cancelled(out: ReflectorOutput | BatchOutput) -> bool:
    if isinstance(out, BatchOutput):
        return out.cancelled
    return bool(out.raw.get("rr_trace", {}).get("stop_reason") == "cancelled")


async def _children(client: Client, wf_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    try:
        async for wf in client.list_workflows(f"ParentWorkflowId = '{_quoted(wf_id)}'"):
            found.append(
                {
                    "id": wf.id,
                    "status": _status_name(wf.status),
                    "stop_reason": _get(wf.typed_search_attributes, sa.STOP_REASON),
                }
            )
    except RPCError:  # visibility is only a report here
        return found
    return sorted(found, key=lambda c: c["id"])


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


async def cancel(client: Client, wf_id: str, *, wait_s: float = 60.0) -> CancelResult:
    """Cancel a running reflection or batch and wait up to `wait_s` for it to close (see the module doc)."""
    handle = client.get_workflow_handle(wf_id)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise NotFound(wf_id) from None
        raise
    kind = _TYPES.get(desc.workflow_type)
    if kind is None:
        raise NotFound(wf_id)
    result_type: type[ReflectorOutput] | type[BatchOutput] = (
        BatchOutput if kind == "batch" else ReflectorOutput
    )
    typed = client.get_workflow_handle(wf_id, result_type=result_type)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        output = None
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            output = await typed.result()
        return CancelResult(wf_id, kind, "already_closed", _status_name(desc.status), output)
    await handle.cancel()
    outcome: Outcome
    output = None
    try:
        output = await asyncio.wait_for(typed.result(), timeout=wait_s)
        outcome = "cancelled" if output is not None and _said_cancelled(output) else "finished"
    except TimeoutError:
        outcome = "cancel_requested"
    except WorkflowFailureError as e:
        if not isinstance(e.cause, CancelledError):
            raise
        outcome = "cancelled"  # cancelled by a worker older than the cancelled output: no findings
    status = _status_name((await handle.describe()).status)
    return CancelResult(wf_id, kind, outcome, status, output, await _children(client, wf_id))


def render_cancel(res: CancelResult) -> str:
    """The one-paragraph report of `rr cancel` (stderr); the output itself is rendered by the caller."""
    noun = res.kind
    if res.outcome == "already_closed":
        text = f"{noun} {res.workflow_id} had already finished ({res.status}): nothing was cancelled"
    elif res.outcome == "cancel_requested":
        text = (
            f"cancellation of {noun} {res.workflow_id} requested; it has not closed yet (it closes when a worker "
            f"runs its next step): follow it with `rr result {res.workflow_id}`"
        )
    elif res.outcome == "finished":
        text = f"{noun} {res.workflow_id} finished on its own before it saw the cancellation"
    elif res.output is None:
        text = f"{noun} {res.workflow_id} was cancelled (status {res.status}, no output)"
    else:
        text = f"{noun} {res.workflow_id} was CANCELLED; its output keeps the findings so far"
    if res.children:
        shown = ", ".join(f"{c['id']} ({c['stop_reason'] or c['status']})" for c in res.children[:10])
        more = f" and {len(res.children) - 10} more" if len(res.children) > 10 else ""
        text += f"\nchildren: {shown}{more}"
    return text
