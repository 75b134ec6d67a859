"""The Python client: upload a trace, start a reflection, follow it, fetch or replay it.

The CLI is a thin shell over these functions. Nothing here runs inside a workflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from pydantic import BaseModel
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.api.enums.v1 import PendingWorkflowTaskState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from reflector import telemetry
from reflector.connection import describe_target, open_client
from reflector.contract import (
    BATCH_WORKFLOW_NAME,
    PROGRESS_QUERY,
    WORKFLOW_NAME,
    BatchInput,
    BatchOutput,
    BatchProgress,
    BatchResult,
    ManifestRef,
    Progress,
    ReflectionConfig,
    ReflectionInput,
    ReflectorOutput,
    RunRecord,
    SkillbookRef,
    TraceRef,
)
from reflector.fastscan import FastScanner
from reflector.homeserver import HomeServer
from reflector.models import (
    check_model_name,
)
from reflector.settings import SettingError, Settings, env_number, usable_dir
from reflector.storage.blobs import BlobStore, blob_uri
from reflector.storage.payloads import data_converter
from reflector.traces import TraceFormat, check_trace_file, detect_format, read_trace_file
from reflector.traces.budget import explain_refusal
from reflector.traces.index import INDEX_SUFFIX, write_index

__all__ = [
    "ReflectError",
    "upload_trace",
    "upload_skillbook",
    "build_input",
    "start_reflection",
    "wait_for_result",
    "fetch_result",
    "runtime",
    "Runtime",
    "check_namespace",
    "is_complete",
    "configure_core_logging",
    "EXIT_INCOMPLETE",
    "EXIT_CANCELLED",
    "EXIT_NOT_RUNNING",
    "is_cancelled",
    "FIRST_TASK_WAIT_S",
    "upload_batch",
    "build_batch_input",
    "start_batch",
    "wait_for_batch",
    "load_batch_records",
    "fetch_batch_result",
    "reflect_batch",
    "is_batch_complete",
    "batch_result",
    "default_concurrency",
]

# A workflow task that is not completed in this time is handed to another worker: it bounds how long a
# reflection waits after its worker died during a task. With an in-process model (`heuristic`, function
# models) the model requests and cells are local activities that run inside the task, which the SDK
# renews every 0.8 x this: the task is open nearly all the time, so this is the recovery time. With a
# provider model the requests are regular activities (a dead worker's request is retried after its
# heartbeat timeout) and a task is open only while cells run, so a longer timeout costs recovery only
# for a kill during a cell, and gives the SDK's renewal room on a loaded worker: with 4 s, 3 s requests
# and 200 reflections in flight on 2 cores, first tasks (which start the sandbox host) timed out
# (bench/throughput.py; BENCHMARKS.md, issue 11).
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=4)
PROVIDER_WORKFLOW_TASK_TIMEOUT = timedelta(seconds=10)
QUERY_TIMEOUT = PROVIDER_WORKFLOW_TASK_TIMEOUT + timedelta(seconds=2)


def task_timeout_for(model: str) -> timedelta:
    """The workflow-task timeout of a reflection with `model` (see above)."""
    from reflector.models import answers_in_process

    return WORKFLOW_TASK_TIMEOUT if answers_in_process(model) else PROVIDER_WORKFLOW_TASK_TIMEOUT
# How long `rr reflect` lets the workers listed on the task queue take its reflection's first task before
# it runs an in-process worker itself (see `Runtime.ensure_worker`).
FIRST_TASK_WAIT_S = 2.0
# Exit code of `rr reflect` / `rr result` for a reflection that finished but is incomplete (stop reason
# other than "completed": budget spent, compaction limit, loop guard or error; a partial or fallback text).
EXIT_INCOMPLETE = 4
# Exit code of `rr reflect` / `rr result` (and `rr cancel` for a workflow that did not say so) for a cancelled
# reflection or batch (`rr cancel`): its output says so and keeps the findings so far.
EXIT_CANCELLED = 5
# Exit code of `rr cancel` for a reflection or batch that had already finished: nothing was cancelled.
EXIT_NOT_RUNNING = 6


async def connect(
    address: str | None = None,
    namespace: str | None = None,
    *,
    settings: Settings | None = None,
    read_only: bool = False,
) -> Client:
    """A client whose large payloads go to the blob store of `settings` (default: from the environment).

    It connects as `settings` say (`reflector.connection`: address, namespace, TLS, API key, gRPC metadata
    from the TEMPORAL_* variables or a config profile); `address` / `namespace` override theirs.
    `read_only=True` never writes a blob (for clients that only inspect or replay workflows).
    """
    settings = settings or Settings.from_env()
    dc = data_converter(settings, read_only=read_only)
    plugins = [PydanticAIPlugin(), *telemetry.client_plugins(settings)]  # RR_OTEL: tracing (reflector.telemetry)
    return await open_client(settings, address=address, namespace=namespace, data_converter=dc, plugins=plugins)


InProcessWorker = Callable[[Client, Settings, AsyncExitStack, Callable[[str], None]], Awaitable[None]]
"""Starts a worker inside this process on `client` and registers its shutdown on the exit stack."""


class ReflectError(RuntimeError):
    """A user-facing failure with a one-line message (the CLI prints it and exits non-zero)."""


def upload_trace(path: str | Path, settings: Settings) -> TraceRef:
    """Validate a trace file and put it in the blob store; the workflow only gets the reference.

    A trace under `settings.lazy_trace_bytes` is parsed whole (it is small) to check it and detect its
    format. A larger one is streamed once: hashed, copied into the store and scanned record by record
    (validation, format from the first records, the record index the sandbox reads it lazily with),
    so the client's memory does not grow with the trace. A trace whose sandbox host would need more
    memory than the workers allow (`reflector.traces.budget`) is refused before anything is stored.
    """
    p = Path(path)
    size = check_trace_file(p, settings.max_trace_bytes)
    usable_dir(settings.blob_dir, settings.blob_dir_setting)
    store = _open_store(settings)
    try:
        if size < settings.lazy_trace_bytes:
            data, _container = read_trace_file(p, settings.max_trace_bytes)
            fmt: str = detect_format(data)
            del data
            _refuse(size, None, settings, fmt)
            digest, size = store.put_file(p)  # removes its partial file on any failure
        else:
            index_tmp = store.new_temp()

            def scan(fh: IO[bytes]) -> tuple[str, int | None]:
                with open(index_tmp, "wb") as out:  # the index is written as the scan goes
                    found = write_index(fh, str(p), out, scanner=FastScanner)
                _refuse(size, found[1], settings, found[0])
                return found

            try:
                digest, size, (fmt, index_size) = store.ingest(p, scan)
                if index_size is not None:
                    store.adopt_beside(digest, INDEX_SUFFIX, index_tmp)
            finally:
                index_tmp.unlink(missing_ok=True)
        from reflector.storage.identity import store_id_of

        sid = store_id_of(store)
    except OSError as e:
        raise ReflectError(f"cannot store the trace in the blob store {store.where}: {e.strerror or e}") from None
    return TraceRef(uri=blob_uri(digest), sha256=digest, size=size, format=cast(TraceFormat, fmt),
                    store_id=sid, store_url=store.where)


def _open_store(settings: Settings) -> BlobStore:
    """The blob store of `settings`; an S3 store that cannot be used is a `ReflectError` saying why."""
    from reflector.storage.stores import open_store

    try:
        return open_store(settings)
    except OSError as e:  # S3Unavailable (boto3 missing)
        raise ReflectError(str(e)) from None


def _refuse(size: int, index_size: int | None, settings: Settings, fmt: str) -> None:
    why = f"format {fmt!r} is not indexed" if size >= settings.lazy_trace_bytes else ""
    msg = explain_refusal(size, index_size, settings.sandbox_max_memory, why, fmt)
    if msg is not None:
        raise ReflectError(msg)


def upload_skillbook(skillbook: str | Path | SkillbookRef | None, settings: Settings | None = None) -> SkillbookRef | None:
    """Check a skillbook against its caps (`reflector.limits`) and put it in the blob store; the workflow only
    gets the reference (the prepare activity reads it into the sandbox, the skill tools look skills up in it).

    `skillbook`: its text, or a `Path` to a text file (read as UTF-8, undecodable bytes replaced); a blank one
    is None. Over a cap: a `ReflectError` with the one-line reason."""
    from reflector.limits import InputTooLarge
    from reflector.skillbook import check_skillbook

    if skillbook is None or isinstance(skillbook, SkillbookRef):
        return skillbook
    if isinstance(skillbook, Path):
        if not skillbook.is_file():
            raise ReflectError(f"skillbook file not found: {skillbook}")
        text = skillbook.read_text(encoding="utf-8", errors="replace")
    else:
        text = skillbook
    if not text.strip():
        return None
    try:
        skills = check_skillbook(text)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None
    settings = settings or Settings.from_env()
    store = _open_store(settings)
    data = text.encode("utf-8", "surrogatepass")
    try:
        digest = store.put_bytes(data)
    except OSError as e:
        raise ReflectError(f"cannot store the skillbook in the blob store {store.where}: {e.strerror or e}") from None
    return SkillbookRef(uri=blob_uri(digest), sha256=digest, size=len(data), chars=len(text), skills=skills)


def check_task_texts(**texts: str | None) -> None:
    from reflector.limits import InputTooLarge, check_task_text

    try:
        for name, value in texts.items():
            check_task_text(name, value)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None


def build_input(
    trace: TraceRef,
    *,
    question: str = "",
    ground_truth: str | None = None,
    feedback: str | None = None,
    skillbook: str | Path | SkillbookRef | None = "",
    mode: str = "offline",
    config: ReflectionConfig | None = None,
    settings: Settings | None = None,
) -> ReflectionInput:
    """The workflow's input. Every user-sized value is checked against its cap (`reflector.limits`: a
    `ReflectError` with one line); a skillbook goes to the blob store (`upload_skillbook`, into the store of
    `settings`, default: the environment's)."""
    config = config or ReflectionConfig()
    try:
        check_model_name(config.model)
    except ValueError as e:
        raise ReflectError(str(e)) from e
    check_task_texts(question=question, ground_truth=ground_truth, feedback=feedback)
    return ReflectionInput(
        trace=trace,
        question=question,
        ground_truth=ground_truth,
        feedback=feedback,
        skillbook_ref=upload_skillbook(skillbook, settings),
        mode=mode,
        config=config,
    )


def check_id(workflow_id: str | None) -> None:
    from reflector.limits import InputTooLarge, check_workflow_id

    try:
        check_workflow_id(workflow_id)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None


def new_workflow_id(trace: TraceRef) -> str:
    return f"rr-{trace.sha256[:8]}-{uuid.uuid4().hex[:8]}"


async def start_reflection(
    client: Client, inp: ReflectionInput, task_queue: str, workflow_id: str | None = None, *, trace_name: str = ""
) -> WorkflowHandle[object, ReflectorOutput]:
    """Start `ReflectionWorkflow`; with rr's search attributes set where the namespace has them registered
    (`reflector.search_attributes`), and a memo naming the trace (`trace_name`: its file name) for `rr list`."""
    from reflector import search_attributes as sa

    check_id(workflow_id)
    wf_id = workflow_id or new_workflow_id(inp.trace)
    attrs = None
    if not await sa.missing(client):
        inp = inp.model_copy(update={"search_attributes": True})
        attrs = sa.start_attributes(inp.config.model, trace_sha256=inp.trace.sha256, parent=inp.parent_workflow_id)
    try:
        handle: WorkflowHandle[object, ReflectorOutput] = await client.start_workflow(
            WORKFLOW_NAME,
            inp,
            id=wf_id,
            task_queue=task_queue,
            task_timeout=task_timeout_for(inp.config.model),
            result_type=ReflectorOutput,
            search_attributes=attrs,
            memo={**sa.memo(inp.trace, trace_name), **_rerun_memo(inp)},
        )
    except WorkflowAlreadyStartedError:
        raise ReflectError(
            f"a reflection with id {wf_id!r} is already running: follow it with `rr result {wf_id}`, "
            "or choose another --id"
        ) from None
    return handle


def _rerun_memo(inp: ReflectionInput) -> dict[str, Any]:
    """`rr rerun`: the memo names the origin and the first live step (for `rr list`, `rr status`, the Web UI)."""
    r = inp.rerun
    return {} if r is None else {"rr_rerun": {"origin": r.origin, "from_step": r.from_step, "origin_model": r.origin_model}}


async def waiting_for_worker(handle: WorkflowHandle[Any, Any]) -> bool:
    """True when the reflection's next workflow task is scheduled and no worker has started it.

    That is what "no live worker" means for this reflection, whatever the task queue's poller list says
    (the server lists an exited worker as a poller for about a minute after its last poll).
    """
    desc = await handle.describe()
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return False
    raw = desc.raw_description
    return raw.HasField("pending_workflow_task") and (
        raw.pending_workflow_task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED
    )


async def wait_for_result(
    handle: WorkflowHandle[object, ReflectorOutput],
    on_progress: Callable[[Progress], Awaitable[None] | None] | None = None,
    poll_s: float = 1.0,
    *,
    on_no_worker: Callable[[float], None] | None = None,
    on_worker_back: Callable[[], None] | None = None,
    no_worker_after_s: float = 15.0,
) -> ReflectorOutput:
    """Wait for the result, reporting progress from the workflow's `progress` query meanwhile.

    When the reflection's next step has waited `no_worker_after_s` for a worker (its workflow task
    scheduled, started by nobody: no live worker polls the queue), `on_no_worker(seconds)` is called once,
    and `on_worker_back()` when a worker takes it again; progress is not queried meanwhile (a query
    needs a worker and would only time out).
    """
    return await _follow(handle, Progress, on_progress, poll_s, on_no_worker=on_no_worker,
                         on_worker_back=on_worker_back, no_worker_after_s=no_worker_after_s)


_R = TypeVar("_R")
_P = TypeVar("_P", bound=BaseModel)


async def _follow(
    handle: WorkflowHandle[Any, _R],
    progress_type: type[_P],
    on_progress: Callable[[_P], Awaitable[None] | None] | None,
    poll_s: float,
    *,
    on_no_worker: Callable[[float], None] | None,
    on_worker_back: Callable[[], None] | None,
    no_worker_after_s: float,
) -> _R:
    """`wait_for_result` for any workflow whose `progress` query answers a `progress_type`."""
    result_task = asyncio.ensure_future(handle.result(rpc_timeout=None))
    waiting_since: float | None = None
    warned = False
    try:
        while not result_task.done():
            done, _ = await asyncio.wait({result_task}, timeout=poll_s)
            if done:
                continue
            if on_no_worker is not None:
                try:
                    waiting = await waiting_for_worker(handle)
                except Exception:  # best effort, like progress
                    waiting = False
                now = time.monotonic()
                if not waiting:
                    if warned and on_worker_back is not None:
                        on_worker_back()
                    waiting_since, warned = None, False
                else:
                    waiting_since = waiting_since if waiting_since is not None else now
                    if not warned and now - waiting_since >= no_worker_after_s:
                        warned = True
                        on_no_worker(now - waiting_since)
                    continue
            if on_progress is None:
                continue
            try:
                # The server answers a query when the workflow task in progress ends: the session's
                # task is renewed every 0.8 x task timeout, so allow a little more than one task.
                prog = await handle.query(PROGRESS_QUERY, result_type=progress_type, rpc_timeout=QUERY_TIMEOUT)
            except Exception:  # a query can fail while no worker holds the workflow; progress is best effort
                continue
            maybe = on_progress(prog)
            if maybe is not None:
                await maybe
        result: _R = result_task.result()
        return result
    finally:
        if not result_task.done():
            result_task.cancel()


async def fetch_result(client: Client, workflow_id: str) -> ReflectorOutput:
    handle = client.get_workflow_handle(workflow_id, result_type=ReflectorOutput)
    out: ReflectorOutput = await handle.result()
    return out


async def has_pollers(client: Client, task_queue: str) -> bool:
    """Whether the server lists any poller on `task_queue`.

    Only a hint: the server keeps listing a worker for about a minute after its last poll, exited or not
    (and a live idle worker's last poll is up to a minute old too, since polls are long polls), so "yes"
    does not mean a live worker. `Runtime.ensure_worker` decides on what the server does with the
    reflection's own first task instead.
    """
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return len(resp.pollers) > 0


async def check_namespace(client: Client, address: str) -> None:
    """`SettingError` when the client's namespace (TEMPORAL_NAMESPACE) does not exist on the server."""
    try:
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=client.namespace))
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise SettingError(
                f"TEMPORAL_NAMESPACE: namespace {client.namespace!r} does not exist on the Temporal server at "
                f"{address} (create it with `temporal operator namespace create --namespace {client.namespace} "
                f"--address {address}`, or unset TEMPORAL_NAMESPACE for 'default')"
            ) from None
        raise


