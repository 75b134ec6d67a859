"""`rr rerun ID --from-step N`: a new reflection that reuses its origin's recorded steps before N.

A step is one model request of the origin's root session (its turns, counted across its
continue-as-new chain; summaries and the budget synthesis are not steps). The client reads the
origin's chain of histories (`reflector.client.audit.histories.iter_runs`, payloads inlined) and extracts
what the origin recorded before its request N (`extract`): the responses of steps 1..N-1 (local
model-request markers, or pydantic-ai's regular model-request activities for provider models), every
cell outcome by its sequence number (the `rr.sandbox.run_cell` markers), every child reflection's
output, and every summary. That prefix is stored as ONE blob and a new `ReflectionWorkflow` starts
with the origin's input, the model asked for, and `rerun=RerunOf(...)`; the workflow answers the
reused steps from the blob (`workflows.rerun`, `activities.rerun`) and continues live from step N.

The origin may itself be a rerun: its reused items are recorded (as `rr.rerun.*` markers) like the
ones it ran live, and count the same way.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelResponse
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from reflector.client import ReflectError, build_input
from reflector.contract import (
    AGENT_NAME,
    BATCH_WORKFLOW_NAME,
    PREPARE_ACTIVITY,
    RERUN_CELL_ACTIVITY,
    RERUN_CHILD_ACTIVITY,
    RERUN_RESPONSE_ACTIVITY,
    RERUN_SUMMARY_ACTIVITY,
    RUN_CELL_ACTIVITY,
    SUMMARISE_ACTIVITY,
    WORKFLOW_NAME,
    CellOutcome,
    PrepareSessionResult,
    ReflectionInput,
    ReflectorOutput,
    RerunOf,
    RerunPrefix,
    ReusedChild,
    SummariseResult,
)
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import parse_blob_uri
from reflector.runtime.storage.stores import open_store

__all__ = ["Origin", "read_origin", "extract", "plan_rerun", "RerunPlan", "rerun_line"]

_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_LOCAL_MARKER = "core_local_activity"
_CHILD_NUMBER = re.compile(r"\.r(\d+)$")


def _is_step(activity_type: str) -> bool:
    """A model request of the reflector agent (local or regular activity; streaming variants too)."""
    return f"__{AGENT_NAME}__model_request" in activity_type or activity_type == RERUN_RESPONSE_ACTIVITY


@dataclass
class Origin:
    """What the client read from the origin's chain of histories."""

    workflow_id: str
    input: ReflectionInput  # the first run's input
    steps: int  # model requests of the root session across the chain
    runs: int
    histories: list[WorkflowHistory] = field(default_factory=list)
    trace_name: str = ""  # the trace's file name, from the origin's memo ("" if it has none)


async def read_origin(client: Client, workflow_id: str, settings: Settings) -> Origin:
    """The origin's root chain (every run, payloads inlined); `ReflectError` (one line) for a bad id."""
    from reflector.client.audit.histories import iter_runs

    handle = client.get_workflow_handle(workflow_id)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise ReflectError(f"no reflection with id {workflow_id!r}") from None
        raise
    if desc.workflow_type == BATCH_WORKFLOW_NAME:
        raise ReflectError(
            f"{workflow_id!r} is a batch, not one reflection: rerun one of its runs' reflections "
            "(`rr result` of the batch lists their workflow ids)"
        )
    if desc.workflow_type != WORKFLOW_NAME:
        raise ReflectError(f"{workflow_id!r} is a {desc.workflow_type}, not a reflection")
    histories: list[WorkflowHistory] = []
    runs = iter_runs(client, workflow_id, settings.blob_dir)
    async with contextlib.aclosing(runs):
        async for run in runs:
            if run.workflow_id != workflow_id:
                break  # its own chain comes first; the children's histories are not needed
            histories.append(run.history)
    conv = client.data_converter.payload_converter
    started = histories[0].events[0].workflow_execution_started_event_attributes
    inp = conv.from_payload(started.input.payloads[0], ReflectionInput)
    if (
        inp.depth > 0
    ):  # a batch's run reflections are root sessions (depth 0) with the batch as parent: allowed
        parent = desc.parent_id or inp.parent_workflow_id
        raise ReflectError(
            f"{workflow_id!r} is a child reflection (of {parent}): rerun its root session instead"
        )
    steps = sum(1 for _ in _walk(histories, conv) if _[0] == "step")
    try:
        from reflector.runtime.search_attributes import memo_of

        trace_name = str(memo_of(await desc.memo()).get("trace") or "")
    except Exception:  # display only: a memo that cannot be decoded names no trace
        trace_name = ""
    return Origin(workflow_id, inp, steps, len(histories), histories, trace_name)


