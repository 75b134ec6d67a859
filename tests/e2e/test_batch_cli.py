"""`rr reflect` on several files and with `--batch`, `rr result` of a batch, in subprocesses."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from reflector.testing.tau_runs import tau_run
from tests.e2e.test_cli import rr
from tests.support.blob_dirs import EXTRA_BLOB_DIRS

pytestmark = pytest.mark.slow


@pytest.fixture
def env(temporal_server, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "rr-home"
    EXTRA_BLOB_DIRS.append(home / "blobs")  # the final replay test replays the children's histories too
    # a private task queue that no worker polls: `rr reflect` runs its in-process worker
    return {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"batch-cli-{uuid.uuid4().hex[:6]}",
    }


def test_reflect_two_files_is_a_batch(env: dict[str, str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(tau_run(1, errors={"get_user_details": 1}, book=False)))
    b.write_text(json.dumps(tau_run(2, errors={"get_user_details": 2}, book=False)))
    p = rr("reflect", str(a), str(b), "--json", "--concurrency", "2", env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["n_runs"], out["reflected"], out["failed"]) == (2, 2, 0)
    assert [r["run_id"] for r in out["run_records"]] == [str(a), str(b)]
    modes = {m["key"]: m for m in out["synthesis"]["failure_modes"]}
    assert modes["tool_error:get_user_details"]["runs"] == 2
    assert modes["tool_error:get_user_details"]["run_ids"] == [str(a), str(b)]
    assert "started batch" in p.stderr and "2 runs, 2 at a time" in p.stderr

    # `rr result` of a batch prints it again (text), `rr replay` replays its history
    p2 = rr("result", out["batch_id"], env=env)
    assert p2.returncode == 0, p2.stderr
    assert (
        f"Batch {out['batch_id']}" in p2.stdout
        and "tool get_user_details returned an error: 2 of 2 runs" in p2.stdout
    )
    p3 = rr("replay", out["batch_id"], env=env)
    assert p3.returncode == 0 and "OK" in p3.stdout, p3.stderr


def test_reflect_one_file_with_batch(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in (tau_run(1), tau_run(2, wrong_cabin=True), tau_run(3)))
    )
    p = rr("reflect", str(path), "--batch", env=env)
    assert p.returncode == 0, p.stderr
    assert "runs: 3  reflected: 3  failed: 0" in p.stdout
    assert "1 failed, 2 succeeded" in p.stdout
    assert "task2-trial0" in p.stdout and "not an LLM" in p.stdout
    # per-run options make no sense for a batch; a file that does not parse starts nothing
    bad = rr("reflect", str(path), "--batch", "--question", "q", env=env)
    assert bad.returncode == 2 and "rr: error:" in bad.stderr and "Traceback" not in bad.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('[{"traj": []}, {"traj": ')
    p4 = rr("reflect", str(broken), "--batch", env=env)
    assert p4.returncode == 2 and "invalid JSON" in p4.stderr and "Traceback" not in p4.stderr
