"""Batch reflection: wall time and runs/s at several concurrencies, and a 10,000-run batch's history.

Everything runs on an embedded dev server (SQLite in a fresh temp RR_HOME) with one in-process worker
(rr's defaults), the heuristic model:

1. a tau-bench file of many runs (its path on the command line, split with `--batch` semantics: one run
   per element), reflected at each `--concurrency` (default 1, 8, 32): wall time of the batch (start to
   result, synthesis included; the split and upload are timed apart), runs/s;
2. `--synthetic N` generated tau-bench-style runs (default 10,000; `reflector.testing.tau_runs`), at
   `--synthetic-concurrency` (default 32), continuing as new every `--children-per-run` children (default:
   the workflow's own, 500): wall time, runs/s, and per run of the parent's continue-as-new chain its
   history size (the server's `history_size_bytes`) and event count. `--synthetic 0` skips it.

    python -m bench.batch PATH/TO/tau-bench.json [--concurrency 1 8 32] [--synthetic 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

from bench.common import bench_home, table
from reflector import client as rr
from reflector.client import connect
from reflector.contract import BatchOutput
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings
from reflector.testing.tau_runs import synthetic_runs
from worker import build_worker


async def _run_batch(
    client,
    settings: Settings,
    tq: str,
    path: Path,
    concurrency: int,  # type: ignore[no-untyped-def]
    children_per_run: int | None,
) -> tuple[BatchOutput, float, float, str]:
    t0 = time.monotonic()
    manifest = rr.upload_batch([path], settings, split=True)
    t1 = time.monotonic()
    inp = rr.build_batch_input(manifest, concurrency=concurrency, children_per_run=children_per_run)
    handle = await rr.start_batch(client, inp, tq, f"bench-batch-{uuid.uuid4().hex[:8]}")
    out = await rr.wait_for_batch(handle)
    return out, t1 - t0, time.monotonic() - t1, handle.id


async def _chain(client, batch_id: str) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(history bytes, events) of each run of the batch's continue-as-new chain, oldest first."""
    runs = []
    async for wf in client.list_workflows(f"WorkflowId = '{batch_id}'"):
        d = await client.get_workflow_handle(batch_id, run_id=wf.run_id).describe()
        info = d.raw_description.workflow_execution_info
        runs.append((info.start_time.ToNanoseconds(), info.history_size_bytes, info.history_length))
    return [(size, events) for _, size, events in sorted(runs)]


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("tau", type=Path, help="a tau-bench results file (a JSON list of runs)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--synthetic", type=int, default=10_000, help="generated runs (0: skip)")
    ap.add_argument("--synthetic-concurrency", type=int, default=32)
    ap.add_argument("--children-per-run", type=int, default=None)
    args = ap.parse_args(argv)

    home = bench_home()
    server = DevServer(home / "temporal.sqlite", ui=False, log_file=home / "server.log")
    address = await server.astart()
    settings = Settings.from_env()
    try:
        client = await connect(address, settings=settings)
        tq = f"bench-batch-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            n_tau = len(json.loads(args.tau.read_text()))
            rows = []
            for c in args.concurrency:
                out, split_s, wall, batch_id = await _run_batch(
                    client, settings, tq, args.tau, c, args.children_per_run
                )
                (size, events), *_ = await _chain(client, batch_id)
                rows.append(
                    [
                        c,
                        out.n_runs,
                        out.reflected,
                        out.failed,
                        f"{split_s:.2f}",
                        f"{wall:.1f}",
                        f"{out.n_runs / wall:.2f}",
                        events,
                        f"{size / 1e6:.2f}",
                    ]
                )
                print(f"concurrency {c}: {wall:.1f} s", flush=True)
            print(f"\n{args.tau.name}: {n_tau} runs, heuristic, one in-process worker")
            print(
                table(
                    [
                        "concurrency",
                        "runs",
                        "reflected",
                        "failed",
                        "split+upload s",
                        "batch wall s",
                        "runs/s",
                        "parent events",
                        "parent history MB",
                    ],
                    rows,
                )
            )
            top = out.synthesis.failure_modes[:3]
            print("top modes: " + "; ".join(f"{m.key} {m.runs} runs ({m.share:.0%})" for m in top))

            if args.synthetic:
                path = home / f"synthetic-{args.synthetic}.json"
                path.write_text(json.dumps(synthetic_runs(args.synthetic)))
                out, split_s, wall, batch_id = await _run_batch(
                    client, settings, tq, path, args.synthetic_concurrency, args.children_per_run
                )
                chain = await _chain(client, batch_id)
                print(
                    f"\n{args.synthetic:,} synthetic runs at concurrency {args.synthetic_concurrency}: "
                    f"split+upload {split_s:.1f} s, batch wall {wall:.0f} s, {out.n_runs / wall:.2f} runs/s, "
                    f"{out.reflected} reflected, {out.failed} failed, {out.continued_as_new} continue-as-new"
                )
                print(
                    table(
                        ["chain run", "history MB", "events"],
                        [[i, f"{size / 1e6:.2f}", events] for i, (size, events) in enumerate(chain)],
                    )
                )
                print(
                    f"max history {max(s for s, _ in chain) / 1e6:.2f} MB, max events {max(e for _, e in chain)} "
                    f"(Temporal's limits: 50 MB / 51,200 events; warnings at 10 MB / 10,240)"
                )
    finally:
        await server.astop()


if __name__ == "__main__":
    asyncio.run(main())
