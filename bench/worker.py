"""A benchmark worker process: ReflectionWorkflow plus the anchor workflow, bench models registered.

    TEMPORAL_ADDRESS=... RR_TASK_QUEUE=... python -m bench.worker
"""

from __future__ import annotations

import asyncio
import os
import signal

import bench.scripts  # noqa: F401
from activities import sandbox_cells
from bench.anchor import AnchorWorkflow
from reflector.settings import Settings
from reflector.worker import build_worker, connect


async def _loop_lag(every_s: float = 0.1) -> None:
    """Log the worst event-loop lag per 5 s (how late a 100 ms sleep wakes up): heartbeats need the loop."""
    loop = asyncio.get_running_loop()
    worst, window_start = 0.0, loop.time()
    while True:
        t = loop.time()
        await asyncio.sleep(every_s)
        worst = max(worst, loop.time() - t - every_s)
        if loop.time() - window_start > 5:
            print(f"loop lag max {worst * 1000:.0f} ms", flush=True)
            worst, window_start = 0.0, loop.time()


async def main() -> None:
    s = Settings.from_env()
    client = await connect(s.address)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with build_worker(client, s.task_queue, extra_workflows=[AnchorWorkflow]):
        print(f"rr worker pid={os.getpid()} ready", flush=True)
        lag = asyncio.create_task(_loop_lag())
        await stop.wait()
        lag.cancel()
    await sandbox_cells.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
