"""The Python client: upload a trace, start a reflection, follow it, fetch or replay it.

The CLI is a thin shell over these functions. Nothing here runs inside a workflow.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import DataConverter
from temporalio.worker import Replayer

from reflector.blobstore import BlobStore, blob_uri
from reflector.models import check_model_name
from reflector.payload_storage import blob_dir_of, data_converter, external_storage
from reflector.settings import Settings
from reflector.traces import detect_format, read_trace_file
from reflector.types import Progress, ReflectionConfig, ReflectionInput, ReflectorOutput, TraceRef

__all__ = [
    "ReflectError",
    "upload_trace",
    "build_input",
    "start_reflection",
    "wait_for_result",
    "fetch_result",
    "replay_workflow",
    "runtime",
    "Runtime",
]

# A workflow task that is not completed in this time is handed to another worker: it bounds how long a
# reflection waits after its worker died (its model requests and cells are local activities that run
# inside the task, which the SDK renews every 0.8 x this).
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=4)
QUERY_TIMEOUT = WORKFLOW_TASK_TIMEOUT + timedelta(seconds=2)


class ReflectError(RuntimeError):
    """A user-facing failure with a one-line message (the CLI prints it and exits non-zero)."""


def upload_trace(path: str | Path, settings: Settings) -> TraceRef:
    """Validate a trace file and put it in the blob store; the workflow only gets the reference."""
    data, _container = read_trace_file(path, settings.max_trace_bytes)
    digest, size = BlobStore(settings.blob_dir).put_file(path)
    return TraceRef(uri=blob_uri(digest), sha256=digest, size=size, format=detect_format(data))


def build_input(
    trace: TraceRef,
    *,
    question: str = "",
    ground_truth: str | None = None,
    feedback: str | None = None,
    skillbook: str = "",
    mode: str = "offline",
    config: ReflectionConfig | None = None,
) -> ReflectionInput:
    config = config or ReflectionConfig()
    try:
        check_model_name(config.model)
    except ValueError as e:
        raise ReflectError(str(e)) from e
    return ReflectionInput(
        trace=trace,
        question=question,
        ground_truth=ground_truth,
        feedback=feedback,
        skillbook=skillbook,
        mode=mode,  # type: ignore[arg-type]
        config=config,
    )


def new_workflow_id(trace: TraceRef) -> str:
    return f"rr-{trace.sha256[:8]}-{uuid.uuid4().hex[:8]}"


async def start_reflection(
    client: Client, inp: ReflectionInput, task_queue: str, workflow_id: str | None = None
) -> WorkflowHandle[object, ReflectorOutput]:
    from workflows.reflection import ReflectionWorkflow

    handle: WorkflowHandle[object, ReflectorOutput] = await client.start_workflow(  # type: ignore[call-overload]
        ReflectionWorkflow.run,
        inp,
        id=workflow_id or new_workflow_id(inp.trace),
        task_queue=task_queue,
        task_timeout=WORKFLOW_TASK_TIMEOUT,
        result_type=ReflectorOutput,
    )
    return handle


async def wait_for_result(
    handle: WorkflowHandle[object, ReflectorOutput],
    on_progress: Callable[[Progress], Awaitable[None] | None] | None = None,
    poll_s: float = 1.0,
) -> ReflectorOutput:
    """Wait for the result, reporting progress from the workflow's `progress` query meanwhile."""
    from workflows.reflection import ReflectionWorkflow

    result_task = asyncio.ensure_future(handle.result(rpc_timeout=None))
    try:
        while not result_task.done():
            done, _ = await asyncio.wait({result_task}, timeout=poll_s)
            if done or on_progress is None:
                continue
            try:
                # The server answers a query when the workflow task in progress ends: the session's
                # task is renewed every 0.8 x task timeout, so allow a little more than one task.
                prog: Progress = await handle.query(  # type: ignore[call-overload]
                    ReflectionWorkflow.progress,
                    rpc_timeout=QUERY_TIMEOUT,
                )
            except Exception:  # a query can fail while no worker holds the workflow; progress is best effort
                continue
            maybe = on_progress(prog)
            if maybe is not None:
                await maybe
        return result_task.result()
    finally:
        if not result_task.done():
            result_task.cancel()


