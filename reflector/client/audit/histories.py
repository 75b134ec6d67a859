"""Every history of one reflection: the runs of its continue-as-new chain and, recursively, its children's.

`collect` / `iter_runs` read them from the server (order: the root's chain, then each child's chain and
its descendants, depth-first in start order), inlining every external payload reference (driver
`rr-blobs`) from the blob store, so what they return is self-contained: offline replay and audit need
neither the server nor the blob store. `iter_runs` streams (a batch has thousands of children): at most
`concurrency` histories are fetched at once, and only a window of child subtrees is held ahead.

The export file (`rr export`) is a JSON object

    {"rr_export": 1, "root": <workflow id>, "histories": [
        {"workflow_id", "run_id", "parent_workflow_id", "chain_index", "workflow_type", "events": [...]}, ...]}

where each entry's `{"events": [...]}` is exactly Temporal's JSON history format (what
`temporal workflow show --output json` prints and `WorkflowHistory.from_json` reads). `load_bundle` reads
such a file or one plain Temporal JSON history.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import re
from collections import deque
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History, HistoryEvent
from temporalio.client import Client, WorkflowHistory

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

EXPORT_VERSION = 1
DEFAULT_CONCURRENCY = 8  # histories fetched at once (and child subtrees held ahead of the one being yielded)

CLOSE_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)
# every external-storage reference (current and legacy form) carries one of these in its bytes
_REFERENCE_MARKS = (b"ExternalStorageReference", b"external-storage-reference")


class BundleError(ValueError):
    """A file that is not an `rr export` file nor a Temporal JSON history (one line, for the CLI)."""


@dataclass(frozen=True)
class RunHistory:
    workflow_id: str
    run_id: str
    parent_workflow_id: str | None  # None for the root
    chain_index: int  # 0 = first run of this workflow id's continue-as-new chain
    workflow_type: str  # ReflectionWorkflow / BatchReflectionWorkflow
    history: WorkflowHistory  # every external payload inlined

    @property
    def events(self) -> int:
        return len(self.history.events)

    @property
    def running(self) -> bool:
        """The run had not closed when its history was read: a partial history."""
        events = self.history.events
        return not events or events[-1].event_type not in CLOSE_EVENTS

    @property
    def continued(self) -> bool:
        """The run ended by continuing as new (a later run of the chain follows)."""
        events = self.history.events
        return (
            bool(events) and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        )


@dataclass(frozen=True)
class HistoryBundle:
    root_id: str
    runs: list[RunHistory]  # the root's chain in order, then each child's chain, depth-first in start order

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    @property
    def running(self) -> list[RunHistory]:
        """The runs whose history is partial (the reflection, or part of it, was still running)."""
        return [r for r in self.runs if r.running]


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


def _started(history: WorkflowHistory) -> Any:
    if not history.events or not history.events[0].HasField("workflow_execution_started_event_attributes"):
        raise BundleError(
            f"the history of {history.workflow_id} does not begin with WorkflowExecutionStarted"
        )
    return history.events[0].workflow_execution_started_event_attributes


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


# ---------------------------------------------------------------------------------------------
# The export file
# ---------------------------------------------------------------------------------------------


def _events_json(history: WorkflowHistory) -> list[Any]:
    events: list[Any] = json_format.MessageToDict(History(events=history.events)).get("events", [])
    return events


def plain_history_json(run: RunHistory) -> str:
    """One run as a plain Temporal JSON history (`{"events": [...]}`), indented like the temporal CLI prints it."""
    return json.dumps({"events": _events_json(run.history)}, indent=2) + "\n"


def split_file_name(position: int, run: RunHistory) -> str:
    """The file name of `run` in an `rr export --split` directory: bundle order, workflow id, chain index."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run.workflow_id)[:150]
    return f"{position:05d}-{safe}-run{run.chain_index}.json"


def write_split_file(directory: Path, position: int, run: RunHistory) -> Path:
    """Write `run` as a plain Temporal JSON history into `directory` (`rr export --split`); returns its path."""
    path = Path(directory) / split_file_name(position, run)
    path.write_text(plain_history_json(run), encoding="utf-8")
    return path


