"""The `progress` query and `reflector.client.status` on a real worker: a running tree (a root waiting for its
child, the child held in the middle of its session by a gate), then the same reflection finished.

What is checked: the numbers agree with each other and with the ledger (requests and tokens of the
tree = the root's ledger + the running child's; the child's budget is the allocation carved from the
root's remaining budget), the latest cell id is the cell's sequence number (prefill = cell 1, facts = cell 2), the last
tool, children running / done, and a finished reflection's final numbers from its result and input.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from temporalio.client import Client

import tests.support.gated_models as gated
from reflector import client as rr
from reflector.analysis.ledger import MIN_CHILD_TOKENS
from reflector.client import status
from reflector.contract import PROGRESS_QUERY, ChildProgress, Progress, ReflectionConfig, ReflectorOutput
from tests.support.fixtures import write_trace

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")


async def _until(probe: Callable[[], Awaitable[T | None]], what: str, bound_s: float = 90.0) -> T:
    """Poll `probe` until it returns something (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + bound_s
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.2)


async def _progress(client: Client, wf_id: str) -> Progress:
    p: Progress = await client.get_workflow_handle(wf_id).query(
        PROGRESS_QUERY, result_type=Progress, rpc_timeout=rr.QUERY_TIMEOUT
    )
    return p


def _tree(gate: Path) -> dict[str, object]:
    child = {"code": ["print('child cell')"], "children": [], "after": [], "wait": str(gate), "wait_after": 1}
    return {"code": ["x = 1\nprint('root cell', x)"], "children": [child], "after": ["print('after', x)"]}


