"""The OS layer's cost, side by side in one run: `language-only` hosts against `auto` hosts
(namespaces + uid drop + no-new-privs + Landlock + seccomp), measured in alternating rounds.

  * host start, cold: `SubprocessExecutor.start` of a host spawned on demand (interpreter, namespaces,
    imports, lockdown, trace load) until it is ready for a cell;
  * host start, pooled: the first cell of a new session (prefill `describe_traces()`) with a warm pool;
  * trivial cell (`x = 1`) round trip: `SessionManager.run_cell` direct, and through the activity path
    (`bench.sandbox_cells`' workflow: a real dev server, an in-process worker, cells as local activities);
  * state rebuild after a SIGKILL of the host (10 and 50 recorded cells, 10 MB trace, journal replay only).

    python -m bench.sandbox_isolation [--cells 300] [--rounds 5] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import median, table
from bench.sandbox_recovery import make_trace, measure
from sandbox.executor import SubprocessExecutor
from sandbox.isolation import IsolationMode
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager

MODES: tuple[IsolationMode, ...] = ("language-only", "auto")
CELL = "x = 1"


async def cold_start(trace: Path, mode: IsolationMode) -> float:
    ex = SubprocessExecutor(SandboxLimits(), isolation=mode)
    t0 = time.perf_counter()
    await ex.start(str(trace), "auto", {"task": {}})
    ms = (time.perf_counter() - t0) * 1000
    await ex.close()
    return ms


async def direct(home: Path, trace: Path, mode: IsolationMode, cells: int) -> tuple[float, list[float]]:
    """(pooled first cell ms, per-cell ms) for one session."""
    from reflector.contract import PREFILL_CODE

    sessions = SessionManager(
        home / f"j-{mode}-{uuid.uuid4().hex[:6]}", pool_size=2, isolation=mode, fsync=False
    )
    kw = {
        "trace_path": str(trace),
        "trace_format": "auto",
        "extra_vars": {"task": {}},
        "limits": SandboxLimits(),
    }
    await sessions.prewarm()
    t0 = time.perf_counter()
    r = await sessions.run_cell("s", 1, PREFILL_CODE, **kw)
    first = (time.perf_counter() - t0) * 1000
    assert r.ok, r
    per_cell = []
    for seq in range(2, cells + 2):
        t0 = time.perf_counter()
        r = await sessions.run_cell("s", seq, CELL, **kw)
        per_cell.append((time.perf_counter() - t0) * 1000)
        assert r.ok and not r.host_restarted, r
    await sessions.close_all()
    return first, per_cell


async def activity_path(cells: int, reps: int) -> dict[str, list[float]]:
    """Per mode, workflow walls per cell, (wall(N) - wall(0)) / N, through the activity path.

    One dev server and one worker per mode, each with its own session manager (`activities.scope`); the
    modes alternate, so machine noise hits both alike.
    """
    import contextlib
    import dataclasses

    from activities import sandbox as sandbox_activities
    from bench.common import upload_bench_trace
    from bench.sandbox_cells import CellsWorkflow
    from reflector.client import connect
    from reflector.runtime.devserver import DevServer
    from reflector.runtime.settings import Settings
    from worker import build_worker

    trace = upload_bench_trace(Settings.from_env())
    server = DevServer(None, ui=False)
    address = await server.astart()
    walls: dict[tuple[str, int], list[float]] = {(m, n): [] for m in MODES for n in (0, cells)}
    try:
        client = await connect(address)
        run = uuid.uuid4().hex[:6]
        per_mode = {m: dataclasses.replace(Settings.from_env(), sandbox_isolation=m) for m in MODES}
        async with contextlib.AsyncExitStack() as stack:
            for mode, settings in per_mode.items():
                await stack.enter_async_context(
                    build_worker(
                        client,
                        f"bench-iso-{run}-{mode}",
                        settings=settings,
                        max_live_sandboxes=64,
                        extra_workflows=[CellsWorkflow],
                    )
                )
            for rep in range(reps + 1):  # the first round warms up and is discarded
                for mode, settings in per_mode.items():
                    sessions = sandbox_activities.runtime_for(settings, max_live=64).sessions  # that worker's
                    for n in (0, cells):
                        await sessions.prewarm()
                        sid = f"bench-{uuid.uuid4().hex[:10]}"
                        t0 = time.perf_counter()
                        ok = await client.execute_workflow(
                            CellsWorkflow.run,
                            args=[sid, trace, n],
                            id=sid,
                            task_queue=f"bench-iso-{run}-{mode}",
                        )
                        assert ok == n, (ok, n)
                        if rep:
                            walls[(mode, n)].append(time.perf_counter() - t0)
            await sandbox_activities.shutdown()
    finally:
        server.stop()
    return {m: [(w - median(walls[(m, 0)])) * 1000 / cells for w in walls[(m, cells)]] for m in MODES}


async def main(cells: int, rounds: int, reps: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="rr-bench-isolation-"))
    os.environ.setdefault("RR_HOME", str(home / "rr-home"))
    small = home / "trace.json"
    small.write_text(json.dumps({"question": "q", "steps": [{"role": "user", "content": "hi"}] * 20}))
    big = home / "trace-10mb.json"
    make_trace(big, 10)
    cold: dict[str, list[float]] = {m: [] for m in MODES}
    pooled: dict[str, list[float]] = {m: [] for m in MODES}
    per_cell: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(rounds):  # alternate the modes so machine noise hits both alike
        for mode in MODES:
            for _ in range(3):
                cold[mode].append(await cold_start(small, mode))
            first, times = await direct(home, small, mode, cells)
            pooled[mode].append(first)
            per_cell[mode].extend(times)
    via_activity = await activity_path(cells, reps)
    rebuild: dict[tuple[str, int], float] = {}
    for n in (10, 50):
        for mode in MODES:
            t, replayed, _ = await measure(home / f"r-{mode}-{n}", big, n, 0, reps, mode)
            assert replayed == n, replayed
            rebuild[(mode, n)] = t * 1000

    def row(label: str, values: dict[str, float]) -> list[object]:
        a, b = values["language-only"], values["auto"]
        return [label, a, b, b / a]

    rows = [
        row("host start, cold (spawn until ready), ms", {m: median(cold[m]) for m in MODES}),
        row("first cell of a session, warm pool, ms", {m: median(pooled[m]) for m in MODES}),
        row(
            f"trivial cell, SessionManager.run_cell, ms (n={len(per_cell['auto'])})",
            {m: median(per_cell[m]) for m in MODES},
        ),
        row(
            "trivial cell, activity path (wall(N)-wall(0))/N, ms", {m: median(via_activity[m]) for m in MODES}
        ),
        row("rebuild after host SIGKILL, 10 cells, 10 MB trace, ms", {m: rebuild[(m, 10)] for m in MODES}),
        row("rebuild after host SIGKILL, 50 cells, 10 MB trace, ms", {m: rebuild[(m, 50)] for m in MODES}),
    ]
    print(f"OS layer cost, medians, modes alternated in {rounds} rounds (activity path: {reps} rounds)")
    print(table(["measure", "language-only", "auto (OS layer)", "ratio"], rows))
    print(f"\ncommand: python -m bench.sandbox_isolation --cells {cells} --rounds {rounds} --reps {reps}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.cells, a.rounds, a.reps))
