"""Histories in which a local activity's result reached the workflow code one workflow task late.

Temporal's core SDK (temporalio 1.35) can record a local activity's marker in one workflow task while the
workflow code sees the result only in the next one: under load, when the activity outlasts 80% of the task
timeout (core then heartbeats the task) and finishes around the heartbeat. On replay core hands the result to
the code in the task that holds the marker, one task early. Commands are matched to events in order, so most
code does not care; a *first* `workflow.patched()` does: core answers it from the patch markers of the
current task only, finds none there (the marker is one task later) and the replay fails with TMPRL1100
("patch marker ... but there is no corresponding change command").

`deliver_local_results_late` rewrites any history into that shape: after every local-activity marker that
other commands follow in the same task, it closes the task and starts a new one (scheduled, started,
completed), so the commands the code issued after seeing the result sit one task later, as in the recorded
failures. A workflow that replays such a history is immune to the race (see
`workflows.patches.decide_patches_first`).
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

__all__ = ["deliver_local_results_late", "late_deliveries", "patch_ids"]

_MARKER = "EVENT_TYPE_MARKER_RECORDED"
_WFT_SCHEDULED = "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED"
_WFT_STARTED = "EVENT_TYPE_WORKFLOW_TASK_STARTED"
_WFT_COMPLETED = "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"
_LA_MARKER_NAME = "core_local_activity"


def _is_la_marker(event: dict[str, Any]) -> bool:
    attrs = event.get("markerRecordedEventAttributes") or {}
    return event.get("eventType") == _MARKER and attrs.get("markerName") == _LA_MARKER_NAME


def _template(events: list[dict[str, Any]], event_type: str) -> dict[str, Any]:
    for event in events:
        if event.get("eventType") == event_type:
            return event
    raise ValueError(f"history has no {event_type} event to copy")


def _split_points(events: list[dict[str, Any]]) -> list[int]:
    """Indexes of local-activity markers followed by another command event of the same workflow task."""
    points = []
    for i, event in enumerate(events[:-1]):
        if _is_la_marker(event) and events[i + 1].get("eventType") != _WFT_SCHEDULED:
            # the next event is a command of the same task (a marker, a schedule, a completion, ...), unless
            # the task closed there (a scheduled task) or a non-command event (e.g. an activity result) came
            # in between: those start a new task anyway and are fine to split after as well
            points.append(i)
    return points


def patch_ids(history: dict[str, Any]) -> list[str]:
    """The patch ids a history's `core_patch` markers record, in order."""
    out = []
    for event in history["events"]:
        attrs = event.get("markerRecordedEventAttributes") or {}
        if event.get("eventType") == _MARKER and attrs.get("markerName") == "core_patch":
            payload = attrs["details"]["patch-data"]["payloads"][0]
            out.append(json.loads(base64.b64decode(payload["data"]))["id"])
    return out


def late_deliveries(history: dict[str, Any]) -> int:
    """How many local-activity results `deliver_local_results_late` would deliver a task late."""
    return len(_split_points(history["events"]))


def _remap_ids(node: Any, mapping: dict[int, int]) -> None:
    """Rewrite every `...EventId` field (proto JSON: int64 as a string) through `mapping`, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("EventId") and isinstance(value, (str, int)) and int(value) in mapping:
                node[key] = str(mapping[int(value)]) if isinstance(value, str) else mapping[int(value)]
            else:
                _remap_ids(value, mapping)
    elif isinstance(node, list):
        for item in node:
            _remap_ids(item, mapping)


def deliver_local_results_late(history: dict[str, Any]) -> dict[str, Any]:
    """A copy of `history` (its JSON form) with every local activity's result delivered one task late."""
    events: list[dict[str, Any]] = copy.deepcopy(history["events"])
    splits = set(_split_points(events))
    scheduled_t = _template(events, _WFT_SCHEDULED)
    started_t = _template(events, _WFT_STARTED)
    completed_t = _template(events, _WFT_COMPLETED)
    out: list[dict[str, Any]] = []
    mapping: dict[int, int] = {}
    # commands after a split belong to the inserted task: their "completed by" id becomes its completion
    completed_override: dict[int, int] = {}
    current_override: int | None = None
    for i, event in enumerate(events):
        old_id = int(event["eventId"])
        if event.get("eventType") == _WFT_SCHEDULED:
            current_override = None
        new_id = len(out) + 1
        mapping[old_id] = new_id
        event["eventId"] = str(new_id)
        if current_override is not None:
            completed_override[new_id] = current_override
        out.append(event)
        if i in splits:
            time = event.get("eventTime")
            scheduled = copy.deepcopy(scheduled_t)
            started = copy.deepcopy(started_t)
            completed = copy.deepcopy(completed_t)
            s_id, st_id, c_id = len(out) + 1, len(out) + 2, len(out) + 3
            for ev, ev_id in ((scheduled, s_id), (started, st_id), (completed, c_id)):
                ev["eventId"] = str(ev_id)
                if time is not None:
                    ev["eventTime"] = time
            started["workflowTaskStartedEventAttributes"]["scheduledEventId"] = str(s_id)
            completed["workflowTaskCompletedEventAttributes"]["scheduledEventId"] = str(s_id)
            completed["workflowTaskCompletedEventAttributes"]["startedEventId"] = str(st_id)
            out.extend([scheduled, started, completed])
            current_override = c_id
    inserted = {int(ev["eventId"]) for ev in out} - set(mapping.values())
    for event in out:
        if int(event["eventId"]) in inserted:
            continue
        _remap_ids({k: v for k, v in event.items() if k.endswith("Attributes")}, mapping)
        new_id = int(event["eventId"])
        if new_id in completed_override:
            for key, attrs in event.items():
                if (
                    key.endswith("Attributes")
                    and isinstance(attrs, dict)
                    and "workflowTaskCompletedEventId" in attrs
                ):
                    attrs["workflowTaskCompletedEventId"] = str(completed_override[new_id])
    result = dict(history)
    result["events"] = out
    return result
