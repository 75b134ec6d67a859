"""Log slow workflow activations and slow activities of a bench worker, with wall-clock times, so a held
task that timed out (bench/throughput.py's "held-task timeouts") can be matched with what the worker was
doing: `RR_BENCH_SLOW_S=2 python -m bench.throughput ...` logs every activation and every activity (local
ones included) that took longer than 2 s, as

    SLOW activation <seconds> run=<run id> wf=<workflow id or -> jobs=<job kinds> at=<start, UTC>
    SLOW activity <seconds> <type> local=<bool> wf=<workflow id> waited=<s from handed over to begun> at=...
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor
from temporalio.worker import _workflow as temporal_workflow_worker

from reflector.runtime.admission import start_delay_s


def _now() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]


def install_activation_log(threshold_s: float) -> None:
    """Wrap temporalio's activation handler to print activations slower than `threshold_s`."""
    original = temporal_workflow_worker._WorkflowWorker._handle_activation

    async def timed(self: Any, act: Any) -> None:
        began, at = time.monotonic(), _now()
        try:
            await original(self, act)
        finally:
            took = time.monotonic() - began
            if took > threshold_s:
                jobs = ",".join(j.WhichOneof("variant") or "?" for j in act.jobs)
                wf = next(
                    (
                        j.initialize_workflow.workflow_id
                        for j in act.jobs
                        if j.HasField("initialize_workflow")
                    ),
                    "-",
                )
                print(f"SLOW activation {took:.2f} run={act.run_id} wf={wf} jobs={jobs} at={at}", flush=True)

    temporal_workflow_worker._WorkflowWorker._handle_activation = timed  # type: ignore[method-assign]


class SlowActivities(Interceptor):
    """Prints activities (local ones included) whose body took longer than the threshold."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Timed(next, self.threshold_s)


class _Timed(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, threshold_s: float) -> None:
        super().__init__(next)
        self.threshold_s = threshold_s

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        began, at = time.monotonic(), _now()
        waited = start_delay_s(info)
        waited = -1.0 if waited is None else waited
        try:
            return await self.next.execute_activity(input)
        finally:
            took = time.monotonic() - began
            # a provider request takes the model's latency: only its wait, or a body past twice the threshold
            slow = took > self.threshold_s * (1 if info.is_local else 2)
            if slow or waited > self.threshold_s:
                print(
                    f"SLOW activity {took:.2f} {info.activity_type} local={info.is_local} "
                    f"wf={info.workflow_id} waited={waited:.2f} at={at}",
                    flush=True,
                )
