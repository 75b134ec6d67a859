"""Connecting to Temporal and what a client waits for: the workflow-task timeouts, the exit codes, the
one error type of the client (`ReflectError`), workers polling a task queue, and the SDK core's logging."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, DescribeTaskQueueRequest
from temporalio.client import Client, Plugin
from temporalio.service import RPCError, RPCStatusCode

from reflector.runtime import telemetry
from reflector.runtime.connection import open_client
from reflector.runtime.settings import SettingError, Settings
from reflector.runtime.storage.payloads import data_converter

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
    from reflector.runtime.models import answers_in_process

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
    for_workers: bool = True,
) -> Client:
    """A client whose large payloads go to the blob store of `settings` (default: from the environment).

    It connects as `settings` say (`reflector.runtime.connection`: address, namespace, TLS, API key, gRPC metadata
    from the TEMPORAL_* variables or a config profile); `address` / `namespace` override theirs.
    `read_only=True` never writes a blob (for clients that only inspect or replay workflows).
    `for_workers=False` is for a client that no worker will use: it leaves out pydantic-ai's plugin (which a
    worker inherits from its client) and reads and writes the same payloads without importing pydantic-ai
    (about 1 s of CPU less: `reflector.runtime.storage.light_converter`).
    """
    settings = settings or Settings.from_env()
    dc = data_converter(settings, read_only=read_only, light=not for_workers)
    plugins = [*agent_plugins(for_workers), *telemetry.client_plugins(settings)]  # RR_OTEL: tracing
    return await open_client(
        settings, address=address, namespace=namespace, data_converter=dc, plugins=plugins
    )


def agent_plugins(for_workers: bool) -> list[Plugin]:
    """pydantic-ai's plugin for a client that may host a worker (a worker inherits its client's plugins)."""
    if not for_workers:
        return []
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin

    return [PydanticAIPlugin()]


class ReflectError(RuntimeError):
    """A user-facing failure with a one-line message (the CLI prints it and exits non-zero)."""


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
    targets = {
        "temporalio_common": core,
        "temporalio_sdk_core": core,
        "temporalio_sdk": core,
        "temporal_sdk_bridge": core,
        "temporalio_client": "ERROR",
    }
    spec = ",".join(["ERROR", *(f"{t}={lvl}" for t, lvl in targets.items())])
    logger = logging.getLogger("temporalio.core")
    forwarding = LogForwardingConfig(logger=logger, append_target_to_name=True)
    Runtime.set_default(
        Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=spec, forwarding=forwarding))),
        error_if_already_set=False,
    )
