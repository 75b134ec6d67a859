"""`rr --version`, and `rr reflect -`: the trace read from stdin gives the same reflection as the file."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import EXAMPLE, _rr_cmd
from tests.support import prefork

NO_SERVER = "127.0.0.1:1"  # the tests that must fail before connecting point at nothing


def rr_in(
    *args: str, stdin: bytes, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    p = prefork.run(
        [*_rr_cmd(), *args], env={**base, **env}, input=stdin, capture_output=True, timeout=timeout
    )
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "rr-home"


def _one_line_error(p: subprocess.CompletedProcess[str], needle: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("rr: error:")]
    assert len(lines) == 1 and needle in lines[0], p.stderr
    return lines[0]


def test_version() -> None:
    p = prefork.run(
        [*_rr_cmd(), "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"rr {metadata.version('durable-recursive-reflector')}\n"


def _without_ids(out: dict[str, Any]) -> dict[str, Any]:
    wf_id = out["raw"]["workflow_id"]
    return dict(json.loads(json.dumps(out).replace(wf_id, "<id>")))


@pytest.mark.slow
async def test_reflect_from_stdin_is_the_reflection_of_the_file(home: Path, temporal_server) -> None:
    from reflector.client import connect
    from reflector.runtime import search_attributes as sa

    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"rr-stdin-{uuid.uuid4().hex[:8]}",
    }  # no other worker: rr runs one in-process
    piped = rr_in("reflect", "-", "--json", stdin=EXAMPLE.read_bytes(), env=env)
    assert piped.returncode == 0, piped.stderr
    from_file = rr_in("reflect", str(EXAMPLE), "--json", stdin=b"", env=env)
    assert from_file.returncode == 0, from_file.stderr
    a, b = json.loads(piped.stdout), json.loads(from_file.stdout)
    assert a["raw"]["rr_trace"]["stop_reason"] == "completed" and a["extracted_learnings"]
    assert _without_ids(a) == _without_ids(b)
    assert f"(trace ace, {EXAMPLE.stat().st_size:,} bytes)" in piped.stderr, (
        piped.stderr
    )  # detected from content
    assert list((home / "tmp").iterdir()) == []  # the spooled copy is gone
    client = await connect(temporal_server.address, read_only=True)
    memos = [
        await (await client.get_workflow_handle(out["raw"]["workflow_id"]).describe()).memo()
        for out in (a, b)
    ]
    assert [sa.memo_of(m)["trace"] for m in memos] == ["<stdin>", EXAMPLE.name]  # what `rr list` shows


def test_empty_stdin_is_a_one_line_error(home: Path) -> None:
    env = {"RR_HOME": str(home), "TEMPORAL_ADDRESS": NO_SERVER}
    _one_line_error(rr_in("reflect", "-", stdin=b"", env=env), "the trace on stdin is empty")
    _one_line_error(rr_in("reflect", "-", stdin=b"  \n", env=env), "empty (whitespace only): <stdin>")
    assert list((home / "tmp").iterdir()) == []


def test_a_bad_trace_on_stdin_is_named_stdin(home: Path) -> None:
    env = {"RR_HOME": str(home), "TEMPORAL_ADDRESS": NO_SERVER}
    line = _one_line_error(
        rr_in("reflect", "-", stdin=b'{"question": "q", "steps": [1, 2,', env=env), "invalid JSON in <stdin>"
    )
    assert str(home) not in line
    over = {**env, "RR_MAX_TRACE_BYTES": "100"}
    _one_line_error(rr_in("reflect", "-", stdin=EXAMPLE.read_bytes(), env=over), "RR_MAX_TRACE_BYTES")
    assert list((home / "tmp").iterdir()) == []


def test_stdin_is_one_trace_not_a_batch(home: Path) -> None:
    env = {"RR_HOME": str(home), "TEMPORAL_ADDRESS": NO_SERVER}
    _one_line_error(rr_in("reflect", "-", str(EXAMPLE), stdin=b"{}", env=env), "reads one trace from stdin")
    _one_line_error(rr_in("reflect", "-", "--batch", stdin=b"{}", env=env), "reads one trace from stdin")
