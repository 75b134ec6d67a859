"""BatchReflectionWorkflow end to end on the session's dev server (heuristic and scripted models).

A batch of tau-bench-style runs: one child reflection per run, a synthesis that counts runs (not
errors) and cites run ids, broken runs reported without sinking the batch, continue-as-new giving the
same result as one run, the LLM synthesis session for an LLM model, and every history replaying.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

import worker
from reflector import client as rr
from reflector.analysis.traces.scan import iter_records
from reflector.contract import PROGRESS_QUERY, BatchResult, ReflectionConfig, RunRecord, TraceRef
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore, blob_uri
from reflector.runtime.storage.manifest import RunSource, write_manifest
from reflector.testing.tau_runs import synthetic_runs, tau_run
from workflows.batch import child_id

pytestmark = pytest.mark.timeout(120)


def _write(path: Path, runs: list[Any]) -> Path:
    path.write_text(json.dumps(runs, indent=1))
    return path


async def _batch(client: Client, tq: str, settings: Settings, paths: list[Path], **kw: Any) -> BatchResult:
    return await rr.reflect_batch(
        client, paths, settings, task_queue=tq, batch_id=f"b-{uuid.uuid4().hex[:8]}", **kw
    )


async def _replays(client: Client, settings: Settings, batch_id: str) -> int:
    """Replay every run of the batch's continue-as-new chain (and its children) with no workflow cache."""
    replayer = worker.make_replayer(settings.blob_dir)
    n = 0
    async for wf in client.list_workflows(f"WorkflowId = '{batch_id}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, result.replay_failure
        n += 1
    return n


async def test_a_batch_counts_runs_not_errors_and_cites_run_ids(
    client, task_queue, settings, tmp_path
) -> None:
    runs = [
        tau_run(0, errors={"get_flight_status": 6}, book=False),  # one run, six errors of one tool
        *(tau_run(i, errors={"get_user_details": 1}, book=False) for i in range(1, 6)),  # five runs, one each
        tau_run(6),
    ]
    path = _write(tmp_path / "runs.json", runs)
    res = await _batch(client, task_queue, settings, [path], split=True, concurrency=4)

    assert (res.n_runs, res.reflected, res.failed) == (7, 7, 0)
    s = res.synthesis
    assert s.outcomes == {"failure": 6, "success": 1, "unknown": 0}
    modes = {m.key: m for m in s.failure_modes}
    top = s.failure_modes[0]
    # 6 runs miss the booking; the tool failing in 5 runs ranks above the one failing 6 times in 1 run
    assert (top.key, top.runs, top.share) == ("missing_action:book_reservation", 6, round(6 / 7, 4))
    assert s.failure_modes[1].key == "tool_error:get_user_details"
    assert modes["tool_error:get_user_details"].runs == 5
    assert modes["tool_error:get_user_details"].run_ids == [f"task{i}-trial0" for i in range(1, 6)]
    assert modes["tool_error:get_flight_status"].runs == 1
    assert modes["tool_error:get_flight_status"].run_ids == ["task0-trial0"]
    assert s.single_run_modes == 1
    assert "5 of 7 runs" in s.summary and "task1-trial0" in s.summary
    assert res.llm_synthesis is None  # the heuristic: the computed synthesis only
    # learnings the heuristic wrote for the same finding in several runs are grouped, with their runs
    assert s.recurring_learnings and s.recurring_learnings[0].runs >= 5

    # each run is its own trace blob: exactly its bytes in the file
    with open(path, "rb") as fh:
        spans = [(a, b) for a, b, _ in iter_records(fh, str(path))]
    raw = path.read_bytes()
    assert [r.trace_sha256 for r in res.run_records] == [
        hashlib.sha256(raw[a:b]).hexdigest() for a, b in spans
    ]
    rec = res.run_records[0]
    assert rec.failing_tools == {"get_flight_status": 6} and rec.reward == 0.0 and rec.outcome == "failure"
    # a record names its child reflection; the full one is that workflow's output
    assert rec.workflow_id == child_id(res.batch_id, 0)
    full = await rr.fetch_result(client, rec.workflow_id)
    assert "get_flight_status" in full.error_identification and rec.what_went_wrong[:60] in " ".join(
        full.error_identification.split()
    )
    assert await _replays(client, settings, res.batch_id) == 1


async def test_broken_runs_are_reported_and_the_batch_goes_on(client, task_queue, settings, tmp_path) -> None:
    d = tmp_path / "runs"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(tau_run(1)))
    (d / "b.json").write_text('{"task_id": 2, "traj": [')  # not JSON: a broken run
    (d / "c.jsonl").write_text(json.dumps(tau_run(3, book=False)) + "\n")
    res = await _batch(client, task_queue, settings, [d])
    assert (res.n_runs, res.reflected, res.failed) == (3, 2, 1)
    assert [r.run_id for r in res.run_records] == [str(d / "a.json"), str(d / "b.json"), str(d / "c.jsonl")]
    broken = res.run_records[1]
    assert broken.status == "failed" and broken.workflow_id is None and "invalid JSON" in (broken.error or "")
    assert [f.run_id for f in res.synthesis.failed_runs] == [str(d / "b.json")]
    assert res.synthesis.outcomes == {"failure": 1, "success": 1, "unknown": 0}
    assert not rr.is_batch_complete(res)

    # a child reflection that fails (its trace blob is missing from the store) is one failed run too
    store = BlobStore(settings.blob_dir)
    good = rr.upload_trace(d / "a.json", settings)
    missing = TraceRef(uri=blob_uri("0" * 64), sha256="0" * 64, size=10, format="tau-bench")
    manifest = write_manifest(
        [RunSource("ok", "ok", trace=good), RunSource("gone", "gone", trace=missing)], store
    )
    handle = await rr.start_batch(
        client, rr.build_batch_input(manifest), task_queue, f"b-{uuid.uuid4().hex[:8]}"
    )
    out = await handle.result()
    assert (out.reflected, out.failed) == (1, 1)
    records = rr.load_batch_records(out, settings)
    assert records[1].status == "failed" and "the reflection failed" in (records[1].error or "")
    assert records[1].workflow_id == child_id(out.batch_id, 1)


