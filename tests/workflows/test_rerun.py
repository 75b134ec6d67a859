"""`rr rerun`: a new reflection that reuses the origin's recorded steps before N and continues live from N.

Real dev server and worker (tests/workflows/conftest.py), scripted models that count their calls, and
the local OpenAI-protocol server for the provider path. What is asserted comes from the new
reflection's history (which markers it holds) and from the models' own call counts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

import worker
from reflector import client as rr
from reflector.client import ReflectError
from reflector.client.rerun import plan_rerun
from reflector.contract import (
    EXECUTE_CODE_TOOL,
    RERUN_CELL_ACTIVITY,
    RERUN_CHILD_ACTIVITY,
    RERUN_RESPONSE_ACTIVITY,
    RERUN_SUMMARY_ACTIVITY,
    RUN_CELL_ACTIVITY,
    SUMMARISE_ACTIVITY,
    CellOutcome,
    ReflectionConfig,
    ReflectorOutput,
)
from reflector.runtime.models import register_model
from reflector.runtime.settings import Settings
from reflector.testing.openai_server import OpenAIServer
from reflector.testing.scripted import synthesis_aware
from tests.support.fixtures import ActivityRecord, comparable, completed_activities, write_trace

# ------------------------------------------------------------------------------------ scripted models

ORIGIN_CELLS = 5  # the origin: 5 cells (steps 1-5) that each set a variable, then its answer (step 6)
CALLS: dict[str, int] = {}


def _outputs(messages: list[ModelMessage]) -> list[str]:
    return [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == EXECUTE_CODE_TOOL
    ]


def _answer(info: AgentInfo, who: str, outputs: list[str]) -> ModelResponse:
    args = {
        "reasoning": f"{who} over {len(outputs)} cells",
        "error_identification": f"{who} saw: {outputs[-1][-120:]}",
        "root_cause_analysis": who,
        "correct_approach": who,
        "key_insight": who,
        "extracted_learnings": [
            {
                "learning": f"{who} learning",
                "atomicity_score": 0.9,
                "evidence": outputs[-1][-80:],
                "justification": who,
            }
        ],
        "skill_tags": [],
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id=f"{who}-final")])


def origin_script(name: str):
    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        CALLS[name] = CALLS.get(name, 0) + 1
        k = len(_outputs(messages)) + 1
        if k <= ORIGIN_CELLS:
            code = f"v{k} = {k} * 10\nprint('set v{k}', v{k})"
            return ModelResponse(
                parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"o{k}")]
            )
        return _answer(info, "origin", _outputs(messages))

    return fn


def new_script(name: str):
    """From step 4 on: a cell that needs the variables the origin's cells 1-3 set, then its own answer."""

    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        CALLS[name] = CALLS.get(name, 0) + 1
        outputs = _outputs(messages)
        if len(outputs) == 3:
            code = (
                "try:\n    v4\n    has_v4 = True\nexcept NameError:\n    has_v4 = False\n"
                "print('new model sum', v1 + v2 + v3, 'v4 set:', has_v4)"
            )
            return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id="n4")])
        return _answer(info, "new-model", outputs)

    return fn


def _register(kind: str) -> str:
    name = f"rerun-{kind}-{uuid.uuid4().hex[:6]}"
    script = origin_script(name) if kind == "origin" else new_script(name)
    register_model(name, lambda: FunctionModel(synthesis_aware(script), model_name=name))
    return name


# ------------------------------------------------------------------------------------ helpers


async def _reflect(
    client: Client,
    tq: str,
    settings: Settings,
    trace: Path,
    question: str = "What is 17 * 24?",
    **cfg: object,
) -> tuple[ReflectorOutput, str]:
    ref = rr.upload_trace(trace, settings)
    inp = rr.build_input(
        ref, question=question, ground_truth="408", config=ReflectionConfig(recursion="always", **cfg)
    )
    handle = await rr.start_reflection(client, inp, tq, f"rr-origin-{uuid.uuid4().hex[:8]}")
    return await handle.result(), handle.id


async def _rerun(
    client: Client,
    tq: str,
    settings: Settings,
    origin: str,
    step: int,
    model: str | None = None,
    **overrides: object,
) -> tuple[ReflectorOutput, list[WorkflowHistory]]:
    plan = await plan_rerun(client, settings, origin, step, model=model, config_overrides=overrides or None)
    handle = await rr.start_reflection(client, plan.input, tq, f"rr-rerun-{uuid.uuid4().hex[:8]}")
    out = await handle.result()
    return out, await _chain(client, handle.id)