def is_cancelled(out: ReflectorOutput) -> bool:
    """True for a reflection cancelled by `rr cancel` (its text is built from the findings so far)."""
    return bool(out.raw.get("rr_trace", {}).get("stop_reason") == "cancelled")


def is_complete(out: ReflectorOutput) -> bool:
    """False for a reflection that stopped early (budget, compaction limit, loop guard, error): its text is
    a partial synthesis or the deterministic fallback (the CLI exits with `EXIT_INCOMPLETE`)."""
    stop = out.raw.get("rr_trace", {}).get("stop_reason", "completed")
    return bool(stop == "completed")


def configure_core_logging(*, worker_warnings: bool = True) -> None:
    """Route the Temporal core's (Rust) log lines through Python logging (`temporalio.core`), one line each.

    Without this the core writes multi-line records straight to stderr, e.g. a client's WARN each time it
    retries a query the server refused for a moment ("consistent query buffer is full"). The client's
    retry warnings are dropped (a call that finally fails raises, and the CLI reports that); the
    worker's warnings (failing workflow tasks, `Task not found when completing`) are kept when
    `worker_warnings`. Call once, before any client connects (only the CLI does: it owns the process).
    """
    from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig

    core = "WARN" if worker_warnings else "ERROR"
    targets = {"temporalio_common": core, "temporalio_sdk_core": core, "temporalio_sdk": core,
               "temporal_sdk_bridge": core, "temporalio_client": "ERROR"}
    spec = ",".join(["ERROR", *(f"{t}={lvl}" for t, lvl in targets.items())])
    logger = logging.getLogger("temporalio.core")
    forwarding = LogForwardingConfig(logger=logger, append_target_to_name=True)
    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=spec, forwarding=forwarding))),
        error_if_already_set=False,
    )


