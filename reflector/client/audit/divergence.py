"""The first diverging event of a replayed history (`reflector.client.audit.replay` records the commands): the
SDK's nondeterminism message is parsed for the event it names (`HistoryEvent(id: N, ...)`, or
`LocalActivity(seq)` / `Activity(seq)` / `Timer(seq)` / `ChildWorkflow(seq)`, mapped to its event), and the
recorded commands, aligned with the history's command events, say what the code did there instead (and
give the event when the message names none).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.bridge.proto.workflow_commands import WorkflowCommand
from temporalio.client import WorkflowHistory

__all__ = ["Divergence", "divergence_of"]

_LA_MARKER = "core_local_activity"


@dataclass(frozen=True)
class Divergence:
    event_id: int | None  # the first diverging event of the history (None: the code went past the history)
    event_type: str  # e.g. "MarkerRecorded (local activity rr.sandbox.prepare_session)"
    code_did: str  # what the code did there instead
    message: str  # the SDK's message

    def describe(self) -> str:
        where = f"event {self.event_id} {self.event_type}" if self.event_id is not None else self.event_type
        return f"first diverging event: {where}; the code instead {self.code_did}"


def _marker_data(ev: HistoryEvent, key: str) -> dict[str, Any]:
    payloads = ev.marker_recorded_event_attributes.details.get(key)
    if payloads is None or not payloads.payloads:
        return {}
    try:
        data = json.loads(payloads.payloads[0].data)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _event_label(ev: HistoryEvent) -> tuple[str, str] | None:
    """(kind, detail) of an event a command produces; None for events no command makes (or that are skipped)."""
    t = ev.event_type
    if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return "activity", ev.activity_task_scheduled_event_attributes.activity_type.name
    if t == EventType.EVENT_TYPE_MARKER_RECORDED:
        name = ev.marker_recorded_event_attributes.marker_name
        if name == _LA_MARKER:
            return "local activity", str(_marker_data(ev, "data").get("activity_type", "?"))
        return None  # patch markers (and their search-attribute upserts) are not compared
    if t == EventType.EVENT_TYPE_TIMER_STARTED:
        return "timer", ""
    if t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
        a = ev.start_child_workflow_execution_initiated_event_attributes
        return "child workflow", f"{a.workflow_type.name} {a.workflow_id}"
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        return "complete", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return "fail", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return "continue as new", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
        return "cancel", ""
    if t == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
        return "signal external", ""
    if t == EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
        return "cancel external", ""
    return None


def _command_label(c: WorkflowCommand) -> tuple[str, str] | None:
    v = c.WhichOneof("variant")
    if v == "schedule_activity":
        return "activity", c.schedule_activity.activity_type
    if v == "schedule_local_activity":
        return "local activity", c.schedule_local_activity.activity_type
    if v == "start_timer":
        return "timer", f"{c.start_timer.start_to_fire_timeout.ToTimedelta().total_seconds():g} s"
    if v == "start_child_workflow_execution":
        s = c.start_child_workflow_execution
        return "child workflow", f"{s.workflow_type} {s.workflow_id}"
    if v == "complete_workflow_execution":
        return "complete", ""
    if v == "fail_workflow_execution":
        return "fail", c.fail_workflow_execution.failure.message[:200]
    if v == "continue_as_new_workflow_execution":
        return "continue as new", ""
    if v == "cancel_workflow_execution":
        return "cancel", ""
    if v == "signal_external_workflow_execution":
        return "signal external", ""
    if v == "request_cancel_external_workflow_execution":
        return "cancel external", ""
    return None  # queries, patches, upserts, cancellations of its own commands: not compared


_EVENT_WORDS = {
    "local activity": "MarkerRecorded",
    "activity": "ActivityTaskScheduled",
    "timer": "TimerStarted",
    "child workflow": "StartChildWorkflowExecutionInitiated",
    "complete": "WorkflowExecutionCompleted",
    "fail": "WorkflowExecutionFailed",
    "continue as new": "WorkflowExecutionContinuedAsNew",
    "cancel": "WorkflowExecutionCanceled",
    "signal external": "SignalExternalWorkflowExecutionInitiated",
    "cancel external": "RequestCancelExternalWorkflowExecutionInitiated",
}


def _type_name(ev: HistoryEvent) -> str:
    name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
    return "".join(w.capitalize() for w in name.split("_"))


def _describe_event(ev: HistoryEvent) -> str:
    label = _event_label(ev)
    kind = _type_name(ev)
    if label is None:
        return kind
    what, detail = label
    if what in ("local activity", "activity", "child workflow") and detail:
        return f"{kind} ({what} {detail})"
    return kind


def _describe_command(label: tuple[str, str] | None) -> str:
    if label is None:
        return (
            "issued no further command (its code had returned or was waiting on something the history lacks)"
        )
    what, detail = label
    return {
        "local activity": f"scheduled local activity {detail}",
        "activity": f"scheduled activity {detail}",
        "timer": f"started a timer ({detail})",
        "child workflow": f"started child workflow {detail}",
        "complete": "completed the workflow",
        "fail": f"failed the workflow ({detail}){_model_hint(detail)}" if detail else "failed the workflow",
        "continue as new": "continued as new",
        "cancel": "cancelled the workflow",
        "signal external": "signalled an external workflow",
        "cancel external": "requested cancellation of an external workflow",
    }[what]


_UNKNOWN_MODEL = re.compile(r"model ('[^']*'|\"[^\"]*\") cannot be used")


def _model_hint(failure: str) -> str:
    """Why a replay that fails its workflow on a model is not a change of code: the history names a model this
    process cannot build (one a plugin of the worker that ran it registered)."""
    m = _UNKNOWN_MODEL.search(failure)
    if m is None:
        return ""
    return (
        f": not a change of the code, model {m[1]} is not known in this process; name the module that"
        " registers it in RR_PLUGINS, as the worker that ran it did"
    )


_EVENT_IN_MESSAGE = re.compile(r"HistoryEvent\(id: (\d+)|event[_ ]id[:= ]+(\d+)", re.IGNORECASE)
_SEQ_IN_MESSAGE = re.compile(r"\b(LocalActivity|Activity|Timer|ChildWorkflow\w*)\((\d+)\)")
_CORE_MESSAGE = re.compile(r'message: "(.*?)", source:', re.DOTALL)


def _core_message(failure: BaseException) -> str:
    text = str(failure)
    m = _CORE_MESSAGE.search(text)
    return (m.group(1) if m else text).strip()


def _event_for_seq(events: Iterable[HistoryEvent], kind: str, seq: int) -> HistoryEvent | None:
    children = 0
    for ev in events:
        t = ev.event_type
        if (
            kind == "LocalActivity"
            and t == EventType.EVENT_TYPE_MARKER_RECORDED
            and ev.marker_recorded_event_attributes.marker_name == _LA_MARKER
        ):
            if _marker_data(ev, "data").get("seq") == seq:
                return ev
        elif kind == "Activity" and t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_id == str(seq):
                return ev
        elif kind == "Timer" and t == EventType.EVENT_TYPE_TIMER_STARTED:
            if ev.timer_started_event_attributes.timer_id == str(seq):
                return ev
        elif (
            kind.startswith("ChildWorkflow")
            and t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ):
            children += 1
            if children == seq:
                return ev
    return None


def divergence_of(
    failure: BaseException, history: WorkflowHistory, commands: list[WorkflowCommand]
) -> Divergence | None:
    """The first diverging event of `history` under `failure`, and what the code (`commands`) did there.

    None for a failure that is not a nondeterminism error (e.g. the workflow task raised) when neither its
    message nor the commands point at an event."""
    message = _core_message(failure)
    history_cmds = [(ev, lab) for ev in history.events if (lab := _event_label(ev)) is not None]
    code = [lab for c in commands if (lab := _command_label(c)) is not None]
    by_id = {ev.event_id: ev for ev in history.events}
    named: HistoryEvent | None = None
    if (m := _EVENT_IN_MESSAGE.search(message)) is not None:
        named = by_id.get(int(m.group(1) or m.group(2)))
    elif (m := _SEQ_IN_MESSAGE.search(message)) is not None:
        named = _event_for_seq(history.events, m.group(1), int(m.group(2)))
    first_mismatch = next(
        (i for i, (_ev, lab) in enumerate(history_cmds) if i >= len(code) or code[i] != lab), None
    )
    if named is None and first_mismatch is None and not isinstance(failure, workflow.NondeterminismError):
        return None
    index: int | None
    if named is not None:
        index = next((i for i, (ev, _lab) in enumerate(history_cmds) if ev.event_id == named.event_id), None)
        target: HistoryEvent | None = named
    else:
        index = first_mismatch
        target = history_cmds[index][0] if index is not None else None
    if index is not None:
        did = _describe_command(code[index] if index < len(code) else None)
    elif first_mismatch is None and len(code) > len(history_cmds):
        did = _describe_command(code[len(history_cmds)])
    else:
        did = "(the recorded commands do not show it)"
    if target is None:
        if len(code) > len(history_cmds):
            return Divergence(
                None,
                f"past the end of the history ({_EVENT_WORDS[code[len(history_cmds)][0]]} "
                "expected by the code)",
                did,
                message,
            )
        return Divergence(None, "(not found in the history)", did, message)
    return Divergence(target.event_id, _describe_event(target), did, message)