async def _chain(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    runs.sort(key=lambda w: w.start_time)
    return [await client.get_workflow_handle(workflow_id, run_id=r.run_id).fetch_history() for r in runs]


def _local(histories: list[WorkflowHistory], name: str) -> list[ActivityRecord]:
    return [r for h in histories for r in completed_activities(h.events) if r.local and r.name == name]


def _cell_seqs(histories: list[WorkflowHistory], name: str) -> list[int]:
    return [CellOutcome.model_validate(r.result_json()).seq for r in _local(histories, name)]


def _events(histories: list[WorkflowHistory], kind: int) -> int:
    return sum(1 for h in histories for e in h.events if e.event_type == kind)


# ------------------------------------------------------------------------------------ in-process models


async def test_rerun_reuses_steps_before_n_and_continues_with_another_model(
    client, task_queue, settings, tmp_path
):
    origin_model, new_model = _register("origin"), _register("new")
    origin_out, origin_id = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), model=origin_model
    )
    assert origin_out.raw["rr_trace"]["total_iterations"] == ORIGIN_CELLS + 1 == CALLS[origin_model]
    assert origin_out.raw["rr_trace"]["stop_reason"] == "completed"

    out, chain = await _rerun(client, task_queue, settings, origin_id, 4, model=new_model)

    # the origin's model was not asked again; the new one exactly for steps 4 and 5
    assert CALLS[origin_model] == ORIGIN_CELLS + 1
    assert CALLS[new_model] == 2
    # steps 1-3 came from the prefix: their responses and their three cells (seq 3, 4, 5: 1 and 2 are the
    # prefill), none of which ran as a cell; the one live cell (step 4's) is seq 6
    assert len(_local(chain, RERUN_RESPONSE_ACTIVITY)) == 3
    assert _cell_seqs(chain, RERUN_CELL_ACTIVITY) == [3, 4, 5]
    assert _cell_seqs(chain, RUN_CELL_ACTIVITY) == [6]
    model_markers = [r for h in chain for r in completed_activities(h.events) if r.is_model_request]
    assert len(model_markers) == 2  # the live steps only
    # the live cell saw the variables the reused cells set (the sandbox was rebuilt from their journal),
    # and none the origin set after step 3
    [live] = [CellOutcome.model_validate(r.result_json()) for r in _local(chain, RUN_CELL_ACTIVITY)]
    assert "new model sum 60 v4 set: False" in live.output, live.output
    assert live.host_restarted and live.cells_replayed == 5
    # the output is the new model's, and says what it reused
    assert out.reasoning == "new-model over 4 cells"
    assert "new model sum 60" in out.error_identification
    assert out.raw["model"] == new_model
    assert out.raw["rerun"] == {
        "origin": origin_id,
        "from_step": 4,
        "origin_model": origin_model,
        "model": new_model,
        "reused_requests": 3,
        "reused_cells": 3,
        "reused_children": 0,
        "reused_summaries": 0,
        "sandbox_rebuilt_from_reused_cells": True,
    }
    memo = await (await client.get_workflow_handle(out.raw["workflow_id"]).describe()).memo()
    assert memo["rr_rerun"] == {"origin": origin_id, "from_step": 4, "origin_model": origin_model}
    # reused requests are not charged: the ledger holds the two live turns
    assert out.raw["usage"]["requests"] == 2
    assert [r["model"] for r in out.raw["usage_records"]] == [new_model, new_model]
    assert out.raw["rr_trace"]["total_iterations"] == 5 and out.raw["rr_trace"]["cells"] == 4
    # the rerun is itself durable: its history replays against the current code
    for h in chain:
        await worker.make_replayer(settings.blob_dir).replay_workflow(h)

    # a rerun of the rerun: its reused steps count as steps, its reused cells as cells
    again, chain2 = await _rerun(client, task_queue, settings, out.raw["workflow_id"], 5)
    assert CALLS[new_model] == 3 and CALLS[origin_model] == ORIGIN_CELLS + 1
    assert again.raw["rerun"]["reused_requests"] == 4 and again.raw["rerun"]["reused_cells"] == 4
    assert (
        _cell_seqs(chain2, RERUN_CELL_ACTIVITY) == [3, 4, 5, 6]
        and _cell_seqs(chain2, RUN_CELL_ACTIVITY) == []
    )
    assert again.error_identification == out.error_identification


