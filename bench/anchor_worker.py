"""The anchor's worker process: the plain pydantic-ai `TemporalDurability` agent on a worker with
temporalio's default settings (slots, cache, sticky timeout), as a user would run it.

    TEMPORAL_ADDRESS=... RR_TASK_QUEUE=... python -m bench.anchor_worker
"""

from __future__ import annotations

import asyncio
import os
import signal

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from bench.anchor import AnchorWorkflow
from bench.evictions import print_evictions
from reflector.runtime.models import prepare_workflow_side


async def main() -> None:
    print_evictions()
    prepare_workflow_side()  # the served models (RR_WORKER_MODELS), as rr's worker does before polling
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[PydanticAIPlugin()])
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=os.environ["RR_TASK_QUEUE"], workflows=[AnchorWorkflow]):
        print(f"anchor worker pid={os.getpid()} ready", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