@dataclass
class Runtime:
    client: Client
    address: str
    embedded_server: bool
    local_worker: bool
    ui_url: str | None = None
    task_queue: str = ""
    _start_worker: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)
    _announce: Callable[[str], None] = field(default=lambda _msg: None, repr=False)

    async def ensure_worker(self, handle: WorkflowHandle[Any, Any], wait_s: float = FIRST_TASK_WAIT_S) -> None:
        """Make sure a live worker runs the reflection just started: if no worker takes its first task
        within `wait_s`, run an in-process worker.

        Why decide on the reflection's own first task, not on the task queue's poller list: the server
        lists a worker as a poller for about a minute after its last poll, so an exited worker (e.g. the
        in-process worker of the previous `rr reflect`) looks alive; and a live idle worker's
        `last_access_time` is also up to a minute old (polls are long polls), so no recency threshold
        separates the two. Whether a worker *started the task* is true now. A live worker starts it
        within milliseconds, so the wait only costs time when the listed workers are gone. (Starting an
        in-process worker unconditionally would also work, but it would take other clients' queued
        reflections and hand them back half done when this command exits.)
        """
        if self.local_worker or self._start_worker is None:
            return
        if not await has_pollers(self.client, self.task_queue):
            await self._start_worker()
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not await waiting_for_worker(handle):
                return
            await asyncio.sleep(0.1)
        self._announce(f"the workers listed on task queue {self.task_queue!r} did not take the reflection "
                       f"within {wait_s:g} s (they have exited)")
        await self._start_worker()


