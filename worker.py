"""The composition root: settings -> client -> worker (the workflow, its activities, the models).

The only module that imports every layer: `workflows/` (the reflection workflow and its agents),
`activities/` (model requests, sandbox cells, summaries), `reflector/` (contract, settings, client,
storage, admission control) and, through the activities, `sandbox/`. `rr worker`, the in-process
worker of `rr reflect` and `rr replay` come through here; `python worker.py` is `rr worker`.

`PydanticAIPlugin` on the client registers the agent's model-request activities (from the
workflow's `__pydantic_ai_agents__`) and the pydantic payload converter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import (
    FixedSizeSlotSupplier,
    Interceptor,
    PollerBehaviorSimpleMaximum,
    Replayer,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerTuner,
    WorkflowRunner,
)

from activities import batch as batch_activities
from activities import model_requests
from activities import rerun as rerun_activities
from activities import sandbox as sandbox_activities
from activities.provider_failures import CompactProviderFailures
from activities.scope import STORE, BindWorkerScope
from activities.summarise import summarise
from reflector.client import InProcessWorker, ReflectError, check_namespace, connect
from reflector.client.audit.histories import CLOSE_EVENTS
from reflector.runtime import event_loop, lean_gc, lean_openai, lean_schemas, lean_visits, telemetry
from reflector.runtime.admission import WORKFLOW_TASK_POLLS, AdmissionControl, LiveRuns, StartDelay
from reflector.runtime.build_id import build_id
from reflector.runtime.models import SHIPPED_FAMILIES, load_plugins, prepare_workflow_side
from reflector.runtime.settings import SettingError, Settings, usable_dir
from reflector.runtime.storage.identity import store_id
from reflector.runtime.storage.payloads import blob_dir_of, replay_storage
from reflector.runtime.storage.stores import check_store, describe_store
from sandbox import capacity
from sandbox.isolation import IsolationUnavailable
from workflows.agents import MODEL_ACTIVITIES
from workflows.batch import BatchReflectionWorkflow
from workflows.local_model import use_heartbeats_when_due
from workflows.reflection import ReflectionWorkflow

__all__ = [
    "build_worker",
    "run_worker",
    "in_process_worker",
    "make_replayer",
    "replay",
    "replay_workflow",
    "ReplayReport",
    "WORKFLOWS",
]

if TYPE_CHECKING:
    from reflector.client.audit.capture import ReplayHooks

log = logging.getLogger("rr.worker")

WORKFLOWS = [ReflectionWorkflow, BatchReflectionWorkflow]
MAX_ADAPTIVE_ACTIVITIES = 2000
ACTIVITY_SLOTS_AT_START = 100
# Activity slots hold provider requests that wait on the network: what must not come late is their first
# heartbeat (30 s timeout) and the workflow tasks they share the loop with (renewed every 3.2 s with an
# in-process model, 8 s with a provider one). Cut at 250 ms of lag like workflow tasks, the limit fell to
# 10-30 requests at 500 reflections in flight on two cores, i.e. 3-10 requests/s with a 3 s model, well
# below what the CPU could carry (rr 17.0 steps/s vs the anchor's 20.6; with these 21.5 vs 25.2 at 1 s and
# 18.0 vs 22.1 at 3 s, no timeouts, nothing paid twice: bench/throughput.py, BENCHMARKS.md issue 11).
ACTIVITY_LAG_LOW_S = 0.25
ACTIVITY_LAG_HIGH_S = 1.0
# New reflections (polls of the shared queue) admitted per 0.5 s to start with; admission control then
# raises or halves it by the loop's lag. Each new reflection starts a sandbox host (~190 ms of CPU): 500
# admitted at once held the loop 2 s late (bench/throughput.py, 3 s model, 500 in flight).
NEW_WORK_PER_INTERVAL = 8
# A reflection with an in-process model (the heuristic, function models) holds its workflow task for its
# whole session (its model requests and cells are local activities), and the SDK renews a held task only
# once the workflow's last activation was answered (temporalio/features#168): past a few dozen held tasks
# per process the renewals come late, tasks time out and are replayed from scratch, at low loop lag too.
# Unbounded, the limit grew into that collapse at 200 in flight with a 200 ms in-process model (over 800
# "Task not found" in 2 min, bench/throughput.py --transport function); 30 fixed slots ran that point at
# 64.9 steps/s. Provider reflections hold a task only while a cell runs: at 500 in flight with a 3 s model
# they used 6-17 slots, so the cap does not bind them.
MAX_ADAPTIVE_WORKFLOW_TASKS = 32
# Workflow runs alive in the worker at first (then raised and cut on the loop's lag: reflector/runtime/admission.py)
LIVE_RUNS_AT_START = 32
# Local activities (model requests, cells): each reflection in progress runs at most one at a time; the
# admission controller is what bounds them (at most its `maximum` reflections).
MAX_LOCAL_ACTIVITIES = 4000
MAX_NEXUS_TASKS = 10
GRACEFUL_SHUTDOWN = timedelta(seconds=25)


def workflow_admission() -> AdmissionControl:
    """The default workflow-task slot supplier: slots, the rate of new reflections and the reflections alive in
    the worker follow the loop's lag, slots up to MAX_ADAPTIVE_WORKFLOW_TASKS."""
    return AdmissionControl(
        initial_rate=NEW_WORK_PER_INTERVAL,
        maximum=MAX_ADAPTIVE_WORKFLOW_TASKS,
        live_initial=LIVE_RUNS_AT_START,
    )


