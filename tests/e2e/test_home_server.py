"""One embedded server per RR_HOME, shared by the home's processes; work reaches only workers of its store (issue 26).

Each test runs `rr` as users do: subprocesses with nothing configured but RR_HOME (no TEMPORAL_ADDRESS, no
RR_TASK_QUEUE), concurrently, killed with SIGTERM and SIGKILL. Before the change two calls at once on one
home failed 3-4 times in 5 (port in use, SQLite locked, one call's end stopping the server the other used),
a call of a second home ran on the first home's server and its worker (`blob ... is not in the store`), and
a SIGTERMed `rr reflect` left its server running.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reflector.runtime.devserver import free_port, is_reachable
from reflector.runtime.homeserver import live_server
from tests.support import prefork
from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
RR = [sys.executable, "-c", "from reflector.cli import run; run()"]
ROUNDS = 20

pytestmark = [pytest.mark.slow]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = user_env()
    # a free preferred port: the suite's other worker may run its own homes at the same time
    env.update({"RR_HOME": str(home), "RR_EMBEDDED_PORT": str(free_port()), **extra})
    return env


def _reflect(home: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return prefork.run(
        [*RR, "reflect", str(EXAMPLE), *args],
        cwd=REPO_ROOT,
        env=_env(home, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _no_server_left(home: Path, server_pid: int | None, within: float = 15.0) -> None:
    """The home's keeper and server are gone (and their record) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        gone = server_pid is None or not Path(f"/proc/{server_pid}").exists() or _zombie(server_pid)
        if live_server(home) is None and not (home / "server.json").exists() and gone:
            return
        time.sleep(0.1)
    raise AssertionError(
        f"the embedded server of {home} is still running: {(home / 'server.json').read_text()}"
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _recorded_server_pid(home: Path, within: float = 60.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = live_server(home)
        if state is not None:
            return state.server_pid
        time.sleep(0.05)
    raise AssertionError(f"no embedded server was recorded in {home}")


@pytest.mark.timeout(600)
def test_two_processes_of_one_home_and_a_second_home_at_once(tmp_path: Path) -> None:
    """Three processes at once, two of home A and one of home B, each making 20 `reflect()` calls in a row (each
    call leases the home's server, so servers stop and start again between calls, racing the other process):
    every call completes, each home's reflections are in its own SQLite file, no server outlives its users."""
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    homes = [home_a, home_a, home_b]
    procs = [
        prefork.Popen(
            [sys.executable, "-m", "tests.support.api_rounds", str(ROUNDS)],
            cwd=REPO_ROOT,
            env=_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for home in homes
    ]
    try:
        results = [p.communicate(timeout=540) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for home, p, (out, err) in zip(homes, procs, results, strict=True):
        where = f"{home.name} (exit {p.returncode}):\n{out[-1500:]}\n{err[-3000:]}"
        assert p.returncode == 0, where
        assert out.count(": completed") == ROUNDS, where
        for bad in ("Traceback", "database is locked", "address already in use", "Task was destroyed"):
            assert bad not in err, where
    _no_server_left(home_a, None)
    _no_server_left(home_b, None)
    _count_reflections(home_a, 2 * ROUNDS)
    _count_reflections(home_b, ROUNDS)


def test_rr_reflect_twice_on_one_home_and_once_on_another_at_once(tmp_path: Path) -> None:
    """The same through the CLI: three `rr reflect` at once (two on home A, one on home B), twice."""
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    with ThreadPoolExecutor(3) as pool:
        for i in range(2):
            runs = list(pool.map(lambda h: _reflect(h), [home_a, home_a, home_b]))
            for home, p in zip([home_a, home_a, home_b], runs, strict=True):
                where = f"round {i + 1}, {home.name} (exit {p.returncode}):\n{p.stderr[-3000:]}"
                assert p.returncode == 0, where
                assert "Traceback" not in p.stderr and "database is locked" not in p.stderr, where
                assert "Diagnosis: step 1 " in p.stdout, where
            _no_server_left(home_a, None)
            _no_server_left(home_b, None)
    _count_reflections(home_a, 4)
    _count_reflections(home_b, 2)


def _count_reflections(home: Path, expected: int) -> None:
    """`rr list` of `home` (its own SQLite file, through its embedded server) lists exactly `expected`."""
    p = prefork.run(
        [*RR, "list", "--json", "--limit", "1000"],
        cwd=REPO_ROOT,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert len(rows) == expected, (home.name, len(rows))
    assert all(r["task_queue"] == rows[0]["task_queue"] and r["store_id"] for r in rows), rows[:2]


def _start_reflect(home: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    """An `rr reflect` that waits (a gated model never answers), as a user's long run would."""
    return prefork.Popen(
        [*RR, "reflect", str(EXAMPLE), "--model", "scripted-paced-20", *args],
        cwd=REPO_ROOT,
        env=_env(home, RR_PLUGINS="reflector.testing.scripted", **extra),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_started(proc: subprocess.Popen[str], home: Path) -> int:
    """Wait until the reflection has started; returns the home's server pid."""
    pid = _recorded_server_pid(home)
    deadline = time.monotonic() + 60
    assert proc.stderr is not None
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        if "started reflection" in line:
            return pid
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"rr reflect did not start its reflection:\n{seen}")


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=["SIGTERM", "SIGHUP", "SIGKILL"]
)
def test_a_killed_rr_reflect_leaves_no_server(tmp_path: Path, sig: signal.Signals) -> None:
    home = tmp_path / "home"
    proc = _start_reflect(home)
    try:
        server_pid = _wait_started(proc, home)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:  # ended like Ctrl-C: one line naming the reflection left running, the signal's exit code
        assert proc.returncode == 128 + sig, err[-2000:]
        assert "interrupted: reflection" in err and "Traceback" not in err, err[-2000:]
    _no_server_left(home, server_pid)


def test_the_server_lives_while_any_process_of_its_home_uses_it(tmp_path: Path) -> None:
    """A worker of the home keeps the home's server; another process uses the same server (not a second one),
    its end does not stop it; the worker's SIGKILL does (nothing else uses it)."""
    home = tmp_path / "home"
    worker = prefork.Popen(
        [*RR, "worker", "--processes", "1"],
        cwd=REPO_ROOT,
        env=_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        server_pid = _recorded_server_pid(home)
        address = live_server(home).address
        p = _reflect(home)
        assert p.returncode == 0, p.stderr[-3000:]
        assert f"using the embedded Temporal server of {home} on {address}" in p.stderr, p.stderr
        time.sleep(1.0)  # longer than the keeper's poll: the reflect's end must not have stopped it
        assert live_server(home) is not None and live_server(home).server_pid == server_pid
        assert is_reachable(address)
        worker.kill()
        worker.wait(30)
        _no_server_left(home, server_pid)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _rr(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    p = prefork.run(
        [*RR, *args],
        cwd=REPO_ROOT,
        env=_env(home, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def _reachable_within(address: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not is_reachable(address):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_an_unused_server_lingers_for_the_next_command_and_then_stops(tmp_path: Path) -> None:
    """With a linger, the next command of the home within it uses the same server (no start paid again); the
    server stops once no lease has been taken for that long."""
    home = tmp_path / "home"
    first = _rr(home, "list", RR_EMBEDDED_LINGER_S="60")
    assert "it stops 60 s after the last rr process of this home stops using it" in first.stderr, first.stderr
    server_pid = _recorded_server_pid(home, within=1)  # its only user has ended: the server is still there
    second = _rr(home, "list", RR_EMBEDDED_LINGER_S="60")
    assert "using the embedded Temporal server" in second.stderr, second.stderr
    assert live_server(home).server_pid == server_pid
    # a short linger (the one of the process that started the server counts): stops once unused that long
    home2 = tmp_path / "home2"
    _rr(home2, "list", RR_EMBEDDED_LINGER_S="1")
    _no_server_left(home2, _recorded_server_pid(home2, within=1), within=30)
    # the first one is still up (60 s); once its record is gone nobody can find it: it stops, and the next
    # command starts another (not refused by the old keeper); the same when the whole home is removed
    assert live_server(home).server_pid == server_pid
    (home / "server.json").unlink()
    third = _rr(home, "list", RR_EMBEDDED_LINGER_S="60")
    assert "started the embedded Temporal server" in third.stderr, third.stderr
    assert _zombie(server_pid)
    replacement = live_server(home).server_pid
    shutil.rmtree(home)
    _no_server_left(home, replacement, within=30)


def test_rr_server_takes_over_an_idle_embedded_server_but_not_one_in_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _rr(home, "list", RR_EMBEDDED_LINGER_S="600")
    idle = live_server(home)
    assert idle is not None and idle.managed
    port = free_port()
    server = prefork.Popen(
        [*RR, "server", "--port", str(port), "--ui-port", str(free_port())],
        cwd=REPO_ROOT,
        env=_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (live_server(home) and not live_server(home).managed):
            assert server.poll() is None, server.communicate()
            time.sleep(0.05)
        foreground = live_server(home)
        assert foreground is not None and not foreground.managed and foreground.address.endswith(f":{port}")
        assert _zombie(idle.server_pid)  # stopped (or not yet reaped) before its keeper let go of the home
        # the keeper lets go of the home (its lock) and then exits: its interpreter's exit may outlast the start
        deadline = time.monotonic() + 15
        while not _zombie(idle.keeper_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _zombie(idle.keeper_pid), f"the idle server's keeper {idle.keeper_pid} did not exit"
        # `rr server` in use by itself: a second one is refused, naming the running one
        second = prefork.run(
            [*RR, "server", "--port", str(free_port()), "--ui-port", str(free_port())],
            cwd=REPO_ROOT,
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 1 and "is already running on" in second.stderr, second.stderr
        assert _reachable_within(foreground.address, 60)
    finally:
        server.send_signal(signal.SIGTERM)
        _out, err = server.communicate(timeout=60)
    assert (
        f"stopped the embedded server of {home} (pid {idle.server_pid}), which no rr process used" in err
    ), err
    # a managed server in use (a worker holds its lease) is never taken over
    home_b = tmp_path / "b"
    worker = prefork.Popen(
        [*RR, "worker", "--processes", "1"],
        cwd=REPO_ROOT,
        env=_env(home_b, RR_EMBEDDED_LINGER_S="600"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        busy = _recorded_server_pid(home_b)
        refused = prefork.run(
            [*RR, "server", "--port", str(free_port()), "--ui-port", str(free_port())],
            cwd=REPO_ROOT,
            env=_env(home_b),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert refused.returncode == 1 and f"(pid {busy}); its clients use it" in refused.stderr, (
            refused.stderr
        )
        in_use = prefork.run(
            [*RR, "server", "--stop"],
            cwd=REPO_ROOT,
            env=_env(home_b),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert in_use.returncode == 1 and "is in use by an rr process" in in_use.stderr, in_use.stderr
        assert live_server(home_b).server_pid == busy and not (home_b / "server.stop").exists()
    finally:
        worker.kill()
        worker.wait()
    stop = _rr(home_b, "server", "--stop")  # the worker is gone: nothing uses it now
    assert f"stopped the embedded server of {home_b} (pid {busy})" in stop.stdout, stop.stdout
    _no_server_left(home_b, busy, within=5)
    assert "no embedded server" in _rr(home_b, "server", "--stop").stdout


def test_two_homes_never_share_a_queue_and_a_mismatched_store_is_refused(tmp_path: Path) -> None:
    """Different stores give different default queues; with one RR_TASK_QUEUE forced on both, a worker of
    home B refuses home A's reflection at once, naming both stores."""
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    worker = prefork.Popen(
        [*RR, "worker", "--processes", "1"],
        cwd=REPO_ROOT,
        env=_env(home_b),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_worker(worker)
        # the default queues differ (each is rr-<store id>)
        ids = {h.name: (h / "blobs" / "rr-store-id").read_text().strip() for h in (home_b,)}
        p = _reflect(home_a, timeout=120)
        assert p.returncode == 0, p.stderr[-3000:]
        ids["a"] = (home_a / "blobs" / "rr-store-id").read_text().strip()
        assert ids["a"] != ids["b"]
        assert f"task queue 'rr-{ids['a']}'" in p.stderr
        # one queue forced on both, home A's client on home B's server: B's worker takes it and refuses it
        worker.kill()
        worker.wait(30)
        queue = "shared-queue"
        worker = prefork.Popen(
            [*RR, "worker", "--processes", "1"],
            cwd=REPO_ROOT,
            env=_env(home_b, RR_TASK_QUEUE=queue),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        _wait_worker(worker)
        address = _wait_address(home_b)
        started = time.monotonic()
        p = _reflect(home_a, timeout=120, RR_TASK_QUEUE=queue, TEMPORAL_ADDRESS=address)
        assert p.returncode != 0
        assert f"id {ids['b']}" in p.stderr and f"id {ids['a']}" in p.stderr, p.stderr[-3000:]
        assert str(home_b / "blobs") in p.stderr and str(home_a / "blobs") in p.stderr, p.stderr[-3000:]
        assert time.monotonic() - started < 60  # at once: no retries
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _wait_worker(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    seen = ""
    while "store id:" not in seen:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"rr worker exited:\n{seen}")
        seen += line


def _wait_address(home: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = live_server(home)
        if state is not None and is_reachable(state.address):
            return state.address
        time.sleep(0.05)
    raise AssertionError(f"no server for {home}")


def test_two_areflect_calls_at_once_on_the_embedded_default(tmp_path: Path) -> None:
    """`asyncio.gather` of two `areflect` calls (ACE's `Pipeline.run(workers=2)` does the same), three times:
    both complete every time, and the home's server is gone after the script."""
    for i in range(3):
        home = tmp_path / f"home-{i}"
        p = prefork.run(
            [sys.executable, "-m", "tests.support.api_gather"],
            cwd=REPO_ROOT,
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        where = f"run {i + 1} (exit {p.returncode}):\n{p.stderr[-3000:]}"
        assert p.returncode == 0, where
        assert "stop reasons: completed completed" in p.stdout, where
        assert "Task was destroyed" not in p.stderr and "Traceback" not in p.stderr, where
        # the calls' core runtime is gone once they return, though the loop they ran on goes on (its cancelled
        # timers held their activities' contexts, and so the runtime, until a cell timeout later)
        threads = re.search(r"tokio threads: (\d+) -> (\d+)", p.stdout)
        assert threads is not None and int(threads[2]) <= int(threads[1]), where + p.stdout
        _no_server_left(home, None)
