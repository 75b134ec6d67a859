"""Every history the suite produced on the session server replays cleanly against the current code.

Meant to run last in the session (file name): by then the crash, CLI-independent, recursion,
compaction and budget tests have left root, child and continued-as-new runs on the shared dev server.
Run alone or early, it first makes a few reflections of its own, so it always replays something.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

import worker
from reflector import client as rr
from reflector.contract import WORKFLOW_NAME, ReflectionConfig
from reflector.settings import Settings
from reflector.storage.blobs import BlobNotFound
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import write_trace


async def test_every_reflection_history_replays(
    client: Client, settings: Settings, task_queue: str, tmp_path: Path
) -> None:
    for model in ("scripted-stateful", "heuristic"):
        ref = rr.upload_trace(write_trace(tmp_path), settings)
        handle = await rr.start_reflection(client, rr.build_input(ref, config=ReflectionConfig(model=model)), task_queue)
        await handle.result()
    replayers = [worker.make_replayer(d) for d in (settings.blob_dir, *EXTRA_BLOB_DIRS)]
    replayed = failures = 0
    async for wf in client.list_workflows(f"WorkflowType = '{WORKFLOW_NAME}'"):
        if wf.status == WorkflowExecutionStatus.RUNNING:
            continue
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        result = None
        for replayer in replayers:  # the store the run was made with holds its external payloads
            try:
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            except BlobNotFound:
                continue
            if result.replay_failure is None or "rr-blobs: payload blob" not in str(result.replay_failure):
                break
        assert result is not None, f"no blob store holds the payloads of {wf.id}"
        if result.replay_failure is not None:
            failures += 1
            print(f"replay failed for {wf.id}/{wf.run_id}: {result.replay_failure}")
        replayed += 1
    assert replayed >= 2
    assert failures == 0
