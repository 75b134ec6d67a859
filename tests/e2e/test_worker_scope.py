"""Two workers in one process, each on its own blob store (`activities.scope`).

A process may run workers with different settings (the Python API's in-process worker beside a program's
own, the suite's workers on several `RR_HOME`s). Each worker's activities must use that worker's blob
store, sandbox sessions and response cache: before they were bound per worker, the worker built last
re-pointed the process-wide ones, and the other worker's next cell looked for its trace in the wrong
store (`BlobNotFound`, seen in CI as a workflow test failing after the HTML-audit test's worker ran).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig, ReflectorOutput, session_key
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import RESPONSES_DIR, SESSIONS_DIR
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import write_trace

pytestmark = pytest.mark.slow


def _settings_at(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    home.mkdir()
    monkeypatch.setenv("RR_HOME", str(home))
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    settings = Settings.from_env()
    EXTRA_BLOB_DIRS.append(settings.blob_dir)  # the suite's final replay reads these histories' payloads
    return settings


def test_each_worker_uses_its_own_store(
    temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from activities import sandbox as sandbox_activities
    from worker import build_worker

    homes = {name: _settings_at(tmp_path / name, monkeypatch) for name in ("a", "b")}
    # while the workers run, the environment names a third home: activities must not read it
    _settings_at(tmp_path / "elsewhere", monkeypatch)

    async def main() -> dict[str, tuple[str, ReflectorOutput]]:
        clients = {n: await connect(temporal_server.address, settings=s) for n, s in homes.items()}
        queues = {n: f"scope-{n}-{uuid.uuid4().hex[:6]}" for n in homes}
        # both workers are built before either reflection starts: the one built last used to win
        async with (
            build_worker(clients["a"], queues["a"], settings=homes["a"]),
            build_worker(clients["b"], queues["b"], settings=homes["b"]),
        ):

            async def one(name: str) -> tuple[str, ReflectorOutput]:
                settings = homes[name]
                ref = rr.upload_trace(write_trace(tmp_path / f"trace-{name}"), settings)
                inp = rr.build_input(
                    ref,
                    question="What is 17 * 24?",
                    ground_truth="408",
                    config=ReflectionConfig(model="heuristic"),
                )
                handle = await rr.start_reflection(
                    clients[name], inp, queues[name], f"scope-{name}-{uuid.uuid4().hex}"
                )
                return handle.id, await handle.result()

            done = await asyncio.gather(one("a"), one("b"))
        await sandbox_activities.shutdown()
        return dict(zip(homes, done, strict=True))

    for d in ("trace-a", "trace-b"):
        (tmp_path / d).mkdir()
    results = asyncio.run(main())
    for name, (wf_id, out) in results.items():
        assert out.raw["rr_trace"]["stop_reason"] == "completed", (name, out.raw.get("error"))
        other = homes["b" if name == "a" else "a"]
        # its sandbox journal is in its own store, not in the other worker's, nor in the environment's
        assert (Path(homes[name].blob_dir) / SESSIONS_DIR / session_key(wf_id)).is_dir()
        assert not (Path(other.blob_dir) / SESSIONS_DIR / session_key(wf_id)).exists()
        assert not (tmp_path / "elsewhere" / "blobs" / SESSIONS_DIR).exists()
        assert not (Path(other.blob_dir) / RESPONSES_DIR / session_key(wf_id)).exists()
