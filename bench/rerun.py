"""`rr rerun --from-step 15` of a 20-step reflection vs a fresh run, through the local OpenAI server.

The provider is `reflector.testing.openai_server.OpenAIServer` on loopback (19 `execute_code` calls,
then the answer: 20 steps), holding every reply `--latency` seconds. For each latency, `--reps`
times: a fresh reflection (20 requests paid), then a rerun of it from step 15 with another model
name (the same server). "requests paid" is the server's count of requests it answered during that
reflection; "plan s" is the client reading the origin's histories and storing the prefix blob
(`reflector.client.rerun.plan_rerun`), included in the rerun's wall time.

    python -m bench.rerun [--latency 0,1] [--reps 3] [--steps 20] [--from-step 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

from bench.common import median, start_bench_env, table
from reflector import client as rr
from reflector.client import connect
from reflector.client.rerun import plan_rerun
from reflector.contract import ReflectionConfig
from reflector.testing.openai_server import OpenAIServer
from worker import build_worker


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", default="0,1", help="comma-separated reply latencies, seconds")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--from-step", type=int, default=15)
    args = ap.parse_args()
    env = await start_bench_env()
    rows: list[list[object]] = []
    try:
        for latency in (float(x) for x in args.latency.split(",")):
            with OpenAIServer(cells=args.steps - 1, latency_s=latency, nodelay=True, record=False) as server:
                os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = server.base_url, "bench-key"
                client = await connect(env.address, settings=env.settings)
                tq = f"rerun-{uuid.uuid4().hex[:6]}"
                fresh_s: list[float] = []
                rerun_s: list[float] = []
                plan_s: list[float] = []
                fresh_paid: list[int] = []
                rerun_paid: list[int] = []
                async with build_worker(client, tq):
                    for _ in range(args.reps):
                        model = f"openai-chat:bench-origin-{uuid.uuid4().hex[:6]}"
                        cfg = ReflectionConfig(model=model, max_requests=args.steps + 10)
                        n0, t0 = sum(server.completed.values()), time.perf_counter()
                        handle = await rr.start_reflection(client, rr.build_input(env.trace, config=cfg), tq)
                        origin = await handle.result()
                        fresh_s.append(time.perf_counter() - t0)
                        fresh_paid.append(sum(server.completed.values()) - n0)
                        assert origin.raw["rr_trace"]["total_iterations"] == args.steps, origin.raw[
                            "rr_trace"
                        ]

                        n0, t0 = sum(server.completed.values()), time.perf_counter()
                        plan = await plan_rerun(
                            client,
                            env.settings,
                            handle.id,
                            args.from_step,
                            model=f"openai-chat:bench-new-{uuid.uuid4().hex[:6]}",
                        )
                        plan_s.append(time.perf_counter() - t0)
                        out = await (await rr.start_reflection(client, plan.input, tq)).result()
                        rerun_s.append(time.perf_counter() - t0)
                        rerun_paid.append(sum(server.completed.values()) - n0)
                        assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw["rr_trace"]
                        assert out.raw["rerun"]["reused_requests"] == args.from_step - 1
                    assert not server.duplicated_completions()
                rows.append(
                    [f"{latency:g}", "fresh", median(fresh_s), f"{min(fresh_paid)}–{max(fresh_paid)}", "", ""]
                )
                rows.append(
                    [
                        f"{latency:g}",
                        f"rerun from {args.from_step}",
                        median(rerun_s),
                        f"{min(rerun_paid)}–{max(rerun_paid)}",
                        median(plan_s),
                        f"{median(rerun_s) / median(fresh_s):.2f}",
                    ]
                )
    finally:
        await env.server.astop()
    print(
        f"{args.steps}-step reflection, rerun from step {args.from_step}; medians of {args.reps} "
        "(requests paid: min–max over the reps)"
    )
    print(table(["latency s", "run", "wall s", "requests paid", "plan s", "rerun / fresh"], rows))


if __name__ == "__main__":
    asyncio.run(main())
