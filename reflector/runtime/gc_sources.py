"""What `rr gc` keeps because the server still names it: the blobs and sessions named in the histories of
the workflows the server retains (`collect_references`), read from Temporal (`TemporalSource`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus

from reflector.contract import session_key
from reflector.runtime.storage.blobs import BlobStore
from reflector.runtime.storage.inventory import (
    Names,
    StoreReader,
    names_in_bytes,
)
from reflector.runtime.storage.payloads import ForeignReference, stored_digest

HISTORY_READERS = 8  # histories read at once


class GCRefused(RuntimeError):
    """What is in use could not be determined: nothing was (or will be) removed."""


@dataclass(frozen=True)
class References:
    """What the retained executions name."""

    blobs: frozenset[str]
    traces: frozenset[str]
    sessions: frozenset[str]  # session keys of the retained executions' workflow ids
    executions: int = 0
    running: int = 0


@dataclass(frozen=True)
class Execution:
    workflow_id: str
    run_id: str
    running: bool


class WorkflowSource(Protocol):
    """The executions of one namespace and their histories."""

    namespace: str

    def executions(self) -> AsyncIterator[Execution]: ...

    def events(self, execution: Execution) -> AsyncIterator[HistoryEvent]: ...


class TemporalSource:
    """A `WorkflowSource` on a Temporal client (its namespace)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.namespace = client.namespace

    async def executions(self) -> AsyncIterator[Execution]:
        async for wf in self.client.list_workflows():
            running = wf.status is None or wf.status == WorkflowExecutionStatus.RUNNING
            yield Execution(wf.id, wf.run_id, running)

    async def events(self, execution: Execution) -> AsyncIterator[HistoryEvent]:
        handle = self.client.get_workflow_handle(execution.workflow_id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            yield event


_holders: dict[str, frozenset[str]] = {}


def _message_fields(d: Descriptor) -> list[Descriptor]:
    return [
        f.message_type
        for f in d.fields
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type is not None
    ]


def _payload_holders(root: Descriptor) -> frozenset[str]:
    """Full names of the message types reachable from `root` that can contain a `Payload`."""
    cached = _holders.get(root.full_name)
    if cached is not None:
        return cached
    target = Payload.DESCRIPTOR.full_name
    reachable: dict[str, Descriptor] = {}
    stack = [root]
    while stack:
        d = stack.pop()
        if d.full_name in reachable:
            continue
        reachable[d.full_name] = d
        stack.extend(_message_fields(d))
    holders = {target}
    changed = True
    while changed:  # a fixpoint: message types refer to each other (a failure's cause is a failure)
        changed = False
        for name, d in reachable.items():
            if name not in holders and any(m.full_name in holders for m in _message_fields(d)):
                holders.add(name)
                changed = True
    result = _holders[root.full_name] = frozenset(holders)
    return result


def _payloads(msg: Message, holders: frozenset[str]) -> Iterator[Payload]:
    """Every `Payload` inside `msg` (any depth, maps and repeated fields included)."""
    if isinstance(msg, Payload):
        yield msg
        return
    for fd, value in msg.ListFields():
        kind = fd.message_type
        if fd.type != FieldDescriptor.TYPE_MESSAGE or kind is None or kind.full_name not in holders:
            continue
        children: Iterable[Any]
        if kind.GetOptions().map_entry:
            children = value.values()
        elif fd.is_repeated:
            children = value
        else:
            children = (value,)
        for child in children:
            if isinstance(child, Message):
                yield from _payloads(child, holders)


@dataclass
class _Collected:
    blobs: set[str] = field(default_factory=set)
    traces: set[str] = field(default_factory=set)

    def add(self, names: Names) -> None:
        self.blobs |= names.blobs
        self.traces |= names.traces


async def _read_history(
    source: WorkflowSource, execution: Execution, reader: StoreReader, into: _Collected
) -> None:
    store = BlobStore(reader.root)
    holders = _payload_holders(HistoryEvent.DESCRIPTOR)
    where = f"workflow {execution.workflow_id!r} (run {execution.run_id})"
    try:
        async for event in source.events(execution):
            into.add(names_in_bytes(event.SerializeToString(), reader.known))
            for payload in _payloads(event, holders):
                digest = stored_digest(payload)
                if digest is None:
                    continue
                if not store.exists(digest):
                    raise GCRefused(
                        f"the history of {where} names the stored payload blob {digest}, which is not in "
                        f"the store {reader.root}: what it names cannot be read (is this the store the "
                        "workflow ran with?)"
                    )
                into.blobs.add(digest)
                into.add(reader.names_in_blob(digest))
    except GCRefused:
        raise
    except ForeignReference as e:
        raise GCRefused(f"the history of {where} has a payload this store cannot read: {e}") from e
    except Exception as e:
        raise GCRefused(f"could not read the history of {where}: {type(e).__name__}: {e}") from e


async def collect_references(source: WorkflowSource, reader: StoreReader) -> References:
    """Read every retained execution's history (listed twice: the second listing catches the executions
    started while the first ones were read). Raises `GCRefused` on any failure."""
    seen: dict[tuple[str, str], Execution] = {}
    collected = _Collected()
    limit = asyncio.Semaphore(HISTORY_READERS)

    async def read(execution: Execution) -> None:
        async with limit:
            await _read_history(source, execution, reader, collected)

    for _listing in range(2):
        try:
            listed = [e async for e in source.executions()]
        except Exception as e:
            raise GCRefused(
                f"could not list the workflow executions of namespace {source.namespace!r}: {type(e).__name__}: {e}"
            ) from e
        new = [e for e in listed if (e.workflow_id, e.run_id) not in seen]
        seen.update(((e.workflow_id, e.run_id), e) for e in new)
        tasks = [asyncio.ensure_future(read(e)) for e in new]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
    executions = list(seen.values())
    return References(
        blobs=frozenset(collected.blobs),
        traces=frozenset(collected.traces),
        sessions=frozenset(session_key(e.workflow_id) for e in executions),
        executions=len(executions),
        running=sum(e.running for e in executions),
    )