async def fetch_result(client: Client, workflow_id: str) -> ReflectorOutput:
    handle = client.get_workflow_handle(workflow_id, result_type=ReflectorOutput)
    out: ReflectorOutput = await handle.result()
    return out


async def replay_workflow(client: Client, workflow_id: str, settings: Settings | None = None) -> int:
    """Replay a workflow's history against the current code; returns the number of events replayed.

    Externally stored payloads are read from the client's blob store (else that of `settings`, else
    the environment's) through a read-only driver: a replay never adds a blob.
    """
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    blob_dir = blob_dir_of(client.data_converter) or (settings or Settings.from_env()).blob_dir
    await make_replayer(blob_dir).replay_workflow(history)
    return len(history.events)


def make_replayer(blob_dir: Path | str) -> Replayer:
    """A `Replayer` for reflections that reads external payloads from `blob_dir` and never writes."""
    from workflows.reflection import ReflectionWorkflow

    dc = DataConverter(external_storage=external_storage(blob_dir, read_only=True))
    return Replayer(workflows=[ReflectionWorkflow], data_converter=dc, plugins=[PydanticAIPlugin()])


async def has_pollers(client: Client, task_queue: str) -> bool:
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return len(resp.pollers) > 0


@dataclass
class Runtime:
    client: Client
    address: str
    embedded_server: bool
    local_worker: bool
    ui_url: str | None = None


@asynccontextmanager
async def runtime(
    settings: Settings,
    *,
    want_worker: bool | None = None,
    announce: Callable[[str], None] = lambda _msg: None,
) -> AsyncIterator[Runtime]:
    """Connect to Temporal, starting the embedded dev server and an in-process worker when needed.

    - An explicit `TEMPORAL_ADDRESS` that is unreachable is an error (never silently replaced).
    - The default address, unreachable: start the embedded server on the SQLite file in RR_HOME.
    - A local worker runs in this process when we started the server, when asked, or when nobody polls
      the task queue (otherwise the reflection would wait forever).
    """
    from reflector.devserver import DevServer, DevServerError, free_port, is_reachable

    server: DevServer | None = None
    address = settings.address
    if not is_reachable(address):
        if settings.address_explicit:
            raise ReflectError(f"Temporal server at TEMPORAL_ADDRESS={address} is not reachable")
        settings.home.mkdir(parents=True, exist_ok=True)
        host, _, port_s = address.rpartition(":")
        port = int(port_s) if host in ("localhost", "127.0.0.1") and port_s.isdigit() else free_port()
        ui_port = port + 1000 if port + 1000 < 65536 else free_port()
        server = DevServer(db_file=settings.db_file, port=port, ui_port=ui_port, ui=True)
        announce(f"no Temporal server at {address}: starting the embedded dev server (SQLite {settings.db_file})")
        try:
            address = await server.astart()
        except DevServerError as e:
            raise ReflectError(f"could not start the embedded Temporal server: {e}") from e
        announce(f"embedded server on {address}, Web UI {server.ui_url}")
    try:
        try:
            client = await Client.connect(
                address, namespace=settings.namespace, data_converter=data_converter(settings),
                plugins=[PydanticAIPlugin()],
            )
        except Exception as e:
            raise ReflectError(f"cannot connect to Temporal at {address}: {e}") from e
        local = want_worker if want_worker is not None else (server is not None or not await has_pollers(
            client, settings.task_queue
        ))
        rt = Runtime(client, address, server is not None, local, server.ui_url if server else None)
        if not local:
            yield rt
            return
        from activities import sandbox_cells
        from reflector.worker import build_worker
        from sandbox.isolation import IsolationUnavailable

        try:
            isolation = await sandbox_cells.check_isolation(settings)
        except IsolationUnavailable as e:
            raise ReflectError(str(e)) from None
        announce(f"running an in-process worker on task queue {settings.task_queue!r} "
                 f"(sandbox: {isolation.summary()})")
        if isolation.mode == "language-only":
            announce(f"WARNING: {sandbox_cells.LANGUAGE_ONLY_WARNING}")
        worker = build_worker(client, settings.task_queue)
        async with worker:
            try:
                yield rt
            finally:
                await sandbox_cells.shutdown()
    finally:
        if server is not None:
            await server.astop()