def activity_admission() -> AdmissionControl:
    """The default activity slot supplier: how many run at once follows the loop's lag."""
    # Starts at temporalio's fixed default (100) and grows by a quarter per quiet interval: started at 16
    # and growing by 1/16, the limit trailed the demand at 500 in flight with a 1 s model and the refused
    # requests waited in the server's queue (rr 17.5 steps/s vs the anchor's 23.2, bench/throughput.py).
    # It is cut on loop lag and on start delay (the SDK begins polled activities one loop turn at a
    # time, so a backlog inside the worker shows there).
    return AdmissionControl(
        initial=ACTIVITY_SLOTS_AT_START,
        maximum=MAX_ADAPTIVE_ACTIVITIES,
        growth=4,
        low_lag_s=ACTIVITY_LAG_LOW_S,
        high_lag_s=ACTIVITY_LAG_HIGH_S,
    )


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
    admission: AdmissionControl | None = None,
    activity_slots_supplier: AdmissionControl | None = None,
    settings: Settings | None = None,
    extra_interceptors: Sequence[Interceptor] = (),
) -> Worker:
    """A worker for reflections on `task_queue`; the sandbox session manager is process-wide.

    Everything workflow code needs to resolve the models this worker serves is built here, before
    it polls (`prepare_workflow_side`: the heuristic, registered models, `RR_MODEL`, `models` and
    `RR_WORKER_MODELS`, with their provider families): workflow code never imports a module or loads data.

    Workflow-task slots: `max_concurrent_workflow_tasks` (or `RR_MAX_CONCURRENT_WORKFLOW_TASKS`) fixes
    their number; by default `admission` (an `AdmissionControl`, a new one if not given) decides.
    Activity slots likewise: `max_concurrent_activities` / `RR_MAX_CONCURRENT_ACTIVITIES`, else
    `activity_slots_supplier` (default `activity_admission()`).
    """
    settings = settings or Settings.from_env()
    load_plugins(",".join(settings.plugins))
    prepare_workflow_side(models, settings=settings)
    # model requests: the OpenAI SDK's body walk skipped where it changes nothing, tool schemas customised
    # once, not at every request (worker CPU per step: reflector/runtime/lean_openai.py, reflector/runtime/lean_schemas.py)
    lean_openai.enable()
    lean_schemas.install()
    # workflow tasks: one payload walk per activation and per completion instead of three each
    # (reflector/runtime/lean_visits.py)
    lean_visits.install()
    # activities: no heartbeat before one is due (one server write per model request; reflector/runtime/lean_heartbeats.py)
    use_heartbeats_when_due()
    # Regular activities: provider model requests, summaries. A worker that accepts more than it can run
    # promptly lets them sit "started" past their heartbeat timeout and Temporal retries them: a request
    # paid twice (measured with 200 concurrent reflections on 2 cores: 200 fixed slots -> hundreds of
    # retried attempts, 40 -> 0). With a 3 s model, 40 leave the worker idle. So by default their number
    # follows the event loop's lag as well (`AdmissionControl`, at most MAX_ADAPTIVE_ACTIVITIES);
    # `max_concurrent_activities` / RR_MAX_CONCURRENT_ACTIVITIES fixes it.
    if max_concurrent_activities is None:
        max_concurrent_activities = settings.max_concurrent_activities
    workflow_slots: FixedSizeSlotSupplier | AdmissionControl
    if max_concurrent_workflow_tasks is None:
        max_concurrent_workflow_tasks = settings.max_concurrent_workflow_tasks
    if max_concurrent_workflow_tasks is not None:
        workflow_slots = FixedSizeSlotSupplier(max_concurrent_workflow_tasks)
    else:
        # how many reflections this worker advances at once follows how late its event loop runs
        # (reflector/runtime/admission.py: a fixed count idles at slow models and collapses when raised)
        workflow_slots = admission or workflow_admission()
    activity_slots: FixedSizeSlotSupplier | AdmissionControl
    if max_concurrent_activities is not None:
        activity_slots = FixedSizeSlotSupplier(max_concurrent_activities)
    else:
        activity_slots = activity_slots_supplier or activity_admission()
    interceptors = [
        StartDelay(
            activities=activity_slots if isinstance(activity_slots, AdmissionControl) else None,
            local=workflow_slots if isinstance(workflow_slots, AdmissionControl) else None,
            backlog=workflow_slots if isinstance(workflow_slots, AdmissionControl) else None,
        ),
        CompactProviderFailures(),
    ]  # a retried provider error's failure fits in the history (no stack traces)
    if isinstance(workflow_slots, AdmissionControl):
        interceptors.append(LiveRuns(workflow_slots))  # the runs alive, for its `live_limit`
    interceptors.extend(extra_interceptors)  # a bench's or test's observers, innermost
    tuner = WorkerTuner.create_composite(
        workflow_supplier=workflow_slots,
        activity_supplier=activity_slots,
        local_activity_supplier=FixedSizeSlotSupplier(MAX_LOCAL_ACTIVITIES),
        nexus_supplier=FixedSizeSlotSupplier(MAX_NEXUS_TASKS),
    )
    # This worker's own blob store, sandbox sessions and response cache, bound to its activities (another
    # worker of this process may have other settings: `activities.scope`)
    runtime = sandbox_activities.runtime_for(
        settings, max_live=max_live_sandboxes or None
    )  # None: RR_MAX_LIVE_SANDBOXES
    responses = model_requests.cache_for(settings)
    model_requests.sweep(cache=responses)
    interceptors.insert(
        0,
        BindWorkerScope(
            {
                sandbox_activities.RUNTIME: runtime,
                model_requests.CACHE: responses,
                STORE: runtime.store,
            }
        ),
    )
    sticky = sticky_timeout_s if sticky_timeout_s is not None else settings.sticky_timeout_s
    kwargs: dict[str, object] = {}
    if isinstance(workflow_slots, AdmissionControl):
        # more sticky polls than temporalio's 4: each waits a loop turn for its slot (reflector/runtime/admission.py)
        kwargs["workflow_task_poller_behavior"] = PollerBehaviorSimpleMaximum(WORKFLOW_TASK_POLLS)
    if max_cached_workflows is not None:
        kwargs["max_cached_workflows"] = max_cached_workflows
    return Worker(
        client,
        task_queue=task_queue,
        # rr's sources and library versions (reflector/runtime/build_id.py), not temporalio's hash of every
        # loaded module's bytecode (0.28 s of CPU per worker start)
        build_id=build_id(),
        workflows=[*WORKFLOWS, *extra_workflows],
        activities=[
            *sandbox_activities.ACTIVITIES,
            *MODEL_ACTIVITIES,
            model_requests.forget_responses,
            summarise,
            *batch_activities.ACTIVITIES,
            *rerun_activities.ACTIVITIES,
        ],
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=sticky),
        # Core otherwise sends a heartbeat only every 0.8 x heartbeat_timeout, leaving an overloaded server
        # 20% of the timeout to record it; sending at most every second keeps short timeouts safe.
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        # A stopping worker lets the provider requests in flight (regular activities) finish rather than
        # cancel them to be sent again elsewhere; within the supervisor's 30 s grace.
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        tuner=tuner,
        interceptors=interceptors,
        **kwargs,  # type: ignore[arg-type]
    )


