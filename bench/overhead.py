"""Orchestration overhead: the same scripted 20-step reflection, (A) in-process vs (B) durable.

(A) a plain pydantic-ai agent (no Temporal) with in-process `exec` cells; (B) `ReflectionWorkflow` on
the local dev server with an in-process worker (sandbox host subprocess, local-activity cells);
(C) the anchor: a plain `TemporalDurability` agent, tool as a regular activity. Runs alternate
A, B, C in one process, repeated; medians reported, per-step overhead = (X - A) / steps.

    python -m bench.overhead [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import bench.scripts as scripts
from bench.anchor import AnchorWorkflow, plain_agent
from bench.common import median, start, start_bench_env, table
from reflector.client import connect
from worker import build_worker

STEPS = 20


async def main(reps: int) -> None:
    env = await start_bench_env()
    trace, address, server = env.trace, env.address, env.server
    try:
        client = await connect(address)
        tq = f"bench-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq, extra_workflows=[AnchorWorkflow]):
            rows = []
            for latency in scripts.LATENCIES_MS:
                model = scripts.model_name(STEPS, latency)
                times: dict[str, list[float]] = {"A": [], "B": [], "C": []}
                for rep in range(reps + 1):  # the first round warms up and is discarded
                    t = time.perf_counter()
                    await plain_agent.run("go", model=model)
                    a = time.perf_counter() - t
                    t = time.perf_counter()
                    await (await start(client, trace, model, tq)).result()
                    b = time.perf_counter() - t
                    t = time.perf_counter()
                    await client.execute_workflow(
                        AnchorWorkflow.run, model, id=f"anchor-{uuid.uuid4().hex[:8]}", task_queue=tq
                    )
                    c = time.perf_counter() - t
                    if rep:
                        times["A"].append(a)
                        times["B"].append(b)
                        times["C"].append(c)
                a, b, c = (median(times[k]) for k in "ABC")
                rows.append(
                    [f"{latency} ms", a, b, c, (b - a) / STEPS * 1000, (c - a) / STEPS * 1000, b / a, c / a]
                )
            print(f"scripted {STEPS}-step reflection, median of {reps} alternated runs each")
            print(
                table(
                    [
                        "model latency",
                        "A in-process s",
                        "B rr durable s",
                        "C anchor s",
                        "B overhead ms/step",
                        "C overhead ms/step",
                        "B/A",
                        "C/A",
                    ],
                    rows,
                )
            )
    finally:
        server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    asyncio.run(main(ap.parse_args().reps))
