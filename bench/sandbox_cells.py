"""Cell round trip on the fast path: a trivial cell (`x = 1`) through the whole activity path.

(T) Temporal: a real dev server, an in-process worker (`build_worker`) and a tiny workflow that runs
    `rr.sandbox.prepare_session` once, then `rr.sandbox.run_cell` N times as local activities, then
    closes the session. `workflow.now()` is task time, so the cost is measured from outside: wall
    time of the workflow / N, and (wall - wall of the same workflow with 0 cells) / N.
(D) `SessionManager.run_cell` called directly (no Temporal): median per cell.
(E) in-process `exec` of the same cell string (no sandbox): median per cell.
Also the first cell of a new session (the prefill `describe_traces()`, through `SessionManager`)
with the host pool and without it.

    python -m bench.sandbox_cells [--cells 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from reflector.contract import (
        CLOSE_ACTIVITY,
        PREFILL_CODE,
        PREPARE_ACTIVITY,
        RUN_CELL_ACTIVITY,
        CellInput,
        CellOutcome,
        CloseSessionInput,
        PrepareSessionInput,
        PrepareSessionResult,
        TraceRef,
    )

CELL = "x = 1"
_LA_TIMEOUT = timedelta(seconds=120)


@workflow.defn(name="BenchSandboxCells")
class CellsWorkflow:
    @workflow.run
    async def run(self, session_id: str, trace: TraceRef, n: int) -> int:
        prep: PrepareSessionResult = await workflow.execute_local_activity(
            PREPARE_ACTIVITY,
            PrepareSessionInput(session_id=session_id, trace=trace),
            result_type=PrepareSessionResult,
            start_to_close_timeout=_LA_TIMEOUT,
        )
        ok = 0
        for i in range(n):
            out: CellOutcome = await workflow.execute_local_activity(
                RUN_CELL_ACTIVITY,
                CellInput(
                    session_id=session_id,
                    seq=prep.next_seq + i,
                    code=CELL,
                    trace=trace,
                    init_ref=prep.init_ref,
                ),
                result_type=CellOutcome,
                start_to_close_timeout=_LA_TIMEOUT,
            )
            ok += int(out.ok and not out.host_restarted)
        await workflow.execute_local_activity(
            CLOSE_ACTIVITY, CloseSessionInput(session_id=session_id), start_to_close_timeout=_LA_TIMEOUT
        )
        return ok


async def _direct(n: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """(D) per-cell times, (E) per-cell exec times, prefill with and without the pool (ms)."""
    import json
    import tempfile
    from pathlib import Path

    from bench.common import TRACE
    from sandbox.protocol import SandboxLimits
    from sandbox.sessions import SessionManager

    home = Path(tempfile.mkdtemp(prefix="rr-bench-cells-"))
    trace = home / "trace.json"
    trace.write_text(json.dumps(TRACE))
    kw = {
        "trace_path": str(trace),
        "trace_format": "auto",
        "extra_vars": {"task": {}},
        "limits": SandboxLimits(),
    }
    direct: list[float] = []
    prefill: dict[int, list[float]] = {0: [], 2: []}
    for pool_size in (0, 2):
        sessions = SessionManager(home / f"j{pool_size}", pool_size=pool_size)
        for i in range(10):
            await sessions.prewarm()
            t0 = time.perf_counter()
            r = await sessions.run_cell(f"p{i}", 1, PREFILL_CODE, **kw)
            prefill[pool_size].append((time.perf_counter() - t0) * 1000)
            assert r.ok, r
        if pool_size:
            for seq in range(2, n + 2):
                t0 = time.perf_counter()
                r = await sessions.run_cell("p0", seq, CELL, **kw)
                direct.append((time.perf_counter() - t0) * 1000)
                assert r.ok and not r.host_restarted, r
        await sessions.close_all()
    in_process: list[float] = []
    ns: dict[str, object] = {}
    for _ in range(n):
        t0 = time.perf_counter()
        exec(CELL, ns)  # the in-process reference (trusted benchmark code
        in_process.append((time.perf_counter() - t0) * 1000)
    return direct, in_process, prefill[0], prefill[2]


async def main(n: int, reps: int) -> None:
    from bench.common import bench_home, median, table, upload_bench_trace
    from reflector.client import connect
    from reflector.runtime.devserver import DevServer
    from reflector.runtime.settings import Settings
    from worker import build_worker

    direct, in_process, prefill_cold, prefill_pool = await _direct(n)
    home = bench_home()
    settings = Settings.from_env()
    trace = upload_bench_trace(settings)
    server = DevServer(None, ui=False, log_file=home / "server.log")
    address = await server.astart()
    walls: dict[int, list[float]] = {0: [], n: []}
    try:
        client = await connect(address)
        tq = f"bench-cells-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq, extra_workflows=[CellsWorkflow]):
            from activities import sandbox as sandbox_cells

            for rep in range(reps + 1):  # the first round warms up and is discarded
                for cells in (0, n):
                    await sandbox_cells._rt().sessions.prewarm()
                    sid = f"bench-{uuid.uuid4().hex[:10]}"
                    t0 = time.perf_counter()
                    ok = await client.execute_workflow(
                        CellsWorkflow.run, args=[sid, trace, cells], id=sid, task_queue=tq
                    )
                    wall = time.perf_counter() - t0
                    assert ok == cells, (ok, cells)
                    if rep:
                        walls[cells].append(wall)
    finally:
        server.stop()
    exec_ms = median(in_process)
    t_total = median(walls[n]) * 1000 / n
    t_marginal = (median(walls[n]) - median(walls[0])) * 1000 / n
    rows = [
        ["(T) activity path, workflow wall / N", t_total, t_total / exec_ms],
        ["(T) activity path, (wall - wall of 0 cells) / N", t_marginal, t_marginal / exec_ms],
        ["(D) SessionManager.run_cell direct", median(direct), median(direct) / exec_ms],
        ["(E) in-process exec", exec_ms, 1.0],
    ]
    print(
        f"trivial cell `{CELL}`, N={n} cells per workflow, medians ({reps} workflow runs; D and E per cell)"
    )
    print(table(["path", "ms per cell", "x in-process exec"], rows))
    print()
    print("first cell of a new session (prefill `describe_traces()` incl. host start), median of 10")
    print(
        table(
            ["host", "ms"],
            [
                ["spawned on demand (pool_size=0)", median(prefill_cold)],
                ["from the warm pool (pool_size=2)", median(prefill_pool)],
            ],
        )
    )
    print(f"\nworkflow walls: 0 cells {median(walls[0]):.3f} s, {n} cells {median(walls[n]):.3f} s")
    print(f"command: python -m bench.sandbox_cells --cells {n} --reps {reps}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.cells, a.reps))