async def test_progress_shows_done_running_failed(client, task_queue, settings, tmp_path) -> None:
    from reflector.client.batch_render import render_batch_progress
    from reflector.contract import BatchProgress

    runs: list[Any] = [*synthetic_runs(5), 7]  # the last record is not a run
    path = _write(tmp_path / "six.json", runs)
    manifest = rr.upload_batch([path], settings, split=True)
    handle = await rr.start_batch(
        client, rr.build_batch_input(manifest, concurrency=1), task_queue, f"b-{uuid.uuid4().hex[:8]}"
    )
    seen: list[BatchProgress] = []
    out = await rr.wait_for_batch(handle, on_progress=seen.append, poll_s=0.05)
    assert (out.reflected, out.failed) == (5, 1)
    assert seen, "no progress was reported while the batch ran"
    assert all(p.total == 6 and p.running <= 1 and p.done + p.failed + p.running <= 6 for p in seen)
    assert [p.done for p in seen] == sorted(p.done for p in seen)  # monotonic
    final = await handle.query(PROGRESS_QUERY, result_type=BatchProgress)
    assert (final.phase, final.done, final.failed, final.running) == ("done", 5, 1, 0)
    assert render_batch_progress(final).startswith("  … done: 5/6 done, 0 running, 1 failed, 0 pending")


def _comparable(records: list[RunRecord]) -> list[dict[str, Any]]:
    return [r.model_dump(exclude={"workflow_id"}) for r in records]


async def test_continue_as_new_gives_the_same_result(client, task_queue, settings, tmp_path) -> None:
    path = _write(tmp_path / "twelve.json", synthetic_runs(12))
    one = await _batch(client, task_queue, settings, [path], split=True, concurrency=6)
    chained = await _batch(
        client, task_queue, settings, [path], split=True, concurrency=3, children_per_run=5
    )
    assert one.continued_as_new == 0 and chained.continued_as_new == 2
    assert chained.synthesis == one.synthesis
    assert _comparable(chained.run_records) == _comparable(one.run_records)
    assert [r.workflow_id for r in chained.run_records] == [child_id(chained.batch_id, i) for i in range(12)]
    # 12 runs, kinds i % 6: 0, 1 and 4 succeed (4 after tool errors); get_user_details fails in kinds 2 and 5,
    # search_direct_flight in 4 and 5: 4 runs each
    modes = {m.key: m.runs for m in one.synthesis.failure_modes}
    assert one.synthesis.outcomes == {"failure": 6, "success": 6, "unknown": 0}
    assert modes["tool_error:get_user_details"] == 4 and modes["tool_error:search_direct_flight"] == 4
    assert await _replays(client, settings, chained.batch_id) == 3


async def test_an_llm_model_adds_a_synthesis_session_over_the_records(
    client, task_queue, settings, tmp_path
) -> None:
    path = _write(tmp_path / "two.json", [tau_run(1), tau_run(2, errors={"get_user_details": 1}, book=False)])
    res = await _batch(
        client, task_queue, settings, [path], split=True, config=ReflectionConfig(model="scripted-steps-3")
    )
    assert res.reflected == 2 and res.llm_synthesis is not None, res.llm_synthesis_error
    assert res.llm_synthesis.raw["workflow_id"] == f"{res.batch_id}.synthesis"
    assert res.llm_synthesis.raw["rr_trace"]["cells"] >= 1
    # its trace is the run records: the computed synthesis is there as well
    assert (
        json.loads(BlobStore(settings.blob_dir).get_bytes(res.records.sha256))[1]["run_id"] == "task2-trial0"
    )
    assert res.synthesis.outcomes == {"failure": 1, "success": 1, "unknown": 0}


async def test_the_shared_tau_bench_file(client, task_queue, settings, tmp_path, shared_traces) -> None:
    data = json.loads((shared_traces / "tau-bench-airline-gpt-4o.json").read_text())[:8]
    path = _write(tmp_path / "tau8.json", data)
    res = await _batch(client, task_queue, settings, [path], split=True)
    assert res.reflected == 8
    assert [r.run_id for r in res.run_records] == [f"task{d['task_id']}-trial{d['trial']}" for d in data]
    assert res.synthesis.outcomes["failure"] == sum(1 for d in data if d["reward"] < 1)
    for mode in res.synthesis.failure_modes:  # every count is a count of runs, and cites them
        having = [r.run_id for r in res.run_records if mode.key in r.failure_modes]
        assert mode.runs == len(having) and mode.run_ids == having[:20]
