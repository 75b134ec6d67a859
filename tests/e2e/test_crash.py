"""Crash recovery with real processes: SIGKILL a worker mid-reflection, a new worker finishes it.

The output must equal an uncrashed run's, and no completed model request may run twice: the
only request allowed to execute again is the one in flight at the kill. Model requests are local
activities whose responses reach the history only every few seconds, so the new worker re-executes
the recent ones; the response cache is what keeps them from reaching the model again.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from pathlib import Path

import pytest

import reflector.testing.scripted  # noqa: F401  (registers the scripted models in this process too)
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import comparable, write_trace
from tests.support.procs import WorkerProcess, assert_no_completed_request_ran_twice, read_model_log

pytestmark = pytest.mark.slow


def _comparable(out: ReflectorOutput) -> dict[str, object]:
    return comparable(out)


async def _wait_for(cond, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


@pytest.fixture
def crash_env(temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"crash-{uuid.uuid4().hex[:6]}",
        "RR_TEST_MODEL_LOG": str(tmp_path / "model.log"),
        "RR_TEST_SLOW_LOOP": "30000000",
        "RR_STICKY_TIMEOUT_S": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    EXTRA_BLOB_DIRS.append(home / "blobs")
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    return env


async def _run(env: dict[str, str], tmp_path: Path, kill_when, tag: str):
    settings = Settings.from_env()
    client = await connect(env["TEMPORAL_ADDRESS"])
    trace = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        trace,
        question="What is 17 * 24?",
        ground_truth="408",
        config=ReflectionConfig(model="scripted-stateful"),
    )
    w1 = WorkerProcess(env, tmp_path / f"{tag}-w1.log")
    w2: WorkerProcess | None = None
    try:
        w1.wait_ready()
        handle = await rr.start_reflection(client, inp, env["RR_TASK_QUEUE"], f"{tag}-{uuid.uuid4().hex[:8]}")
        recovery = None
        if kill_when is not None:
            await _wait_for(lambda: kill_when(handle.id))
            w1.kill()
            t_kill = time.monotonic()
            w2 = WorkerProcess(env, tmp_path / f"{tag}-w2.log")
            w2.wait_ready()
        out = await asyncio.wait_for(handle.result(), 120)
        if kill_when is not None:
            recovery = time.monotonic() - t_kill
        history = await handle.fetch_history()
        return out, history, recovery, w1.proc.pid
    finally:
        w1.stop()
        if w2:
            w2.stop()


def _journal(env: dict[str, str], wf_id: str, seq: int) -> Path:
    return Path(env["RR_HOME"]) / "blobs" / "sessions" / wf_id / f"{seq:08d}.json"


async def test_kill_during_slow_cell(crash_env, tmp_path) -> None:
    base_out, _, _, _ = await _run(crash_env, tmp_path, None, "base")
    Path(crash_env["RR_TEST_MODEL_LOG"]).unlink()

    log_path = Path(crash_env["RR_TEST_MODEL_LOG"])

    def slow_cell_running(_wf_id: str) -> bool:
        # the model answered with the slow cell (5 messages seen) after the second model cell (seq 4)
        entries = read_model_log(log_path)
        return any(e["n"] == 5 for e in entries) and _journal(crash_env, _wf_id, 4).exists()

    def trigger(wf_id: str) -> bool:
        if not slow_cell_running(wf_id):
            return False
        time.sleep(0.4)  # well inside the ~2 s slow cell
        assert not _journal(crash_env, wf_id, 5).exists(), (
            "slow cell finished before the kill; raise RR_TEST_SLOW_LOOP"
        )
        return True

    out, hist, recovery, pid1 = await _run(crash_env, tmp_path, trigger, "slowcell")
    assert _comparable(out) == _comparable(base_out)
    assert_no_completed_request_ran_twice(read_model_log(log_path), hist, pid1)
    print(f"recovery after kill during slow cell: {recovery:.2f}s")


async def test_kill_between_model_requests(crash_env, tmp_path) -> None:
    base_out, _, _, _ = await _run(crash_env, tmp_path, None, "base2")
    log_path = Path(crash_env["RR_TEST_MODEL_LOG"])
    log_path.unlink()

    def trigger(wf_id: str) -> bool:
        # the second model cell (seq 4; 1-2 are prefill and facts) completed in the host: its result is not yet recorded and the next
        # model request has not been issued (it needs the workflow task that records the cell first)
        return _journal(crash_env, wf_id, 4).exists()

    out, hist, recovery, pid1 = await _run(crash_env, tmp_path, trigger, "between")
    assert _comparable(out) == _comparable(base_out)
    assert_no_completed_request_ran_twice(read_model_log(log_path), hist, pid1)
    print(f"recovery after kill between requests: {recovery:.2f}s")


async def test_graceful_stop_mid_reflection_loses_and_repeats_nothing(crash_env, tmp_path) -> None:
    """SIGTERM (a deploy) while model requests and cells run inside the worker's workflow task: the
    worker finishes the request in flight and hands over; the next worker completes the reflection
    and no model request is sent twice, not even the one in flight."""
    settings = Settings.from_env()
    client = await connect(crash_env["TEMPORAL_ADDRESS"])
    trace = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(trace, config=ReflectionConfig(model="scripted-paced-20"))
    log_path = Path(crash_env["RR_TEST_MODEL_LOG"])
    w1 = WorkerProcess(crash_env, tmp_path / "graceful-w1.log")
    w2: WorkerProcess | None = None
    try:
        w1.wait_ready()
        handle = await rr.start_reflection(
            client, inp, crash_env["RR_TASK_QUEUE"], f"grace-{uuid.uuid4().hex[:8]}"
        )
        await _wait_for(lambda: len(read_model_log(log_path)) >= 5)
        t_stop = time.monotonic()
        w1.stop()
        stopped_in = time.monotonic() - t_stop
        assert w1.proc.returncode == 0, w1.log.read_text()[-2000:]
        w2 = WorkerProcess(crash_env, tmp_path / "graceful-w2.log")
        w2.wait_ready()
        out = await asyncio.wait_for(handle.result(), 120)
    finally:
        w1.stop()
        if w2:
            w2.stop()
    assert out.raw["rr_trace"]["cells"] == 20 and out.raw["rr_trace"]["stop_reason"] == "completed"
    log = read_model_log(log_path)
    counts = collections.Counter(e["key"] for e in log)
    assert len(counts) == 21 and max(counts.values()) == 1, counts
    assert {e["pid"] for e in log} == {w1.proc.pid, w2.proc.pid}  # both workers did part of the work
    # the stopping worker handed over instead of finishing the reflection (~5 s of model time)
    assert stopped_in < 3.0, stopped_in
    print(
        f"graceful stop took {stopped_in:.2f} s; requests per worker "
        f"{collections.Counter(e['pid'] for e in log)}"
    )
