"""Two workers that share nothing but S3 and the Temporal server: SIGKILL the one running a reflection
mid-session, the other finishes it.

Each worker (and the client) has its own RR_HOME, so its own local blob cache: the trace the client
uploaded, the cell journal the killed worker wrote, the model responses it cached and the large
payloads in the history (temporalio's S3 driver; the threshold is lowered so that many are offloaded)
reach the second worker only through the bucket. The kill comes while the slow cell runs, after the
history has recorded the cells before it: the second worker never re-runs those, it rebuilds the
sandbox from the journal it reads from S3, and the reflection ends exactly as an uncrashed one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import reflector.testing.scripted  # noqa: F401  (registers the scripted models in this process too)
from reflector import client as rr
from reflector.client import connect
from reflector.client.audit.events import local_activity
from reflector.contract import RUN_CELL_ACTIVITY, ReflectionConfig, session_key
from reflector.runtime.settings import Settings
from tests.support.fixtures import comparable, write_trace
from tests.support.procs import WorkerProcess, assert_no_completed_request_ran_twice, read_model_log
from tests.support.s3_server import S3Server, s3_server

pytest.importorskip("moto", reason="moto[server] comes with the dev extra")
pytestmark = [pytest.mark.slow, pytest.mark.server]


@pytest.fixture
def s3(tmp_path: Path):
    with s3_server(tmp_path / "moto.log") as server:
        yield server


@pytest.fixture
def env(
    s3: S3Server, temporal_server_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    server = (
        temporal_server_factory()
    )  # private: its histories name S3 payloads, replayed here while S3 is up
    common = {
        **s3.env(prefix="shared"),
        "TEMPORAL_ADDRESS": server.address,
        "RR_TASK_QUEUE": f"s3-{uuid.uuid4().hex[:6]}",
        "RR_TEST_MODEL_LOG": str(tmp_path / "model.log"),
        "RR_TEST_SLOW_LOOP": "80000000",  # the slow cell outlasts a workflow-task heartbeat (markers flushed)
        "RR_STICKY_TIMEOUT_S": "1",
        "RR_PAYLOAD_THRESHOLD_BYTES": "1024",
    }
    for k, v in {**common, "RR_HOME": str(tmp_path / "client")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    return common


def _worker(env: dict[str, str], tmp_path: Path, name: str) -> WorkerProcess:
    w = WorkerProcess({**env, "RR_HOME": str(tmp_path / name)}, tmp_path / f"{name}.log")
    w.wait_ready()
    return w


def _cells(history: Any, blob_dir: Path) -> dict[int, dict[str, Any]]:
    """The recorded outcome of every sandbox cell in a history, by its seq."""
    out = {}
    for ev in history.events:
        m = local_activity(ev, blob_dir)
        if m is not None and m.activity_type == RUN_CELL_ACTIVITY and isinstance(m.result, dict):
            out[int(m.result["seq"])] = m.result
    return out


async def test_a_worker_on_another_machine_finishes_a_killed_workers_reflection(env, s3, tmp_path) -> None:
    settings = Settings.from_env()
    client = await connect(settings=settings)
    trace = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        trace,
        question="What is 17 * 24?",
        ground_truth="408",
        config=ReflectionConfig(model="scripted-stateful"),
    )
    log_path = Path(env["RR_TEST_MODEL_LOG"])

    base_worker = _worker(env, tmp_path, "w0")
    try:
        base = await rr.start_reflection(client, inp, env["RR_TASK_QUEUE"], f"s3-base-{uuid.uuid4().hex[:6]}")
        base_out = await asyncio.wait_for(base.result(), 120)
    finally:
        base_worker.stop()
    log_path.unlink()

    w1 = _worker(env, tmp_path, "w1")
    w2: WorkerProcess | None = None
    try:
        handle = await rr.start_reflection(
            client, inp, env["RR_TASK_QUEUE"], f"s3-crash-{uuid.uuid4().hex[:6]}"
        )
        journal = f"shared/sessions/{session_key(handle.id)}/"
        deadline = time.monotonic() + 90
        while True:  # the slow cell (the model's 5th request) runs, and cell 4's outcome is in the history
            assert time.monotonic() < deadline, "the slow cell never ran with cell 4 recorded"
            slow = any(e["n"] == 5 for e in read_model_log(log_path))
            if slow and 4 in _cells(await handle.fetch_history(), settings.blob_dir):
                break
            await asyncio.sleep(0.05)
        assert f"{journal}00000004.json" in s3.keys(journal)
        assert f"{journal}00000005.json" not in s3.keys(journal), "the slow cell finished before the kill"
        w1.kill()
        assert not (tmp_path / "w2").exists()
        w2 = _worker(env, tmp_path, "w2")
        out = await asyncio.wait_for(handle.result(), 120)
        history = await handle.fetch_history()
    finally:
        w1.stop()
        if w2 is not None:
            w2.stop()

    assert comparable(out) == comparable(base_out)
    assert_no_completed_request_ran_twice(read_model_log(log_path), history, w1.proc.pid)
    cells = _cells(history, settings.blob_dir)
    # w2 rebuilt the session before re-running the slow cell: from the journal entries it read from S3
    assert cells[5]["host_restarted"] and cells[5]["cells_replayed"] >= 2, cells[5]
    assert {e["pid"] for e in read_model_log(log_path)} == {w1.proc.pid, w2.proc.pid}
    assert s3.keys("v0/"), "no payload went through temporalio's S3 driver"

    import worker  # the history replays with its payloads read from S3

    await worker.make_replayer(settings.blob_dir).replay_workflow(history)
