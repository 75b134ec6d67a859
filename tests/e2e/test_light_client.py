"""Commands that run no worker connect without pydantic-ai (`connect(for_workers=False)`); the others keep its plugin.

`rr status`, `result`, `list`, `cancel` and `export` read reflections: they never host a worker, so they connect
with the light payload converter (the same payloads: tests/unit/test_light_converter.py) and never import
pydantic-ai, about 1 s of CPU less per command. A client that may run a worker in its process keeps
`PydanticAIPlugin` (an in-process worker inherits its client's plugins).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"

pytestmark = pytest.mark.timeout(240)


def _rr(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`rr ARGS` with `-X importtime`: its stderr lists every module it imported."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "reflector.cli", *args],
        env={**base, "PYTHONPATH": str(REPO_ROOT), **env},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _imported(p: subprocess.CompletedProcess[str]) -> set[str]:
    """The modules a process imported (from its `-X importtime` lines)."""
    return {
        line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")
    } - {"imported package"}


def _messages(p: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))


def test_commands_that_read_reflections_never_import_pydantic_ai(temporal_server, tmp_path: Path) -> None:
    env = {
        "RR_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"light-{uuid.uuid4().hex[:8]}",
    }
    made = _rr("reflect", str(EXAMPLE), "--json", env=env)
    assert made.returncode == 0, _messages(made)
    assert "pydantic_ai.durable_exec.temporal" in _imported(made)  # it ran an in-process worker: the plugin
    wf_id = json.loads(made.stdout)["raw"]["workflow_id"]

    result = _rr("result", wf_id, "--json", env=env)
    status = _rr("status", wf_id, "--json", env=env)
    listing = _rr("list", "--json", env=env)
    cancel = _rr("cancel", wf_id, env=env)
    export = _rr("export", wf_id, "-o", str(tmp_path / "export.json"), env=env)
    unknown = _rr("status", "no-such-reflection", env=env)
    for p, code in ((result, 0), (status, 0), (listing, 0), (cancel, 6), (export, 0), (unknown, 2)):
        assert p.returncode == code, (p.args, _messages(p))
        assert "Traceback" not in p.stderr, _messages(p)
        leaked = sorted(m for m in _imported(p) if m.split(".")[0] == "pydantic_ai")
        assert not leaked, (p.args, leaked[:10])
        assert "temporalio.contrib.pydantic" in _imported(p) or p is unknown, p.args

    # what they read is what the reflection returned, decoded by the light converter
    assert json.loads(result.stdout) == json.loads(made.stdout)
    assert {k: json.loads(status.stdout)[k] for k in ("workflow_id", "status")} == {
        "workflow_id": wf_id,
        "status": "completed",
    }
    assert wf_id in {row["id"] for row in json.loads(listing.stdout)}
    assert "had already finished" in _messages(cancel)
    exported = json.loads((tmp_path / "export.json").read_text())
    assert exported, "an empty export"


async def test_a_client_that_may_run_a_worker_keeps_pydantic_ais_plugin(
    temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin

    from reflector.client import connect, runtime
    from reflector.runtime.settings import Settings
    from reflector.runtime.storage.converter import SharedPayloadConverter
    from reflector.runtime.storage.light_converter import LightPayloadConverter
    from worker import in_process_worker

    monkeypatch.setenv("RR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_server.address)
    settings = Settings.from_env()

    def kind(client: object) -> tuple[bool, type]:
        config = client.config()  # type: ignore[attr-defined]
        return (
            any(isinstance(p, PydanticAIPlugin) for p in config["plugins"]),
            config["data_converter"].payload_converter_class,
        )

    async with runtime(settings, in_process_worker=in_process_worker(["heuristic"])) as rt:
        assert kind(rt.client) == (True, SharedPayloadConverter)
    async with runtime(settings, want_worker=True, in_process_worker=in_process_worker(["heuristic"])) as rt:
        assert rt.local_worker
        assert kind(rt.client) == (True, SharedPayloadConverter)
    async with runtime(settings, want_worker=False) as rt:
        assert kind(rt.client) == (False, LightPayloadConverter)
    async with runtime(settings) as rt:  # no worker can run here (none given): nothing needs the plugin
        assert kind(rt.client) == (False, LightPayloadConverter)
    assert kind(await connect(settings=settings)) == (True, SharedPayloadConverter)
    assert kind(await connect(settings=settings, for_workers=False)) == (False, LightPayloadConverter)
