"""The test suite's teardown replay (`tests/support/replay_all.py`): every finished history on a server,
replayed against the current code, one replay worker per history (before, issue 30) vs one replay worker
for them all with the histories fetched ahead (after).

A fresh embedded dev server gets `--roots` scripted reflections (`scripted-plan`: each with a child, one
cell printing over the 16 KiB payload threshold, so its output is an external payload), run by an
in-process worker; the replay reads two blob stores (the one the runs used and an empty one, as the
suite's session store and a test's private one). The two ways are timed interleaved, `--repeat` times
each, in this process (wall and this process's CPU), and the median is printed.

    python -m bench.suite_replay [--roots 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import reflector.testing.scripted  # noqa: F401  (registers the scripted models)
from bench.common import median, start_bench_env, table
from reflector import client as rr
from reflector.contract import BATCH_WORKFLOW_NAME, WORKFLOW_NAME, ReflectionConfig
from reflector.runtime.storage.blobs import BlobNotFound


async def _before(address: str, blob_dirs: Sequence[Path]) -> tuple[int, list[str]]:
    """The teardown replay as it was before issue 30 (each history in a replay worker of its own)."""
    from temporalio.client import WorkflowExecutionStatus

    import worker
    from reflector.client import connect
    from reflector.runtime.settings import Settings

    client = await connect(address, settings=Settings.from_env())
    replayers = [worker.make_replayer(d) for d in dict.fromkeys(blob_dirs)]
    replayed, failures = 0, []
    query = f"WorkflowType = '{WORKFLOW_NAME}' OR WorkflowType = '{BATCH_WORKFLOW_NAME}'"
    async for wf in client.list_workflows(query):
        if wf.status == WorkflowExecutionStatus.RUNNING:
            continue
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        result = None
        for replayer in replayers:
            try:
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            except BlobNotFound:
                continue
            if result.replay_failure is None or "rr-blobs: payload blob" not in str(result.replay_failure):
                break
        if result is None or result.replay_failure is not None:
            failures.append(wf.id)
        replayed += 1
    return replayed, failures


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(roots: int, repeat: int) -> None:
    from tests.support.replay_all import replay_server_histories
    from worker import build_worker

    env = await start_bench_env()
    try:
        client = await rr.connect(env.address, settings=env.settings)
        tq = f"bench-suite-replay-{uuid.uuid4().hex[:6]}"
        plan = {
            "code": ["print('root', 'x' * 20000)"],
            "children": [{"code": ["print('child')"]}],
            "after": ["print('after')"],
        }
        cfg = ReflectionConfig(model="scripted-plan", recursion="always")
        async with build_worker(client, tq):
            handles = [
                await rr.start_reflection(
                    client,
                    rr.build_input(env.trace, question="PLAN:" + json.dumps(plan), config=cfg),
                    tq,
                    f"sr-{uuid.uuid4().hex[:8]}",
                )
                for _ in range(roots)
            ]
            for h in handles:
                await h.result()
        empty = env.home / "another-store"
        empty.mkdir()
        dirs = [Path(env.settings.blob_dir), empty]
        rows: dict[str, list[tuple[float, float]]] = {
            "before (a replay worker per history)": [],
            "after (one replay worker, fetched ahead)": [],
        }
        counts: dict[str, int] = {}
        for _ in range(repeat):
            for name, fn in zip(rows, (_before, replay_server_histories), strict=True):
                t0, c0 = time.perf_counter(), _cpu()
                n, failures = await fn(env.address, dirs)
                rows[name].append((time.perf_counter() - t0, _cpu() - c0))
                assert not failures, failures
                counts[name] = n
        print(
            table(
                ["replay", "histories", "wall s (median)", "CPU s (median)"],
                [
                    [name, counts[name], median([w for w, _ in xs]), median([c for _, c in xs])]
                    for name, xs in rows.items()
                ],
            )
        )
    finally:
        await env.server.astop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.roots, a.repeat))
