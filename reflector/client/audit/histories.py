"""Every history of one reflection: the runs of its continue-as-new chain and, recursively, its children's.

`collect` / `iter_runs` read them from the server (order: the root's chain, then each child's chain and
its descendants, depth-first in start order), inlining every external payload reference (driver
`rr-blobs`) from the blob store, so what they return is self-contained: offline replay and audit need
neither the server nor the blob store. `iter_runs` streams (a batch has thousands of children): at most
`concurrency` histories are fetched at once, and only a window of child subtrees is held ahead.

The export file (`rr export`) and the runs' model are `reflector.client.audit.bundle`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory

from reflector.client.audit.bundle import (
    CLOSE_EVENTS,
    EXPORT_VERSION,
    BundleError,
    BundleWriter,
    HistoryBundle,
    RunHistory,
    _started,
    dump_bundle,
    load_bundle,
    plain_history_json,
    split_file_name,
    write_split_file,
)
from reflector.runtime.storage.blobs import BlobNotFound, BlobStore
from reflector.runtime.storage.payloads import ForeignReference, s3_claim, s3_payload, stored_digest
from reflector.runtime.storage.stores import store_at

__all__ = [
    "EXPORT_VERSION",
    "DEFAULT_CONCURRENCY",
    "RunHistory",
    "HistoryBundle",
    "BundleError",
    "collect",
    "iter_runs",
    "load_bundle",
    "dump_bundle",
    "BundleWriter",
    "ExportSummary",
    "export",
    "inline_payloads",
    "plain_history_json",
    "split_file_name",
    "write_split_file",
    "CLOSE_EVENTS",
]

DEFAULT_CONCURRENCY = 8  # histories fetched at once (and child subtrees held ahead of the one being yielded)

# every external-storage reference (current and legacy form) carries one of these in its bytes
_REFERENCE_MARKS = (b"ExternalStorageReference", b"external-storage-reference")


# ---------------------------------------------------------------------------------------------
# Inlining external payloads
# ---------------------------------------------------------------------------------------------


def _stored(payload: Payload, store: BlobStore) -> Payload:
    try:
        digest = stored_digest(payload)
    except ForeignReference as e:
        claim = s3_claim(payload)
        if claim is None:
            raise BundleError(f"cannot inline a payload: {e}") from None
        try:
            return s3_payload(claim)
        except ForeignReference as e2:
            raise BundleError(f"cannot inline a payload: {e2}") from None
    if digest is None:
        return payload
    try:
        data = store.get_bytes(digest)
    except BlobNotFound:
        raise BlobNotFound(
            f"payload blob sha256:{digest} is missing from {store.root} (is RR_BLOB_DIR the store "
            "this reflection was run with?)"
        ) from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise BundleError(f"payload blob sha256:{digest} in {store.root} is corrupt")
    out = Payload()
    out.ParseFromString(data)
    return out


def _visit(msg: Message, store: BlobStore) -> int:
    """Replace every reference Payload inside `msg` by the stored payload; returns how many were replaced."""
    n = 0
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        mt = fd.message_type
        assert mt is not None
        if mt.GetOptions().map_entry:
            if mt.fields_by_name["value"].type != FieldDescriptor.TYPE_MESSAGE:
                continue
            items: Iterable[Message] = value.values()
        elif fd.is_repeated:
            items = value
        else:
            items = (value,)
        for item in items:
            if item.DESCRIPTOR is Payload.DESCRIPTOR:
                assert isinstance(item, Payload)
                resolved = _stored(item, store)
                if resolved is not item:
                    item.CopyFrom(resolved)
                    n += 1
            else:
                n += _visit(item, store)
    return n


def inline_payloads(events: Iterable[HistoryEvent], blob_dir: Path | str) -> int:
    """Replace, in place, every `rr-blobs` payload reference in `events` by its blob; returns how many.

    A reference written by another driver (or a codec-encoded one) raises `BundleError`; a missing blob
    raises `BlobNotFound`.
    """
    store = store_at(blob_dir)
    n = 0
    for ev in events:
        raw = ev.SerializeToString()
        if any(mark in raw for mark in _REFERENCE_MARKS):
            n += _visit(ev, store)
    return n


# ---------------------------------------------------------------------------------------------
# Collecting from the server
# ---------------------------------------------------------------------------------------------


class _Fetcher:
    def __init__(self, client: Client, blob_dir: Path, concurrency: int) -> None:
        self.client, self.blob_dir = client, blob_dir
        self.limit = asyncio.Semaphore(max(1, concurrency))
        self.window = max(1, concurrency)

    async def history(self, workflow_id: str, run_id: str) -> WorkflowHistory:
        async with self.limit:
            handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
            history = await handle.fetch_history()
            inline_payloads(history.events, self.blob_dir)
            return history

    async def first_event(self, workflow_id: str, run_id: str) -> HistoryEvent:
        async with self.limit:
            handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
            async for ev in handle.fetch_history_events(page_size=1):
                return ev
        raise BundleError(f"workflow {workflow_id} run {run_id} has no history")

    async def root_chain(self, workflow_id: str) -> list[str]:
        """The run ids of `workflow_id`'s chain, first to latest (following `continued_execution_run_id` back)."""
        desc = await self.client.get_workflow_handle(workflow_id).describe()
        ids = [desc.run_id]
        while True:
            first = await self.first_event(workflow_id, ids[-1])
            previous = first.workflow_execution_started_event_attributes.continued_execution_run_id
            if not previous or previous in ids:
                break
            ids.append(previous)
        return ids[::-1]