async def test_rerun_from_step_one_reuses_nothing(client, task_queue, settings, tmp_path):
    origin_model = _register("origin")
    _, origin_id = await _reflect(client, task_queue, settings, write_trace(tmp_path), model=origin_model)
    out, chain = await _rerun(client, task_queue, settings, origin_id, 1)
    assert CALLS[origin_model] == 2 * (ORIGIN_CELLS + 1)
    assert out.raw["rerun"]["reused_requests"] == 0 and out.raw["rerun"]["reused_cells"] == 0
    assert not _local(chain, RERUN_RESPONSE_ACTIVITY) and not _local(chain, RERUN_CELL_ACTIVITY)
    assert _cell_seqs(chain, RUN_CELL_ACTIVITY) == [3, 4, 5, 6, 7]
    assert out.reasoning == "origin over 5 cells"


async def test_rerun_with_the_same_model_gives_the_origins_reflection(client, task_queue, settings, tmp_path):
    origin_model = _register("origin")
    origin_out, origin_id = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), model=origin_model
    )
    out, chain = await _rerun(client, task_queue, settings, origin_id, ORIGIN_CELLS + 1)
    assert CALLS[origin_model] == ORIGIN_CELLS + 2  # only the last step was asked again
    assert _cell_seqs(chain, RUN_CELL_ACTIVITY) == []
    a, b = comparable(out), comparable(origin_out)
    a["raw"].pop("rerun")
    for d in (a, b):
        d["raw"].pop("usage"), d["raw"].pop("usage_records")
    assert a == b


# ------------------------------------------------------------------------------------ children, summaries

PLAN = {
    "code": ["a = 1\nprint('a', a)", "b = a + 1\nprint('b', b)"],
    "children": [{"code": ["print('child sees b', b)"]}],
    "after": ["c = b + 1\nprint('c', c)", "print('after child', a, b, c)"],
}


async def test_a_reused_recurse_returns_the_recorded_child(client, task_queue, settings, tmp_path):
    question = "PLAN:" + json.dumps(PLAN)
    origin_out, origin_id = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), question=question, model="scripted-plan"
    )
    assert len(origin_out.raw["rr_trace"]["subagent_calls"]) == 1
    # steps: cell a, cell b, recurse, cell c, cell "after child", answer: rerun from step 5
    out, chain = await _rerun(client, task_queue, settings, origin_id, 5)
    assert _events(chain, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) == 0
    assert len(_local(chain, RERUN_CHILD_ACTIVITY)) == 1
    [call] = out.raw["rr_trace"]["subagent_calls"]
    assert call["reused_from"] == f"{origin_id}.r1" == call["child_workflow_id"]
    assert out.raw["rerun"]["reused_children"] == 1 and out.raw["rerun"]["reused_cells"] == 3
    assert "after child 1 2 3" in out.error_identification
    assert comparable(out)["extracted_learnings"] == comparable(origin_out)["extracted_learnings"]

    # from the step that asked for the child (3): the child is live again, under the rerun's own id
    out3, chain3 = await _rerun(client, task_queue, settings, origin_id, 3)
    assert _events(chain3, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED) == 1
    assert not _local(chain3, RERUN_CHILD_ACTIVITY)
    assert "after child 1 2 3" in out3.error_identification


@pytest.fixture
def _big_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RR_TEST_BIG_CELLS", "8")


@pytest.mark.usefixtures("_big_cells")
async def test_rerun_across_a_summary_and_continue_as_new(client, task_queue, settings, tmp_path):
    origin_out, origin_id = await _reflect(
        client,
        task_queue,
        settings,
        write_trace(tmp_path),
        model="scripted-big",
        context_window=3_000,
        max_compactions=3,
    )
    origin_chain = await _chain(client, origin_id)
    rt = origin_out.raw["rr_trace"]
    assert rt["compactions"] >= 1 and len(origin_chain) == rt["compactions"] + 1
    steps = rt["total_iterations"]
    # the last step: every summary of the origin is before it
    out, chain = await _rerun(client, task_queue, settings, origin_id, steps)
    assert out.raw["rerun"]["reused_summaries"] == rt["compactions"]
    assert len(_local(chain, RERUN_SUMMARY_ACTIVITY)) == rt["compactions"]
    summaries = [r for h in chain for r in completed_activities(h.events) if r.name == SUMMARISE_ACTIVITY]
    assert summaries == []
    assert len(chain) == len(origin_chain)  # it continued as new where the origin did
    assert out.raw["rerun"]["reused_requests"] == steps - 1
    assert out.error_identification == origin_out.error_identification