async def lease_home_server(
    settings: Settings, stack: AsyncExitStack, announce: Callable[[str], None] = lambda _msg: None
) -> tuple[HomeServer, bool]:
    """Lease the embedded server of `settings.home` (`reflector.homeserver`), starting it if none runs; the
    lease is released when `stack` closes (or by the kernel when this process dies). Returns (the server,
    whether this call started it)."""
    from reflector import homeserver

    usable_dir(settings.home, "RR_HOME")
    port = int(env_number("RR_EMBEDDED_PORT", 7233, maximum=65535))
    try:
        server, lease, started = await asyncio.to_thread(homeserver.acquire, settings.home, port=port)
    except homeserver.HomeServerError as e:
        raise ReflectError(f"could not start the embedded Temporal server: {e}") from e
    stack.callback(lease.release)
    if started:
        announce(f"started the embedded Temporal server of {settings.home} on {server.address} (SQLite "
                 f"{settings.db_file}, Web UI {server.ui_url}); it stops when no rr process of this home uses it")
    else:
        announce(f"using the embedded Temporal server of {settings.home} on {server.address}")
    if settings.temporal.tls is not None or settings.temporal.api_key:
        announce("the TLS / API key settings are for a configured server (TEMPORAL_ADDRESS or a profile's "
                 "address), not for the embedded one")
    return server, started


