"""`rr export` and `rr replay ID|FILE` in subprocesses: exit codes, what they print, and one clear line for
an unknown id or a bad file. A reflection with a child is made once per module through `rr reflect`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import prefork
from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
PLAN = {"code": ["print('root', len(traces['steps']))"], "children": [{"code": ["print('child')"]}]}


def _rr_cmd() -> list[str]:
    import sys

    exe = Path(sys.executable).parent / "rr"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]


def rr(
    *args: str, env: dict[str, str], timeout: float = 180, fork: bool = True
) -> subprocess.CompletedProcess[str]:
    """`rr ARGS` forked from the suite's fork server, or exec'd (`fork=False`: a process that has only what
    its own imports and plugins registered; the fork server's process has the scripted models)."""
    base = user_env()
    return (prefork.run if fork else subprocess.run)(
        [*_rr_cmd(), *args],
        env={**base, "PYTHONPATH": str(REPO_ROOT), **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _one_line_error(p: subprocess.CompletedProcess[str], needle: str, code: int = 2) -> None:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("rr: error:")]
    assert len(lines) == 1, p.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


@pytest.fixture(scope="module")
def reflected(
    temporal_server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], str]]:
    """An env on the session's dev server, and the id of a finished reflection with one child."""
    home = tmp_path_factory.mktemp("export-cli")
    env = {
        "RR_HOME": str(home / "rr-home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"export-cli-{uuid.uuid4().hex[:8]}",
        "RR_PLUGINS": "reflector.testing.scripted",
    }
    wf_id = f"export-cli-{uuid.uuid4().hex[:8]}"
    p = rr(
        "reflect",
        str(EXAMPLE),
        "--model",
        "scripted-plan",
        "--question",
        "PLAN:" + json.dumps(PLAN),
        "--recursion",
        "always",
        "--id",
        wf_id,
        "--json",
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["raw"]["rr_trace"]["subagent_calls"][0]["child_workflow_id"] == f"{wf_id}.r1"
    yield env, wf_id


def test_export_to_stdout_file_and_split(reflected, tmp_path: Path) -> None:
    env, wf_id = reflected
    p = rr("export", wf_id, env=env)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["rr_export"] == 1 and data["root"] == wf_id
    assert [(h["workflow_id"], h["chain_index"], h["parent_workflow_id"]) for h in data["histories"]] == [
        (wf_id, 0, None),
        (f"{wf_id}.r1", 0, wf_id),
    ]
    assert "exported 2 histories" in p.stderr

    out = tmp_path / "export.json"
    p = rr("export", wf_id, "-o", str(out), "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text()) == data
    assert json.loads(p.stdout)["histories"] == 2
    assert [f.name for f in tmp_path.iterdir()] == ["export.json"]  # no temporary file left beside it

    split = tmp_path / "split"
    p = rr("export", wf_id, "--split", str(split), env=env)
    assert p.returncode == 0, p.stderr
    files = sorted(split.iterdir())
    assert len(files) == 2 and all(list(json.loads(f.read_text())) == ["events"] for f in files)
    assert [json.loads(f.read_text())["events"] for f in files] == [h["events"] for h in data["histories"]]
    again = rr("export", wf_id, "--split", str(split), env=env)  # never mixes two exports
    _one_line_error(again, "not an empty directory")


def test_replay_from_the_server_a_file_and_split_files(reflected, tmp_path: Path) -> None:
    env, wf_id = reflected
    p = rr("replay", wf_id, env=env)
    assert p.returncode == 0, p.stderr
    ok_lines = [line for line in p.stdout.splitlines() if line.startswith("OK ")]
    assert len(ok_lines) == 2 and wf_id in ok_lines[0] and f"{wf_id}.r1" in ok_lines[1]
    assert "OK: 2 histories" in p.stdout and "events/s" in p.stdout

    export = tmp_path / "export.json"
    assert rr("export", wf_id, "-o", str(export), env=env).returncode == 0
    split = tmp_path / "split"
    assert rr("export", wf_id, "--split", str(split), env=env).returncode == 0
    # offline: no server, and a blob store that does not exist
    offline = {**env, "TEMPORAL_ADDRESS": "127.0.0.1:1", "RR_BLOB_DIR": str(tmp_path / "none")}
    p = rr("replay", str(export), "--json", env=offline)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["ok"] and report["histories"] == 2 and report["failed"] == 0 and report["events"] > 0
    for f in sorted(split.iterdir()):
        p = rr("replay", str(f), env=offline)
        assert p.returncode == 0 and "OK: 1 history" in p.stdout, p.stderr
    p = rr("replay", str(split), env=offline)
    assert p.returncode == 0 and "OK: 2 histories" in p.stdout, p.stderr
    assert not (tmp_path / "none").exists()


def test_unknown_id_and_bad_files_are_one_clear_line(reflected, tmp_path: Path) -> None:
    env, _ = reflected
    _one_line_error(rr("export", "no-such-reflection", env=env), "no reflection with id 'no-such-reflection'")
    _one_line_error(rr("replay", "no-such-reflection", env=env), "no reflection with id 'no-such-reflection'")
    _one_line_error(rr("replay", str(tmp_path / "missing.json"), env=env), "no such file")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json")
    _one_line_error(rr("replay", str(garbage), env=env), "not JSON")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}))
    _one_line_error(rr("replay", str(other), env=env), "neither an rr export file")
    no_events = tmp_path / "empty-history.json"
    no_events.write_text(json.dumps({"events": []}))
    _one_line_error(rr("replay", str(no_events), env=env), "no events")
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"rr_export": 99, "root": "x", "histories": []}))
    _one_line_error(rr("replay", str(newer), env=env), "rr export format 99 is not supported")


