"""Hostile inputs and faults through the `rr` CLI in subprocesses (issue 10, the CLI parts).

Each case checks: the exit code, exactly one `rr: error:` line (or success for a valid input), no
`Traceback`, a bounded time (the subprocess timeout), and no reflection left Running (every workflow a
test starts is checked and terminated through a client).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from reflector.runtime.devserver import is_reachable
from reflector.runtime.settings import SettingError, env_flag
from tests.e2e.test_cli import _one_line_error, _rr_cmd
from tests.support import prefork
from tests.support.procs import WorkerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
PLUGINS = (
    "reflector.testing.scripted"  # registers scripted-paced-20: 20 steps at 0.25 s, slow enough to interrupt
)


def _env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    return {**base, "PYTHONPATH": str(REPO_ROOT), **env}


def rr(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return prefork.run(
        [*_rr_cmd(), *args],
        env=_env(env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Running:
    """`rr ARGS` in a subprocess whose stderr is read line by line in a thread (to wait for a line)."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = prefork.Popen(
            [*_rr_cmd(), *args],
            env=_env(env),
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first stderr line containing `needle` (fails after `timeout` or if the process exits)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((ln for ln in list(self.lines) if needle in ln), None)
            if found is not None:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"{needle!r} not seen on stderr within {timeout} s:\n" + self.stderr)

    def interrupt(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def wait(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)


def _ok(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "rr: error:" not in p.stderr, p.stderr


class Workflows:
    """Reflections a test started (directly or through the CLI): none may be left Running."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ids: list[str] = []  # reflections that must have ended by the end of the test
        self.left_running: list[str] = []  # reflections the test leaves running on purpose (terminated after)

    async def _client(self):
        from reflector.client import connect

        return await connect(self.address)

    def start_unworked(self, wf_id: str | None = None) -> str:
        """A reflection on a task queue nobody polls: it stays Running until terminated."""
        from reflector import client as c
        from reflector.contract import ReflectionConfig
        from reflector.runtime.settings import Settings

        async def start() -> str:
            client = await self._client()
            ref = c.upload_trace(EXAMPLE, Settings.from_env())
            handle = await c.start_reflection(
                client,
                c.build_input(ref, config=ReflectionConfig()),
                f"nobody-{uuid.uuid4().hex[:6]}",
                wf_id or f"hostile-{uuid.uuid4().hex[:8]}",
            )
            return handle.id

        wf = asyncio.run(start())
        self.left_running.append(wf)
        return wf

    def status(self, wf_id: str) -> str:
        async def get() -> str:
            return str((await (await self._client()).get_workflow_handle(wf_id).describe()).status.name)

        return asyncio.run(get())

    def wait_taken(self, wf_id: str, timeout: float = 30) -> None:
        """Until a worker has taken `wf_id`: a workflow task of it completed (the history records it)."""

        async def run() -> None:
            handle = (await self._client()).get_workflow_handle(wf_id)
            deadline = time.monotonic() + timeout
            while not any(
                e.HasField("workflow_task_completed_event_attributes")
                for e in (await handle.fetch_history()).events
            ):
                assert time.monotonic() < deadline, f"no worker took {wf_id} within {timeout} s"
                await asyncio.sleep(0.05)

        asyncio.run(run())

    def terminate_running(self) -> list[str]:
        """Terminate every tracked reflection still Running; returns those that should have ended."""
        from temporalio.client import WorkflowExecutionStatus

        async def run() -> list[str]:
            client = await self._client()
            left = []
            for wf_id in [*self.ids, *self.left_running]:
                handle = client.get_workflow_handle(wf_id)
                if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                    await handle.terminate("test cleanup")
                    if wf_id not in self.left_running:
                        left.append(wf_id)
            return left

        return asyncio.run(run())


@pytest.fixture
def live(
    temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dict[str, str], Workflows]]:
    """An env for the session's dev server with a private RR_HOME and task queue (no worker polls it)."""
    env = {
        "RR_HOME": str(tmp_path / "rr-home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"hostile-{uuid.uuid4().hex[:8]}",
    }
    monkeypatch.setenv("RR_HOME", env["RR_HOME"])
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    wfs = Workflows(temporal_server.address)
    yield env, wfs
    assert wfs.terminate_running() == [], "a reflection that should have ended was left Running"


def _started_id(line: str) -> str:
    return line.split("started reflection ", 1)[1].split()[0]


# ------------------------------------------------------------------------------------------------
# 1. a second `rr reflect` with no `rr worker` must not hang; a reflection no worker takes is reported
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_second_reflect_without_a_worker_does_not_hang(live) -> None:
    env, wfs = live
    for run in (1, 2):
        # the first run's in-process worker has exited, but the server still lists it as a poller
        p = rr("reflect", str(EXAMPLE), "--json", env=env, timeout=60)
        _ok(p)
        wfs.ids.append(json.loads(p.stdout)["raw"]["workflow_id"])
        assert "running an in-process worker" in p.stderr, (run, p.stderr)
    assert "did not take the reflection" in p.stderr, p.stderr


@pytest.mark.slow
def test_reflect_says_when_no_worker_takes_the_reflection(live, tmp_path: Path) -> None:
    env, wfs = live
    env = {**env, "RR_PLUGINS": PLUGINS, "RR_NO_WORKER_WARN_S": "2", "RR_STICKY_TIMEOUT_S": "1"}
    worker = WorkerProcess(env, tmp_path / "worker.log")
    run = None
    try:
        worker.wait_ready()
        run = Running("reflect", str(EXAMPLE), "--model", "scripted-paced-20", env=env)
        wfs.left_running.append(_started_id(run.wait_for("started reflection", 30)))
        wfs.wait_taken(wfs.left_running[-1])  # the worker has taken it
        worker.kill()
        # the dead worker's task times out (4 s), then nobody takes it for RR_NO_WORKER_WARN_S
        warning = run.wait_for("no worker is polling", 30)
        assert env["RR_TASK_QUEUE"] in warning and "rr worker" in warning, warning
        assert "in-process worker" not in run.stderr, run.stderr
        assert run.interrupt() == 130, run.stderr
        assert "Traceback" not in run.stderr, run.stderr
    finally:
        if run is not None:
            run.kill()
        worker.stop()


# ------------------------------------------------------------------------------------------------
# 2. one `rr: error:` line instead of a traceback
# ------------------------------------------------------------------------------------------------


def test_plugins_that_cannot_be_imported(live) -> None:
    env, _ = live
    bad = {**env, "RR_PLUGINS": "no_such_module"}
    _one_line_error(rr("reflect", str(EXAMPLE), env=bad), "RR_PLUGINS: cannot import 'no_such_module'")
    _one_line_error(rr("worker", env=bad), "RR_PLUGINS: cannot import 'no_such_module'")


def _read_only_dir(tmp_path: Path) -> Generator[Path]:
    ro = tmp_path / "read-only"
    ro.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a read-only tmpfs here (needs root); chmod 555 does not stop root")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize("kind", ["dev-null", "under-a-file", "read-only"])
def test_unusable_home_or_blob_dir(live, tmp_path: Path, kind: str) -> None:
    env, _ = live
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    ro_gen = None
    if kind == "dev-null":
        bad = Path("/dev/null/x")
    elif kind == "under-a-file":
        bad = a_file / "x"
    else:
        ro_gen = _read_only_dir(tmp_path)
        bad = next(ro_gen) / "x"
    try:
        good_blobs = str(tmp_path / "blobs")
        # reflect against a server: the blob store is unusable (through RR_HOME or RR_BLOB_DIR)
        _one_line_error(
            rr("reflect", str(EXAMPLE), env={**env, "RR_HOME": str(bad)}), "RR_HOME: cannot use the directory"
        )
        _one_line_error(
            rr("reflect", str(EXAMPLE), env={**env, "RR_BLOB_DIR": str(bad)}),
            f"RR_BLOB_DIR: cannot use the directory {bad}",
        )
        # rr worker
        _one_line_error(
            rr("worker", env={**env, "RR_BLOB_DIR": str(bad)}), "RR_BLOB_DIR: cannot use the directory"
        )
        if kind != "dev-null":
            return  # the other commands' checks are the same code: one kind of bad path is enough for them
        _one_line_error(rr("worker", env={**env, "RR_HOME": str(bad)}), "RR_HOME: cannot use the directory")
        # embedded mode: RR_HOME holds the server's SQLite file
        if not is_reachable("localhost:7233"):
            embedded = {"RR_HOME": str(bad), "RR_BLOB_DIR": good_blobs}
            _one_line_error(
                rr("reflect", str(EXAMPLE), env=embedded), f"RR_HOME: cannot use the directory {bad}"
            )
            _one_line_error(rr("result", "some-id", env=embedded), f"RR_HOME: cannot use the directory {bad}")
            _one_line_error(
                rr("server", "--port", "1", env=embedded), f"RR_HOME: cannot use the directory {bad}"
            )
    finally:
        if ro_gen is not None:
            ro_gen.close()


def test_disk_full_while_uploading_the_trace(live, tmp_path: Path) -> None:
    env, _ = live
    blobs = tmp_path / "tiny-blobs"
    blobs.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(blobs)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a 1 MiB tmpfs here (needs root)")
    try:
        trace = tmp_path / "big.json"
        steps = [{"role": "tool", "tool_name": "search", "content": "x" * 10_000} for _ in range(2_000)]
        trace.write_text(json.dumps({"question": "q", "steps": steps, "final_answer": "a"}))
        assert trace.stat().st_size > 20_000_000
        p = rr("reflect", str(trace), env={**env, "RR_BLOB_DIR": str(blobs)}, timeout=60)
        _one_line_error(p, "No space left on device")
        left = [f for f in blobs.rglob("*") if f.is_file()]
        assert left == [], f"partial blob left behind: {left}"
    finally:
        subprocess.run(["umount", str(blobs)], check=False)


def test_id_of_a_running_reflection(live) -> None:
    env, wfs = live
    wf_id = wfs.start_unworked()
    p = rr("reflect", str(EXAMPLE), "--id", wf_id, env=env)
    _one_line_error(p, f"a reflection with id {wf_id!r} is already running")
    assert f"rr result {wf_id}" in p.stderr, p.stderr
    assert "in-process worker" not in p.stderr, p.stderr  # nothing was started for it


# ------------------------------------------------------------------------------------------------
# 3. Ctrl-C during `rr reflect`: the reflection goes on, and the message says how to follow or cancel it
# ------------------------------------------------------------------------------------------------


def test_ctrl_c_during_reflect_says_what_happens_to_the_reflection(live) -> None:
    env, wfs = live
    env = {**env, "RR_PLUGINS": PLUGINS}
    run = Running("reflect", str(EXAMPLE), "--model", "scripted-paced-20", env=env)
    try:
        wf_id = _started_id(run.wait_for("started reflection", 30))
        wfs.left_running.append(wf_id)
        run.wait_for("in-process worker", 15)
        code = run.interrupt()
    finally:
        run.kill()
    err = run.stderr
    assert code == 130, err
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("rr: error:")]
    assert len(errors) == 1 and wf_id in errors[0] and "goes on durably" in errors[0], err
    assert f"rr result {wf_id}" in err, err
    assert f"cancel it: rr cancel {wf_id}" in err, err
    assert "continues when a worker runs" in err and "rr worker" in err, err
    assert wfs.status(wf_id) == "RUNNING"  # it went on durably (the fixture terminates it)


# ------------------------------------------------------------------------------------------------
# 4. wrong or misleading messages
# ------------------------------------------------------------------------------------------------


def test_namespace_that_does_not_exist(live) -> None:
    env, _ = live
    bad = {**env, "TEMPORAL_NAMESPACE": "no-such-ns"}
    for args in (("reflect", str(EXAMPLE)), ("result", "some-id"), ("replay", "some-id"), ("worker",)):
        p = rr(*args, env=bad)
        _one_line_error(p, "namespace 'no-such-ns' does not exist")
        assert "no reflection with id" not in p.stderr, p.stderr


def test_bad_payload_threshold_is_a_setting_error(live) -> None:
    env, _ = live
    for args in (("reflect", str(EXAMPLE)), ("result", "some-id")):
        p = rr(*args, env={**env, "RR_PAYLOAD_THRESHOLD_BYTES": "lots"})
        _one_line_error(p, "RR_PAYLOAD_THRESHOLD_BYTES must be a whole number")
        assert "cannot connect" not in p.stderr, p.stderr


def test_boolean_settings_are_checked(live, monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = live
    for args in (("reflect", str(EXAMPLE)), ("worker",)):
        _one_line_error(
            rr(*args, env={**env, "RR_JOURNAL_FSYNC": "maybe"}), "RR_JOURNAL_FSYNC must be one of"
        )
    for raw, value in [
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("NO", False),
        ("off", False),
        ("", False),
    ]:
        monkeypatch.setenv("RR_TEST_FLAG", raw)
        assert env_flag("RR_TEST_FLAG") is value, raw
    for raw in ("maybe", "2", "y", "enabled"):
        monkeypatch.setenv("RR_TEST_FLAG", raw)
        with pytest.raises(SettingError, match="RR_TEST_FLAG"):
            env_flag("RR_TEST_FLAG")


def test_replay_of_a_running_reflection_says_the_history_is_partial(live) -> None:
    env, wfs = live
    wf_id = wfs.start_unworked()
    p = rr("replay", wf_id, env=env)
    _ok(p)
    assert "partial history of a running reflection" in p.stdout, p.stdout


@pytest.mark.slow
def test_result_of_a_running_reflection_prints_no_core_log(live) -> None:
    env, wfs = live
    env = {**env, "RR_PLUGINS": PLUGINS}
    run = Running("reflect", str(EXAMPLE), "--model", "scripted-paced-20", env=env)
    try:
        wf_id = _started_id(run.wait_for("started reflection", 30))
        wfs.left_running.append(wf_id)
        run.wait_for("in-process worker", 15)
        # another client queries its progress while its worker holds the workflow task (the model alone
        # takes 20 x 0.25 s, so it is still running)
        results = [rr("result", wf_id, env=env, timeout=30)]
        run.interrupt()
    finally:
        run.kill()
    for p in results:
        assert p.returncode == 3, p.stderr
        _one_line_error(p, "is still running")
        assert "WARN" not in p.stderr and "\x1b[" not in p.stderr, p.stderr


@pytest.mark.slow
def test_incomplete_reflection_exits_4(live) -> None:
    env, wfs = live
    p = rr("reflect", str(EXAMPLE), "--max-requests", "1", "--json", env=env)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr and "rr: error:" not in p.stderr, p.stderr
    out = json.loads(p.stdout)
    assert out["raw"]["rr_trace"]["stop_reason"] != "completed"
    wf_id = out["raw"]["workflow_id"]
    wfs.ids.append(wf_id)
    assert "INCOMPLETE" in p.stderr, p.stderr
    r = rr("result", wf_id, env=env)
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr and "rr: error:" not in r.stderr, r.stderr
