"""The `rr` CLI in subprocesses: the embedded default end to end, and a clear error for each bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reflector.runtime.devserver import is_reachable
from tests.support import prefork
from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"


def _rr_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "rr"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]


def rr(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    base = user_env()
    return prefork.run(
        [*_rr_cmd(), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def home_env(tmp_path: Path) -> dict[str, str]:
    return {"RR_HOME": str(tmp_path / "rr-home")}


@pytest.mark.slow
def test_reflect_result_replay_on_embedded_default(home_env: dict[str, str]) -> None:
    if is_reachable("localhost:7233"):
        pytest.skip(
            "a Temporal server already listens on localhost:7233; the embedded-default test needs it free"
        )
    p = rr("reflect", str(EXAMPLE), "--json", env=home_env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "embedded" in p.stderr and "not an LLM" in p.stderr
    assert out["raw"]["rr_trace"]["stop_reason"] == "completed"
    assert out["raw"]["rr_trace"]["cells"] >= 1
    assert out["extracted_learnings"] and out["extracted_learnings"][0]["evidence"]
    assert "408" in json.dumps(out)  # the ground truth from the trace reached the reflection via a cell
    wf_id = out["raw"]["workflow_id"]
    assert (Path(home_env["RR_HOME"]) / "temporal.sqlite").exists()

    p2 = rr("result", wf_id, "--json", env=home_env)
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout) == out

    p3 = rr("result", wf_id, env=home_env)
    assert p3.returncode == 0 and "Learnings:" in p3.stdout and "not an LLM" in p3.stdout

    p4 = rr("replay", wf_id, env=home_env)
    assert p4.returncode == 0, p4.stderr
    assert "OK" in p4.stdout


def _one_line_error(p: subprocess.CompletedProcess[str], needle: str) -> None:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("rr: error:")]
    assert len(lines) == 1, p.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


def test_missing_file(home_env: dict[str, str], tmp_path: Path) -> None:
    _one_line_error(rr("reflect", str(tmp_path / "nope.json"), env=home_env), "not found")


def test_empty_file(home_env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "empty.json"
    f.write_text("")
    _one_line_error(rr("reflect", str(f), env=home_env), "empty")


def test_invalid_json(home_env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "bad.json"
    f.write_text('{"question": "q", "steps": [1, 2,')
    _one_line_error(rr("reflect", str(f), env=home_env), "json")


def test_trace_over_the_limit(home_env: dict[str, str]) -> None:
    _one_line_error(
        rr("reflect", str(EXAMPLE), env={**home_env, "RR_MAX_TRACE_BYTES": "100"}), "RR_MAX_TRACE_BYTES"
    )


def test_unknown_model(home_env: dict[str, str]) -> None:
    _one_line_error(
        rr("reflect", str(EXAMPLE), "--model", "nonexistent-model-xyz", env=home_env), "nonexistent-model-xyz"
    )


def test_unreachable_explicit_address(home_env: dict[str, str]) -> None:
    env = {**home_env, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    _one_line_error(rr("reflect", str(EXAMPLE), env=env), "not reachable")


def test_worker_with_an_unreachable_server_or_bad_settings(home_env: dict[str, str], temporal_server) -> None:
    down = rr("worker", env={**home_env, "TEMPORAL_ADDRESS": "127.0.0.1:1"}, timeout=60)
    _one_line_error(down, "not reachable")
    assert "starting" not in down.stdout, down.stdout  # said before any worker process was started
    live = {**home_env, "TEMPORAL_ADDRESS": temporal_server.address}
    for name, value, msg in [
        ("RR_MAX_CONCURRENT_WORKFLOW_TASKS", "many", "must be a whole number"),
        ("RR_MAX_CONCURRENT_ACTIVITIES", "0", "must be >= 1"),
        ("RR_STICKY_TIMEOUT_S", "soon", "must be a number"),
        ("RR_STICKY_TIMEOUT_S", "nan", "must be a number"),  # (every comparison with nan is False)
        ("RR_PAYLOAD_THRESHOLD_BYTES", "-1", "must be >= 0"),
        ("RR_SANDBOX_ISOLATION", "off", "must be one of auto, strict, language-only"),
        ("RR_EVENT_LOOP", "trio", "must be auto, uvloop or asyncio"),
    ]:
        _one_line_error(rr("worker", env={**live, name: value}, timeout=60), f"{name} {msg}")
    # settings every command reads
    _one_line_error(
        rr("reflect", str(EXAMPLE), env={**live, "RR_MAX_TRACE_BYTES": "lots"}),
        "RR_MAX_TRACE_BYTES must be a whole number",
    )
    # the embedded server's linger, read where the home's server is leased (no TEMPORAL_ADDRESS)
    for value in ("nan", "-1", "1e309"):
        _one_line_error(
            rr("list", env={**home_env, "RR_EMBEDDED_LINGER_S": value}), "RR_EMBEDDED_LINGER_S must be"
        )


def test_worker_prints_the_sandbox_isolation_and_event_loop_it_achieved(
    home_env: dict[str, str], temporal_server
) -> None:
    import signal

    from sandbox.confinement import landlock_abi

    if sys.platform != "linux" or landlock_abi() < 1:
        pytest.skip("needs Linux with Landlock")
    base = user_env()
    from reflector.runtime.event_loop import uvloop_installed

    default_loop = "uvloop" if uvloop_installed() else "asyncio"
    for mode, expect, loop_setting, loop in [
        ("", "sandbox: namespaces", "", f"event loop: {default_loop} (RR_EVENT_LOOP=auto)"),
        ("language-only", "sandbox: language-only", "asyncio", "event loop: asyncio (RR_EVENT_LOOP=asyncio)"),
    ]:
        env = {
            **base,
            **home_env,
            "TEMPORAL_ADDRESS": temporal_server.address,
            "RR_SANDBOX_ISOLATION": mode,
            "RR_EVENT_LOOP": loop_setting,
        }
        proc = prefork.Popen(
            [*_rr_cmd(), "worker", "--processes", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline()]
            while lines[-1] and not lines[-1].startswith("store id:"):  # the last line of its start
                lines.append(proc.stdout.readline())
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        sandbox_line = next((ln for ln in lines if ln.startswith("sandbox:")), "")
        assert loop + "\n" in lines, (lines, err)
        assert sandbox_line.startswith(expect), (lines, err)
        if mode == "":
            assert all(layer in sandbox_line for layer in ("landlock", "seccomp", "no-new-privs")), (
                sandbox_line
            )
        else:
            assert "WARNING" in err and "WITHOUT the OS sandbox" in err, err


def test_result_of_unknown_id_with_explicit_server(home_env: dict[str, str], temporal_server) -> None:
    p = rr("result", "no-such-reflection", env={**home_env, "TEMPORAL_ADDRESS": temporal_server.address})
    _one_line_error(p, "no-such-reflection")


def test_result_of_a_running_reflection_says_so(
    home_env: dict[str, str], temporal_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import uuid

    from reflector import client as c
    from reflector.client import connect
    from reflector.contract import ReflectionConfig
    from reflector.runtime.settings import Settings

    async def start() -> str:
        client = await connect(temporal_server.address)
        ref = c.upload_trace(EXAMPLE, Settings.from_env())
        # no worker polls this queue: the reflection stays running
        handle = await c.start_reflection(
            client,
            c.build_input(ref, config=ReflectionConfig()),
            f"nobody-{uuid.uuid4().hex[:6]}",
            f"running-{uuid.uuid4().hex[:6]}",
        )
        return handle.id

    async def terminate(wf_id: str) -> None:
        client = await connect(temporal_server.address)
        await client.get_workflow_handle(wf_id).terminate("test cleanup")

    monkeypatch.setenv("RR_HOME", home_env["RR_HOME"])
    wf_id = asyncio.run(start())
    try:
        p = rr("result", wf_id, env={**home_env, "TEMPORAL_ADDRESS": temporal_server.address})
        assert p.returncode == 3, p.stderr
        assert "still running" in p.stderr and "Traceback" not in p.stderr
    finally:
        asyncio.run(terminate(wf_id))