async def run_worker(settings: Settings | None = None) -> None:
    """Run a worker until SIGINT/SIGTERM, then shut it down gracefully and stop the sandbox hosts."""
    settings = settings or Settings.from_env()
    from reflector.runtime.connection import check_reachable

    async with AsyncExitStack() as stack:
        if not settings.address_explicit:
            # nothing configured: the embedded server of RR_HOME, shared with the home's other rr processes
            # (started when none runs; leased for as long as this worker runs: `reflector.runtime.homeserver`)
            from reflector.client import lease_home_server

            try:
                home_server, _started = await lease_home_server(
                    settings, stack, lambda msg: print(msg, flush=True)
                )
            except ReflectError as exc:
                raise SettingError(str(exc)) from None
            settings = dataclasses.replace(settings, address=home_server.address)
        else:
            check_reachable(settings)
        await _serve(settings)


async def _serve(settings: Settings) -> None:
    from reflector.runtime.connection import describe_target

    usable_dir(settings.blob_dir, settings.blob_dir_setting)  # journals, snapshots, payloads live there
    check_store(settings)  # RR_BLOB_URL=s3://...: the bucket is there and usable
    try:
        isolation = await sandbox_activities.check_isolation(settings)
    except IsolationUnavailable as exc:
        raise SettingError(str(exc)) from None
    try:
        client = await connect(
            settings=settings
        )  # address, namespace, TLS, API key: reflector.runtime.connection
    except RuntimeError as exc:  # gone since the reachability check, or a TLS / credentials failure
        raise SettingError(
            f"cannot connect to the Temporal server at {describe_target(settings)}: "
            f"{' '.join(str(exc).split())}"
        ) from None
    await check_namespace(client, settings.address)
    # A long-running worker serves whatever model a client asks for: prepare every shipped provider
    # family before polling (unless the operator listed what this worker serves).
    served = None if settings.worker_models else list(SHIPPED_FAMILIES)
    worker = build_worker(client, settings.task_queue, models=served, settings=settings)
    # a process that only runs this worker: what it imported stays out of the collector's full collections
    # (reflector/runtime/lean_gc.py; not in build_worker, which an application's own process may call)
    lean_gc.install()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"rr worker pid={os.getpid()} on {settings.address} task queue {settings.task_queue!r}",
        flush=True,
    )
    print(f"sandbox: {isolation.summary()}", flush=True)
    print(
        f"sandbox hosts: {capacity.describe(settings.max_live_sandboxes, set_explicitly=settings.max_live_sandboxes_set)}",
        flush=True,
    )
    print(f"blobs: {describe_store(settings)}", flush=True)
    print(f"event loop: {event_loop.running()} (RR_EVENT_LOOP={settings.event_loop})", flush=True)
    how = "set by RR_TASK_QUEUE" if settings.task_queue_setting else "derived from the store: rr-<store id>"
    print(f"store id: {store_id(settings)} (the task queue is {how})", flush=True)
    if isolation.mode == "language-only":
        print(f"WARNING: {sandbox_activities.LANGUAGE_ONLY_WARNING}", file=sys.stderr, flush=True)
    try:
        async with worker:
            await stop.wait()
        await sandbox_activities.shutdown()
    finally:
        telemetry.flush()  # RR_OTEL: export the spans still buffered (a no-op when tracing is off)


