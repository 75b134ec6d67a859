"""`rr rerun` in subprocesses: a rerun printed like `rr reflect`, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_cli import _one_line_error, rr
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import write_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def env(temporal_server, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "rr-home"
    EXTRA_BLOB_DIRS.append(home / "blobs")  # the final replay test replays these histories too
    # a private task queue no worker polls: each command runs its in-process worker
    return {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"rerun-cli-{uuid.uuid4().hex[:6]}",
        "RR_PLUGINS": "reflector.testing.scripted",
    }


def test_rerun_prints_the_new_reflection_and_its_origin(env: dict[str, str], tmp_path: Path) -> None:
    p = rr("reflect", str(write_trace(tmp_path)), "--model", "scripted-steps-3", "--json", env=env)
    assert p.returncode == 0, p.stderr
    origin = json.loads(p.stdout)
    origin_id = origin["raw"]["workflow_id"]
    assert origin["raw"]["rr_trace"]["total_iterations"] == 4

    p2 = rr("rerun", origin_id, "--from-step", "3", "--json", "--id", f"{origin_id}-rerun", env=env)
    assert p2.returncode == 0, p2.stderr
    out = json.loads(p2.stdout)
    assert out["raw"]["workflow_id"] == f"{origin_id}-rerun"
    assert out["raw"]["rerun"]["origin"] == origin_id and out["raw"]["rerun"]["from_step"] == 3
    assert out["raw"]["rerun"]["reused_requests"] == 2 and out["raw"]["rerun"]["reused_cells"] == 2
    assert out["raw"]["usage"]["requests"] == 2  # steps 3 and 4, the only ones paid
    assert f"rerun of {origin_id} from step 3 of 4" in p2.stderr
    assert "replayed in the sandbox host" in p2.stderr
    assert out["error_identification"] == origin["error_identification"]

    p3 = rr("rerun", origin_id, "--from-step", "2", env=env)  # the human rendering, like `rr reflect`
    assert p3.returncode == 0, p3.stderr
    assert "Learnings:" in p3.stdout

    for args, needle in (
        (["--from-step", "5"], "--from-step must be between 1 and 4"),
        (["--from-step", "0"], "--from-step must be between 1 and 4"),
        (["--from-step", "2", "--max-requests", "0"], "--max-requests must be at least 1"),
    ):
        bad = rr("rerun", origin_id, *args, env=env)
        _one_line_error(bad, needle)
        assert bad.returncode == 2
    unknown = rr("rerun", "no-such-reflection", "--from-step", "1", env=env)
    _one_line_error(unknown, "no reflection with id 'no-such-reflection'")
    assert unknown.returncode == 2
