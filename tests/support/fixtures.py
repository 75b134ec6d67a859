"""Small traces the project writes itself (tests never depend on ../shared for basic coverage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ACE_TRACE = {
    "question": "What is 17 * 24?",
    "ground_truth": "408",
    "feedback": "The answer 398 is wrong.",
    "steps": [
        {"role": "user", "content": "What is 17 * 24?"},
        {
            "role": "assistant",
            "content": "I will compute it with the calculator.",
            "tool_calls": [{"name": "calculator", "arguments": '{"expr": "17*24"}'}],
        },
        {"role": "tool", "tool_name": "calculator", "content": "Error: calculator timed out"},
        {"role": "assistant", "content": "The calculator failed, so I estimate: 17 * 24 = 398."},
    ],
    "final_answer": "398",
}


def write_trace(directory: Path, data: object = None, name: str = "trace.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(ACE_TRACE if data is None else data))
    return path


def comparable(out: object, *, drop_model: bool = False) -> dict:  # type: ignore[type-arg]
    """A ReflectorOutput as a dict without what legitimately differs between two runs: ids (and model)."""
    d = out.model_dump()  # type: ignore[attr-defined]
    raw = d["raw"]
    raw.pop("workflow_id", None)
    for rec in raw.get("usage_records", []):
        rec.pop("workflow_id", None)
        if drop_model:
            rec.pop("model", None)
    if drop_model:
        raw.pop("model", None)
    return d


def payload_text(payload: object) -> str:
    """A history payload's JSON text, following an external-storage reference into the blob store."""
    from reflector.runtime.settings import Settings
    from reflector.runtime.storage.payloads import resolve

    return resolve(payload, Settings.from_env().blob_dir).data.decode(errors="replace")  # type: ignore[arg-type]


class ActivityRecord:
    """One completed activity as the history records it: a regular one (scheduled/started/completed
    events) or a local one (a `core_local_activity` marker)."""

    def __init__(self, name: str, attempt: int, result: object | None, local: bool) -> None:
        self.name, self.attempt, self.result, self.local = name, attempt, result, local

    @property
    def is_model_request(self) -> bool:
        return "model_request" in self.name

    def result_json(self) -> Any:
        return None if self.result is None else json.loads(payload_text(self.result) or "null")


def completed_activities(events: object) -> list[ActivityRecord]:
    """Every completed activity of a history, regular and local, in history order."""
    scheduled: dict[int, str] = {}
    attempts: dict[int, int] = {}
    out: list[ActivityRecord] = []
    for e in events:  # type: ignore[attr-defined]
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.HasField("activity_task_started_event_attributes"):
            a = e.activity_task_started_event_attributes
            attempts[a.scheduled_event_id] = a.attempt
        elif e.HasField("activity_task_completed_event_attributes"):
            a = e.activity_task_completed_event_attributes
            result = a.result.payloads[0] if a.result.payloads else None
            out.append(
                ActivityRecord(
                    scheduled[a.scheduled_event_id],
                    attempts.get(a.scheduled_event_id, 1),
                    result,
                    local=False,
                )
            )
        elif (
            e.HasField("marker_recorded_event_attributes")
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
        ):
            m = e.marker_recorded_event_attributes
            data = json.loads(m.details["data"].payloads[0].data)
            if "result" not in m.details:  # a failed local activity
                continue
            payloads = m.details["result"].payloads
            out.append(
                ActivityRecord(
                    data["activity_type"], int(data["attempt"]), payloads[0] if payloads else None, local=True
                )
            )
    return out