def in_process_worker(models: Sequence[str] = ()) -> InProcessWorker:
    """What `rr reflect` runs when no live worker takes its reflection (`reflector.client.runtime`)."""

    async def start(
        client: Client, settings: Settings, stack: AsyncExitStack, announce: Callable[[str], None]
    ) -> None:
        usable_dir(settings.blob_dir, settings.blob_dir_setting)
        try:
            check_store(settings)
        except SettingError as e:
            raise ReflectError(str(e)) from None
        try:
            isolation = await sandbox_activities.check_isolation(settings)
        except IsolationUnavailable as e:
            raise ReflectError(str(e)) from None
        announce(
            f"running an in-process worker on task queue {settings.task_queue!r} "
            f"(sandbox: {isolation.summary()})"
        )
        if isolation.mode == "language-only":
            announce(f"WARNING: {sandbox_activities.LANGUAGE_ONLY_WARNING}")
        runtime = sandbox_activities.hold(settings)  # the one build_worker binds (same settings, same loop)
        stack.push_async_callback(sandbox_activities.release, runtime)  # after the worker has stopped
        worker = build_worker(client, settings.task_queue, models=list(models) or None, settings=settings)
        await stack.enter_async_context(worker)

    return start


async def replay_workflow(client: Client, workflow_id: str, settings: Settings | None = None) -> int:
    """Replay a workflow's history against the current code; returns the number of events replayed.

    Externally stored payloads are read from the client's blob store (else that of `settings`, else
    the environment's) through a read-only driver: a replay never adds a blob.
    """
    return (await replay(client, workflow_id, settings)).events


