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


async def main() -> None:
    s = Settings.from_env()
    client = await connect(s.address)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with build_worker(client, s.task_queue, extra_workflows=[AnchorWorkflow]):
        print(f"rr worker pid={os.getpid()} ready", flush=True)
        await stop.wait()
    await sandbox_cells.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
