"""A benchmark worker process: ReflectionWorkflow plus the anchor workflow, bench models registered.

TEMPORAL_ADDRESS=... RR_TASK_QUEUE=... python -m bench.worker

`RR_BENCH_WITHOUT=lean_visits,lean_schemas,lean_heartbeats` (any of them) keeps the library's own code path where rr's worker
would replace it, for an A/B of what each replacement saves (`reflector/runtime/lean_*.py`).
`RR_EVENT_LOOP=asyncio|uvloop` chooses its event loop as it does `rr worker`'s (default: uvloop when installed).
`RR_BENCH_SLOW_S=2` logs slow activations and activities (`bench.slow_log`); `RR_BENCH_CORE_LOG=debug` the Temporal core's log;
`RR_BENCH_GC=10` the garbage collector's collections and time every 10 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from temporalio.worker import Interceptor

import bench.scripts  # noqa: F401
from activities import sandbox as sandbox_activities
from bench.anchor import AnchorWorkflow
from bench.evictions import print_evictions
from reflector.client import connect
from reflector.runtime import lean_gc
from reflector.runtime.admission import AdmissionControl
from reflector.runtime.settings import Settings
from sandbox.sessions import SessionManager
from worker import activity_admission, build_worker, workflow_admission


async def _report(suppliers: dict[str, AdmissionControl], every_s: float = 5.0) -> None:
    """Log what admission control saw every 5 s: worst event-loop lag, slot limit, slots in use."""
    while True:
        await asyncio.sleep(every_s)
        parts = []
        for name, supplier in suppliers.items():
            s = supplier.stats
            rate = f", rate {s.rate}" if s.rate else ""
            live = (
                f", runs alive {s.live} of {s.live_limit} (begun {s.runs_started}, shared-queue tasks {s.shared_tasks})"
                if s.live_limit
                else ""
            )
            parts.append(
                f"{name}: lag max {s.window_max_lag_s * 1000:.0f} ms, limit {s.limit}{rate}, in use {s.in_use}{live}"
            )
            s.window_max_lag_s = 0.0
        print("admission: " + "; ".join(parts) + _sandbox_stats(), flush=True)


def _sandbox_stats() -> str:
    """The worker's sandbox hosts: live, host starts (a session's first, or a rebuild), evictions above the cap."""
    return "".join(
        f"; sandbox: live {len(m._live)}, host starts {m.stats.rebuilds}, evictions {m.stats.evictions}"
        for m in _SESSION_MANAGERS
    )


_SESSION_MANAGERS: list[SessionManager] = []


def _count_session_managers() -> None:
    """Remember the worker's `SessionManager` (built inside `build_worker`) for `_sandbox_stats`."""
    init = SessionManager.__init__

    def recorded(self: SessionManager, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _SESSION_MANAGERS.append(self)

    SessionManager.__init__ = recorded  # type: ignore[method-assign]


def _without() -> None:
    """Mark the replacements named in RR_BENCH_WITHOUT as installed, so `build_worker` leaves them out."""
    from reflector.runtime import lean_gc, lean_heartbeats, lean_schemas, lean_visits

    names = {n.strip() for n in os.environ.get("RR_BENCH_WITHOUT", "").split(",") if n.strip()}
    modules = {
        "lean_visits": lean_visits,
        "lean_schemas": lean_schemas,
        "lean_heartbeats": lean_heartbeats,
        "lean_gc": lean_gc,
    }
    unknown = names - modules.keys()
    if unknown:
        raise SystemExit(f"RR_BENCH_WITHOUT: unknown {sorted(unknown)}; known: {sorted(modules)}")
    for name in names:
        modules[name]._installed = True  # install() then does nothing
        print(f"bench worker: without {name}", flush=True)


def _core_log() -> None:
    """RR_BENCH_CORE_LOG=debug (a tracing filter level) prints the Temporal core's own log at that level on
    stderr (the worker's log): which task it polled, activated and completed, for a run's held task that timed out."""
    level = os.environ.get("RR_BENCH_CORE_LOG")
    if level:
        from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

        logging = LoggingConfig(filter=TelemetryFilter(core_level=level.upper(), other_level="WARN"))
        Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=logging)), error_if_already_set=False)


def _gc_stats() -> None:
    """RR_BENCH_GC=S prints, every S seconds, the cyclic garbage collector's collections and CPU time per
    generation so far (the worker holds every cached reflection's objects: a full collection walks them all)."""
    period = float(os.environ.get("RR_BENCH_GC", "0") or 0)
    if not period:
        return
    import gc
    import threading
    import time

    spent = [0.0, 0.0, 0.0]
    count = [0, 0, 0]
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.thread_time()
        else:
            spent[info["generation"]] += time.thread_time() - began[0]
            count[info["generation"]] += 1

    gc.callbacks.append(on_gc)

    def report() -> None:
        while True:
            time.sleep(period)
            parts = [f"gen{g}: {count[g]} collections {spent[g]:.2f} s" for g in range(3)]
            print(f"gc: {'; '.join(parts)}; counts {gc.get_count()}", flush=True)

    threading.Thread(target=report, daemon=True, name="gc-stats").start()


async def main() -> None:
    _without()
    _core_log()
    _gc_stats()
    _count_session_managers()
    print_evictions()
    s = Settings.from_env()
    client = await connect(s.address)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    suppliers = {"workflow tasks": workflow_admission(), "activities": activity_admission()}
    observers: list[Interceptor] = []
    if slow_s := float(os.environ.get("RR_BENCH_SLOW_S", "0")):
        from bench.slow_log import SlowActivities, install_activation_log

        install_activation_log(slow_s)
        observers.append(SlowActivities(slow_s))
    async with build_worker(
        client,
        s.task_queue,
        extra_workflows=[AnchorWorkflow],
        admission=suppliers["workflow tasks"],
        activity_slots_supplier=suppliers["activities"],
        extra_interceptors=observers,
    ):
        lean_gc.install()  # as `rr worker` does (worker.py `_serve`)
        print(f"rr worker pid={os.getpid()} ready", flush=True)
        lag = asyncio.create_task(_report(suppliers))
        await stop.wait()
        lag.cancel()
    await sandbox_activities.shutdown()


if __name__ == "__main__":
    from reflector.runtime import event_loop

    loop = Settings.from_env().event_loop
    print(f"bench worker: event loop {loop} (uvloop installed: {event_loop.uvloop_installed()})", flush=True)
    event_loop.run(main(), loop)
