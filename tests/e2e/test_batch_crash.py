"""A batch survives SIGKILL of its worker: a new worker resumes it, no finished child runs again."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from reflector import client as rr
from reflector.client import connect
from reflector.contract import BatchOutput
from reflector.runtime.settings import Settings
from reflector.testing.tau_runs import synthetic_runs
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.procs import WorkerProcess
from workflows.batch import child_id

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
N_RUNS = 8


@pytest.fixture
def crash_env(temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"batch-crash-{uuid.uuid4().hex[:6]}",
        "RR_STICKY_TIMEOUT_S": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    EXTRA_BLOB_DIRS.append(home / "blobs")
    return env


async def _children(client: Client, batch_id: str) -> dict[int, list[str]]:
    """For each child id of the batch: the run ids of its executions, when any finished."""
    out: dict[int, list[str]] = {}
    for i in range(N_RUNS):
        async for wf in client.list_workflows(f"WorkflowId = '{child_id(batch_id, i)}'"):
            if wf.status == WorkflowExecutionStatus.COMPLETED:
                out.setdefault(i, []).append(wf.run_id)
    return out


async def test_a_batch_resumes_after_its_worker_is_killed(crash_env: dict[str, str], tmp_path: Path) -> None:
    settings = Settings.from_env()
    client = await connect(crash_env["TEMPORAL_ADDRESS"], settings=settings)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(synthetic_runs(N_RUNS)))
    inp = rr.build_batch_input(
        rr.upload_batch([path], settings, split=True), concurrency=2, children_per_run=5
    )
    tq = crash_env["RR_TASK_QUEUE"]
    w1 = WorkerProcess(crash_env, tmp_path / "w1.log")
    w2: WorkerProcess | None = None
    try:
        w1.wait_ready()
        handle = await rr.start_batch(client, inp, tq, f"crash-batch-{uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + 60
        while len(before := await _children(client, handle.id)) < 3:
            assert time.monotonic() < deadline, "the batch made no progress"
            await asyncio.sleep(0.05)
        w1.kill()
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        w2 = WorkerProcess(crash_env, tmp_path / "w2.log")
        w2.wait_ready()
        out = await asyncio.wait_for(handle.result(), 120)
        assert (out.reflected, out.failed, out.continued_as_new) == (N_RUNS, 0, 1)
        after = await _children(client, handle.id)
        # every run was reflected on exactly once; the children finished before the kill kept their run
        assert all(len(runs) == 1 for runs in after.values()) and len(after) == N_RUNS
        assert {i: after[i] for i in before} == before
        # and the result is the one an uncrashed batch gives
        again = await rr.wait_for_batch(
            await rr.start_batch(client, inp, tq, f"calm-batch-{uuid.uuid4().hex[:8]}")
        )
        assert again.synthesis == out.synthesis
        recs = [r.model_dump(exclude={"workflow_id"}) for r in rr.load_batch_records(out, settings)]
        assert recs == [r.model_dump(exclude={"workflow_id"}) for r in rr.load_batch_records(again, settings)]
    finally:
        w1.stop()
        if w2 is not None:
            w2.stop()


async def test_a_batch_survives_a_server_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Temporal server is stopped mid-batch and started again on the same SQLite file and port."""
    from reflector.runtime.devserver import DevServer, free_port

    server = DevServer(
        tmp_path / "temporal.sqlite", port=free_port(), ui=False, log_file=tmp_path / "server.log"
    )
    address = await server.astart(timeout=60)
    home = tmp_path / "home"
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": address,
        "RR_TASK_QUEUE": f"batch-srv-{uuid.uuid4().hex[:6]}",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    EXTRA_BLOB_DIRS.append(home / "blobs")
    worker: WorkerProcess | None = None
    try:
        settings = Settings.from_env()
        client = await connect(address, settings=settings)
        path = tmp_path / "runs.json"
        path.write_text(json.dumps(synthetic_runs(N_RUNS)))
        inp = rr.build_batch_input(
            rr.upload_batch([path], settings, split=True), concurrency=2, children_per_run=5
        )
        worker = WorkerProcess(env, tmp_path / "w.log")
        worker.wait_ready()
        handle = await rr.start_batch(client, inp, env["RR_TASK_QUEUE"], f"srv-batch-{uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + 60
        while len(await _children(client, handle.id)) < 2:
            assert time.monotonic() < deadline, "the batch made no progress"
            await asyncio.sleep(0.05)
        await server.astop()
        await asyncio.sleep(2)  # the worker polls a server that is gone
        await server.astart(timeout=60)
        client = await connect(address, settings=settings)
        out = await asyncio.wait_for(
            client.get_workflow_handle(handle.id, result_type=BatchOutput).result(), 150
        )
        assert (out.reflected, out.failed) == (N_RUNS, 0)
        after = await _children(client, handle.id)
        assert len(after) == N_RUNS and all(len(runs) == 1 for runs in after.values())
    finally:
        if worker is not None:
            worker.stop()
        await server.astop()