@asynccontextmanager
async def runtime(
    settings: Settings,
    *,
    want_worker: bool | None = None,
    announce: Callable[[str], None] = lambda _msg: None,
    in_process_worker: InProcessWorker | None = None,
) -> AsyncIterator[Runtime]:
    """Connect to Temporal, starting the embedded dev server and an in-process worker when needed.

    - An explicit `TEMPORAL_ADDRESS` that is unreachable is an error (never silently replaced).
    - The default address, unreachable: start the embedded server on the SQLite file in RR_HOME.
    - A namespace (TEMPORAL_NAMESPACE) that does not exist is a `SettingError`.
    - A local worker (`in_process_worker`, from the composition root: `worker.in_process_worker`) runs in
      this process when we started the server or when asked (`want_worker=True`);
      with `want_worker=None` (auto) the caller calls `Runtime.ensure_worker` once it has started its
      reflection, which runs one when no live worker takes it (otherwise it would wait forever).
    """
    from reflector.devserver import is_reachable

    async with AsyncExitStack() as stack:
        home_server: HomeServer | None = None
        started = False
        address = settings.address
        if settings.address_explicit:  # TEMPORAL_ADDRESS or a config profile's address: never replaced
            if not is_reachable(address):
                raise ReflectError(f"Temporal server at {describe_target(settings)} is not reachable")
        else:
            home_server, started = await lease_home_server(settings, stack, announce)
            address = home_server.address
        converter = data_converter(settings)  # a bad setting is reported as such, not as a connection error
        plugins = [PydanticAIPlugin(), *telemetry.client_plugins(settings)]  # likewise (RR_OTEL)
        try:
            client = await open_client(settings, address=address, embedded=home_server is not None,
                                       data_converter=converter, plugins=plugins)
        except Exception as e:
            raise ReflectError(f"cannot connect to Temporal at {describe_target(settings, address)}: {e}") from e
        await check_namespace(client, address)
        if started:  # an embedded server on a database older than rr's search attributes
            from reflector import search_attributes as sa

            with contextlib.suppress(Exception):  # best effort: without them, rr works and `rr list` says so
                await sa.register(client)
        rt = Runtime(client, address, home_server is not None, False, home_server.ui_url if home_server else None,
                     task_queue=settings.task_queue, _announce=announce)

        async def start_worker() -> None:
            if rt.local_worker:
                return
            if in_process_worker is None:
                raise ReflectError("no worker takes this reflection and none can run in this process")
            await in_process_worker(client, settings, stack, announce)
            rt.local_worker = True

        rt._start_worker = start_worker
        # On the home's embedded server every `rr reflect` runs its own worker: another process's in-process
        # worker may exit at any time (its half-done tasks then move here, never the other way round).
        if want_worker or (want_worker is None and home_server is not None):
            await start_worker()
        elif want_worker is False or in_process_worker is None:
            rt._start_worker = None
        yield rt