def test_a_running_reflection_is_exported_and_replayed_as_far_as_it_goes(
    reflected, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, _ = reflected
    wf_id = f"export-running-{uuid.uuid4().hex[:8]}"

    async def start() -> None:
        from reflector import client as c
        from reflector.contract import ReflectionConfig
        from reflector.runtime.settings import Settings

        settings = Settings.from_env()
        client = await c.connect(env["TEMPORAL_ADDRESS"], settings=settings)
        ref = c.upload_trace(EXAMPLE, settings)
        await c.start_reflection(
            client, c.build_input(ref, config=ReflectionConfig()), f"nobody-{wf_id}", wf_id
        )

    async def terminate() -> None:
        from reflector.client import connect

        client = await connect(env["TEMPORAL_ADDRESS"])
        await client.get_workflow_handle(wf_id).terminate("test over")

    monkeypatch.setenv("RR_HOME", env["RR_HOME"])
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    try:
        asyncio.run(start())
        out = tmp_path / "running.json"
        p = rr("export", wf_id, "-o", str(out), env=env)
        assert p.returncode == 0, p.stderr
        assert "still running" in p.stderr and f"partial: {wf_id} run 0" in p.stderr
        p = rr("replay", str(out), env=env)
        assert p.returncode == 0, p.stderr
        assert "partial history: still running" in p.stdout
        assert "partial history of a running reflection" in p.stdout
    finally:
        asyncio.run(terminate())


def test_replay_without_the_plugin_of_its_model_says_so(reflected, tmp_path: Path) -> None:
    """A history of a model a plugin registers, replayed where that plugin is not loaded, fails; the report
    says it is the model, not a change of the code, and how to load it."""
    env, wf_id = reflected
    export = tmp_path / "export.json"
    assert rr("export", wf_id, "-o", str(export), env=env).returncode == 0
    offline = {**env, "TEMPORAL_ADDRESS": "127.0.0.1:1", "RR_PLUGINS": ""}
    p = rr("replay", str(export), env=offline, fork=False)
    assert p.returncode != 0 and "FAILED" in p.stdout, (p.returncode, p.stdout, p.stderr)
    assert "model 'scripted-plan' is not known in this process" in p.stdout, p.stdout
    assert "RR_PLUGINS" in p.stdout, p.stdout
