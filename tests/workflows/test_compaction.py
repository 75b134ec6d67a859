"""Compaction that really runs, asserted from the histories: microcompaction, summaries, their cap,
and continue-as-new (forced by a low server threshold) leaving the reflection's output unchanged."""

from __future__ import annotations

import os
import re
import uuid

import pytest
from temporalio.client import Client, WorkflowHistory

from reflector import client as rr
from reflector.analysis.compaction import PLACEHOLDER
from reflector.client import connect
from reflector.contract import SUMMARISE_ACTIVITY, ReflectionConfig, ReflectorOutput
from reflector.testing.scripted import INPUTS_ENV, recorded_inputs
from tests.support.fixtures import comparable, completed_activities, write_trace
from worker import build_worker


async def _run(client: Client, tq: str, settings, tmp_path, model: str, **cfg) -> tuple[ReflectorOutput, str]:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref, question="What is 17 * 24?", ground_truth="408", config=ReflectionConfig(model=model, **cfg)
    )
    handle = await rr.start_reflection(client, inp, tq, f"cmp-{uuid.uuid4().hex[:8]}")
    return await handle.result(), handle.id


async def all_runs(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """Histories of every run of a workflow id (continue-as-new makes a chain of runs)."""
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return [await client.get_workflow_handle(workflow_id, run_id=r.run_id).fetch_history() for r in runs]


def _activity_names(histories: list[WorkflowHistory]) -> list[str]:
    return [r.name for h in histories for r in completed_activities(h.events)]


def _model_inputs(_runs: list[WorkflowHistory]) -> list[str]:
    """The text the scripted model was sent, per call (inputs are not recorded in the history)."""
    return [r["text"] for r in recorded_inputs(os.environ[INPUTS_ENV])]


@pytest.fixture(autouse=True)
def _record_model_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv(INPUTS_ENV, str(tmp_path / "model-inputs.jsonl"))


@pytest.fixture(autouse=True)
def _eight_big_cells(monkeypatch):
    monkeypatch.setenv("RR_TEST_BIG_CELLS", "8")


async def test_microcompaction_keeps_recent_outputs(client, task_queue, settings, tmp_path) -> None:
    out, wf_id = await _run(
        client,
        task_queue,
        settings,
        tmp_path,
        "scripted-big",
        context_window=4_200,
        microcompact_keep_recent=2,
        max_compactions=0,
    )
    rt = out.raw["rr_trace"]
    assert rt["microcompactions"] >= 1 and rt["compactions"] == 0
    runs = await all_runs(client, wf_id)
    assert SUMMARISE_ACTIVITY not in _activity_names(runs)
    last_input = _model_inputs(runs)[-1]
    assert PLACEHOLDER in last_input
    # only the 2 most recent cell outputs are kept verbatim, the older ones are placeholders
    assert len(re.findall(r"cell \d+ yy", last_input)) == 2
    assert last_input.count(PLACEHOLDER) >= 1


async def test_summary_path_archives_history_and_continues(client, task_queue, settings, tmp_path) -> None:
    out, wf_id = await _run(
        client, task_queue, settings, tmp_path, "scripted-big", context_window=3_000, max_compactions=3
    )
    rt = out.raw["rr_trace"]
    assert rt["compactions"] >= 1 and rt["stop_reason"] == "completed"
    assert rt["continued_as_new"] == rt["compactions"]  # a new run after each summary
    runs = await all_runs(client, wf_id)
    assert len(runs) == rt["compactions"] + 1
    names = _activity_names(runs)
    assert names.count(SUMMARISE_ACTIVITY) == rt["compactions"]
    # the summary request was charged to the budget
    kinds = [r["kind"] for r in out.raw["usage_records"]]
    assert kinds.count("summary") == rt["compactions"]
    assert any("scripted summary" in i for i in _model_inputs(runs))
    # the archived transcripts are readable in the sandbox as `history`, and variables survived
    assert "history items" in out.error_identification and "v0 still 2999" in out.error_identification
    assert "history items 0" not in out.error_identification


async def test_max_compactions_stops_gracefully(client, task_queue, settings, tmp_path) -> None:
    out, _ = await _run(
        client, task_queue, settings, tmp_path, "scripted-big", context_window=3_000, max_compactions=1
    )
    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "max_compactions" and rt["timed_out"] is True
    assert rt["compactions"] == 1
    assert out.reasoning.startswith(("PARTIAL", "INCOMPLETE"))


async def test_continue_as_new_output_equals_uncontinued_run(
    client, task_queue, settings, tmp_path, temporal_server_factory
) -> None:
    # Temporal's suggestion reaches the workflow with each new workflow task; model requests and cells
    # run inside one task that is renewed every 0.8 x task timeout, so the model takes its time here.
    server = temporal_server_factory(dynamic_config={"limit.historyCount.suggestContinueAsNew": 20})
    can_client = await connect(server.address)
    tq = f"can-{uuid.uuid4().hex[:6]}"
    async with build_worker(can_client, tq):
        continued, _ = await _run(can_client, tq, settings, tmp_path, "scripted-paced-20")
    plain, _ = await _run(client, task_queue, settings, tmp_path, "scripted-paced-20")
    assert continued.raw["rr_trace"]["continued_as_new"] >= 1
    assert plain.raw["rr_trace"]["continued_as_new"] == 0
    a, b = comparable(continued), comparable(plain)
    a["raw"]["rr_trace"].pop("continued_as_new")
    b["raw"]["rr_trace"].pop("continued_as_new")
    assert a == b
