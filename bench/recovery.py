"""Recovery: SIGKILL the worker mid-reflection, start a new worker right away, time to completion.

A 20-step scripted reflection (200 ms model latency) runs on a worker subprocess; the worker (and its
sandbox hosts) is SIGKILLed at a random moment after step 5, during a model request or a cell, and a
new worker starts at once. Reported per run: kill -> completion, and the *recovery cost*: that time
minus the time the same reflection needed from the same step when nothing crashed (its median step
time × the steps left). Medians over `--reps` runs. "extra model calls" counts the provider calls beyond
the 21 the reflection needs: the request in flight at the kill has to be sent again (at most 1), a
completed one never is.

    python -m bench.recovery [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import bench.scripts as scripts
from bench.common import median, start, start_bench_env, table
from reflector.client import connect

REPO = Path(__file__).resolve().parents[1]
STEPS = 20


def spawn(home: Path, address: str, tq: str, tag: str) -> subprocess.Popen[bytes]:
    log = open(home / f"worker-{tag}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "bench.worker"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TEMPORAL_ADDRESS": address, "RR_TASK_QUEUE": tq},
        start_new_session=True,
    )


async def ready(home: Path, tag: str) -> None:
    while "ready" not in (home / f"worker-{tag}.log").read_text():
        await asyncio.sleep(0.02)


async def main(reps: int) -> None:
    env = await start_bench_env()
    home, trace, address, server = env.home, env.trace, env.address, env.server
    client = await connect(address)
    model = scripts.model_name(STEPS, 200)
    rng = random.Random(7)
    rows, costs = [], []
    os.environ[scripts.CALLS_FILE_ENV] = str(home / "model-calls")
    try:
        tq = f"rec-{uuid.uuid4().hex[:6]}"
        w = spawn(home, address, tq, "base")
        await ready(home, "base")
        t0 = time.perf_counter()
        await (await start(client, trace, model, tq)).result()
        base = time.perf_counter() - t0
        per_step = base / (STEPS + 1)
        w.terminate()
        w.wait(30)
        for rep in range(reps):
            tq = f"rec-{uuid.uuid4().hex[:6]}"
            w1 = spawn(home, address, tq, f"{rep}a")
            await ready(home, f"{rep}a")
            calls0 = scripts.calls_so_far()
            handle = await start(client, trace, model, tq)
            t_start = time.perf_counter()
            kill_after = per_step * rng.uniform(5, 15)
            await asyncio.sleep(kill_after)
            os.killpg(w1.pid, signal.SIGKILL)
            w1.wait(10)
            t_kill = time.perf_counter()
            w2 = spawn(home, address, tq, f"{rep}b")
            await handle.result()
            t_done = time.perf_counter()
            left = max(0.0, base - (t_kill - t_start))
            cost = (t_done - t_kill) - left
            costs.append(cost)
            extra = scripts.calls_so_far() - calls0 - (STEPS + 1)
            rows.append([rep, t_kill - t_start, t_done - t_kill, left, cost, extra])
            w2.terminate()
            w2.wait(30)
        print(f"{STEPS}-step scripted reflection, 200 ms model latency; uncrashed run {base:.2f} s")
        print(
            table(
                [
                    "run",
                    "killed at s",
                    "kill -> done s",
                    "uncrashed time left s",
                    "recovery cost s",
                    "extra model calls",
                ],
                rows,
            )
        )
        print(f"median recovery cost: {median(costs):.2f} s over {reps} runs")
    finally:
        await server.astop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    asyncio.run(main(ap.parse_args().reps))
