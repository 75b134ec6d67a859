"""`rr worker --processes N` with real processes: a supervisor, its worker children, a SIGKILLed child.

Children are found through /proc/<supervisor>/task/<supervisor>/children (and checked against the
supervisor's `child k/N pid=P started` lines); every signal goes to a process by its PID.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import reflector.testing.scripted  # noqa: F401  (registers the scripted models in this process too)
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig
from reflector.runtime.settings import Settings
from sandbox.capacity import host_budget
from tests.e2e.test_cli import rr as rr_cli
from tests.support import prefork
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import write_trace
from tests.support.procs import REPO_ROOT, read_model_log

_STARTED = re.compile(r"rr worker: child (\d+)/(\d+) pid=(\d+) started")


def _one_error_line(p: subprocess.CompletedProcess[str], needle: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("rr: error:")]
    assert len(lines) == 1, p.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


class Supervised:
    """`rr worker --processes N` in a subprocess (its own session, so a failed test can clean up by group)."""

    def __init__(self, env: dict[str, str], log: Path, n: int = 2) -> None:
        self.log = log
        self._out = open(log, "w")  # closed in stop(
        self.proc = prefork.Popen(
            [sys.executable, "-m", "reflector.cli", "worker", "--processes", str(n)],
            cwd=REPO_ROOT,
            env={**os.environ, "RR_PLUGINS": "reflector.testing.scripted", **env},
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text()

    def started(self) -> list[int]:
        """Child pids in the order the supervisor started them."""
        return [int(m.group(3)) for m in _STARTED.finditer(self.text())]

    def children(self) -> set[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return {int(x) for x in path.read_text().split()}
        except FileNotFoundError:
            return set()

    def wait_for(self, cond, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"supervisor exited ({self.proc.returncode}) waiting for {what}:\n{self.text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def sup_env(temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"sup-{uuid.uuid4().hex[:6]}",
        "RR_TEST_MODEL_LOG": str(tmp_path / "model.log"),
        "RR_STICKY_TIMEOUT_S": "1",
        "RR_WORKER_MODELS": "scripted-paced-20",  # no provider SDKs to prepare: children start faster
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    EXTRA_BLOB_DIRS.append(home / "blobs")
    return env


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
async def test_a_killed_child_is_restarted_and_every_reflection_completes(sup_env, tmp_path: Path) -> None:
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("the kernel has no /proc/<pid>/task/<pid>/children")
    log_path = Path(sup_env["RR_TEST_MODEL_LOG"])
    sup = Supervised(sup_env, tmp_path / "supervisor.log")
    try:
        # each child prints its `rr worker pid=` line, then its `sandbox:` and `sandbox hosts:` lines: wait for
        # all of both
        sup.wait_for(
            lambda: sup.text().count("rr worker pid=") >= 2 and sup.text().count("sandbox hosts: ") >= 2,
            "two ready workers",
        )
        first = sup.started()
        assert len(first) == 2 and sup.children() == set(first), (first, sup.children(), sup.text())
        text = sup.text()
        share = math.ceil(host_budget().hosts / 2)  # the machine's budget, split between the two
        assert f"RR_MAX_LIVE_SANDBOXES={share}" in text and "RR_MAX_CONCURRENT_WORKFLOW_TASKS" not in text, (
            text
        )
        assert text.count("sandbox: ") == 2, text  # the children's own output passes through
        assert text.count(f"sandbox hosts: up to {share} live (RR_MAX_LIVE_SANDBOXES)") == 2, text

        settings = Settings.from_env()
        client = await connect(sup_env["TEMPORAL_ADDRESS"])
        trace = rr.upload_trace(write_trace(tmp_path), settings)
        inp = rr.build_input(trace, config=ReflectionConfig(model="scripted-paced-20"))
        handles = [
            await rr.start_reflection(
                client, inp, sup_env["RR_TASK_QUEUE"], f"sup-{i}-{uuid.uuid4().hex[:6]}"
            )
            for i in range(4)
        ]

        # kill a child that is working on some reflection (its model requests are in flight)
        def working() -> set[int]:
            return {int(e["pid"]) for e in read_model_log(log_path)} & set(first)  # type: ignore[call-overload]

        deadline = time.monotonic() + 60
        while len([e for e in read_model_log(log_path)]) < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert working(), (read_model_log(log_path), first)
        victim = min(working())
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()

        def restarted() -> bool:
            kids = sup.children()
            return len(kids) == 2 and victim not in kids and len(sup.started()) == 3

        sup.wait_for(restarted, "a restarted child", timeout=30)
        new = sup.started()[2]
        assert sup.children() == (set(first) - {victim}) | {new}
        assert re.search(rf"child \d/2 pid={victim} died \(killed by SIGKILL\)", sup.text()), sup.text()

        outs = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        took = time.monotonic() - t_kill
        for out in outs:
            assert out.raw["rr_trace"]["stop_reason"] == "completed" and out.raw["rr_trace"]["cells"] == 20, (
                out.raw
            )
        pids = {int(e["pid"]) for e in read_model_log(log_path)}  # type: ignore[call-overload]
        assert victim in pids and pids <= set(first) | {new}, (pids, first, new)
        sup.wait_for(lambda: sup.text().count("rr worker pid=") >= 3, "the restarted child ready")

        all_children = set(first) | {new}
        t_stop = time.monotonic()
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(60) == 0, sup.text()[-3000:]
        stopped_in = time.monotonic() - t_stop
        assert all(_gone(pid) for pid in all_children), [p for p in all_children if not _gone(p)]
        assert "Traceback" not in sup.text(), sup.text()[-3000:]
        print(f"4 reflections done {took:.1f} s after the kill; supervisor stopped in {stopped_in:.1f} s")
    finally:
        sup.stop()


def test_bad_worker_processes_is_one_line_error(tmp_path: Path) -> None:
    env = {"RR_HOME": str(tmp_path / "home")}
    _one_error_line(
        rr_cli("worker", env={**env, "RR_WORKER_PROCESSES": "two"}, timeout=60),
        "RR_WORKER_PROCESSES must be a whole number, got 'two'",
    )
    _one_error_line(
        rr_cli("worker", env={**env, "RR_WORKER_PROCESSES": "0"}, timeout=60),
        "RR_WORKER_PROCESSES must be >= 1",
    )
    _one_error_line(
        rr_cli("worker", "--processes", "0", env=env, timeout=60), "--processes must be at least 1"
    )


def test_a_bad_budget_setting_stops_the_supervisor_before_any_child(tmp_path: Path, temporal_server) -> None:
    env = {
        "RR_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_MAX_CONCURRENT_ACTIVITIES": "0",
    }
    p = rr_cli("worker", "--processes", "2", env=env, timeout=60)
    _one_error_line(p, "RR_MAX_CONCURRENT_ACTIVITIES must be >= 1")
    assert "started" not in p.stdout, p.stdout


def test_a_child_failing_at_start_stops_the_supervisor_with_its_error(
    tmp_path: Path, temporal_server
) -> None:
    # read by the worker only (not by the supervisor): each child fails with exit 2 and its one-line error
    env = {
        "RR_HOME": str(tmp_path / "home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_PLUGINS": "rr_no_such_plugin",
        "RR_WORKER_MODELS": "heuristic",
    }
    t0 = time.monotonic()
    p = rr_cli("worker", "--processes", "2", env=env, timeout=90)
    _one_error_line(p, "RR_PLUGINS: cannot import 'rr_no_such_plugin'")
    assert len(_STARTED.findall(p.stdout)) == 2, p.stdout  # the children started, once each: no restart
    assert "restarting" not in p.stdout, p.stdout
    assert time.monotonic() - t0 < 60
