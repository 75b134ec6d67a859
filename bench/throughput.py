"""Throughput: N concurrent scripted reflections (20 steps, 200 ms model latency) on one worker.

The worker and the dev server run in their own processes so their CPU is measured separately
(/proc utime+stime, sandbox hosts included for the worker). The anchor (a plain pydantic-ai
`TemporalDurability` agent with the same script) runs in the same session on the same worker.

    python -m bench.throughput [--concurrency 50 200] [--steps 20] [--latency 200] [--kinds anchor rr]
                               [--worker-processes N]

`--worker-processes N` runs N worker processes on the task queue (both agents on all of them; CPU is
summed); each takes `RR_MAX_CONCURRENT_WORKFLOW_TASKS` reflections at once, so split the cap yourself.

Set RR_BENCH_PYSPY=<file> (with py-spy on PATH) to sample the worker while the batches run (only
threads holding the GIL, i.e. Python CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import bench.scripts as scripts
from bench.anchor import AnchorWorkflow
from bench.common import children_cpu, start, start_bench_env, table
from reflector.worker import connect

REPO = Path(__file__).resolve().parents[1]


async def _batch(kind: str, n: int, client, trace, model: str, tq: str) -> tuple[float, list]:  # type: ignore[no-untyped-def,type-arg]
    t = time.perf_counter()
    if kind == "rr":
        handles = [await start(client, trace, model, tq, prefix=f"tp{n}") for _ in range(n)]
    else:
        handles = [await client.start_workflow(AnchorWorkflow.run, model, id=f"anchor{n}-{uuid.uuid4().hex[:8]}",
                                               task_queue=tq) for _ in range(n)]
    results = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        cause = getattr(failed[0], "cause", None)
        inner = getattr(cause, "cause", None)
        detail = f"{cause!r} / {inner!r} type={getattr(cause, 'activity_type', None)} retry={getattr(cause, 'retry_state', None)}"
        raise RuntimeError(f"{len(failed)}/{n} {kind} runs failed; first: {failed[0]!r}: {detail}")
    return time.perf_counter() - t, handles


async def main(concurrency: list[int], steps: int, latency: int, kinds: list[str], procs: int = 1) -> None:
    env = await start_bench_env()
    home, trace, address, server = env.home, env.trace, env.address, env.server
    tq = f"tp-{uuid.uuid4().hex[:6]}"
    os.environ[scripts.CALLS_FILE_ENV] = str(home / "model-calls")
    workers = []
    for i in range(procs):
        log = open(home / f"worker{i}.log", "w")
        workers.append(subprocess.Popen([sys.executable, "-m", "bench.worker"], cwd=REPO, stdout=log,
                                        stderr=subprocess.STDOUT,
                                        env={**os.environ, "TEMPORAL_ADDRESS": address, "RR_TASK_QUEUE": tq}))
    worker = workers[0]
    try:
        for i in range(procs):
            while "ready" not in (home / f"worker{i}.log").read_text():
                await asyncio.sleep(0.1)
        client = await connect(address)
        model = scripts.model_name(steps, latency)
        spy = None
        if os.environ.get("RR_BENCH_PYSPY"):
            spy = subprocess.Popen(["py-spy", "record", "-p", str(worker.pid), "-r", "100", "-f", "raw", "--threads", "--gil",
                                    "-o", os.environ["RR_BENCH_PYSPY"]], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        await _batch("rr", 2, client, trace, model, tq)  # warm-up
        await _batch("anchor", 2, client, trace, model, tq)
        rows = []
        for n in concurrency:
            for kind in kinds:
                w0, s0 = sum(children_cpu(w.pid) for w in workers), children_cpu(server.pid or 0)
                calls0 = scripts.calls_so_far()
                wall, handles = await _batch(kind, n, client, trace, model, tq)
                w1, s1 = sum(children_cpu(w.pid) for w in workers), children_cpu(server.pid or 0)
                total_steps = n * (steps + 1)  # model requests per reflection
                paid_twice = scripts.calls_so_far() - calls0 - total_steps
                lower_bound = (steps + 1) * latency / 1000
                rows.append([kind, n, wall, total_steps / wall, (w1 - w0) / total_steps * 1000,
                             (s1 - s0) / total_steps * 1000, wall / lower_bound, paid_twice])
        print(f"{steps}-step scripted reflections, {latency} ms model latency, one worker + dev server, 2 cores")
        print(table(["agent", "concurrent", "wall s", "steps/s", "worker CPU ms/step", "server CPU ms/step",
                     "wall / latency bound", "model calls paid twice"], rows))
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(30)
        server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[50, 200])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--latency", type=int, default=200)
    ap.add_argument("--kinds", nargs="+", default=["anchor", "rr"], choices=["anchor", "rr"])
    ap.add_argument("--worker-processes", type=int, default=1)
    a = ap.parse_args()
    asyncio.run(main(a.concurrency, a.steps, a.latency, a.kinds, a.worker_processes))
