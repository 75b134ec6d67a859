"""A scripted reflection that recurses into 8 children: tokens and requests across the tree vs the root's limits.

The root runs one cell, then starts 8 children one after another (each runs 3 cells and answers),
then answers. Each child is allocated `max(10k, 0.5 x remaining)` tokens and half the remaining
requests; its usage is charged back to the root. Run with the default limits and with tight ones
(the children are then cut short and the tree still stays within the root's limits).

    python -m bench.recursion
"""

from __future__ import annotations

import asyncio
import json
import uuid

import bench.scripts  # noqa: F401
import reflector.testing.scripted  # noqa: F401  (the plan-driven scripted model `scripted-plan`)
from bench.common import start_bench_env, table
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig
from worker import build_worker

CHILD = {
    "code": ["print('child cell 1')", "print('child cell 2')", "print('child cell 3')"],
    "children": [],
    "after": [],
}
ROOT = {"code": ["print('root')"], "children": [CHILD] * 8, "after": []}


async def main() -> None:
    env = await start_bench_env()
    settings, trace, address, server = env.settings, env.trace, env.address, env.server
    try:
        client = await connect(address, settings=settings)
        tq = f"rec-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            for max_requests, max_tokens in ((50, 500_000), (20, 40_000)):
                cfg = ReflectionConfig(
                    model="scripted-plan", max_requests=max_requests, max_tokens=max_tokens
                )
                inp = rr.build_input(trace, question="PLAN:" + json.dumps(ROOT), config=cfg)
                out = await (
                    await rr.start_reflection(client, inp, tq, f"rec8-{uuid.uuid4().hex[:8]}")
                ).result()
                rows = []
                for i, call in enumerate(out.raw["rr_trace"]["subagent_calls"], 1):
                    u, a = call["usage"], call["allocation"]
                    rows.append(
                        [
                            f"child {i}",
                            a["requests"],
                            u["requests"],
                            a["tokens"],
                            u["total_tokens"],
                            call["stop_reason"],
                        ]
                    )
                own = [r for r in out.raw["usage_records"] if r["depth"] == 0]
                rows.append(
                    [
                        "root (own turns)",
                        "",
                        len(own),
                        "",
                        sum(r["input_tokens"] + r["output_tokens"] for r in own),
                        "",
                    ]
                )
                usage = out.raw["usage"]
                rows.append(
                    [
                        "TREE TOTAL",
                        max_requests,
                        usage["requests"],
                        max_tokens,
                        usage["total_tokens"],
                        out.raw["rr_trace"]["stop_reason"],
                    ]
                )
                largest = max(r["input_tokens"] + r["output_tokens"] for r in out.raw["usage_records"])
                print(
                    f"root limits: {max_requests} requests, {max_tokens:,} tokens "
                    f"(largest single request: {largest:,} tokens = the overshoot bound)"
                )
                print(
                    table(
                        [
                            "session",
                            "requests allowed",
                            "requests used",
                            "tokens allowed",
                            "tokens used",
                            "stop",
                        ],
                        rows,
                    )
                )
                print()
    finally:
        await server.astop()


if __name__ == "__main__":
    asyncio.run(main())
