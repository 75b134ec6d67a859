"""What a sticky fallback costs, and what the sticky timeout buys after a worker dies.

Two measurements with plain temporalio workers (the mechanism is temporalio's and the server's, not rr's
code), on a dev server of their own (127.0.0.1, a free port, a temp SQLite file):

1. **A fallback on the worker that still caches the run.** 20 workflows of 6 short activities each on one
   worker with 2 workflow-task slots and rr's sticky timeout; a workflow blocks the worker's event loop
   for 4 s, so their next workflow tasks wait on the sticky queue past the timeout and come back from the
   shared queue with their whole history. Reported: the fallbacks (sticky schedule-to-start timeouts in
   the histories), the workflow instances created per run (a replay creates a new one) and the workflow
   steps run while replaying. A fallback to the same worker is a history fetch, not a replay.
2. **After a SIGKILL.** One workflow of 6 activities of 2 s each (heartbeating) on a worker subprocess that
   is SIGKILLed mid-activity; a new worker starts at once. With the activity's heartbeat timeout shorter
   than the server's sticky-poller window (~10 s) the retried activity's completion schedules the next
   workflow task on the dead worker's sticky queue, where it waits the whole sticky timeout; with a longer
   heartbeat timeout (rr's model requests: 30 s) the server no longer counts the dead worker as polling and
   schedules it on the shared queue at once. Reported: kill -> done, and the longest sticky wait.
3. **After a graceful stop.** The same, with SIGTERM: the worker leaves its `async with Worker` (its
   activity is cancelled and retried), and the server is told the worker is gone.

    python -m bench.sticky_fallbacks [--sticky 1 10]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from bench.common import table
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import DEFAULT_STICKY_TIMEOUT_S

REPO = Path(__file__).resolve().parents[1]
INSTANCES: collections.Counter[str] = collections.Counter()
REPLAYED: collections.Counter[str] = collections.Counter()


@activity.defn
def quick() -> int:
    return 1


@activity.defn
async def block_loop(seconds: float) -> None:
    time.sleep(seconds)  # on the worker's event loop: its workflow activations wait, slots stay taken


@activity.defn
async def beating(i: int) -> int:
    for _ in range(20):
        activity.heartbeat()
        await asyncio.sleep(0.1)
    return i


@workflow.defn(sandboxed=False)
class Steps:
    def __init__(self) -> None:
        INSTANCES[workflow.info().workflow_id] += 1

    @workflow.run
    async def run(self) -> int:
        for _ in range(6):
            await workflow.execute_activity(quick, start_to_close_timeout=timedelta(seconds=30))
            if workflow.unsafe.is_replaying():
                REPLAYED[workflow.info().workflow_id] += 1
        return 6


@workflow.defn(sandboxed=False)
class Blocker:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(block_loop, 4.0, start_to_close_timeout=timedelta(seconds=30))


@workflow.defn(sandboxed=False)
class Beating:
    @workflow.run
    async def run(self, heartbeat_s: float) -> int:
        total = 0
        for i in range(6):
            total += await workflow.execute_activity(
                beating,
                i,
                start_to_close_timeout=timedelta(seconds=120),
                heartbeat_timeout=timedelta(seconds=heartbeat_s),
                retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
            )
        return total


async def _sticky_waits(handle: WorkflowHandle[object, object]) -> tuple[int, float]:
    """Sticky schedule-to-start timeouts, and the longest wait of a workflow task before it started."""
    events = (await handle.fetch_history()).events
    fallbacks, longest = 0, 0.0
    for i, e in enumerate(events):
        if (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            and e.workflow_task_timed_out_event_attributes.timeout_type
            == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
        ):
            fallbacks += 1
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            for f in events[i + 1 :]:
                if f.event_type in (
                    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
                ):
                    longest = max(
                        longest, (f.event_time.ToDatetime() - e.event_time.ToDatetime()).total_seconds()
                    )
                    break
    return fallbacks, longest


async def fallbacks_on_the_caching_worker(client: Client, sticky_s: float) -> list[object]:
    tq = f"fb-{uuid.uuid4().hex[:6]}"
    INSTANCES.clear()
    REPLAYED.clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        async with Worker(
            client,
            task_queue=tq,
            workflows=[Steps, Blocker],
            activities=[quick, block_loop],
            activity_executor=pool,
            max_concurrent_workflow_tasks=2,
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_s),
        ):
            handles = [
                await client.start_workflow(Steps.run, id=f"{tq}-{i}", task_queue=tq) for i in range(20)
            ]
            await asyncio.sleep(0.3)
            await client.start_workflow(Blocker.run, id=f"{tq}-blocker", task_queue=tq)
            for h in handles:
                await h.result()
    fallbacks = sum([(await _sticky_waits(h))[0] for h in handles])
    return [sticky_s, len(handles), fallbacks, max(INSTANCES.values()), sum(REPLAYED.values())]


def _spawn(address: str, tq: str, sticky_s: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.sticky_fallbacks", "--worker", address, tq, str(sticky_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


async def failover_after_stop(
    client: Client, address: str, sticky_s: float, heartbeat_s: float, how: signal.Signals = signal.SIGKILL
) -> list[object]:
    tq = f"fo-{uuid.uuid4().hex[:6]}"
    first = _spawn(address, tq, sticky_s)
    handle = await client.start_workflow(Beating.run, heartbeat_s, id=tq, task_queue=tq)
    await asyncio.sleep(3.0)  # mid-way through the second activity
    os.killpg(first.pid, how)
    first.wait()
    killed = time.monotonic()
    second = _spawn(address, tq, sticky_s)
    try:
        await handle.result()
        done = time.monotonic() - killed
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
    _, longest = await _sticky_waits(handle)
    return [sticky_s, heartbeat_s, done, longest]


async def _worker(address: str, tq: str, sticky_s: float) -> None:
    client = await Client.connect(address)
    async with Worker(
        client,
        task_queue=tq,
        workflows=[Beating],
        activities=[beating],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky_s),
    ):
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()


async def main(stickies: list[float]) -> None:
    root = Path(tempfile.mkdtemp(prefix="rr-bench-sticky-"))
    server = DevServer(root / "temporal.sqlite", ui=False, log_file=root / "server.log")
    address = await server.astart()
    try:
        client = await Client.connect(address)
        rows = [await fallbacks_on_the_caching_worker(client, s) for s in stickies]
        print(
            "1. sticky fallbacks on the worker that caches the run (20 runs x 6 activities, loop blocked 4 s)"
        )
        print(
            table(
                ["sticky timeout s", "runs", "fallbacks", "instances per run (max)", "steps replayed"], rows
            )
        )
        rows = [await failover_after_stop(client, address, s, hb) for hb in (2.0, 12.0) for s in stickies]
        print("\n2. SIGKILL mid-activity, a new worker at once (6 activities of 2 s; uncrashed ~12 s)")
        print(
            table(["sticky timeout s", "heartbeat timeout s", "kill -> done s", "longest task wait s"], rows)
        )
        rows = [await failover_after_stop(client, address, s, 2.0, signal.SIGTERM) for s in stickies]
        print("\n3. SIGTERM (a graceful stop) mid-activity, a new worker at once")
        print(
            table(["sticky timeout s", "heartbeat timeout s", "stop -> done s", "longest task wait s"], rows)
        )
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        asyncio.run(_worker(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        ap = argparse.ArgumentParser(
            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        ap.add_argument("--sticky", type=float, nargs="+", default=sorted({1.0, DEFAULT_STICKY_TIMEOUT_S}))
        asyncio.run(main(ap.parse_args().sticky))
