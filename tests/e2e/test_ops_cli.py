"""`rr list`, `rr cancel` and `rr setup` in subprocesses against the session's dev server and a real
`rr worker` subprocess: the text and `--json` outputs, the exit codes, unknown ids, and a namespace
without rr's search attributes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import _rr_cmd
from tests.e2e.test_hostile_cli import Running, _env
from tests.support import endless, prefork
from tests.support.procs import WorkerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
PLUGINS = f"reflector.testing.scripted,{endless.__name__}"

pytestmark = pytest.mark.timeout(240)


def rr(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return prefork.run(
        [*_rr_cmd(), *args],
        env=_env(env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _errors(p: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in p.stderr, p.stderr
    return [ln for ln in p.stderr.splitlines() if ln.startswith("rr: error:")]


@pytest.fixture
def live(temporal_server, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private RR_HOME and task queue on the session's server, with one `rr worker` polling it."""
    env = {
        "RR_HOME": str(tmp_path / "rr-home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"ops-{uuid.uuid4().hex[:8]}",
        "RR_PLUGINS": PLUGINS,
    }
    worker = WorkerProcess({**env, "PYTHONPATH": str(REPO_ROOT)}, tmp_path / "worker.log")
    try:
        worker.wait_ready(60)
        yield env
    finally:
        worker.stop()


def _started_id(line: str) -> str:
    return line.split("started reflection ", 1)[1].split()[0]


def _wait_for_cells(env: dict[str, str], wf_id: str, n: int) -> None:
    """Until the reflection's progress query reports `n` cells (it never ends by itself)."""
    from reflector.client import connect
    from reflector.contract import PROGRESS_QUERY, Progress

    async def wait() -> None:
        client = await connect(env["TEMPORAL_ADDRESS"])
        for _ in range(600):
            try:
                if (
                    await client.get_workflow_handle(wf_id).query(PROGRESS_QUERY, result_type=Progress)
                ).cells >= n:
                    return
            except Exception:  # not started by a worker yet
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"{wf_id} never ran {n} cells")

    asyncio.run(wait())