# ------------------------------------------------------------------------------ batch reflection

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
    from reflector.models import answers_in_process

    return BATCH_CONCURRENCY_IN_PROCESS if answers_in_process(model) else BATCH_CONCURRENCY_PROVIDER


def upload_batch(paths: Sequence[str | Path], settings: Settings, *, split: bool = False) -> ManifestRef:
    """Store every run of `paths` as its own trace blob and the manifest listing them (`reflector.batch.split`).

    Files and directories: one run per file (a file that is not a valid trace is a broken run, reported by
    the batch); `split=True`: every file holds many runs (a JSON array, JSONL lines), one run per record.
    """
    from reflector.batch.split import iter_sources, write_manifest

    root = usable_dir(settings.blob_dir, settings.blob_dir_setting)
    store = _open_store(settings)
    try:
        sources = iter_sources(paths, store, upload=lambda p: upload_trace(p, settings), split=split,
                               max_bytes=settings.max_trace_bytes)
        return write_manifest(sources, store)
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise ReflectError(f"cannot read the batch or store it in the blob store {root}: {e.strerror or e}{where}") from None


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
    """The batch's input (caps and the skillbook as `build_input`; at most `reflector.limits.MAX_BATCH_RUNS` runs)."""
    from reflector.limits import MAX_BATCH_RUNS

    config = config or ReflectionConfig()
    try:
        check_model_name(config.model)
    except ValueError as e:
        raise ReflectError(str(e)) from e
    if concurrency is not None and concurrency < 1:
        raise ReflectError("--concurrency must be at least 1")
    if manifest.n_runs > MAX_BATCH_RUNS:
        raise ReflectError(f"the batch has {manifest.n_runs:,} runs, over the limit of {MAX_BATCH_RUNS:,} "
                           "(reflector.limits.MAX_BATCH_RUNS): split it into several batches")
    extra: dict[str, Any] = {}
    if children_per_run is not None:
        extra["children_per_run"] = children_per_run
    if page_size is not None:
        extra["page_size"] = page_size
    return BatchInput(
        manifest=manifest, config=config, skillbook_ref=upload_skillbook(skillbook, settings), mode=mode,
        concurrency=concurrency or default_concurrency(config.model), llm_synthesis=llm_synthesis, **extra,
    )


