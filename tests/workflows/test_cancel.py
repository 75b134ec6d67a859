"""`rr cancel` on the session's dev server: a cancelled reflection returns its findings so far, says it was
cancelled, closes its sandbox and cancels its running child; a cancelled batch starts no more runs and
returns the partial batch. Every history (cancellation included) replays."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

import worker
from reflector import client as rr
from reflector.client import ops
from reflector.contract import (
    CLOSE_ACTIVITY,
    PROGRESS_QUERY,
    RUN_CELL_ACTIVITY,
    BatchOutput,
    Progress,
    ReflectionConfig,
    ReflectorOutput,
)
from reflector.runtime.settings import Settings
from reflector.testing.tau_runs import synthetic_runs
from tests.support import endless
from tests.support.fixtures import completed_activities, write_trace

pytestmark = pytest.mark.timeout(180)

ENDLESS = ReflectionConfig(
    model=endless.MODEL, max_requests=5_000, max_tokens=100_000_000, recursion="always"
)


async def _until(handle: WorkflowHandle[Any, Any], done: Any, what: str) -> Any:
    """Poll the progress query until `done(progress)`; the reflection never ends by itself."""
    for _ in range(600):
        try:
            p = await handle.query(PROGRESS_QUERY, result_type=Progress)
        except Exception:  # the first task may not have run yet
            p = None
        if p is not None and done(p):
            return p
        await asyncio.sleep(0.05)
    raise AssertionError(f"the reflection never reached: {what}")


async def _replays(client: Client, settings: Settings, *ids: str) -> None:
    replayer = worker.make_replayer(settings.blob_dir)
    for wf_id in ids:
        history = await client.get_workflow_handle(wf_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (wf_id, result.replay_failure)


async def _start(
    client: Client, tq: str, settings: Settings, tmp_path: Path, question: str = ""
) -> WorkflowHandle[Any, Any]:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, question=question, config=ENDLESS)
    return await rr.start_reflection(
        client, inp, tq, f"cancel-{uuid.uuid4().hex[:8]}", trace_name="trace.json"
    )


async def test_cancel_mid_session_keeps_the_findings_so_far(client, task_queue, settings, tmp_path) -> None:
    handle = await _start(client, task_queue, settings, tmp_path)
    await _until(handle, lambda p: p.cells >= 3, "3 cells")
    res = await ops.cancel(client, handle.id, wait_s=60)
    assert res.outcome == "cancelled" and res.kind == "reflection" and res.status == "completed"
    out = res.output
    assert isinstance(out, ReflectorOutput)
    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "cancelled" and rt["timed_out"] is True
    assert rt["cells"] >= 3
    assert out.reasoning.startswith("CANCELLED")
    # the findings so far: every cell's output, in order
    for n in range(3):
        assert f"finding {n}" in out.error_identification
    assert rr.is_cancelled(out) and not rr.is_complete(out)
    # the sandbox was closed after the cancellation, like at any end
    history = await handle.fetch_history()
    names = [r.name for r in completed_activities(history.events)]
    assert names.count(CLOSE_ACTIVITY) == 1 and names.index(CLOSE_ACTIVITY) > names.index(
        RUN_CELL_ACTIVITY
    ), names
    # `rr result` afterwards gives the same output; a second cancel finds nothing to cancel
    assert (await rr.fetch_result(client, handle.id)).model_dump() == out.model_dump()
    again = await ops.cancel(client, handle.id, wait_s=5)
    assert again.outcome == "already_closed" and isinstance(again.output, ReflectorOutput)
    await _replays(client, settings, handle.id)


async def test_cancel_cancels_the_running_child(client, task_queue, settings, tmp_path) -> None:
    handle = await _start(client, task_queue, settings, tmp_path, question=endless.RECURSE_MARK)
    child_id = f"{handle.id}.r1"
    await _until(handle, lambda p: p.phase == "waiting for child", "a running child")
    child = client.get_workflow_handle(child_id, result_type=ReflectorOutput)
    await _until(child, lambda p: p.cells >= 2, "2 cells in the child")
    res = await ops.cancel(client, handle.id, wait_s=60)
    assert res.outcome == "cancelled"
    assert isinstance(res.output, ReflectorOutput)
    assert res.output.raw["rr_trace"]["stop_reason"] == "cancelled"
    assert "finding 0" in res.output.error_identification  # the root's own cell before the child
    # the child was asked to cancel by its parent and returned its own findings so far
    child_out = await child.result()
    assert child_out.raw["rr_trace"]["stop_reason"] == "cancelled"
    assert child_out.raw["rr_trace"]["depth"] == 1
    assert "finding 1" in child_out.error_identification
    assert (await child.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert [c["id"] for c in res.children] == [child_id]
    await _replays(client, settings, handle.id, child_id)


async def test_cancel_before_the_first_turn(client, settings, tmp_path) -> None:
    """No worker polls this queue: the cancellation is waiting when the first task runs."""
    from worker import build_worker

    tq = f"rr-cancel-{uuid.uuid4().hex[:6]}"
    handle = await _start(client, tq, settings, tmp_path)
    early = await ops.cancel(client, handle.id, wait_s=0.5)
    assert early.outcome == "cancel_requested" and early.status == "running"
    async with build_worker(client, tq):
        out = await handle.result()
    assert out.raw["rr_trace"]["stop_reason"] == "cancelled"
    assert out.raw["rr_trace"]["cells"] == 0
    assert "(no cell output)" in out.error_identification
    await _replays(client, settings, handle.id)


async def test_a_cancelled_batch_starts_no_more_runs(client, task_queue, settings, tmp_path) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(synthetic_runs(6)))
    manifest = rr.upload_batch([path], settings, split=True)
    inp = rr.build_batch_input(manifest, config=ENDLESS, concurrency=2)
    handle = await rr.start_batch(client, inp, task_queue, f"bc-{uuid.uuid4().hex[:8]}", name="runs.json")
    first = [client.get_workflow_handle(f"{handle.id}.run{i}") for i in (0, 1)]
    for h in first:
        await _until(h, lambda p: p.cells >= 2, f"2 cells in {h.id}")
    res = await ops.cancel(client, handle.id, wait_s=90)
    assert res.outcome == "cancelled" and res.kind == "batch"
    out = res.output
    assert isinstance(out, BatchOutput) and out.cancelled
    # the two running children were cancelled and recorded with their findings; nothing else was started
    assert (out.reflected, out.failed, out.n_runs) == (2, 0, 6)
    records = rr.load_batch_records(out, settings)
    assert [r.index for r in records] == [0, 1]
    assert {r.stop_reason for r in records} == {"cancelled"}
    assert sorted(c["id"] for c in res.children) == [f"{handle.id}.run0", f"{handle.id}.run1"]
    listed = [wf.id async for wf in client.list_workflows(f"WorkflowId = '{handle.id}.run2'")]
    assert listed == []
    assert out.llm_synthesis is None  # a cancelled batch asks for no LLM synthesis
    await _replays(client, settings, handle.id, f"{handle.id}.run0")
