"""Replay every finished reflection and batch history on a server against the current code.

Run when the session's dev server is torn down (`tests/conftest.py`), on each pytest-xdist worker for its
own server: by then the crash, CLI, recursion, compaction, batch and budget tests have left root, child,
continued-as-new and batch runs on it. Each history's external payloads are in the blob store it was run
with: the session's and every store a test registered in `EXTRA_BLOB_DIRS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

__all__ = ["replay_server_histories", "TEST_PLUGINS"]

TEST_PLUGINS = ("reflector.testing.scripted", "tests.support.audit_script")


async def replay_server_histories(address: str, blob_dirs: Sequence[Path]) -> tuple[int, list[str]]:
    """(histories replayed, failures): every closed `ReflectionWorkflow` / `BatchReflectionWorkflow` run."""
    import worker
    from reflector.client import connect
    from reflector.contract import BATCH_WORKFLOW_NAME, WORKFLOW_NAME
    from reflector.runtime.settings import Settings
    from reflector.runtime.storage.blobs import BlobNotFound

    # the models the tests' subprocesses registered through RR_PLUGINS: a workflow resolves its model by name,
    # so a history of `scripted-paced-20` replays only where that model is known (as for `rr replay`)
    for plugin in TEST_PLUGINS:
        importlib.import_module(plugin)
    client: Client = await connect(address, settings=Settings.from_env())
    # no store registered (e.g. only unit and CLI tests ran): histories with inline payloads still replay
    dirs = list(dict.fromkeys(blob_dirs)) or [Settings.from_env().blob_dir]
    replayers = [worker.make_replayer(d) for d in dirs]
    replayed, failures = 0, []
    query = f"WorkflowType = '{WORKFLOW_NAME}' OR WorkflowType = '{BATCH_WORKFLOW_NAME}'"
    async for wf in client.list_workflows(query):
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
        if result is None:
            failures.append(f"{wf.id}/{wf.run_id}: no blob store of {dirs} holds its payloads")
        elif result.replay_failure is not None:
            failures.append(f"{wf.id}/{wf.run_id}: {str(result.replay_failure)[:2000]}")
        replayed += 1
    return replayed, failures
