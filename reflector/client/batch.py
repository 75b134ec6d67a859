"""Batch reflection from the client: the runs into the blob store, the batch started and followed, its
records and result read back."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from reflector.client.runs import _follow
from reflector.client.temporal import ReflectError, task_timeout_for
from reflector.client.upload import _open_store, check_id, upload_skillbook, upload_trace
from reflector.contract import (
    BATCH_WORKFLOW_NAME,
    BatchInput,
    BatchOutput,
    BatchProgress,
    BatchResult,
    ManifestRef,
    ReflectionConfig,
    RunRecord,
    SkillbookRef,
)
from reflector.runtime.settings import Settings, usable_dir

# Children of a batch that run at once (`--concurrency`) by default. An in-process model (the heuristic)
# costs CPU only: each child holds a workflow task and a sandbox host for its whole session. On two cores
# 8 at once reflect 10 runs/s, 32 only 12 (1: 5.5; bench/batch.py, 120 tau-bench runs), and 8 leave most of
# a worker's 32 adaptive workflow-task slots to other reflections started meanwhile. With a provider
# model each child waits on the network, but every request counts against the provider's rate limit and
# costs money: 4 sessions at once stay within a default-tier limit, and a batch found to be set up wrong
# is stopped having spent less.
BATCH_CONCURRENCY_IN_PROCESS = 8

BATCH_CONCURRENCY_PROVIDER = 4


def default_concurrency(model: str) -> int:
    from reflector.runtime.models import answers_in_process

    return BATCH_CONCURRENCY_IN_PROCESS if answers_in_process(model) else BATCH_CONCURRENCY_PROVIDER


def upload_batch(paths: Sequence[str | Path], settings: Settings, *, split: bool = False) -> ManifestRef:
    """Store every run of `paths` as its own trace blob and the manifest listing them (`reflector.runtime.storage.manifest`).

    Files and directories: one run per file (a file that is not a valid trace is a broken run, reported by
    the batch); `split=True`: every file holds many runs (a JSON array, JSONL lines), one run per record.
    """
    from reflector.runtime.storage.manifest import iter_sources, write_manifest

    root = usable_dir(settings.blob_dir, settings.blob_dir_setting)
    store = _open_store(settings)
    try:
        sources = iter_sources(
            paths,
            store,
            upload=lambda p: upload_trace(p, settings),
            split=split,
            max_bytes=settings.max_trace_bytes,
        )
        return write_manifest(sources, store)
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise ReflectError(
            f"cannot read the batch or store it in the blob store {root}: {e.strerror or e}{where}"
        ) from None


def build_batch_input(
    manifest: ManifestRef,
    *,
    config: ReflectionConfig | None = None,
    skillbook: str | Path | SkillbookRef | None = "",
    mode: str = "offline",
    concurrency: int | None = None,
    children_per_run: int | None = None,
    page_size: int | None = None,
    llm_synthesis: bool | None = None,
    settings: Settings | None = None,
) -> BatchInput:
    """The batch's input (caps and the skillbook as `build_input`; at most `reflector.analysis.limits.MAX_BATCH_RUNS` runs)."""
    from reflector.analysis.limits import MAX_BATCH_RUNS
    from reflector.runtime.models import check_model_name  # pydantic-ai: not for clients that only read

    config = config or ReflectionConfig()
    try:
        check_model_name(config.model)
    except ValueError as e:
        raise ReflectError(str(e)) from e
    if concurrency is not None and concurrency < 1:
        raise ReflectError("--concurrency must be at least 1")
    if manifest.n_runs > MAX_BATCH_RUNS:
        raise ReflectError(
            f"the batch has {manifest.n_runs:,} runs, over the limit of {MAX_BATCH_RUNS:,} "
            "(reflector.analysis.limits.MAX_BATCH_RUNS): split it into several batches"
        )
    extra: dict[str, Any] = {}
    if children_per_run is not None:
        extra["children_per_run"] = children_per_run
    if page_size is not None:
        extra["page_size"] = page_size
    return BatchInput(
        manifest=manifest,
        config=config,
        skillbook_ref=upload_skillbook(skillbook, settings),
        mode=mode,
        concurrency=concurrency or default_concurrency(config.model),
        llm_synthesis=llm_synthesis,
        **extra,
    )


