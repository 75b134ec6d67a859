"""Building and running a worker: the reflection workflow, its agent's activities, the sandbox.

`PydanticAIPlugin` on the client registers the agent's model-request activities (from the
workflow's `__pydantic_ai_agents__`) and the pydantic payload converter.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.worker import Worker

from activities import model_requests, sandbox_cells
from activities.summarise import summarise
from reflector.models import load_plugins, prepare_workflow_side
from reflector.payload_storage import data_converter
from reflector.settings import SettingError, Settings, env_number
from sandbox.isolation import IsolationUnavailable
from workflows.agent import MODEL_ACTIVITIES
from workflows.reflection import ReflectionWorkflow

__all__ = ["connect", "build_worker", "run_worker", "WORKFLOWS"]

log = logging.getLogger("rr.worker")

WORKFLOWS = [ReflectionWorkflow]
# After a worker dies, its sticky queue holds the next workflow task until this expires (default 10 s):
# a short value is what makes recovery fast.
DEFAULT_STICKY_TIMEOUT_S = 1.0
DEFAULT_MAX_ACTIVITIES = 32
# A reflection keeps its workflow task (one slot) while its model requests and cells run as local
# activities, so this is how many reflections one worker advances at once; more wait, for free, in
# the server's queue. Too many at once on a CPU-bound worker delays workflow activations past the
# workflow-task timeout; the task is then retried (a replay, wasted work; requests in flight are
# awaited, not sent again). Measured in bench/throughput.py, 200 concurrent reflections with a 200 ms
# model on 2 cores: 50 slots -> 35 steps/s and 220 task timeouts (a slower hour: 9 steps/s, 2,000
# timeouts); 20 or 30 -> 59-61 steps/s, none. A reflection waiting on a slow model holds its slot
# without using CPU: with multi-second models, raise it (RR_MAX_CONCURRENT_WORKFLOW_TASKS).
DEFAULT_MAX_WORKFLOW_TASKS = 30


async def connect(
    address: str, namespace: str = "default", *, settings: Settings | None = None, read_only: bool = False
) -> Client:
    """A client whose large payloads go to the blob store of `settings` (default: from the environment).

    `read_only=True` never writes a blob (for clients that only inspect or replay workflows).
    """
    dc = data_converter(settings or Settings.from_env(), read_only=read_only)
    return await Client.connect(address, namespace=namespace, data_converter=dc, plugins=[PydanticAIPlugin()])


def build_worker(
    client: Client,
    task_queue: str,
    *,
    max_cached_workflows: int | None = None,
    sticky_timeout_s: float | None = None,
    max_concurrent_activities: int | None = None,
    max_concurrent_workflow_tasks: int | None = None,
    max_live_sandboxes: int | None = None,
    extra_workflows: Sequence[type] = (),
    models: Sequence[str] | None = None,
) -> Worker:
    """A worker for reflections on `task_queue`; the sandbox session manager is process-wide.

    Everything workflow code needs to resolve the models this worker serves is built here, before
    it polls (`prepare_workflow_side`: the heuristic, registered models, `RR_MODEL`, `models` and
    `RR_WORKER_MODELS`, with their provider families): workflow code never imports a module or loads data.
    """
    load_plugins()
    prepare_workflow_side(models)
    if max_concurrent_activities is None:
        # Regular activities: summaries (and the model requests of workflows recorded before model requests
        # became local activities). A worker that accepts more than it can run promptly lets them sit
        # "started" past their heartbeat timeout and Temporal retries them: a request paid twice. Measured
        # with 200 concurrent reflections on 2 cores when every model request was a regular activity
        # (bench/throughput.py): 200 slots -> hundreds of retried attempts, 40 -> 0, at the same steps/s.
        max_concurrent_activities = int(env_number("RR_MAX_CONCURRENT_ACTIVITIES", DEFAULT_MAX_ACTIVITIES))
    if max_concurrent_workflow_tasks is None:
        max_concurrent_workflow_tasks = int(
            env_number("RR_MAX_CONCURRENT_WORKFLOW_TASKS", DEFAULT_MAX_WORKFLOW_TASKS)
        )
    sandbox_cells.configure(max_live=max_live_sandboxes or int(env_number("RR_MAX_LIVE_SANDBOXES", 256)))
    model_requests.configure()
    model_requests.sweep()
    sticky = sticky_timeout_s if sticky_timeout_s is not None else env_number(
        "RR_STICKY_TIMEOUT_S", DEFAULT_STICKY_TIMEOUT_S, integer=False, minimum=0.1
    )
    kwargs: dict[str, object] = {}
    if max_cached_workflows is not None:
        kwargs["max_cached_workflows"] = max_cached_workflows
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=[*sandbox_cells.ACTIVITIES, *MODEL_ACTIVITIES, model_requests.forget_responses, summarise],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky),
        # Core otherwise sends a heartbeat only every 0.8 x heartbeat_timeout, leaving an overloaded server
        # 20% of the timeout to record it; sending at most every second keeps short timeouts safe.
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        max_concurrent_activities=max_concurrent_activities,
        max_concurrent_workflow_tasks=max_concurrent_workflow_tasks,
        # each running reflection has at most one local activity (a model request or a cell) at a time
        max_concurrent_local_activities=2 * max_concurrent_workflow_tasks,
        **kwargs,  # type: ignore[arg-type]
    )


async def run_worker(settings: Settings | None = None) -> None:
    """Run a worker until SIGINT/SIGTERM, then shut it down gracefully and stop the sandbox hosts."""
    settings = settings or Settings.from_env()
    from reflector.devserver import is_reachable

    if not is_reachable(settings.address):
        raise SettingError(f"the Temporal server at TEMPORAL_ADDRESS={settings.address} is not reachable "
                                "(start one with `rr server`, or point TEMPORAL_ADDRESS at your cluster)")
    from reflector.client import check_namespace
    from reflector.settings import usable_dir

    usable_dir(settings.blob_dir, settings.blob_dir_setting)  # journals, snapshots, payloads live there
    try:
        isolation = await sandbox_cells.check_isolation(settings)
    except IsolationUnavailable as exc:
        raise SettingError(str(exc)) from None
    try:
        client = await connect(settings.address, settings.namespace, settings=settings)
    except RuntimeError as exc:  # the server went away between the reachability check and the connect
        raise SettingError(f"cannot connect to the Temporal server at {settings.address}: {exc}") from None
    await check_namespace(client, settings.address)
    from reflector.models import SHIPPED_FAMILIES, WORKER_MODELS_ENV

    # A long-running worker serves whatever model a client asks for: prepare every shipped provider
    # family before polling (unless the operator listed what this worker serves).
    served = None if os.environ.get(WORKER_MODELS_ENV, "").strip() else list(SHIPPED_FAMILIES)
    worker = build_worker(client, settings.task_queue, models=served)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"rr worker pid={os.getpid()} on {settings.address} task queue {settings.task_queue!r}",
        flush=True,
    )
    print(f"sandbox: {isolation.summary()}", flush=True)
    if isolation.mode == "language-only":
        print(f"WARNING: {sandbox_cells.LANGUAGE_ONLY_WARNING}", file=sys.stderr, flush=True)
    async with worker:
        await stop.wait()
    await sandbox_cells.shutdown()
