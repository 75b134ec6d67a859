"""Run in a fresh process (`python -m tests.support.first_activation ADDRESS MODEL...`): start a worker,
then run one reflection per model and record every module that workflow code imported.

An import hook at the front of `sys.meta_path` sees every import of a module not yet loaded; it
records those made while `temporalio.workflow.in_workflow()` is true (the workflow thread, during an
activation), not those of activities or of the worker's own event loop. The hook is installed after
`build_worker` returned, so what the worker prepared at start is not counted. Prints one line
`RESULT <json>`: per model, the modules imported from workflow code, the reflection's stop reason and
how long it took.

Models from `reflector.testing.scripted` come through `RR_PLUGINS`, like a real worker's plugins; OpenAI
models talk to the local OpenAI-compatible test server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from temporalio import workflow


class WorkflowImports:
    """A meta-path finder that finds nothing and notes what workflow code tried to import."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if workflow.in_workflow():
            self.names.append(name)
        return None


async def main(address: str, models: list[str]) -> dict[str, dict[str, object]]:
    from reflector import client as rr
    from reflector.client import connect
    from reflector.contract import ReflectionConfig, ReflectionInput
    from reflector.runtime.settings import Settings
    from reflector.testing.openai_server import OpenAIServer
    from tests.support.fixtures import write_trace
    from worker import build_worker

    results: dict[str, dict[str, object]] = {}
    with OpenAIServer(prompt_tokens=100, completion_tokens=20) as server:
        os.environ["OPENAI_BASE_URL"] = server.base_url
        os.environ["OPENAI_API_KEY"] = "test-key"
        settings = Settings.from_env()
        client = await connect(address, settings=settings)
        tq = f"rr-first-{uuid.uuid4().hex[:6]}"
        trace = rr.upload_trace(write_trace(Path(tempfile.mkdtemp())), settings)
        async with build_worker(client, tq):
            hook = WorkflowImports()
            sys.meta_path.insert(0, hook)
            for model in models:
                hook.names.clear()
                # not rr.build_input: its model check would build the model in this process first
                inp = ReflectionInput(
                    trace=trace,
                    question="What is 17 * 24?",
                    ground_truth="408",
                    config=ReflectionConfig(model=model),
                )
                start = time.perf_counter()
                handle = await rr.start_reflection(client, inp, tq, f"first-{uuid.uuid4().hex[:8]}")
                out = await handle.result()
                results[model] = {
                    "imports": sorted(set(hook.names)),
                    "seconds": round(time.perf_counter() - start, 3),
                    "stop_reason": out.raw["rr_trace"]["stop_reason"],
                }
            sys.meta_path.remove(hook)
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2:]))), flush=True)
    os._exit(0)  # no interpreter finalization with SDK threads alive (temporalio/sdk-python#300)