@dataclass
class ReplayReport:
    events: int
    running: bool  # the history was partial: the reflection had not finished when it was fetched


async def replay(client: Client, workflow_id: str, settings: Settings | None = None) -> ReplayReport:
    """`replay_workflow`, saying whether the history replayed was a running reflection's (partial) one.

    The latest run of `workflow_id` only: `rr replay` replays every run of its continue-as-new chain and
    every child (`reflector.client.audit.replay.replay_all` over `reflector.client.audit.histories.iter_runs`)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    running = not history.events or history.events[-1].event_type not in CLOSE_EVENTS
    blob_dir = blob_dir_of(client.data_converter) or (settings or Settings.from_env()).blob_dir
    await make_replayer(blob_dir).replay_workflow(history)
    return ReplayReport(events=len(history.events), running=running)


def make_replayer(
    blob_dir: Path | str,
    *,
    unsandboxed_workflow_runner: WorkflowRunner | None = None,
    models: Sequence[str] | None = None,
) -> Replayer:
    """A `Replayer` for reflections and batches that reads external payloads from `blob_dir` and never writes.

    `unsandboxed_workflow_runner` (the workflows run unsandboxed): e.g. `reflector.client.audit.replay.CommandRecorder`,
    which records the commands the code produces (to name what it did at a diverging event). `models`: the
    models the histories use (e.g. `rr audit` reads them from the inputs), prepared instead of every shipped
    provider family (whose imports cost seconds)."""

    settings = Settings.from_env()
    load_plugins(
        ",".join(settings.plugins)
    )  # the workflow resolves its model by name: plugins' models must be known
    # as `rr worker` does: replayed workflow code must not import either (a provider model's first
    # import in workflow code can trip the deadlock detector on a loaded machine)
    served = list(models) if models else None if settings.worker_models else list(SHIPPED_FAMILIES)
    prepare_workflow_side(served, settings=settings)
    dc = DataConverter(external_storage=replay_storage(blob_dir, settings))
    return Replayer(
        workflows=list(WORKFLOWS),
        data_converter=dc,
        plugins=[PydanticAIPlugin()],
        unsandboxed_workflow_runner=unsandboxed_workflow_runner or UnsandboxedWorkflowRunner(),
    )


def replay_factory(
    blob_dir: Path | str, runner: WorkflowRunner, models: Sequence[str] | None = None
) -> Replayer:
    """`make_replayer` with `runner` for the (unsandboxed) workflows: what `reflector.client.audit.replay` replays with."""
    return make_replayer(blob_dir, unsandboxed_workflow_runner=runner, models=models)


def audit_replay_hooks() -> ReplayHooks:
    """What `rr audit` replays histories with: `make_replayer`, and the installer of the workflow-side
    model-request capture (`workflows.local_model.request_capture`; reflector/ never imports workflows/)."""
    from reflector.client.audit.capture import ReplayHooks
    from workflows import local_model

    def install(callback: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
        previous, local_model.request_capture = local_model.request_capture, callback
        return previous

    return ReplayHooks(
        make_replayer=lambda blob_dir, models: make_replayer(blob_dir, models=models), install=install
    )


if (
    __name__ == "__main__"
):  # `python worker.py` runs the `rr worker` program (the composition root imports no entry point)
    import runpy

    sys.argv = ["rr", "worker"]
    runpy.run_module("reflector.cli", run_name="__main__", alter_sys=True)
