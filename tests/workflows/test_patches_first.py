"""Every patch is decided before a run's first command, so a history replays even when core delivered a local
activity's result one workflow task after its marker (workflows/patches.py, tests/support/late_resolution.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import reflector.testing.scripted  # noqa: F401  (the committed histories used the scripted models)
import worker
from reflector import client as rr
from reflector.contract import PATCHES_FIRST_PATCH, ReflectionConfig
from tests.support.fixtures import write_trace
from tests.support.late_resolution import deliver_local_results_late, late_deliveries, patch_ids
from workflows.patches import ASKED_AT_START, LIBRARY_PATCHES
from workflows.reflection import ReflectionWorkflow

COMMITTED = Path(__file__).parents[1] / "replay" / "histories" / "stateful_v3.json"


def _first_la_marker(data: dict[str, Any]) -> int:
    return next(
        i
        for i, e in enumerate(data["events"])
        if (e.get("markerRecordedEventAttributes") or {}).get("markerName") == "core_local_activity"
    )


async def test_reflection_replays_with_local_results_delivered_late(
    client, task_queue, settings, tmp_path
) -> None:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, question="What is 17 * 24?", config=ReflectionConfig(model="scripted-stateful"))
    handle = await rr.start_reflection(client, inp, task_queue, f"t-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    assert out.raw["rr_trace"]["cells"] == 4
    history = await handle.fetch_history()
    data = json.loads(history.to_json())

    # one umbrella marker, the library's patch and the patches added since, all before the prefill's local activity
    assert patch_ids(data) == [PATCHES_FIRST_PATCH, *LIBRARY_PATCHES, *ASKED_AT_START]
    markers = [
        i
        for i, e in enumerate(data["events"])
        if (e.get("markerRecordedEventAttributes") or {}).get("markerName") == "core_patch"
    ]
    assert max(markers) < _first_la_marker(data)

    # prefill, cells and in-process model requests: each result a task late, and the run still replays
    assert late_deliveries(data) >= 5
    late = WorkflowHistory.from_json(history.workflow_id, deliver_local_results_late(data))
    assert len(late.events) == len(history.events) + 3 * late_deliveries(data)
    result = await worker.make_replayer(settings.blob_dir).replay_workflow(
        late, raise_on_replay_failure=False
    )
    assert result.replay_failure is None, result.replay_failure


async def test_history_recorded_before_the_fix_fails_in_the_late_shape() -> None:
    """The control: a committed history whose first `rr-local-model-requests` ask came after the prefill's local
    activity replays as recorded and fails in the late shape with the error seen under load (TMPRL1100)."""
    data = json.loads(COMMITTED.read_text())
    assert PATCHES_FIRST_PATCH not in patch_ids(data) and late_deliveries(data)
    replayer = Replayer(workflows=[ReflectionWorkflow], plugins=[PydanticAIPlugin()])
    as_recorded = WorkflowHistory.from_json("recorded", data)
    assert (await replayer.replay_workflow(as_recorded, raise_on_replay_failure=False)).replay_failure is None
    late = WorkflowHistory.from_json("recorded-late", deliver_local_results_late(data))
    with pytest.raises(workflow.NondeterminismError, match="TMPRL1100.*patch marker"):
        await replayer.replay_workflow(late)