class BundleWriter:
    """Writes an export file entry by entry (a batch's bundle never has to be held whole)."""

    def __init__(self, out: TextIO, root_id: str) -> None:
        self.out, self.count = out, 0
        out.write(f'{{"rr_export": {EXPORT_VERSION}, "root": {json.dumps(root_id)}, "histories": [')

    def add(self, run: RunHistory) -> None:
        entry = {
            "workflow_id": run.workflow_id,
            "run_id": run.run_id,
            "parent_workflow_id": run.parent_workflow_id,
            "chain_index": run.chain_index,
            "workflow_type": run.workflow_type,
            "events": _events_json(run.history),
        }
        self.out.write(("," if self.count else "") + "\n" + json.dumps(entry, separators=(",", ":")))
        self.count += 1

    def close(self) -> None:
        self.out.write("\n]}\n")


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


def dump_bundle(bundle: HistoryBundle) -> str:
    """`bundle` as an export file (the text `rr export` writes)."""
    buf = io.StringIO()
    writer = BundleWriter(buf, bundle.root_id)
    for run in bundle.runs:
        writer.add(run)
    writer.close()
    return buf.getvalue()


def _history(workflow_id: str, events: Any, where: str) -> WorkflowHistory:
    if not isinstance(events, list) or not events:
        raise BundleError(f"{where}: no events")
    try:
        return WorkflowHistory.from_json(workflow_id, {"events": events})
    except (json_format.ParseError, KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{where}: not a Temporal JSON history ({str(e).splitlines()[0][:200]})") from None


def _entries(data: dict[str, Any], path: Path) -> Iterator[RunHistory]:
    version = data.get("rr_export")
    if version != EXPORT_VERSION:
        raise BundleError(
            f"{path}: rr export format {version!r} is not supported (this rr reads {EXPORT_VERSION})"
        )
    entries = data.get("histories")
    if not isinstance(entries, list):
        raise BundleError(f"{path}: an rr export file without a list of histories")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("workflow_id"), str):
            raise BundleError(f"{path}: history {i} is not an export entry (no workflow_id)")
        history = _history(e["workflow_id"], e.get("events"), f"{path}: history {i} ({e['workflow_id']})")
        started = _started(history)
        yield RunHistory(
            workflow_id=e["workflow_id"],
            run_id=str(e.get("run_id") or started.original_execution_run_id),
            parent_workflow_id=e.get("parent_workflow_id"),
            chain_index=int(e.get("chain_index") or 0),
            workflow_type=str(e.get("workflow_type") or started.workflow_type.name),
            history=history,
        )


def _plain(data: dict[str, Any], path: Path) -> RunHistory:
    history = _history(path.stem, data.get("events"), str(path))
    started = _started(history)
    workflow_id = (
        started.workflow_id or path.stem
    )  # servers record the id in the start event; older ones did not
    if workflow_id != history.workflow_id:
        history = WorkflowHistory(workflow_id, history.events)
    parent = started.parent_workflow_execution.workflow_id or None
    return RunHistory(
        workflow_id=workflow_id,
        run_id=started.original_execution_run_id,
        parent_workflow_id=parent,
        # a single history does not say where in its chain it stands: 0 for a first run, 1 for any later one
        chain_index=1 if started.continued_execution_run_id else 0,
        workflow_type=started.workflow_type.name,
        history=history,
    )


def load_bundle(path: Path) -> HistoryBundle:
    """An `rr export` file, or ONE plain Temporal JSON history (`temporal workflow show --output json`,
    a file of `rr export --split`), as a bundle. Raises `BundleError` (one line) for anything else.

    A directory (of `rr export --split`) gives the runs of its `*.json` files in name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise BundleError(f"{path}: a directory without *.json history files")
        runs = [run for f in files for run in load_bundle(f).runs]
        roots = [r for r in runs if r.parent_workflow_id is None]
        return HistoryBundle((roots or runs)[0].workflow_id, runs)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{path}: not a text (JSON) file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BundleError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise BundleError(
            f"{path}: neither an rr export file nor a Temporal JSON history (a JSON {type(data).__name__})"
        )
    if "rr_export" in data:
        runs = list(_entries(data, path))
        root = data.get("root")
        return HistoryBundle(str(root) if root else (runs[0].workflow_id if runs else path.stem), runs)
    if "events" in data:
        run = _plain(data, path)
        return HistoryBundle(run.workflow_id, [run])
    raise BundleError(
        f'{path}: neither an rr export file (no "rr_export") nor a Temporal JSON history (no "events")'
    )