# ------------------------------------------------------------------------------------ bad inputs


async def test_bad_origins_and_steps_are_one_line_errors(client, task_queue, settings, tmp_path):
    origin_model = _register("origin")
    _, origin_id = await _reflect(client, task_queue, settings, write_trace(tmp_path), model=origin_model)
    with pytest.raises(ReflectError, match="no reflection with id 'no-such-id'"):
        await plan_rerun(client, settings, "no-such-id", 1)
    for step in (0, ORIGIN_CELLS + 2):
        with pytest.raises(
            ReflectError, match=rf"--from-step must be between 1 and {ORIGIN_CELLS + 1} .* not {step}$"
        ):
            await plan_rerun(client, settings, origin_id, step)

    question = "PLAN:" + json.dumps(PLAN)
    _, plan_id = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), question=question, model="scripted-plan"
    )
    with pytest.raises(ReflectError, match=rf"is a child reflection \(of {plan_id}\)"):
        await plan_rerun(client, settings, f"{plan_id}.r1", 1)

    batch = await rr.reflect_batch(
        client,
        [write_trace(tmp_path)],
        settings,
        task_queue=task_queue,
        config=ReflectionConfig(model="scripted-steps-3"),
    )
    with pytest.raises(ReflectError, match="is a batch"):
        await plan_rerun(client, settings, batch.batch_id, 1)
    # a batch's run reflection is a root session (its parent is the batch): it can be rerun, standalone
    run_id = batch.run_records[0].workflow_id
    assert run_id is not None
    out, _ = await _rerun(client, task_queue, settings, run_id, 2)
    assert out.raw["rerun"]["origin"] == run_id and out.raw["rerun"]["reused_requests"] == 1
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    with pytest.raises(ReflectError, match="unknown model|not a known model|model"):
        await plan_rerun(client, settings, origin_id, 2, model="no-such-provider:x")


# ------------------------------------------------------------------------------------ provider path

API_KEY = "test-key"


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    with OpenAIServer(cells=ORIGIN_CELLS) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        yield server


async def test_provider_requests_paid_are_exactly_the_steps_from_n(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer
):
    origin_model = f"openai-chat:rr-rerun-{uuid.uuid4().hex[:8]}"
    origin_out, origin_id = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), model=origin_model
    )
    steps = ORIGIN_CELLS + 1
    assert origin_out.raw["rr_trace"]["stop_reason"] == "completed"
    assert sum(openai_server.completed.values()) == steps

    new_model = f"openai-chat:rr-rerun-new-{uuid.uuid4().hex[:8]}"
    before = len(openai_server.requests)
    out, chain = await _rerun(client, task_queue, settings, origin_id, 4, model=new_model)
    paid = openai_server.requests[before:]
    assert sum(openai_server.completed.values()) == steps + (steps - 3)
    assert len(paid) == steps - 3 and all(r.status == 200 for r in paid)
    assert all(r.body["model"] == new_model.split(":", 1)[1] for r in paid)
    # the first live request carried the three reused cells' results, as the origin's request 4 did
    first = paid[0].body["messages"]
    assert len([m for m in first if m.get("role") == "tool"]) == 3
    assert not openai_server.duplicated_completions()
    assert out.raw["usage"]["requests"] == steps - 3
    assert out.raw["rerun"]["reused_requests"] == 3 and out.raw["rerun"]["origin_model"] == origin_model
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    assert _cell_seqs(chain, RERUN_CELL_ACTIVITY) == [3, 4, 5]
    assert _cell_seqs(chain, RUN_CELL_ACTIVITY) == [6, 7]

    # an in-process origin continued by a provider model
    scripted = _register("origin")
    _, scripted_id = await _reflect(client, task_queue, settings, write_trace(tmp_path), model=scripted)
    before = sum(openai_server.completed.values())
    out2, _ = await _rerun(client, task_queue, settings, scripted_id, 5, model=new_model)
    assert sum(openai_server.completed.values()) - before == 2  # its cell 5 and its answer
    assert out2.raw["rerun"]["reused_requests"] == 4 and out2.raw["rr_trace"]["stop_reason"] == "completed"
