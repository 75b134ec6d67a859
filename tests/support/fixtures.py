"""Small traces the project writes itself (tests never depend on ../shared for basic coverage)."""

from __future__ import annotations

import json
from pathlib import Path

ACE_TRACE = {
    "question": "What is 17 * 24?",
    "ground_truth": "408",
    "feedback": "The answer 398 is wrong.",
    "steps": [
        {"role": "user", "content": "What is 17 * 24?"},
        {"role": "assistant", "content": "I will compute it with the calculator.",
         "tool_calls": [{"name": "calculator", "arguments": "{\"expr\": \"17*24\"}"}]},
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
    from reflector.payload_storage import resolve
    from reflector.settings import Settings

    return resolve(payload, Settings.from_env().blob_dir).data.decode(errors="replace")  # type: ignore[arg-type]
