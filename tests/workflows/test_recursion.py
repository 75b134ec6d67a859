"""Recursion as child workflows, one budget for the whole tree (real server, scripted models)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory

from reflector import client as rr
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from tests.support.fixtures import write_trace


def plan(
    code: list[str] | None = None,
    children: list[dict[str, Any]] | None = None,
    after: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {"code": code or [], "children": children or [], "after": after or [], **extra}


async def run_plan(
    client: Client, tq: str, settings: Settings, tmp_path: Path, root: dict[str, Any], **cfg: Any
) -> tuple[ReflectorOutput, str]:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref,
        question="PLAN:" + json.dumps(root),
        ground_truth="408",
        config=ReflectionConfig(model="scripted-plan", recursion="always", **cfg),
    )
    handle = await rr.start_reflection(client, inp, tq, f"tree-{uuid.uuid4().hex[:8]}")
    return await handle.result(), handle.id


async def histories(client: Client, out: ReflectorOutput, root_id: str) -> dict[str, WorkflowHistory]:
    """The root's history and, recursively, every child's."""
    found = {root_id: await client.get_workflow_handle(root_id).fetch_history()}
    for call in out.raw["rr_trace"]["subagent_calls"]:
        child = await client.get_workflow_handle(call["child_workflow_id"]).result()
        found.update(
            await histories(client, ReflectorOutput.model_validate(child), call["child_workflow_id"])
        )
    return found


async def test_depth_one_child_inherits_a_copy_and_charges_its_usage(
    client, task_queue, settings, tmp_path
) -> None:
    root = plan(
        code=["data = {'a': 1}\nrows = traces['steps']\nprint('root', data, len(rows))"],
        children=[
            plan(
                code=["print('child sees', data, len(rows), len(sub))", "data['a'] = 99\nrows.append('x')"],
                ctx="sub = rows[:2]",
            )
        ],
        after=["print('parent still has', data, len(rows))"],
    )
    out, root_id = await run_plan(client, task_queue, settings, tmp_path, root)
    calls = out.raw["rr_trace"]["subagent_calls"]
    assert len(calls) == 1 and calls[0]["depth"] == 1 and calls[0]["child_workflow_id"] == f"{root_id}.r1"
    child = ReflectorOutput.model_validate(
        await client.get_workflow_handle(calls[0]["child_workflow_id"]).result()
    )
    assert "child sees {'a': 1} 4 2" in child.error_identification  # inherited copy + context_code ran
    assert (
        "parent still has {'a': 1} 4" in out.error_identification
    )  # the child's mutation stayed in the child
    # the root's usage is the sum over the tree; the child's records are in it
    records = out.raw["usage_records"]
    assert {r["depth"] for r in records} == {0, 1}
    assert out.raw["usage"]["requests"] == len(records)
    assert out.raw["usage"]["total_tokens"] == sum(r["input_tokens"] + r["output_tokens"] for r in records)
    assert calls[0]["usage"] == child.raw["usage"]
    assert child.raw["rr_trace"]["depth"] == 1


async def test_depth_two_and_refusal_at_max_depth(client, task_queue, settings, tmp_path) -> None:
    grandchild = plan(code=["print('depth two')"], children=[plan(code=["print('depth three')"])])
    root = plan(code=["print('root')"], children=[plan(code=["print('depth one')"], children=[grandchild])])
    out, root_id = await run_plan(client, task_queue, settings, tmp_path, root)  # max_depth defaults to 2
    tree = await histories(client, out, root_id)
    assert sorted(tree) == sorted([root_id, f"{root_id}.r1", f"{root_id}.r1.r1"])
    leaf = ReflectorOutput.model_validate(await client.get_workflow_handle(f"{root_id}.r1.r1").result())
    assert leaf.raw["rr_trace"]["depth"] == 2
    assert "recurse offered: False" in leaf.error_identification  # not offered at max_depth
    assert {r["depth"] for r in out.raw["usage_records"]} == {0, 1, 2}

    out0, _ = await run_plan(client, task_queue, settings, tmp_path, root, max_depth=0)
    assert out0.raw["rr_trace"]["subagent_calls"] == []
    assert "recurse offered: False" in out0.error_identification


async def test_failing_context_code_is_a_tool_error_the_model_corrects(
    client, task_queue, settings, tmp_path
) -> None:
    root = plan(
        code=["x = 1\nprint(x)"],
        children=[plan(code=["print('child ok', y)"], ctx="y = undefined_name", fixed_ctx="y = x + 1")],
    )
    out, root_id = await run_plan(client, task_queue, settings, tmp_path, root)
    calls = out.raw["rr_trace"]["subagent_calls"]
    assert len(calls) == 2
    assert calls[0]["stop_reason"] == "error" and calls[0]["usage"]["requests"] == 0
    first = ReflectorOutput.model_validate(
        await client.get_workflow_handle(calls[0]["child_workflow_id"]).result()
    )
    assert "undefined_name" in first.raw["context_error"]
    second = ReflectorOutput.model_validate(
        await client.get_workflow_handle(calls[1]["child_workflow_id"]).result()
    )
    assert "child ok 2" in second.error_identification


async def test_budget_exhaustion_in_child_and_parent(client, task_queue, settings, tmp_path) -> None:
    greedy_child = plan(code=[f"print({i})" for i in range(30)])
    root = plan(
        code=["print('start')"], children=[greedy_child], after=[f"print('after {i}')" for i in range(30)]
    )
    out, _ = await run_plan(client, task_queue, settings, tmp_path, root, max_requests=12)
    call = out.raw["rr_trace"]["subagent_calls"][0]
    # the child got half of the 10 remaining requests and was cut short there
    assert call["allocation"]["requests"] == 5
    assert call["cut_short"] is True and call["stop_reason"] == "request_budget"
    assert call["usage"]["requests"] == 5
    assert out.raw["rr_trace"]["stop_reason"] == "request_budget"
    assert out.raw["usage"]["requests"] == 12  # never more than the root's limit, tree-wide


async def test_cancelling_a_reflection_cancels_its_children(client, task_queue, settings, tmp_path) -> None:
    import asyncio

    from temporalio.client import WorkflowExecutionStatus

    slow = "t = 0\nfor i in range(300000000):\n    t += 1\nprint(t)"
    root = plan(code=["print('root')"], children=[plan(code=[slow])])
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref,
        question="PLAN:" + json.dumps(root),
        config=ReflectionConfig(model="scripted-plan", cell_timeout_s=30, recursion="always"),
    )
    handle = await rr.start_reflection(client, inp, task_queue, f"cancel-{uuid.uuid4().hex[:8]}")
    child = client.get_workflow_handle(f"{handle.id}.r1")
    for _ in range(200):  # wait until the child runs its slow cell
        try:
            if (await child.describe()).status == WorkflowExecutionStatus.RUNNING:
                break
        except Exception:
            pass
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    await handle.cancel()
    # a cancelled reflection returns its findings so far, saying so (`rr cancel`); so does its child
    out = ReflectorOutput.model_validate(await handle.result())
    assert out.raw["rr_trace"]["stop_reason"] == "cancelled"
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    child_out = ReflectorOutput.model_validate(await child.result())
    assert child_out.raw["rr_trace"]["stop_reason"] == "cancelled"
    assert (await child.describe()).status == WorkflowExecutionStatus.COMPLETED
