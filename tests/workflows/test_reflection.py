"""ReflectionWorkflow end to end on a real dev server with scripted models and the heuristic."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory

import worker
from activities import model_requests
from reflector import client as rr
from reflector.contract import FORGET_ACTIVITY, PROVIDER_MODEL_PATCH, ReflectionConfig, ReflectorOutput
from reflector.runtime.build_id import build_id
from reflector.runtime.settings import Settings
from tests.support.fixtures import completed_activities, write_trace

HISTORIES: list[WorkflowHistory] = []


async def _reflect(
    client: Client, tq: str, settings: Settings, trace: Path, **cfg: object
) -> ReflectorOutput:
    ref = rr.upload_trace(trace, settings)
    inp = rr.build_input(ref, question="What is 17 * 24?", ground_truth="408", config=ReflectionConfig(**cfg))
    handle = await rr.start_reflection(client, inp, tq, f"t-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    HISTORIES.append(await handle.fetch_history())
    return out


async def test_scripted_reflection_runs_cells_and_fills_raw(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-stateful")
    rt = out.raw["rr_trace"]
    assert rt["cells"] == 4 and rt["failed_cells"] == 0
    assert rt["stop_reason"] == "completed" and rt["timed_out"] is False
    assert out.raw["usage"]["requests"] == 5
    assert (
        out.raw["usage"]["total_tokens"]
        == out.raw["usage"]["input_tokens"] + out.raw["usage"]["output_tokens"]
        > 0
    )
    assert out.raw["workflow_id"].startswith("t-")
    # statements come from the cells: the state built across cells is visible in later outputs
    assert "steps 4" in out.error_identification
    assert "final check 8 6" in out.error_identification


async def test_history_records_model_requests_and_cells_as_local_activities(
    client, task_queue, settings, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[str] = []
    real_take = model_requests._take

    def take(key, name):
        taken.append(key)
        return real_take(key, name)

    monkeypatch.setattr(model_requests, "_take", take)
    await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-steps-3")
    hist = HISTORIES[-1]
    records = completed_activities(hist.events)
    local = [r.name for r in records if r.local]
    regular = [r.name for r in records if not r.local]
    # 4 model requests, prefill + 3 cells + close: each one marker with its result, no server round trip
    assert sum(r.is_model_request for r in records if r.local) == 4, local
    assert local.count("rr.sandbox.run_cell") == 3 and local.count("rr.sandbox.prepare_session") == 1
    assert local.count("rr.sandbox.close_session") == 1
    # the one regular activity deletes the response cache after every response reached the history
    assert regular == [FORGET_ACTIVITY]
    # every workflow task says which code completed it: rr's build id (reflector/runtime/build_id.py)
    stamps = {
        e.workflow_task_completed_event_attributes.worker_version.build_id
        for e in hist.events
        if e.HasField("workflow_task_completed_event_attributes")
    }
    assert stamps == {build_id()}
    responses = [r.result_json() for r in records if r.is_model_request]
    assert all(resp["parts"] for resp in responses)
    # the model's inputs are not in the history (they follow from it): one small payload per step
    assert not any(
        e.HasField("activity_task_scheduled_event_attributes")
        and "model_request" in e.activity_task_scheduled_event_attributes.activity_type.name
        for e in hist.events
    )
    # they were handed to the local activity in process (this test's worker runs in this process), and
    # every hand-over was released once the workflow had the response
    assert len(taken) == 4 and len(set(taken)) == 4 and not set(taken) & set(model_requests._handed)
    # an in-process model never asks for the provider patch: its histories are as before
    assert PROVIDER_MODEL_PATCH.encode() not in b"".join(
        p.data
        for e in hist.events
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
        for p in e.marker_recorded_event_attributes.details["patch-data"].payloads
    )
    assert hist.events[0].workflow_execution_started_event_attributes.workflow_task_timeout.ToSeconds() == 4


async def test_response_cache_holds_responses_while_running_and_is_deleted_at_the_end(
    client, task_queue, settings, tmp_path
) -> None:
    import asyncio

    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, config=ReflectionConfig(model="scripted-paced-20"))
    handle = await rr.start_reflection(client, inp, task_queue, f"t-{uuid.uuid4().hex[:10]}")
    cache = model_requests.response_dir(handle.id)
    for _ in range(200):
        if cache.is_dir() and len(list(cache.glob("*.json"))) >= 3:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"no responses were cached in {cache}")
    out = await handle.result()
    assert out.raw["rr_trace"]["cells"] == 20
    assert not cache.exists()


async def test_workflow_input_holds_reference_not_trace(client, task_queue, settings, tmp_path) -> None:
    big = {"question": "q", "steps": [{"role": "tool", "content": "x" * 200_000}]}
    await _reflect(client, task_queue, settings, write_trace(tmp_path, big), model="scripted-steps-3")
    started = HISTORIES[-1].events[0].workflow_execution_started_event_attributes
    assert started.input.ByteSize() < 5_000


async def test_validator_refuses_final_answer_before_a_successful_cell(
    client, task_queue, settings, tmp_path
) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-eager")
    assert out.raw["rr_trace"]["cells"] >= 1
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    assert "ok dict" in out.error_identification


async def test_text_only_model_ends_gracefully(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-text")
    assert out.raw["rr_trace"]["stop_reason"] == "error"
    assert out.raw["rr_trace"]["timed_out"] is True
    assert out.reasoning.startswith("INCOMPLETE")


async def test_request_budget_stops_with_typed_reason(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), model="scripted-steps-20", max_requests=3
    )
    assert out.raw["rr_trace"]["stop_reason"] == "request_budget"
    assert out.raw["rr_trace"]["timed_out"] is True
    # two turns, then the one request kept back for the final synthesis; never more than the limit
    assert out.raw["usage"]["requests"] == 3
    assert [r["kind"] for r in out.raw["usage_records"]] == ["turn", "turn", "synthesis"]
    assert out.reasoning.startswith("PARTIAL")


async def test_request_budget_too_small_for_synthesis_gives_fallback(
    client, task_queue, settings, tmp_path
) -> None:
    out = await _reflect(
        client, task_queue, settings, write_trace(tmp_path), model="scripted-steps-20", max_requests=2
    )
    assert out.raw["rr_trace"]["stop_reason"] == "request_budget"
    assert out.raw["usage"]["requests"] == 2
    assert out.reasoning.startswith("INCOMPLETE")
    # the trace's final answer (398) against the ground truth (408): the fallback says it is wrong
    assert out.raw["answer_correct"] is False
    assert "does NOT match" in out.error_identification


async def test_heuristic_on_tau_bench_run(client, task_queue, settings, tmp_path, shared_traces) -> None:
    runs = json.loads((shared_traces / "tau-bench-airline-gpt-4o.json").read_text())
    run = next(r for r in runs if r["reward"] < 1 and r["task_id"] == 0)
    trace = write_trace(tmp_path, run, "tau.json")
    ref = rr.upload_trace(trace, settings)
    assert ref.format == "tau-bench"
    inp = rr.build_input(ref, config=ReflectionConfig(model="heuristic"))
    handle = await rr.start_reflection(client, inp, task_queue, f"t-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    HISTORIES.append(await handle.fetch_history())
    assert out.raw["rr_trace"]["cells"] >= 1 and out.raw["rr_trace"]["stop_reason"] == "completed"
    assert "not an LLM" in out.reasoning
    assert out.extracted_learnings and all(0 <= x.atomicity_score <= 1 for x in out.extracted_learnings)
    assert out.extracted_learnings[0].evidence


async def test_all_histories_replay_cleanly(client, task_queue, settings, tmp_path) -> None:
    # run alone (or first), this test makes the histories it replays: at least five, of different scripts
    for model in ("scripted-stateful", "scripted-steps-3", "scripted-submit", "scripted-loop", "heuristic")[
        len(HISTORIES) :
    ]:
        await _reflect(client, task_queue, settings, write_trace(tmp_path), model=model)
    assert len(HISTORIES) >= 5
    replayer = worker.make_replayer(Settings.from_env().blob_dir)
    for hist in HISTORIES:
        await replayer.replay_workflow(hist)


@pytest.mark.parametrize("n", [1])
async def test_suite_with_max_cached_workflows_zero(client, settings, tmp_path, n) -> None:
    """Every workflow task replays the whole history from scratch: the workflow must be deterministic."""
    from worker import build_worker

    tq = f"rr-nocache-{uuid.uuid4().hex[:6]}"
    async with build_worker(client, tq, max_cached_workflows=0):
        out = await _reflect(client, tq, settings, write_trace(tmp_path), model="scripted-stateful")
    assert out.raw["rr_trace"]["cells"] == 4
    assert "final check 8 6" in out.error_identification


async def test_progress_is_reported_while_a_reflection_runs(client, task_queue, settings, tmp_path) -> None:
    """The progress query is answered while model requests and cells run inside the held workflow task
    (at its renewals), so a waiting client sees the reflection advance."""
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, config=ReflectionConfig(model="scripted-paced-20"))
    handle = await rr.start_reflection(client, inp, task_queue, f"t-{uuid.uuid4().hex[:10]}")
    seen: list[tuple[str, int, int]] = []
    out = await rr.wait_for_result(
        handle, on_progress=lambda p: seen.append((p.phase, p.iterations, p.cells)), poll_s=0.2
    )
    assert out.raw["rr_trace"]["cells"] == 20
    # ~5 s of work in a task renewed every 3.2 s: at least one report from the middle of the run
    assert any(0 < cells < 20 for _, _, cells in seen), seen
    assert [c for _, _, c in seen] == sorted(c for _, _, c in seen)
