"""Reading raw Temporal history events for the audit: payloads (inline or in the blob store), markers,
timestamps, the event types that end a run or a child and the status each names. No interpretation of
what a reflection did (that is `reflector.client.audit.walk`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from reflector.runtime.storage.payloads import resolve

__all__ = [
    "payload_json",
    "first_json",
    "event_time",
    "failure_text",
    "LocalActivityMarker",
    "local_activity",
    "started_model",
    "models_of",
]

LOCAL_ACTIVITY_MARKER = "core_local_activity"

# Workflow-task events (no progress of the workflow itself), and the events that end a run or a child:
# the status each names (for a child, with the attribute that holds its result or failure).
_WT_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    }
)
_END_STATUS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "canceled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed out",
}
_CHILD_END = {
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: (
        "completed",
        "child_workflow_execution_completed_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: (
        "failed",
        "child_workflow_execution_failed_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED: (
        "canceled",
        "child_workflow_execution_canceled_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT: (
        "timed out",
        "child_workflow_execution_timed_out_event_attributes",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED: (
        "terminated",
        "child_workflow_execution_terminated_event_attributes",
    ),
}


def payload_json(payload: Payload, blob_dir: Path | str) -> Any:
    """A payload's JSON value (following an `rr-blobs` reference); None for a null or unreadable one."""
    try:
        stored = resolve(payload, blob_dir)
    except (OSError, ValueError, KeyError):
        return None
    if stored.metadata.get("encoding", b"") == b"binary/null" or not stored.data:
        return None
    try:
        return json.loads(stored.data)
    except ValueError:
        return stored.data.decode(errors="replace")


def first_json(payloads: Payloads, blob_dir: Path | str) -> Any:
    return payload_json(payloads.payloads[0], blob_dir) if payloads.payloads else None


def started_model(first: HistoryEvent, blob_dir: Path | str) -> str | None:
    """The model a reflection or batch was started with, from its first event's input (`config.model`)."""
    if not first.HasField("workflow_execution_started_event_attributes"):
        return None
    inp = first_json(first.workflow_execution_started_event_attributes.input, blob_dir)
    model = (inp.get("config") or {}).get("model") if isinstance(inp, dict) else None
    return str(model) if model else None


def models_of(firsts: Iterable[HistoryEvent], blob_dir: Path | str) -> list[str]:
    """The models the histories whose first events these are were started with, each once: what a replayer
    must prepare (instead of every shipped provider family, whose imports cost seconds)."""
    names: list[str] = []
    for event in firsts:
        model = started_model(event, blob_dir)
        if model and model not in names:
            names.append(model)
    return names


def event_time(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


def failure_text(failure: Any) -> str:
    """A Temporal `Failure` as one line: its message and its causes'."""
    parts: list[str] = []
    while failure is not None and failure.ByteSize():
        kind = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
        if failure.HasField("timeout_failure_info"):
            kind = "timeout"
        parts.append(f"{kind + ': ' if kind else ''}{failure.message}")
        failure = failure.cause if failure.HasField("cause") else None
    return " <- ".join(p for p in parts if p.strip()) or "(no message)"


class LocalActivityMarker:
    """A `core_local_activity` marker: the local activity's type, attempts and result (or failure)."""

    def __init__(self, data: dict[str, Any], result: Any, failure: str | None) -> None:
        self.activity_type = str(data.get("activity_type", ""))
        self.attempt = int(data.get("attempt", 1) or 1)
        self.result = result
        self.failure = failure


def local_activity(event: HistoryEvent, blob_dir: Path | str) -> LocalActivityMarker | None:
    if not event.HasField("marker_recorded_event_attributes"):
        return None
    m = event.marker_recorded_event_attributes
    if m.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in m.details:
        return None
    data = first_json(m.details["data"], blob_dir) or {}
    result = first_json(m.details["result"], blob_dir) if "result" in m.details else None
    failure = failure_text(m.failure) if m.HasField("failure") else None
    return LocalActivityMarker(data if isinstance(data, dict) else {}, result, failure)
