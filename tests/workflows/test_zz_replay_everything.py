"""Every history the suite produced on the session server replays cleanly against the current code.

Runs last in the session (file name): by then the crash, CLI-independent, recursion, compaction and
budget tests have left root, child and continued-as-new runs on the shared dev server.
"""

from __future__ import annotations

from temporalio.client import Client, WorkflowExecutionStatus

from reflector import client as rr
from reflector.blobstore import BlobNotFound
from reflector.settings import Settings
from reflector.types import WORKFLOW_NAME
from tests.support.blob_dirs import EXTRA_BLOB_DIRS


async def test_every_reflection_history_replays(client: Client, settings: Settings) -> None:
    replayers = [rr.make_replayer(d) for d in (settings.blob_dir, *EXTRA_BLOB_DIRS)]
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
    assert replayed >= 30
    assert failures == 0
