"""Replay every finished reflection and batch history on a server against the current code.

Run when the session's dev server is torn down (`tests/conftest.py`), on each pytest-xdist worker for its
own server: by then the crash, CLI, recursion, compaction, batch and budget tests have left root, child,
continued-as-new and batch runs on it. Each history's external payloads are in the blob store it was run
with: the session's and every store a test registered in `EXTRA_BLOB_DIRS`.

One replayer replays them all, in one replay worker (`Replayer.workflow_replay_iterator`, what
`replay_workflow` runs for a single history), reading each payload from whichever of those stores holds it
(blobs are content-addressed and checked against their sha256, so any store that has one has the same
bytes); the histories are fetched from the server several at a time, ahead of the replay. Before, each
history had a replay worker of its own, built once per store until one held its payloads
(`python -m bench.suite_replay`). A payload in none of the stores fails the replay of its history, which
the failures name (checked 2026-12-06 against an empty store); should the replay worker raise instead, the
histories not yet replayed are replayed one by one, store by store, as before.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.converter import DataConverter, ExternalStorage
from temporalio.worker import Replayer

from reflector.runtime.storage.blobs import BlobNotFound, BlobStore

__all__ = ["replay_server_histories", "TEST_PLUGINS"]

TEST_PLUGINS = ("reflector.testing.scripted", "tests.support.audit_script")
FETCH_CONCURRENCY = 8  # histories fetched from the server at once, ahead of the replay


class AnyOfStores(BlobStore):
    """A read-only view of several blob stores: a blob is read from the first store that holds it."""

    def __init__(self, roots: Sequence[Path]) -> None:
        super().__init__(roots[0])
        self.stores = [BlobStore(r) for r in roots]

    def get_bytes(self, sha256: str) -> bytes:
        for store in self.stores:
            if store.exists(sha256):
                return store.get_bytes(sha256)
        raise BlobNotFound(
            f"blob sha256:{sha256} is in none of the stores {[str(s.root) for s in self.stores]}"
        )

    def exists(self, sha256: str) -> bool:
        return any(store.exists(sha256) for store in self.stores)

    def put_bytes(self, data: bytes) -> str:
        raise PermissionError("the replay's blob stores are read-only")


def _replayer_over(dirs: Sequence[Path]) -> Replayer:
    """`worker.make_replayer` (the workflows, plugins and converter `rr replay` uses) reading from every store."""
    import worker
    from reflector.runtime.storage.payloads import ReadOnlyBlobStorageDriver, payload_threshold

    base = worker.make_replayer(dirs[0])
    driver = ReadOnlyBlobStorageDriver(dirs[0])
    driver.blobs = AnyOfStores(dirs)
    limit = payload_threshold()
    storage = ExternalStorage(
        drivers=[driver],
        payload_size_threshold=limit,
        driver_selector=driver.select if limit > 0 else lambda _c, _p: None,
    )
    config = base.config()
    config["data_converter"] = DataConverter(external_storage=storage)
    return Replayer(**config, plugins=base.plugins)


async def replay_server_histories(
    address: str, blob_dirs: Sequence[Path], keep_failed: Path | None = None
) -> tuple[int, list[str]]:
    """(histories replayed, failures): every closed `ReflectionWorkflow` / `BatchReflectionWorkflow` run.

    `keep_failed`: a directory where each history that fails is written (JSON, as `temporal workflow show
    --output json`), named in its failure: the server is gone after the session, and a failure that depends
    on how the run went (its workflow tasks' timing) may not come back when the tests are run again."""
    from reflector.client import connect
    from reflector.contract import BATCH_WORKFLOW_NAME, WORKFLOW_NAME
    from reflector.runtime.settings import Settings

    # the models the tests' subprocesses registered through RR_PLUGINS: a workflow resolves its model by name,
    # so a history of `scripted-paced-20` replays only where that model is known (as for `rr replay`)
    for plugin in TEST_PLUGINS:
        importlib.import_module(plugin)
    client: Client = await connect(address, settings=Settings.from_env())
    # no store registered (e.g. only unit and CLI tests ran): histories with inline payloads still replay
    dirs = list(dict.fromkeys(blob_dirs)) or [Settings.from_env().blob_dir]
    query = f"WorkflowType = '{WORKFLOW_NAME}' OR WorkflowType = '{BATCH_WORKFLOW_NAME}'"
    runs = [
        (wf.id, wf.run_id)
        async for wf in client.list_workflows(query)
        if wf.status != WorkflowExecutionStatus.RUNNING
    ]
    if not runs:
        return 0, []

    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def fetch(wid: str, run_id: str | None) -> WorkflowHistory:
        async with gate:
            return await client.get_workflow_handle(wid, run_id=run_id).fetch_history()

    fetches = [asyncio.ensure_future(fetch(wid, run_id)) for wid, run_id in runs]

    # each history as recorded, then (runs with `PATCHES_FIRST_PATCH`) with every local activity's result
    # delivered a task late, the shape of core's heartbeat race (tests/support/late_resolution.py)
    labels: list[
        tuple[int, str]
    ] = []  # (index into runs, "" or " (late)") of each history replayed, in order
    replays: list[WorkflowHistory] = []

    async def histories() -> AsyncIterator[WorkflowHistory]:
        for i, f in enumerate(fetches):
            history = await f
            for suffix, h in (("", history),) + tuple(
                (" (results delivered late)", v) for v in _late(history)
            ):
                labels.append((i, suffix))
                replays.append(h)
                yield h

    failures: list[str] = []
    done = 0
    try:
        async with _replayer_over(dirs).workflow_replay_iterator(histories()) as results:
            async for result in results:
                i, suffix = labels[done]
                if result.replay_failure is not None:
                    wid, run_id = runs[i]
                    kept = _keep(keep_failed, f"{wid}--{run_id}{'--late' if suffix else ''}", replays[done])
                    failures.append(f"{wid}/{run_id}{suffix}: {str(result.replay_failure)[:2000]}{kept}")
                done += 1
    except BlobNotFound:
        # a payload no store holds: name every history of the rest that cannot be replayed, one by one
        first = labels[done][0] if done < len(labels) else (labels[-1][0] + 1 if labels else 0)
        rest = [
            (f"{wid}/{run_id}", await f)
            for (wid, run_id), f in zip(runs[first:], fetches[first:], strict=True)
        ]
        failures += await _one_by_one(rest, dirs, keep_failed)
    finally:
        for f in fetches:
            f.cancel()
    return len(runs), failures


def _late(history: WorkflowHistory) -> list[WorkflowHistory]:
    """`history` with its local activities' results delivered a task late (none: nothing to move, or a run
    recorded before `PATCHES_FIRST_PATCH`, which does not promise to replay in that shape)."""
    import json

    from reflector.contract import PATCHES_FIRST_PATCH
    from tests.support.late_resolution import deliver_local_results_late, late_deliveries, patch_ids

    data = json.loads(history.to_json())
    if PATCHES_FIRST_PATCH not in patch_ids(data) or not late_deliveries(data):
        return []
    return [WorkflowHistory.from_json(history.workflow_id, deliver_local_results_late(data))]


def _keep(keep_failed: Path | None, name: str, history: WorkflowHistory) -> str:
    """Write a history that failed to replay into `keep_failed`; the note naming the file (or "")."""
    if keep_failed is None:
        return ""
    keep_failed.mkdir(parents=True, exist_ok=True)
    path = keep_failed / f"{name.replace('/', '--')}.json"
    path.write_text(history.to_json(), encoding="utf-8")
    return f" (history: {path})"


async def _one_by_one(
    histories: Sequence[tuple[str, WorkflowHistory]], dirs: Sequence[Path], keep_failed: Path | None = None
) -> list[str]:
    """Each history in a replay worker of its own, with each store in turn until one holds its payloads."""
    import worker

    replayers = [worker.make_replayer(d) for d in dirs]
    failures = []
    for name, history in histories:
        result = None
        for replayer in replayers:  # the store the run was made with holds its external payloads
            try:
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            except BlobNotFound:
                continue
            if result.replay_failure is None or "rr-blobs: payload blob" not in str(result.replay_failure):
                break
        if result is None:
            failures.append(f"{name}: no blob store of {list(dirs)} holds its payloads")
        elif result.replay_failure is not None:
            failures.append(f"{name}: {str(result.replay_failure)[:2000]}{_keep(keep_failed, name, history)}")
    return failures