async def start_batch(
    client: Client, inp: BatchInput, task_queue: str, workflow_id: str | None = None, *, name: str = ""
) -> WorkflowHandle[Any, BatchOutput]:
    """Start `BatchReflectionWorkflow` (search attributes and memo as `start_reflection`; `name`: what it reads)."""
    from reflector.runtime import search_attributes as sa

    check_id(workflow_id)
    wf_id = workflow_id or f"rr-batch-{inp.manifest.sha256[:8]}-{uuid.uuid4().hex[:8]}"
    attrs = None
    if not await sa.missing(client):
        inp = inp.model_copy(update={"search_attributes": True})
        attrs = sa.start_attributes(inp.config.model, batch_id=wf_id)
    try:
        handle: WorkflowHandle[Any, BatchOutput] = await client.start_workflow(
            BATCH_WORKFLOW_NAME,
            inp,
            id=wf_id,
            task_queue=task_queue,
            task_timeout=task_timeout_for(inp.config.model),
            result_type=BatchOutput,
            search_attributes=attrs,
            memo=sa.memo(None, name, runs=inp.manifest.n_runs),
        )
    except WorkflowAlreadyStartedError:
        raise ReflectError(
            f"a batch with id {wf_id!r} is already running: follow it with `rr result {wf_id}`, "
            "or choose another --id"
        ) from None
    return handle


async def wait_for_batch(
    handle: WorkflowHandle[Any, BatchOutput],
    on_progress: Callable[[BatchProgress], Awaitable[None] | None] | None = None,
    poll_s: float = 1.0,
    *,
    on_no_worker: Callable[[float], None] | None = None,
    on_worker_back: Callable[[], None] | None = None,
    no_worker_after_s: float = 15.0,
) -> BatchOutput:
    """`wait_for_result` for a batch (it follows the batch across continue-as-new)."""
    return await _follow(
        handle,
        BatchProgress,
        on_progress,
        poll_s,
        on_no_worker=on_no_worker,
        on_worker_back=on_worker_back,
        no_worker_after_s=no_worker_after_s,
    )


def load_batch_records(out: BatchOutput, settings: Settings) -> list[RunRecord]:
    """Every run's record of a finished batch, in run order, from the blob store."""
    from reflector.runtime.storage.manifest import load_records

    return load_records(_open_store(settings), [out.records.sha256])


def batch_result(out: BatchOutput, settings: Settings) -> BatchResult:
    """A finished batch's output with every run's record (from the blob store)."""
    return BatchResult(**out.model_dump(), run_records=load_batch_records(out, settings))


async def fetch_batch_result(client: Client, batch_id: str, settings: Settings) -> BatchResult:
    handle = client.get_workflow_handle(batch_id, result_type=BatchOutput)
    out: BatchOutput = await handle.result()
    return batch_result(out, settings)


async def reflect_batch(
    client: Client,
    paths: Sequence[str | Path],
    settings: Settings,
    *,
    split: bool = False,
    task_queue: str | None = None,
    config: ReflectionConfig | None = None,
    skillbook: str | Path | SkillbookRef | None = "",
    mode: str = "offline",
    concurrency: int | None = None,
    children_per_run: int | None = None,
    batch_id: str | None = None,
    on_progress: Callable[[BatchProgress], Awaitable[None] | None] | None = None,
) -> BatchResult:
    """Reflect on every run of `paths` (see `upload_batch`) and synthesise across them.

    Returns the batch's `BatchResult`: counts, the synthesis and every run's compact record; a record's
    `workflow_id` names its child reflection (`fetch_result(client, record.workflow_id)` for all of it).
    Needs a worker on `task_queue` (default `RR_TASK_QUEUE`).
    """
    manifest = upload_batch(paths, settings, split=split)
    inp = build_batch_input(
        manifest,
        config=config,
        skillbook=skillbook,
        mode=mode,
        concurrency=concurrency,
        children_per_run=children_per_run,
        settings=settings,
    )
    handle = await start_batch(client, inp, task_queue or settings.task_queue, batch_id)
    return batch_result(await wait_for_batch(handle, on_progress), settings)


def is_batch_complete(out: BatchOutput) -> bool:
    """False when a run could not be reflected on or a reflection stopped early (the CLI exits with
    `EXIT_INCOMPLETE`); the synthesis is still there, over the runs that were."""
    return out.failed == 0 and out.synthesis.incomplete_reflections == 0
