"""A script that uses the Python API exits cleanly, every time (issue 16).

Before the fix a script like `tests/support/api_script.py` could abort at interpreter exit ("Fatal Python
error: PyGILState_Release", SIGABRT): Temporal's core threads were still alive while CPython finalized.
Now each call runs on a core runtime of its own that is gone when `reflect` returns (`reflector.client.api_core`), and no
call may leave a core thread running: about one call in 40 on a loaded machine did (2026-12-04), because the
core's threads dropped their last Python objects off the GIL and PyO3 only queued those drops
(`reflector.client.api_core._wait_core_threads_gone`, which now enters PyO3 so that they are applied).

The script runs 20 times, one after another (the suite's other worker runs beside it), with no TEMPORAL_ADDRESS
and a free RR_EMBEDDED_PORT, each with an in-process worker (the path that aborted), whatever else runs on the
machine: the first `FRESH` runs each on a new RR_HOME (each starts its own embedded dev server), the others on one
home whose server lingers between them (`RR_EMBEDDED_LINGER_S`, the default since the linger: a call finds the
server a previous one left).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflector.runtime.devserver import free_port
from reflector.runtime.homeserver import live_server, stop_idle
from tests.support import prefork
from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]
RUNS = 20
FRESH = 5
CORE_PANIC = "sdk-core/src/worker/activities/local_activities.rs"


def _run_script(home: Path, linger_s: str) -> subprocess.CompletedProcess[str]:
    env = user_env()
    env.update({"RR_HOME": str(home), "RR_EMBEDDED_PORT": str(free_port()), "RR_EMBEDDED_LINGER_S": linger_s})
    return prefork.run(
        [sys.executable, "-m", "tests.support.api_script"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
@pytest.mark.timeout(RUNS * 60)
def test_a_script_using_reflect_exits_cleanly_every_time(tmp_path: Path) -> None:
    started = time.monotonic()
    try:
        _runs(tmp_path)
    finally:
        stop_idle(tmp_path / "shared")
    print(f"{RUNS} runs in {time.monotonic() - started:.0f} s")


def _runs(tmp_path: Path) -> None:
    shared_pid = 0
    for i in range(RUNS):
        fresh = i < FRESH
        home = tmp_path / (f"home-{i}" if fresh else "shared")
        p = _run_script(home, "0" if fresh else "600")
        where = f"run {i + 1} (exit code {p.returncode}):\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}"
        assert "Fatal Python error" not in p.stderr, where
        assert p.returncode == 0, where
        assert "Traceback" not in p.stderr, where
        # temporalio's core panicked in a local activity's timeout task only where the call's runtime outlived
        # its worker (local_activities.rs:1120, a timer left from an attempt retried locally): not any more
        assert CORE_PANIC not in p.stderr, where
        assert "stop reason: completed" in p.stdout, where
        assert (home / "temporal.sqlite").exists(), where  # its own embedded server
        threads = re.search(r"tokio threads: (\d+) -> (\d+)", p.stdout)
        assert threads is not None, p.stdout
        assert int(threads[2]) <= int(threads[1]), (
            f"core threads left running after reflect() returned: {where}"
        )
        if not fresh:  # the shared home's server outlives each run, and the next run uses it
            state = live_server(home)
            assert state is not None, where
            shared_pid = shared_pid or state.server_pid
            assert state.server_pid == shared_pid, where
