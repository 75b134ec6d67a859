"""Record a reference history for the replay suite: `python -m tests.replay.record NAME MODEL`.

Committed histories are the durable contract: every later version of the workflow must replay
them. Only re-record one deliberately (a breaking change needs a patch instead: workflows/patches.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).parent


async def main(name: str, model: str) -> None:
    os.environ["RR_HOME"] = tempfile.mkdtemp(prefix="rr-record-")
    import reflector.testing.scripted  # noqa: F401
    from reflector import client as rr
    from reflector.client import connect
    from reflector.contract import ReflectionConfig
    from reflector.runtime.devserver import DevServer
    from reflector.runtime.settings import Settings
    from tests.support.fixtures import write_trace
    from worker import build_worker

    server = DevServer(None, ui=False)
    address = await server.astart()
    try:
        client = await connect(address)
        tq = f"record-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            settings = Settings.from_env()
            ref = rr.upload_trace(write_trace(settings.home), settings)
            inp = rr.build_input(
                ref, question="What is 17 * 24?", ground_truth="408", config=ReflectionConfig(model=model)
            )
            handle = await rr.start_reflection(client, inp, tq, f"recorded-{name}")
            await handle.result()
            history = await handle.fetch_history()
        (HERE / "histories" / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1))
    finally:
        await server.astop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
