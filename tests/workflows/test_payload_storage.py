"""External payload storage: large payloads live in the blob store, the history keeps references.

One reflection whose cells print ~30 KB each runs twice on private workers: once with the default
16 KiB threshold (external) and once with the threshold at 0 (everything inline). The payload blobs go
to a private store so that the file set can be compared exactly around a replay.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf.message import Message
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHistory
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)
from temporalio.worker import Replayer

import worker
from reflector import client as rr
from reflector.contract import PAYLOAD_DRIVER_NAME, ReflectionConfig, ReflectorOutput
from reflector.runtime.models import register_model
from reflector.runtime.settings import Settings
from reflector.runtime.storage.payloads import (
    DEFAULT_THRESHOLD_BYTES,
    BlobStorageDriver,
    ReadOnlyBlobStorageDriver,
    ReadOnlyBlobStore,
    blob_dir_of,
    external_storage,
    resolve,
)
from reflector.testing.scripted import _final, _returns, synthesis_aware
from tests.conftest import ServerInfo
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.fixtures import completed_activities, write_trace

BIG_CELLS = 4
CELL_WORDS = 10_000  # "wN " * 10,000 = 30,000 characters printed per cell
# while set, the model request after this many cells fails (retryably): the worker-restart test
# stops its first worker there and lets a second one, with a fresh converter, take over
HOLD_AFTER: dict[str, int | None] = {"cells": None}


def print_30k(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """`BIG_CELLS` cells that each print ~30 KB, then an answer."""
    outputs = _returns(messages)
    hold = HOLD_AFTER["cells"]
    if hold is not None and len(outputs) >= hold:
        raise RuntimeError("held: this worker is about to be stopped")
    if len(outputs) < BIG_CELLS:
        i = len(outputs)
        code = f"print('cell {i}', ' '.join(['w{i}'] * {CELL_WORDS}))"
        return ModelResponse(parts=[ToolCallPart("execute_code", {"code": code}, tool_call_id=f"p{i}")])
    return _final(info, [o[:40] for o in outputs])


register_model(
    "scripted-print30k",
    lambda: FunctionModel(synthesis_aware(print_30k), model_name="scripted-print30k"),
)


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _history_bytes(history: WorkflowHistory) -> int:
    return sum(e.ByteSize() for e in history.events)


def _references(history: WorkflowHistory, skip_scheduled: bool = False) -> list[dict[str, object]]:
    """Every external-storage reference in the history (found in its JSON form).

    `skip_scheduled`: leave out activity inputs (a replaying workflow never reads those).
    """
    refs: list[dict[str, object]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("metadata", {}).get("messageType") is not None and "data" in node:
                meta = node["metadata"]
                if base64.b64decode(meta["messageType"]).decode().endswith("ExternalStorageReference"):
                    refs.append(json.loads(base64.b64decode(node["data"])))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for event in history.to_json_dict()["events"]:
        if not (skip_scheduled and "activityTaskScheduledEventAttributes" in event):
            walk(event)
    return refs


@dataclass
class Run:
    client: Client
    workflow_id: str
    history: WorkflowHistory
    blob_dir: Path


async def _client(address: str, blob_dir: Path, threshold: int) -> Client:
    dc = DataConverter(external_storage=external_storage(blob_dir, threshold=threshold))
    return await Client.connect(address, data_converter=dc, plugins=[PydanticAIPlugin()])


async def _reflect(client: Client, tq: str, settings: Settings, trace: Path) -> str:
    ref = rr.upload_trace(trace, settings)  # the trace itself goes to the rr blob store, as always
    cfg = ReflectionConfig(model="scripted-print30k", microcompact_keep_recent=20)
    inp = rr.build_input(ref, question="What is 17 * 24?", ground_truth="408", config=cfg)
    handle = await rr.start_reflection(client, inp, tq, f"ps-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    assert out.raw["rr_trace"]["cells"] == BIG_CELLS and out.raw["rr_trace"]["stop_reason"] == "completed"
    assert "cell 3" in out.error_identification  # the 30 KB outputs made it back to the model
    return handle.id


@pytest.fixture(scope="module")
async def runs(temporal_server, settings: Settings, tmp_path_factory) -> AsyncIterator[dict[str, Run]]:
    """The same reflection with external storage (default threshold) and inline (threshold 0)."""
    from worker import build_worker

    tmp = tmp_path_factory.mktemp("payloads")
    trace = write_trace(tmp)
    out: dict[str, Run] = {}
    for label, threshold in (("external", DEFAULT_THRESHOLD_BYTES), ("inline", 0)):
        blob_dir = tmp / f"blobs-{label}"
        EXTRA_BLOB_DIRS.append(blob_dir)
        client = await _client(temporal_server.address, blob_dir, threshold)
        tq = f"rr-ps-{label}-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            wid = await _reflect(client, tq, settings, trace)
        history = await client.get_workflow_handle(wid).fetch_history()
        out[label] = Run(client, wid, history, blob_dir)
    yield out


async def test_plugin_keeps_external_storage(runs: dict[str, Run]) -> None:
    dc = runs["external"].client.data_converter
    assert dc.payload_converter_class.__name__ == "PydanticAIPayloadConverter"
    assert dc.external_storage is not None
    assert dc.external_storage.payload_size_threshold == DEFAULT_THRESHOLD_BYTES
    assert blob_dir_of(dc) == runs["external"].blob_dir


async def test_history_is_far_smaller_and_blobs_exist(runs: dict[str, Run]) -> None:
    ext, inline = runs["external"], runs["inline"]
    ext_bytes, inline_bytes = _history_bytes(ext.history), _history_bytes(inline.history)
    print(f"history bytes: inline={inline_bytes} external={ext_bytes} ({inline_bytes / ext_bytes:.1f}x)")
    assert inline_bytes > BIG_CELLS * CELL_WORDS * 3  # the inline history holds every output
    assert ext_bytes * 3 < inline_bytes
    # the server's own figure agrees
    desc = await ext.client.get_workflow_handle(ext.workflow_id).describe()
    assert desc.raw_description.workflow_execution_info.history_size_bytes * 3 < inline_bytes

    assert not _references(inline.history) and not inline.blob_dir.exists()
    refs = _references(ext.history)
    assert len(refs) >= BIG_CELLS  # at least every cell result (a local-activity marker)
    store = BlobStorageDriver(ext.blob_dir).blobs
    # model-request inputs (handed to the local activity in process, never encoded) are not in the store
    for blob in _files(ext.blob_dir):
        stored = Payload()
        stored.ParseFromString((ext.blob_dir / blob).read_bytes())
        assert b'"messages":[' not in stored.data, blob
    for ref in refs:
        assert ref["driverName"] == PAYLOAD_DRIVER_NAME
        digest = ref["claimData"]["sha256"]  # type: ignore[index]
        assert store.path_for(digest).is_file(), digest
    # no payload in the history is over the threshold any more; `resolve` reads raw references back
    for e in ext.history.events:
        for p in _payloads(e):
            assert p.ByteSize() < DEFAULT_THRESHOLD_BYTES
    cell3 = [r.result for r in completed_activities(ext.history.events) if r.name == "rr.sandbox.run_cell"][3]
    assert b"cell 3 w3 w3" not in cell3.data  # type: ignore[attr-defined]
    assert b"cell 3 w3 w3" in resolve(cell3, ext.blob_dir).data  # type: ignore[arg-type]


def _payloads(msg: Message) -> list[Payload]:
    """Every `Payload` inside a proto message."""
    if isinstance(msg, Payload):
        return [msg]
    found: list[Payload] = []
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        found.extend(p for v in items if isinstance(v, Message) for p in _payloads(v))
    return found


async def test_replay_reads_blobs_and_writes_nothing(runs: dict[str, Run]) -> None:
    ext = runs["external"]
    before = _files(ext.blob_dir)
    assert before
    events = await worker.replay_workflow(ext.client, ext.workflow_id)
    assert events == len(ext.history.events)
    assert _files(ext.blob_dir) == before


async def test_a_writing_replayer_stores_nothing_new(runs: dict[str, Run], tmp_path: Path) -> None:
    """Replay re-encodes every command the workflow makes. The ones that would re-encode with new bytes
    (pydantic-ai stamps each model-request input with a fresh timestamp) are model-request inputs,
    which are handed to the local activity in process and never encoded; the read-only driver of
    `rr replay` makes sure of it whatever a future workflow encodes."""
    import shutil

    ext = runs["external"]
    copy = tmp_path / "copy"
    shutil.copytree(ext.blob_dir, copy)
    before = _files(copy)
    dc = DataConverter(external_storage=external_storage(copy))
    await Replayer(workflows=_workflows(), data_converter=dc, plugins=[PydanticAIPlugin()]).replay_workflow(
        ext.history
    )
    assert set(_files(copy)) == set(before)


async def test_fresh_process_reads_stored_payloads(runs: dict[str, Run], temporal_server) -> None:
    """A new converter (as after a worker restart) resolves the references: replay and the result."""
    ext = runs["external"]
    driver = CountingReadOnly(ext.blob_dir)
    ro = ExternalStorage(
        drivers=[driver], driver_selector=driver.select, payload_size_threshold=DEFAULT_THRESHOLD_BYTES
    )
    replayer = Replayer(
        workflows=_workflows(),
        data_converter=DataConverter(external_storage=ro),
        plugins=[PydanticAIPlugin()],
    )
    result = await replayer.replay_workflow(ext.history, raise_on_replay_failure=False)
    assert result.replay_failure is None
    read_back = _references(ext.history, skip_scheduled=True)
    print(
        f"replay on the driver: retrieve {driver.retrieved} claims (history: {len(_references(ext.history))} "
        f"references, {len(read_back)} outside activity inputs), store {driver.stored} (already stored), "
        f"{driver.refused} new payloads kept inline"
    )
    # the workflow reads back the cell results (local-activity markers), never the activity inputs; it
    # encodes no model-request input (handed over in process), so nothing new is kept inline either
    assert driver.retrieved == len(read_back) >= BIG_CELLS
    assert driver.refused == 0
    fresh_dc = DataConverter(external_storage=external_storage(ext.blob_dir, read_only=True))
    fresh = await Client.connect(
        temporal_server.address, data_converter=fresh_dc, plugins=[PydanticAIPlugin()]
    )
    out = await fresh.get_workflow_handle(ext.workflow_id, result_type=ReflectorOutput).result()
    assert "cell 3" in out.error_identification


async def test_worker_restart_reads_payloads_stored_by_the_previous_worker(
    temporal_server: ServerInfo, settings: Settings, tmp_path: Path
) -> None:
    """Worker A runs two cells and stops; worker B (new client, new driver) replays and finishes."""
    import asyncio

    from worker import build_worker

    blob_dir = tmp_path / "blobs"
    EXTRA_BLOB_DIRS.append(blob_dir)
    tq = f"rr-ps-restart-{uuid.uuid4().hex[:6]}"
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    cfg = ReflectionConfig(model="scripted-print30k", microcompact_keep_recent=20)
    inp = rr.build_input(ref, question="What is 17 * 24?", ground_truth="408", config=cfg)
    HOLD_AFTER["cells"] = 2
    try:
        client_a = await _client(temporal_server.address, blob_dir, DEFAULT_THRESHOLD_BYTES)
        async with build_worker(client_a, tq):
            handle = await rr.start_reflection(client_a, inp, tq, f"ps-r-{uuid.uuid4().hex[:10]}")
            for _ in range(200):
                hist = await handle.fetch_history()
                if len(_references(hist, skip_scheduled=True)) >= 2:  # two 30 KB cell results stored
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("worker A never ran two cells")
            # a graceful shutdown lets the in-flight (retrying) local model request finish first
            HOLD_AFTER["cells"] = None
    finally:
        HOLD_AFTER["cells"] = None
    stored_by_a = _files(blob_dir)
    assert stored_by_a

    driver = CountingDriver(blob_dir)
    dc = DataConverter(
        external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=DEFAULT_THRESHOLD_BYTES)
    )
    client_b = await Client.connect(temporal_server.address, data_converter=dc, plugins=[PydanticAIPlugin()])
    async with build_worker(client_b, tq):
        out = await client_b.get_workflow_handle(handle.id, result_type=ReflectorOutput).result()
    assert out.raw["rr_trace"]["cells"] == BIG_CELLS
    assert "cell 3" in out.error_identification
    # B read back what A stored: the cell results on replay, the pending model request's input
    read = set(driver.retrieved_digests)
    from_a = read & {Path(f).name for f in stored_by_a}
    hist = await client_b.get_workflow_handle(handle.id).fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in hist.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    print(
        f"worker B read {len(from_a)} blobs stored by A ({len(read)} in all); model-request attempts {attempts}"
    )
    assert len(from_a) >= 2


async def test_read_only_driver_refuses_new_payloads(tmp_path: Path) -> None:
    known, new = Payload(data=b"k" * 100), Payload(data=b"n" * 100)
    [claim] = await BlobStorageDriver(tmp_path).store(StorageDriverStoreContext(), [known])
    ro = ReadOnlyBlobStorageDriver(tmp_path)
    before = _files(tmp_path)
    assert await ro.store(StorageDriverStoreContext(), [known]) == [claim]
    with pytest.raises(ReadOnlyBlobStore):
        await ro.store(StorageDriverStoreContext(), [new])
    assert ro.select(None, new) is None and ro.select(None, known) is ro  # type: ignore[arg-type]
    assert _files(tmp_path) == before
    [back] = await ro.retrieve(StorageDriverRetrieveContext(), [claim])
    assert back == known


class CountingReadOnly(ReadOnlyBlobStorageDriver):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.retrieved = self.stored = 0

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        self.stored += len(payloads)
        return await super().store(context, payloads)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        self.retrieved += len(claims)
        return await super().retrieve(context, claims)


class CountingDriver(BlobStorageDriver):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.retrieved_digests: list[str] = []

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        self.retrieved_digests += [c.claim_data["sha256"] for c in claims]
        return await super().retrieve(context, claims)


def _workflows() -> list[type]:
    from workflows.reflection import ReflectionWorkflow

    return [ReflectionWorkflow]
