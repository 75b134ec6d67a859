"""The live-host cap's default is sized from the machine (`sandbox.capacity`): memory, cgroups, open files,
processes; and a worker lifts its open-file limit to the hosts it keeps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox import capacity as cap
from tests.support.procs import REPO_ROOT

GIB = 1024**3


def test_the_budget_follows_the_tightest_of_the_machines_limits() -> None:
    # memory: a quarter of it at 16 MiB a host
    assert cap.machine_budget(24 * GIB) == cap.HostBudget(384, "memory", 24 * GIB)
    assert cap.machine_budget(4 * GIB).hosts == 64
    # the open files the hard limit allows, after the reserve (3 per host)
    assert cap.machine_budget(64 * GIB, open_files=1024) == cap.HostBudget(170, "open files", 64 * GIB)
    # processes (3 per host, after the reserve)
    assert cap.machine_budget(64 * GIB, processes=2048).hosts == 512
    assert cap.machine_budget(64 * GIB, processes=2048).bound == "processes"
    # never below the floor, never above the ceiling
    assert cap.machine_budget(GIB // 4) == cap.HostBudget(cap.FLOOR, "floor", GIB // 4)
    assert cap.machine_budget(1024 * GIB) == cap.HostBudget(cap.CEILING, "ceiling", 1024 * GIB)
    assert "bound by memory" in cap.machine_budget(24 * GIB).summary()


def test_this_machines_budget_is_within_its_memory() -> None:
    b = cap.host_budget()
    assert cap.FLOOR <= b.hosts <= cap.CEILING
    assert b.bound == "floor" or b.hosts * cap.HOST_MEMORY_BYTES <= b.memory_bytes * cap.MEMORY_SHARE


def test_cgroup_limits_are_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/jobs/one\n1:pids:/jobs/one\n0::/svc/worker\n")
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v2 / "svc" / "worker").mkdir(parents=True)
    (v2 / "svc" / "worker" / "memory.max").write_text("max\n")
    (v2 / "svc" / "memory.max").write_text(f"{8 * GIB}\n")  # the parent's limit binds the child
    (v1 / "memory" / "jobs" / "one").mkdir(parents=True)
    (v1 / "memory" / "jobs" / "one" / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    kw = {"proc_cgroup": str(proc), "v2_mounts": [str(v2)], "v1_root": str(v1)}
    assert cap.cgroup_limit("memory.max", "memory", "memory.limit_in_bytes", **kw) == 6 * GIB  # type: ignore[arg-type]
    (v2 / "svc" / "memory.max").write_text(f"{2 * GIB}\n")
    assert cap.cgroup_limit("memory.max", "memory", "memory.limit_in_bytes", **kw) == 2 * GIB  # type: ignore[arg-type]
    # nothing set anywhere: unlimited (the machine's memory decides)
    none = {"proc_cgroup": str(tmp_path / "absent"), "v2_mounts": [], "v1_root": str(v1)}
    assert cap.cgroup_limit("pids.max", "pids", "pids.max", **none) >= 1 << 60  # type: ignore[arg-type]


def _run(code: str, home: Path | None = None) -> str:
    env = {**os.environ, "RR_HOME": str(home)} if home is not None else None
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_open_file_limit_is_lifted_to_the_hosts_and_no_further_than_the_hard_limit() -> None:
    out = _run(
        """
        import resource
        from sandbox.capacity import raise_open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))
        print(raise_open_files(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        print(raise_open_files(100), resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # never lowered
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))
        print(raise_open_files(1000), resource.getrlimit(resource.RLIMIT_NOFILE)[0])  # the hard limit binds
        """
    )
    assert out.split("\n")[:3] == ["1000 3512", "100 3512", "512 2048"], out


@pytest.mark.slow
def test_a_worker_keeps_more_live_hosts_than_its_soft_open_file_limit_would_hold(tmp_path: Path) -> None:
    # 150 live hosts hold ~300 of the worker's open files: past a soft limit of 200 unless it is lifted; with
    # the hard limit too low, the worker keeps what fits and says so
    out = _run(
        """
        import asyncio, logging, resource
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from activities import sandbox as sb
        from reflector.runtime.settings import Settings
        from sandbox.zygote_client import close_zygotes

        async def main():
            rt = sb.runtime_for(Settings.from_env(), max_live=150)
            results = await asyncio.gather(
                *(rt.sessions.run_cell(f"s{i}", 1, "print(6 * 7)", trace_path=None, trace_format="auto",
                                       extra_vars={}, limits=sb.SandboxLimits()) for i in range(150))
            )
            print("ok", sum(r.ok and r.stdout.strip() == "42" for r in results), rt.sessions.stats.evictions)
            await rt.sessions.close_all()
            await close_zygotes()
            resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))
            print("capped", sb._open_files_for(1000))

        asyncio.run(main())
        """,
        home=tmp_path,
    )
    assert "ok 150 0" in out, out
    assert "capped 29" in out, out  # (600 - 512) // 3


def test_a_hosts_memory_is_read_from_proc() -> None:
    assert cap.host_memory(os.getpid()) > 1024**2  # this process's anonymous resident memory
    assert cap.host_memory(None) == 0
    assert cap.host_memory(2**22 + 12345) == 0  # no such process