async def test_progress_and_status_of_a_running_tree_then_finished(
    client, task_queue, settings, tmp_path
) -> None:
    gate = tmp_path / "gate"
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    config = ReflectionConfig(model=gated.MODEL, max_requests=20, max_tokens=100_000, recursion="always")
    inp = rr.build_input(ref, question=f"PLAN:{json.dumps(_tree(gate))}", config=config)
    wf_id = f"progress-{uuid.uuid4().hex[:8]}"
    child_id = f"{wf_id}.r1"
    handle = await rr.start_reflection(client, inp, task_queue, wf_id)
    try:

        async def child_waits() -> Progress | None:
            try:
                p = await _progress(client, child_id)
            except Exception:  # not started yet
                return None
            return p if p.cells == 1 and p.phase == "waiting for the model" else None

        child = await _until(child_waits, "the child never reached its gate")
        root = await _progress(client, wf_id)

        # the root: one cell of its own (cell 3: the prepare activity ran cells 1 and 2, the prefill and
        # the facts), then `recurse`, now waiting
        assert root.phase == "waiting for child" and root.model == gated.MODEL
        assert (root.cells, root.failed_cells, root.last_cell) == (1, 0, 3)
        assert root.last_tool == "recurse"
        assert (root.iterations, root.requests) == (2, 2)
        assert (root.max_requests, root.max_tokens, root.depth, root.max_depth) == (20, 100_000, 0, 2)
        assert (root.children_started, root.children_done, root.child_running) == (1, 0, child_id)
        assert root.children == [ChildProgress(workflow_id=child_id)]

        # the child: its budget is the allocation carved from the root's remaining budget when it started
        left = 100_000 - root.total_tokens
        assert child.depth == 1 and child.max_requests == (20 - 2) // 2
        assert child.max_tokens == min(left, max(MIN_CHILD_TOKENS, left // 2))
        assert child.cells == 1 and child.requests == 1 and child.last_tool == "execute_code"
        # (the child's prepare also ran its context_code, when there is one, as cell 3)
        assert child.last_cell == 3 and child.child_running == "" and child.children_started == 0

        assert await status.running_chain(client, root) == [child]

        st = await status.fetch_status(client, wf_id)
        assert st.status == "running" and st.kind == "reflection" and not st.waiting_for_worker
        assert st.started is not None and st.elapsed_s is not None and st.elapsed_s > 0
        assert st.progress is not None and st.progress.child_running == child_id
        [running_child] = st.running_children
        assert running_child.workflow_id == child_id and running_child.parent_workflow_id == wf_id
        assert running_child.progress is not None and running_child.progress.depth == 1
        # the tree's total: the root's ledger does not hold the running child's usage yet
        assert st.tree_requests == root.requests + child.requests == 3
        assert st.tree_tokens == root.total_tokens + child.total_tokens
        text = status.render_status(st)
        assert f"reflection {wf_id}: running for " in text
        assert (
            "requests: 3/20 (tree total)" in text
            and "cells: 1 by the model (0 failed), latest [cell 3]" in text
        )
        assert f"children: 0 done, 1 running ({child_id})" in text and "last tool: recurse" in text
        assert f"reflection {child_id}: running for " in text and f"child of {wf_id}" in text
    finally:
        gate.write_text("open")

    out = ReflectorOutput.model_validate(await asyncio.wait_for(handle.result(), 120))
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw.get("error")
    done = await status.fetch_status(client, wf_id)
    assert done.status == "completed" and done.complete is True and done.stop_reason == "completed"
    assert done.closed is not None and not done.running_children
    p = done.progress
    assert p is not None and p.phase == "done"
    # final numbers: the result's (the child's usage charged to the root), the budget from the input
    assert (p.requests, p.total_tokens) == (out.raw["usage"]["requests"], out.raw["usage"]["total_tokens"])
    assert (p.max_requests, p.max_tokens, p.cells) == (20, 100_000, 2)
    assert (
        p.requests == root.requests + child.requests + 3
    )  # the child's answer, the root's after-cell and answer
    [c] = p.children
    assert c.workflow_id == child_id and c.done and c.stop_reason == "completed" and c.requests == 2
    assert (done.tree_requests, done.tree_tokens) == (p.requests, p.total_tokens)
    assert status.exit_code(done) == 0

    # the closed workflow's own answer agrees (the query replays it)
    final = await _progress(client, wf_id)
    assert final.phase == "done" and final.child_running == ""
    assert (final.children_started, final.children_done) == (1, 1)
    assert final.children == [c] and final.requests == p.requests


async def test_status_without_a_worker_says_so_instead_of_querying(client, settings, tmp_path) -> None:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    handle = await rr.start_reflection(
        client, rr.build_input(ref), queue, f"no-worker-{uuid.uuid4().hex[:6]}"
    )
    try:
        st = await status.fetch_status(client, handle.id)
        assert st.status == "running" and st.waiting_for_worker and st.progress is None
        assert queue in st.note and "rr worker" in st.note
        assert "no worker is running it right now" in status.render_status(st)
    finally:
        await handle.terminate("test cleanup")
    ended = await status.fetch_status(client, handle.id)
    assert ended.status == "terminated" and ended.error and status.exit_code(ended) == 1


async def test_status_of_an_unknown_id(client) -> None:
    with pytest.raises(rr.ReflectError, match="no reflection or batch with id 'no-such-reflection-x'"):
        await status.fetch_status(client, "no-such-reflection-x")


async def test_status_of_a_cancelled_reflection(client, task_queue, settings, tmp_path) -> None:
    gate = tmp_path / "never-opened"
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    tree = {"code": ["print('root cell')"], "children": [], "after": [], "wait": str(gate), "wait_after": 1}
    inp = rr.build_input(
        ref,
        question=f"PLAN:{json.dumps(tree)}",
        config=ReflectionConfig(model=gated.MODEL, recursion="always"),
    )
    handle = await rr.start_reflection(client, inp, task_queue, f"cancelled-{uuid.uuid4().hex[:8]}")

    async def at_gate() -> Progress | None:
        p = await _progress(client, handle.id)
        return p if p.cells == 1 and p.phase == "waiting for the model" else None

    await _until(at_gate, "the reflection never reached its gate")
    await handle.cancel()
    try:
        out = ReflectorOutput.model_validate(await asyncio.wait_for(handle.result(), 120))
    finally:
        gate.write_text("open")  # the cancelled model request may still be waiting in the worker
    assert out.raw["rr_trace"]["stop_reason"] == "cancelled"
    st = await status.fetch_status(client, handle.id)
    assert st.status == "completed" and st.cancelled and st.complete is False
    assert st.progress is not None and st.progress.cells == 1
    assert status.exit_code(st) == rr.EXIT_CANCELLED
    assert ", CANCELLED" in status.render_status(st)