async def start_batch(
    client: Client, inp: BatchInput, task_queue: str, workflow_id: str | None = None, *, name: str = ""
) -> WorkflowHandle[Any, BatchOutput]:
    """Start `BatchReflectionWorkflow` (search attributes and memo as `start_reflection`; `name`: what it reads)."""
    from reflector import search_attributes as sa

    check_id(workflow_id)
    wf_id = workflow_id or f"rr-batch-{inp.manifest.sha256[:8]}-{uuid.uuid4().hex[:8]}"
    attrs = None
    if not await sa.missing(client):
        inp = inp.model_copy(update={"search_attributes": True})
        attrs = sa.start_attributes(inp.config.model, batch_id=wf_id)
    try:
        handle: WorkflowHandle[Any, BatchOutput] = await client.start_workflow(
            BATCH_WORKFLOW_NAME, inp, id=wf_id, task_queue=task_queue,
            task_timeout=task_timeout_for(inp.config.model), result_type=BatchOutput,
            search_attributes=attrs, memo=sa.memo(None, name, runs=inp.manifest.n_runs),
        )
    except WorkflowAlreadyStartedError:
        raise ReflectError(f"a batch with id {wf_id!r} is already running: follow it with `rr result {wf_id}`, "
                           "or choose another --id") from None
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
    return await _follow(handle, BatchProgress, on_progress, poll_s, on_no_worker=on_no_worker,
                         on_worker_back=on_worker_back, no_worker_after_s=no_worker_after_s)


def load_batch_records(out: BatchOutput, settings: Settings) -> list[RunRecord]:
    """Every run's record of a finished batch, in run order, from the blob store."""
    from reflector.batch.records import load_records

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
    inp = build_batch_input(manifest, config=config, skillbook=skillbook, mode=mode, concurrency=concurrency,
                            children_per_run=children_per_run, settings=settings)
    handle = await start_batch(client, inp, task_queue or settings.task_queue, batch_id)
    return batch_result(await wait_for_batch(handle, on_progress), settings)


def is_batch_complete(out: BatchOutput) -> bool:
    """False when a run could not be reflected on or a reflection stopped early (the CLI exits with
    `EXIT_INCOMPLETE`); the synthesis is still there, over the runs that were."""
    return out.failed == 0 and out.synthesis.incomplete_reflections == 0
