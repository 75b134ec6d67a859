"""The runs alive in a worker (`LiveRuns`, `AdmissionControl.live_limit`) on a real server: counted from start to
end and through evictions, and a limit smaller than a recursing tree does not hold the tree up (a parent alive
and waiting for its child must not keep the child out). The limit itself is not asserted as held: temporalio's
core hands some shared-queue tasks to polls whose slot was reserved as sticky, which the gate does not see."""

from __future__ import annotations

import asyncio
import uuid

from reflector import client as rr
from reflector.contract import ReflectionConfig
from reflector.runtime.admission import AdmissionControl
from tests.support.fixtures import write_trace
from tests.workflows.test_recursion import plan, run_plan
from worker import build_worker


async def test_runs_alive_are_counted_back_to_zero_through_evictions(client, settings, tmp_path) -> None:
    # no control step runs (interval_s=60): the live limit stays 2 for the whole test
    admission = AdmissionControl(
        initial=16, minimum=1, maximum=32, live_initial=2, live_minimum=1, interval_s=60
    )
    tq = f"rr-live-{uuid.uuid4().hex[:6]}"
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    # a cache of one run: each reflection's tasks evict the other's run, which is restored by replay later
    async with build_worker(client, tq, admission=admission, max_cached_workflows=1):
        handles = [
            await rr.start_reflection(
                client,
                rr.build_input(ref, config=ReflectionConfig(model="scripted-steps-3")),
                tq,
                f"live-{i}-{uuid.uuid4().hex[:6]}",
            )
            for i in range(3)
        ]
        outs = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
    assert all(o.raw["rr_trace"]["stop_reason"] == "completed" for o in outs)
    assert admission.stats.peak_live == 1, (
        "a live limit of 1 (never raised: no control step ran) admits one run"
    )
    assert admission.stats.live == 0, "every run that began here ended here"


async def test_a_tree_deeper_than_the_live_limit_finishes(client, settings, tmp_path) -> None:
    admission = AdmissionControl(
        initial=16, minimum=1, maximum=32, live_initial=1, live_minimum=1, interval_s=0.2
    )
    tq = f"rr-live-tree-{uuid.uuid4().hex[:6]}"
    root = plan(
        code=["print('root')"],
        children=[plan(code=["print('child')"], children=[plan(code=["print('grandchild')"])])],
    )
    async with build_worker(client, tq, admission=admission):
        out, _ = await asyncio.wait_for(run_plan(client, tq, settings, tmp_path, root), 120)
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    # all three were alive at once (each parent waits for its child), past a limit of 1
    assert admission.stats.peak_live == 3 and admission.stats.live == 0, admission.stats