def _rows(p: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert isinstance(rows, list)
    return {row["id"]: row for row in rows}


def test_list_cancel_result_and_their_exit_codes(live: dict[str, str]) -> None:
    done = rr("reflect", str(EXAMPLE), "--model", "scripted-steps-3", "--json", env=live)
    assert done.returncode == 0, done.stderr
    done_id = json.loads(done.stdout)["raw"]["workflow_id"]

    run = Running(
        "reflect",
        str(EXAMPLE),
        "--model",
        endless.MODEL,
        "--max-requests",
        "5000",
        "--max-tokens",
        "100000000",
        env=live,
    )
    try:
        wf_id = _started_id(run.wait_for("started reflection", 60))
        _wait_for_cells(live, wf_id, 2)
        running = _rows(rr("list", "--status", "running", "--json", "--limit", "100", env=live))
        assert wf_id in running and done_id not in running
        assert running[wf_id]["status"] == "running" and running[wf_id]["model"] == endless.MODEL
        assert running[wf_id]["trace"] == EXAMPLE.name and running[wf_id]["stop_reason"] is None

        cancelled = rr("cancel", wf_id, "--json", env=live)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"{wf_id} was CANCELLED" in cancelled.stderr and not _errors(cancelled)
        report = json.loads(cancelled.stdout)
        assert (report["outcome"], report["kind"], report["status"]) == (
            "cancelled",
            "reflection",
            "completed",
        )
        out = report["output"]
        assert out["raw"]["rr_trace"]["stop_reason"] == "cancelled"
        assert "finding 0" in out["error_identification"]  # the findings so far
        # the `rr reflect` that was waiting prints the cancelled reflection and exits with its own code
        assert run.wait(60) == 5
        assert "CANCELLED" in run.stderr
    finally:
        run.kill()

    result = rr("result", wf_id, env=live)
    assert result.returncode == 5, result.stderr
    assert (
        "stop: cancelled" in result.stdout and "CANCELLED" in result.stdout and "exit code 5" in result.stderr
    )
    as_json = rr("result", wf_id, "--json", env=live)
    assert as_json.returncode == 5 and json.loads(as_json.stdout) == out

    again = rr("cancel", wf_id, env=live)
    assert again.returncode == 6, again.stderr
    assert "had already finished" in again.stderr and not _errors(again)

    unknown = rr("cancel", "no-such-reflection", env=live)
    assert unknown.returncode == 2 and _errors(unknown) == [
        "rr: error: no reflection with id 'no-such-reflection'"
    ]

    every = _rows(rr("list", "--json", "--limit", "200", env=live))
    assert every[wf_id]["stop_reason"] == "cancelled" and every[done_id]["stop_reason"] == "completed"
    assert every[done_id]["requests"] == json.loads(done.stdout)["raw"]["usage"]["requests"]
    assert wf_id in _rows(rr("list", "--status", "incomplete", "--json", "--limit", "200", env=live))
    completed = _rows(rr("list", "--status", "completed", "--json", "--limit", "200", env=live))
    assert done_id in completed and wf_id not in completed
    table = rr("list", "--limit", "200", env=live)
    assert table.returncode == 0 and not _errors(table)
    header, *lines = table.stdout.splitlines()
    assert header.split()[:4] == ["ID", "STARTED", "DURATION", "STATUS"]
    assert any(line.startswith(wf_id) and "cancelled" in line for line in lines), table.stdout
    bad = rr("list", "--limit", "0", env=live)
    assert bad.returncode == 2 and len(_errors(bad)) == 1


def test_cancel_without_a_worker_is_requested_and_says_so(
    temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflector import client as c
    from reflector.contract import ReflectionConfig
    from reflector.runtime.settings import Settings

    env = {"RR_HOME": str(tmp_path / "rr-home"), "TEMPORAL_ADDRESS": temporal_server.address}
    monkeypatch.setenv("RR_HOME", env["RR_HOME"])
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)

    async def start() -> str:
        client = await c.connect(temporal_server.address, settings=Settings.from_env())
        ref = c.upload_trace(EXAMPLE, Settings.from_env())
        handle = await c.start_reflection(
            client,
            c.build_input(ref, config=ReflectionConfig()),
            f"nobody-{uuid.uuid4().hex[:6]}",
            f"ops-{uuid.uuid4().hex[:8]}",
        )
        return handle.id

    async def terminate(wf_id: str) -> None:
        client = await c.connect(temporal_server.address, settings=Settings.from_env())
        await client.get_workflow_handle(wf_id).terminate("test cleanup")

    wf_id = asyncio.run(start())
    try:
        p = rr("cancel", wf_id, "--wait", "1", "--json", env=env)
        assert p.returncode == 3, p.stderr
        assert json.loads(p.stdout)["outcome"] == "cancel_requested" and "has not closed yet" in p.stderr
    finally:
        asyncio.run(terminate(wf_id))


def test_list_and_setup_in_a_namespace_without_the_attributes(temporal_server, tmp_path: Path) -> None:
    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
    from temporalio.client import Client

    ns = f"ops-bare-{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        client = await Client.connect(temporal_server.address)
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace=ns, workflow_execution_retention_period=Duration(seconds=86_400)
            )
        )

    asyncio.run(create())
    env = {
        "RR_HOME": str(tmp_path / "rr-home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": ns,
    }
    for _ in range(100):  # the namespace is usable once the frontend's namespace cache has it
        listed = rr("list", env=env)
        if "does not exist" not in listed.stderr:
            break
    assert listed.returncode == 0 and not _errors(listed), listed.stderr
    assert "search attributes are not registered" in listed.stderr and "rr setup" in listed.stderr
    assert "RrStopReason" in listed.stderr and "no reflection matches" in listed.stderr
    assert json.loads(rr("list", "--json", env=env).stdout) == []

    setup = rr("setup", env=env)
    assert setup.returncode == 0, setup.stderr
    assert "added RrModel" in setup.stdout
    twice = rr("setup", "--json", env=env)
    assert twice.returncode == 0 and json.loads(twice.stdout)["added"] == []
    after = rr("list", env=env)
    assert after.returncode == 0 and "not registered" not in after.stderr