def _children(history: WorkflowHistory) -> list[tuple[str, str]]:
    """(workflow id, first run id) of every child this run started, in start order: the order the workflow
    initiated them (deterministic; concurrent children's `ChildWorkflowExecutionStarted` events come in the
    order the server confirmed them)."""
    started = [
        ev.child_workflow_execution_started_event_attributes
        for ev in history.events
        if ev.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
    ]
    return [
        (a.workflow_execution.workflow_id, a.workflow_execution.run_id)
        for a in sorted(started, key=lambda a: a.initiated_event_id)
    ]


def _next_run(history: WorkflowHistory) -> str | None:
    last = history.events[-1] if history.events else None
    if last is not None and last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id or None
    return None


async def _chain(
    f: _Fetcher, workflow_id: str, first_run: str | None, parent: str | None
) -> AsyncGenerator[RunHistory, None]:
    """The runs of one chain, in order: the root's from its run ids, a child's forward from its first run."""
    known = await f.root_chain(workflow_id) if first_run is None else None
    run_id: str | None = known[0] if known else first_run
    index = 0
    while run_id is not None:
        history = await f.history(workflow_id, run_id)
        yield RunHistory(workflow_id, run_id, parent, index, _started(history).workflow_type.name, history)
        index += 1
        if known is not None:
            run_id = known[index] if index < len(known) else None
        else:
            run_id = _next_run(history)


async def _walk(
    f: _Fetcher, workflow_id: str, first_run: str | None, parent: str | None
) -> AsyncGenerator[RunHistory, None]:
    children: list[tuple[str, str]] = []
    async for run in _chain(f, workflow_id, first_run, parent):
        children.extend(_children(run.history))
        yield run
    pending: deque[asyncio.Task[list[RunHistory]]] = deque()
    refs = iter(children)
    try:
        for wf, run_id in refs:
            pending.append(asyncio.ensure_future(_subtree(f, wf, run_id, workflow_id)))
            if len(pending) >= f.window:
                break
        while pending:
            runs = await pending.popleft()
            for wf, run_id in refs:  # keep the window full: the next child starts as one is yielded
                pending.append(asyncio.ensure_future(_subtree(f, wf, run_id, workflow_id)))
                break
            for run in runs:
                yield run
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)  # closed early, or a subtree failed


async def _subtree(f: _Fetcher, workflow_id: str, first_run: str, parent: str) -> list[RunHistory]:
    return [run async for run in _walk(f, workflow_id, first_run, parent)]


async def iter_runs(
    client: Client, workflow_id: str, blob_dir: Path | str, *, concurrency: int = DEFAULT_CONCURRENCY
) -> AsyncGenerator[RunHistory, None]:
    """The runs `collect` returns, streamed in the same order (payloads inlined)."""
    f = _Fetcher(client, Path(blob_dir), concurrency)
    async for run in _walk(f, workflow_id, None, None):
        yield run


async def collect(client: Client, workflow_id: str, blob_dir: Path) -> HistoryBundle:
    """Every history of the reflection (or batch) `workflow_id`, external payloads inlined from `blob_dir`.

    A running reflection gives what exists so far (`HistoryBundle.running` names the partial runs).
    An unknown id raises the server's `RPCError` (NOT_FOUND).
    """
    return HistoryBundle(workflow_id, [run async for run in iter_runs(client, workflow_id, blob_dir)])


@dataclass
class ExportSummary:
    root_id: str
    histories: int = 0
    events: int = 0
    partial: list[str] = field(default_factory=list)  # "<workflow id> run <chain index>" of runs still open
    files: list[Path] = field(default_factory=list)  # with a split directory

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root_id,
            "histories": self.histories,
            "events": self.events,
            "partial": self.partial,
            "files": [str(f) for f in self.files],
        }


async def export(
    client: Client,
    workflow_id: str,
    blob_dir: Path | str,
    *,
    out: TextIO | None = None,
    split_dir: Path | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> ExportSummary:
    """Stream the histories of `workflow_id` into an export file on `out` and/or one plain history per run
    into `split_dir`; nothing is written to `out` before the first history has been read."""
    summary = ExportSummary(workflow_id)
    writer: BundleWriter | None = None
    async with contextlib.aclosing(iter_runs(client, workflow_id, blob_dir, concurrency=concurrency)) as runs:
        async for run in runs:
            if out is not None:
                writer = writer or BundleWriter(out, workflow_id)
                writer.add(run)
            if split_dir is not None:
                summary.files.append(write_split_file(split_dir, summary.histories, run))
            summary.histories += 1
            summary.events += run.events
            if run.running:
                summary.partial.append(f"{run.workflow_id} run {run.chain_index}")
    if writer is not None:
        writer.close()
    return summary
