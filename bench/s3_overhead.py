"""S3 blob store vs the file store: the same scripted reflection, per step (one model request + one cell).

Each mode runs in a fresh child process (its own worker, client and blob cache, as two deployments
would) against one dev server and one local S3-compatible server (moto, loopback). Modes alternate
rep by rep; medians are reported, and the S3 calls each reflection made are counted (botocore's
event hooks), so the figure for a real bucket is the loopback figure plus calls x round trip:
`--rtt-ms 20` adds that round trip to every S3 call (same-region S3 is ~10-30 ms for small objects).

    python -m bench.s3_overhead [--reps 5] [--rtt-ms 0,20] [--models bench-20-0,bench-10-1000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import median, table

STEPS = {"bench-20-0": 20, "bench-10-1000": 10}


async def child(model: str, runs: int, rtt_ms: float) -> None:
    import bench.scripts  # noqa: F401  (registers the bench models)
    from bench.common import start, upload_bench_trace
    from reflector.client import connect
    from reflector.runtime.settings import Settings
    from reflector.runtime.storage.stores import mirror_for
    from worker import build_worker

    settings = Settings.from_env()
    calls: collections.Counter[str] = collections.Counter()
    mirror = mirror_for(settings)
    if mirror is not None:

        def on_call(event_name: str, **_kw: object) -> None:
            calls[event_name.split(".")[-1]] += 1
            if rtt_ms:
                time.sleep(rtt_ms / 1000)

        mirror.client.meta.events.register("before-call.s3", on_call)
    client = await connect(os.environ["TEMPORAL_ADDRESS"], settings=settings)
    trace = upload_bench_trace(settings)
    tq = f"s3b-{uuid.uuid4().hex[:6]}"
    times = []
    async with build_worker(client, tq, settings=settings):
        await (await start(client, trace, model, tq)).result()  # warm-up: hosts, imports
        calls.clear()
        for _ in range(runs):
            t = time.perf_counter()
            out = await (await start(client, trace, model, tq)).result()
            times.append(time.perf_counter() - t)
            assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw["rr_trace"]
    print(
        "RESULT " + json.dumps({"times": times, "calls": {k: v / runs for k, v in calls.items()}}), flush=True
    )


def run_child(mode: str, model: str, runs: int, rtt_ms: float, base_env: dict[str, str]) -> dict[str, object]:
    home = tempfile.mkdtemp(prefix=f"rr-s3bench-{mode}-")
    env = {**os.environ, **base_env, "RR_HOME": home}
    env.pop("RR_BLOB_DIR", None)
    if mode == "file":
        for k in ("RR_BLOB_URL", "AWS_ENDPOINT_URL"):
            env.pop(k, None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.s3_overhead",
            "--child",
            model,
            "--runs",
            str(runs),
            "--rtt-ms",
            str(rtt_ms),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{mode} child failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    result: dict[str, object] = json.loads(line[len("RESULT ") :])
    return result


def micro(s3_env: dict[str, str], rtt_ms: float, n: int = 40) -> list[list[object]]:
    """The S3 work of one cell (its journal entry) and of one in-process model request (the cache lookup,
    a miss, and the response stored), timed directly: file store vs S3, median of `n`."""
    from reflector.runtime.settings import Settings
    from reflector.runtime.storage.stores import mirror_for
    from sandbox.journal import Journal

    saved = dict(os.environ)
    os.environ.update({**s3_env, "RR_HOME": tempfile.mkdtemp(prefix="rr-s3micro-")})
    try:
        settings = Settings.from_env()
        mirror = mirror_for(settings)
        assert mirror is not None
        if rtt_ms:
            mirror.client.meta.events.register("before-call.s3", lambda **_kw: time.sleep(rtt_ms / 1000))
        root = Path(settings.blob_dir)
        response = b'{"parts": [{"part_kind": "tool-call", "args": "print(1)"}]}' * 20
        rows = []
        for what in ("cell: journal entry", "request: lookup (miss) + store"):
            per = {}
            for mode, replica in (("file", None), ("s3", mirror)):
                journal = Journal(root / f"sessions-{mode}", fsync=False, replica=replica)
                times = []
                for i in range(n):
                    t = time.perf_counter()
                    if what.startswith("cell"):
                        journal.write_entry("bench", i + 1, "x = sum(range(10))\nprint(x)")
                    else:
                        path = root / f"responses-{mode}" / "bench" / f"run.{i}.json"
                        if replica is not None and not path.exists():
                            replica.pull(path)
                        if replica is not None:
                            replica.push_bytes(path, response)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(response)
                    times.append(time.perf_counter() - t)
                per[mode] = median(times) * 1000
            rows.append([what, f"{rtt_ms:g}", per["file"], per["s3"], per["s3"] - per["file"]])
        return rows
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(reps: int, rtts: list[float], models: list[str]) -> None:
    from reflector.runtime.devserver import DevServer
    from tests.support.s3_server import s3_server

    root = Path(tempfile.mkdtemp(prefix="rr-s3bench-"))
    server = DevServer(root / "temporal.sqlite", ui=False, log_file=root / "server.log")
    address = server.start(timeout=60)
    rows = []
    try:
        with s3_server(root / "moto.log") as s3:
            base_env = {**s3.env(prefix="bench"), "TEMPORAL_ADDRESS": address}
            micro_rows = [row for rtt in rtts for row in micro(s3.env(prefix="micro"), rtt)]
            for model in models:
                steps = STEPS.get(model, 20)
                for rtt in rtts:
                    per: dict[str, list[float]] = {"file": [], "s3": []}
                    calls: dict[str, float] = {}
                    for _ in range(reps):
                        for mode in ("file", "s3"):
                            r = run_child(mode, model, 3, rtt, base_env)
                            per[mode].append(median(r["times"]))  # type: ignore[arg-type]
                            if mode == "s3":
                                calls = r["calls"]  # type: ignore[assignment]
                    f, s = median(per["file"]), median(per["s3"])
                    total_calls = sum(calls.values())
                    rows.append(
                        [
                            model,
                            f"{rtt:g}",
                            f,
                            s,
                            s / f,
                            (s - f) / steps * 1000,
                            total_calls / steps,
                            " ".join(f"{k}={v:g}" for k, v in sorted(calls.items())),
                        ]
                    )
    finally:
        server.stop()
    print(table(["S3 work of", "S3 rtt ms", "file ms", "S3 ms", "extra ms"], micro_rows))
    print()
    print(
        table(
            [
                "model",
                "S3 rtt ms",
                "file s",
                "S3 s",
                "S3/file",
                "extra ms/step",
                "S3 calls/step",
                "S3 calls per reflection",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rtt-ms", default="0,20")
    p.add_argument("--models", default="bench-20-0,bench-10-1000")
    p.add_argument("--child", default=None)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    if a.child:
        asyncio.run(child(a.child, a.runs, float(a.rtt_ms)))
    else:
        main(a.reps, [float(x) for x in a.rtt_ms.split(",")], a.models.split(","))