def _walk(histories: list[WorkflowHistory], conv: PayloadConverter) -> Any:
    """(kind, item) in history order: ("step", ModelResponse | None), ("prepare", PrepareSessionResult),
    ("cell", CellOutcome), ("child", (workflow id, ReflectorOutput | None, call | None)),
    ("summary", SummariseResult).

    A step is yielded where its request is first recorded: a local model request at its marker (written
    when it completed, after everything before it), a regular one when it was scheduled (its result
    follows as ("response", ModelResponse)).
    """
    for history in histories:
        scheduled: dict[int, str] = {}
        initiated: dict[int, str] = {}
        for e in history.events:
            t = e.event_type
            if t == EventType.EVENT_TYPE_MARKER_RECORDED:
                m = e.marker_recorded_event_attributes
                if m.marker_name != _LOCAL_MARKER or "result" not in m.details:
                    continue  # another marker, or a local activity that failed
                name = json.loads(m.details["data"].payloads[0].data).get("activity_type", "")
                result = m.details["result"].payloads
                if not result:
                    continue
                yield from _local(name, result[0], conv)
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = e.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[e.event_id] = name
                if _is_step(name):
                    yield "step", None
            elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                a = e.activity_task_completed_event_attributes
                name = scheduled.get(a.scheduled_event_id, "")
                if not a.result.payloads:
                    continue
                if _is_step(name):
                    yield "response", conv.from_payload(a.result.payloads[0], ModelResponse)
                elif name == SUMMARISE_ACTIVITY:
                    yield "summary", conv.from_payload(a.result.payloads[0], SummariseResult)
            elif t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                initiated[e.event_id] = (
                    e.start_child_workflow_execution_initiated_event_attributes.workflow_id
                )
                yield "child", (initiated[e.event_id], None, None)
            elif t == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
                a2 = e.child_workflow_execution_completed_event_attributes
                if a2.result.payloads:
                    out = conv.from_payload(a2.result.payloads[0], ReflectorOutput)
                    yield "child", (a2.workflow_execution.workflow_id, out, None)


def _local(name: str, payload: Payload, conv: PayloadConverter) -> Any:
    if _is_step(name):
        yield "step", conv.from_payload(payload, ModelResponse)
    elif name == PREPARE_ACTIVITY:
        yield "prepare", conv.from_payload(payload, PrepareSessionResult)
    elif name in (RUN_CELL_ACTIVITY, RERUN_CELL_ACTIVITY):
        yield "cell", conv.from_payload(payload, CellOutcome)
    elif name == RERUN_CHILD_ACTIVITY:
        child = conv.from_payload(payload, ReusedChild)
        yield "child", (child.workflow_id, child.output, child.call)
    elif name == RERUN_SUMMARY_ACTIVITY:
        yield "summary", conv.from_payload(payload, SummariseResult)


