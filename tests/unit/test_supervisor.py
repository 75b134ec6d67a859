"""The worker supervisor's policy with stand-in children (tiny Python scripts): budget split, restarts,
crash loop, a child's start-up error, stop."""

from __future__ import annotations

import io
import math
import os
import sys
import threading

import pytest

from reflector.runtime import supervisor as sv
from reflector.runtime.settings import SettingError
from sandbox.capacity import HostBudget, host_budget


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, _ in sv.BUDGETS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(sv.PROCESSES_ENV, raising=False)
    monkeypatch.setattr(sv, "BACKOFF_FIRST_S", 0.01)


def _script(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _run(cmd: list[str], n: int = 2, stop_after: float | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    sup = sv.Supervisor(n, cmd=cmd, out=out, err=err)
    if stop_after is not None:
        threading.Timer(stop_after, sup.stop).start()
    code = sup.run(install_signals=False)
    return code, out.getvalue(), err.getvalue()


def test_budgets_are_split_with_ceil_and_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # slot counts are not split unless set: each child's admission control finds its own number; the live
    # hosts' default is the machine's budget (sandbox.capacity), split like a set value
    monkeypatch.setattr(sv, "host_budget", lambda: HostBudget(hosts=256, bound="memory", memory_bytes=1))
    assert sv.split_budgets(1) == {"RR_MAX_LIVE_SANDBOXES": "256"}
    assert sv.split_budgets(2) == {"RR_MAX_LIVE_SANDBOXES": "128"}
    assert sv.split_budgets(16) == {"RR_MAX_LIVE_SANDBOXES": "16"}
    monkeypatch.setenv("RR_MAX_CONCURRENT_ACTIVITIES", "32")
    assert sv.split_budgets(2)["RR_MAX_CONCURRENT_ACTIVITIES"] == "16"
    monkeypatch.setenv("RR_MAX_CONCURRENT_WORKFLOW_TASKS", "30")
    assert sv.split_budgets(2)["RR_MAX_CONCURRENT_WORKFLOW_TASKS"] == "15"
    monkeypatch.setenv("RR_MAX_CONCURRENT_WORKFLOW_TASKS", "3")
    assert sv.split_budgets(64)["RR_MAX_CONCURRENT_WORKFLOW_TASKS"] == "1"
    monkeypatch.setenv("RR_MAX_LIVE_SANDBOXES", "1000")  # a set value wins over the machine's budget
    assert sv.split_budgets(4)["RR_MAX_LIVE_SANDBOXES"] == "250"
    monkeypatch.setenv("RR_MAX_LIVE_SANDBOXES", "lots")
    with pytest.raises(SettingError, match="RR_MAX_LIVE_SANDBOXES must be a whole number"):
        sv.split_budgets(2)


def test_processes_default_env_and_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert sv.default_processes() == cores
    assert sv.worker_processes(None) == cores
    monkeypatch.setenv(sv.PROCESSES_ENV, "3")
    assert sv.worker_processes(None) == 3
    assert sv.worker_processes(1) == 1  # the argument wins
    with pytest.raises(SettingError, match="--processes must be at least 1"):
        sv.worker_processes(0)
    monkeypatch.setenv(sv.PROCESSES_ENV, "0")
    with pytest.raises(SettingError, match="RR_WORKER_PROCESSES must be >= 1"):
        sv.worker_processes(None)


def test_children_get_their_share_and_are_stopped_by_sigterm() -> None:
    child = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('child stopping', flush=True), sys.exit(0)))\n"
        "print('rr worker pid=%d sandboxes=%s' % (os.getpid(), os.environ['RR_MAX_LIVE_SANDBOXES']),"
        " flush=True)\n"
        "time.sleep(60)\n"
    )
    code, out, err = _run(_script(child), n=3, stop_after=1.5)
    assert code == 0, (out, err)
    share = math.ceil(host_budget().hosts / 3)  # the machine's budget (unset), split three ways
    assert out.count(f"sandboxes={share}") == 3 and out.count("child stopping") == 3, out
    assert "restarting" not in out and "rr: error:" not in err, (out, err)


def test_a_dying_child_is_restarted_then_a_crash_loop_stops_everything() -> None:
    # a child that was ready and then died: restarted with a growing backoff, 5 deaths -> exit 1
    code, out, err = _run(
        _script(
            "import sys; print('rr worker pid=1', flush=True); "
            "print('rr: error: boom', file=sys.stderr); sys.exit(2)"
        ),
        n=1,
    )
    assert code == 1, (out, err)
    assert out.count("restarting in") == sv.CRASH_LIMIT - 1, out
    assert "restarting in 0.01 s" in out and "restarting in 0.08 s" in out, out
    errors = [line for line in err.splitlines() if line.startswith("rr: error:")]
    assert len(errors) == 1 and "died 5 times within 30 s" in errors[0] and "boom" in errors[0], err


def test_a_child_failing_at_start_with_a_setting_error_stops_the_supervisor() -> None:
    code, out, err = _run(
        _script("import sys; print('rr: error: RR_X must be a number', file=sys.stderr); sys.exit(2)")
    )
    assert code == 2, (out, err)
    assert err.splitlines() == ["rr: error: RR_X must be a number"], err
    assert "restarting" not in out, out


def test_a_child_exiting_2_after_a_restart_is_a_death_not_a_setting_error(tmp_path) -> None:
    # first start: ready, then killed (exit 1); later starts: exit 2 before ready (e.g. the server went
    # away): restarted (backoff) until the crash-loop limit, not taken for a bad setting
    flag = tmp_path / "started"
    child = (
        f"import os, sys\nif not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close(); print('rr worker pid=1', flush=True); sys.exit(1)\n"
        "print('rr: error: not reachable', file=sys.stderr); sys.exit(2)\n"
    )
    code, out, err = _run(_script(child), n=1)
    assert code == 1, (out, err)
    assert "died (exit code 2: not reachable)" in out, out
