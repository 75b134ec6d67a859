"""Real worker subprocesses for crash tests (started and ended by PID)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import prefork

REPO_ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """`rr worker --processes 1` (one worker process, no supervisor) in a subprocess with the scripted
    models registered through RR_PLUGINS."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = open(log, "w")
        self.proc = prefork.Popen(
            [sys.executable, "-m", "reflector.cli", "worker", "--processes", "1"],
            cwd=REPO_ROOT,
            env={**os.environ, "RR_PLUGINS": "reflector.testing.scripted", **env},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "rr worker pid=" in self.log.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"worker not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the worker and its sandbox hosts (its process group), like a machine loss."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


def read_model_log(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_completed_request_ran_twice(
    log: list[dict[str, object]], history: Any, killed_pid: int
) -> None:
    """At most the model request in flight at the kill ran again; the reflection completed."""
    counts = collections.Counter(e["key"] for e in log)
    twice = [k for k, c in counts.items() if c > 1]
    assert all(c <= 2 for c in counts.values()), counts
    killed_keys = [e["key"] for e in log if e["pid"] == killed_pid]
    # at most the request in flight at the kill (the last one the killed worker sent) ran again
    assert len(twice) <= 1, twice
    if twice:
        assert twice[0] == killed_keys[-1]
    # every request the new worker sent came after the killed worker's last one
    later = [e["key"] for e in log if e["pid"] != killed_pid]
    assert not set(later) & set(killed_keys[:-1]), "a request completed before the kill was sent again"
    assert history.events[-1].HasField("workflow_execution_completed_event_attributes")