def _calls(histories: list[WorkflowHistory], conv: PayloadConverter) -> dict[str, dict[str, Any]]:
    """The origin's `subagent_calls` entries by child workflow id (from its output or its last continuation)."""
    last = histories[-1].events
    calls: list[dict[str, Any]] = []
    if last and last[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        payloads = last[-1].workflow_execution_completed_event_attributes.result.payloads
        if payloads:
            calls = conv.from_payload(payloads[0], ReflectorOutput).raw.get("subagent_calls") or []
    elif last:
        inp = conv.from_payload(
            last[0].workflow_execution_started_event_attributes.input.payloads[0], ReflectionInput
        )
        calls = inp.continuation.subagent_calls if inp.continuation is not None else []
    return {str(c.get("child_workflow_id")): c for c in calls if isinstance(c, dict)}


def extract(origin: Origin, from_step: int, conv: PayloadConverter) -> RerunPrefix:
    """Everything the origin recorded before its request `from_step` (see the module doc)."""
    calls = _calls(origin.histories, conv)
    prefix = RerunPrefix(
        origin=origin.workflow_id, from_step=from_step, origin_model=origin.input.config.model
    )
    steps, next_seq, ordinal = 0, 2, 0
    pending_child: set[str] = set()
    for item in _walk(origin.histories, conv):
        kind = item[0]
        if kind == "step":
            steps += 1
            if steps >= from_step:
                break
            if item[1] is not None:
                prefix.responses.append(_RESPONSE.dump_json(item[1]).decode())
        elif kind == "response":
            prefix.responses.append(_RESPONSE.dump_json(item[1]).decode())
        elif kind == "prepare":
            next_seq = item[1].next_seq
        elif kind == "cell":
            outcome: CellOutcome = item[1]
            seq = outcome.seq or next_seq + ordinal
            ordinal += 1
            prefix.cells[seq] = outcome
        elif kind == "child":
            child_id, out, call = item[1]
            number = _CHILD_NUMBER.search(child_id)
            if number is None:
                continue
            if out is None:
                pending_child.add(child_id)
                continue
            pending_child.discard(child_id)
            prefix.children[int(number.group(1))] = ReusedChild(
                workflow_id=child_id, output=out, call=call if call is not None else calls.get(child_id, {})
            )
        elif kind == "summary":
            prefix.summaries.append(item[1])
    if pending_child:
        raise ReflectError(
            f"the origin's child {sorted(pending_child)[0]} started before step {from_step} did not "
            "complete: its result cannot be reused"
        )
    if len(prefix.responses) != from_step - 1:
        raise ReflectError(
            f"the origin's history holds {len(prefix.responses)} responses before step {from_step}, "
            f"expected {from_step - 1}"
        )
    return prefix


@dataclass
class RerunPlan:
    """The new reflection's input and what it reuses."""

    input: ReflectionInput
    prefix: RerunPrefix
    origin: Origin


async def plan_rerun(
    client: Client,
    settings: Settings,
    origin_id: str,
    from_step: int,
    *,
    model: str | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> RerunPlan:
    """Read and check the origin, store its prefix as one blob, and build the rerun's input."""
    origin = await read_origin(client, origin_id, settings)
    if origin.steps == 0:
        raise ReflectError(
            f"reflection {origin_id!r} recorded no step (model request) yet: nothing to rerun from"
        )
    if not 1 <= from_step <= origin.steps:
        raise ReflectError(
            f"--from-step must be between 1 and {origin.steps} (the steps reflection {origin_id!r} "
            f"recorded), not {from_step}"
        )
    store = open_store(settings)
    if not store.exists(parse_blob_uri(origin.input.trace.uri)):
        raise ReflectError(
            f"the trace of reflection {origin_id!r} ({origin.input.trace.uri}) is not in the blob store "
            f"{store.where} (is {settings.blob_dir_setting} the store it was run with?)"
        )
    conv = client.data_converter.payload_converter
    prefix = extract(origin, from_step, conv)
    sha = store.put_bytes(prefix.model_dump_json().encode())
    old = origin.input
    config = old.config.model_copy(update={"model": model or old.config.model, **(config_overrides or {})})
    build_input(old.trace, config=config)  # checks the model name (one-line error)
    rerun = RerunOf(
        origin=origin_id,
        from_step=from_step,
        prefix_sha256=sha,
        origin_model=old.config.model,
        steps=len(prefix.responses),
        cells_through=max(prefix.cells, default=0),
        children=max(prefix.children, default=0),
        summaries=len(prefix.summaries),
    )
    # a standalone root reflection (a batch run's rerun is not part of the batch)
    inp = old.model_copy(
        update={
            "config": config,
            "continuation": None,
            "rerun": rerun,
            "parent_workflow_id": None,
            "search_attributes": False,
        }
    )
    return RerunPlan(ReflectionInput.model_validate(inp.model_dump()), prefix, origin)


def rerun_line(out: ReflectorOutput) -> str:
    """One line for the CLI: what a rerun reused ("" for any other reflection)."""
    r = out.raw.get("rerun")
    if not isinstance(r, dict):
        return ""
    cells = r.get("reused_cells", 0)
    rebuilt = (
        (
            " (their code was replayed in the sandbox host to rebuild its state: no model request, "
            "not a paid cell)"
        )
        if cells
        else ""
    )
    return (
        f"rerun of {r.get('origin')} from step {r.get('from_step')}: reused {r.get('reused_requests', 0)} model "
        f"responses of {r.get('origin_model') or 'the origin model'}, {cells} cells{rebuilt}, "
        f"{r.get('reused_children', 0)} children and {r.get('reused_summaries', 0)} summaries; "
        f"live from step {r.get('from_step')} with {r.get('model')}"
    )
