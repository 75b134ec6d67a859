"""`rr export` / `rr replay` over a whole reflection: a continue-as-new chain and a child, exported with
its external payloads inlined, replayed offline (no server, no blob store), a divergence named, and the
`--split` files replayed one by one (and read by the `temporal` CLI and temporalio's Replayer).

The reflection is made once per module on a private dev server whose low continue-as-new threshold
makes the root continue as new after its child; the server is stopped before any test reads the file.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import worker
from reflector import client as rr
from reflector.client.audit.histories import (
    HistoryBundle,
    RunHistory,
    collect,
    dump_bundle,
    load_bundle,
    write_split_file,
)
from reflector.client.audit.replay import ReplayReport, replay_all
from reflector.contract import (
    CLOSE_ACTIVITY,
    SUMMARISE_ACTIVITY,
    WORKFLOW_NAME,
    CloseSessionInput,
    ReflectionConfig,
    ReflectionInput,
    ReflectorOutput,
)
from reflector.runtime.devserver import DevServer, find_temporal_binary
from reflector.runtime.settings import Settings
from tests.support.fixtures import write_trace
from workflows.activity_options import CELL_RETRY
from workflows.batch import BatchReflectionWorkflow
from workflows.reflection import ReflectionWorkflow

BIG = (
    40_000  # characters a cell prints: above the 16 KiB payload threshold, so its result is a blob reference
)


@dataclass(frozen=True)
class Exported:
    root_id: str
    path: Path  # the export file, written while the server ran
    out: ReflectorOutput
    blob_dir: Path  # where the payloads were stored (the tests replay without it)
    references: int  # external payload references the server's histories held
    raw: list[str]  # the server's histories as fetched (references not inlined), as JSON


def _plan() -> dict[str, object]:
    child = {"code": ["print('child', len(traces['steps']))"]}
    return {
        "code": [f"big = 'x' * {BIG}\nprint(big)", "print('root', 1)"],
        "children": [child],
        "after": [f"print('after {i}')" for i in range(4)],
    }


def _references(histories: list[WorkflowHistory]) -> int:
    return sum(
        ev.SerializeToString().count(b"ExternalStorageReference") for h in histories for ev in h.events
    )


@pytest.fixture(scope="module")
async def exported(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Exported:
    root = tmp_path_factory.mktemp("export")
    server = DevServer(
        root / "t.sqlite",
        ui=False,
        log_file=root / "server.log",
        dynamic_config={"limit.historyCount.suggestContinueAsNew": 20},
    )
    address = await server.astart(timeout=60)
    try:
        client = await rr.connect(address, settings=settings)
        tq = f"export-{uuid.uuid4().hex[:6]}"
        async with worker.build_worker(client, tq):
            ref = rr.upload_trace(write_trace(root), settings)
            inp = rr.build_input(
                ref,
                question="PLAN:" + json.dumps(_plan()),
                ground_truth="408",
                config=ReflectionConfig(model="scripted-plan", recursion="always"),
            )
            handle = await rr.start_reflection(client, inp, tq, f"exp-{uuid.uuid4().hex[:8]}")
            out = await handle.result()
        bundle = await collect(client, handle.id, settings.blob_dir)
        raw = [
            await client.get_workflow_handle(r.workflow_id, run_id=r.run_id).fetch_history()
            for r in bundle.runs
        ]
        path = root / "export.json"
        path.write_text(dump_bundle(bundle))
        return Exported(
            handle.id, path, out, Path(settings.blob_dir), _references(raw), [h.to_json() for h in raw]
        )
    finally:
        await server.astop()


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No server reachable and an empty blob store: only the file can answer."""
    empty = tmp_path / "no-blobs"
    monkeypatch.setenv("RR_BLOB_DIR", str(empty))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")
    return empty


async def _replay(bundle: HistoryBundle, blob_dir: Path, source: str = "file") -> ReplayReport:
    async def runs() -> AsyncIterator[RunHistory]:
        for r in bundle.runs:
            yield r

    return await replay_all(
        runs(), root_id=bundle.root_id, source=source, blob_dir=blob_dir, make_replayer=worker.replay_factory
    )


def test_export_holds_the_chain_and_the_child_self_contained(exported: Exported) -> None:
    bundle = load_bundle(exported.path)
    assert bundle.root_id == exported.root_id
    ids = [(r.workflow_id, r.chain_index, r.parent_workflow_id) for r in bundle.runs]
    root_runs = [r for r in bundle.runs if r.workflow_id == exported.root_id]
    child_id = f"{exported.root_id}.r1"
    # the root's chain first and in order, then the child (whose parent is the root)
    assert len(root_runs) == exported.out.raw["rr_trace"]["continued_as_new"] + 1 >= 2, ids
    assert ids[: len(root_runs)] == [(exported.root_id, i, None) for i in range(len(root_runs))]
    assert ids[len(root_runs) :] == [(child_id, 0, exported.root_id)]
    assert all(r.continued for r in root_runs[:-1]) and not root_runs[-1].running
    assert not any(r.running for r in bundle.runs)
    assert {r.workflow_type for r in bundle.runs} == {WORKFLOW_NAME}
    # a run's `continued_execution_run_id` is the previous run of the chain
    for prev, nxt in zip(root_runs, root_runs[1:], strict=False):
        assert (
            nxt.history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
            == prev.run_id
        )
    # the server's histories held references; the file holds the payloads themselves
    assert exported.references >= 1
    text = exported.path.read_text()
    assert "ExternalStorageReference" not in text and "rr-blobs" not in text
    assert "x" * BIG in "".join(_payload_strings(bundle))
    # each entry's events are Temporal's JSON history format, as the SDK reads it
    data = json.loads(text)
    assert data["rr_export"] == 1 and data["root"] == exported.root_id
    for entry, run in zip(data["histories"], bundle.runs, strict=True):
        again = WorkflowHistory.from_json(entry["workflow_id"], {"events": entry["events"]})
        assert [e.event_id for e in again.events] == [e.event_id for e in run.history.events]
        assert set(entry) == {
            "workflow_id",
            "run_id",
            "parent_workflow_id",
            "chain_index",
            "workflow_type",
            "events",
        }


def _payload_strings(bundle: HistoryBundle) -> Iterator[str]:
    for r in bundle.runs:
        for ev in r.history.events:
            if ev.HasField("marker_recorded_event_attributes"):
                for payloads in ev.marker_recorded_event_attributes.details.values():
                    for p in payloads.payloads:
                        yield p.data.decode(errors="replace")


async def test_offline_replay_of_the_export_file(exported: Exported, offline: Path) -> None:
    bundle = load_bundle(exported.path)
    report = await _replay(bundle, offline)
    assert report.ok, [r.failure for r in report.runs]
    assert len(report.runs) == len(bundle.runs) >= 3
    assert report.events == bundle.events and report.events_per_s > 0
    assert [(r.workflow_id, r.chain_index) for r in report.runs] == [
        (r.workflow_id, r.chain_index) for r in bundle.runs
    ]
    assert not offline.exists()  # nothing was read from (or written to) a blob store


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)
class SkipsClosingWorkflow(ReflectionWorkflow):
    """Same name, one changed decision: the sandbox session is not closed at the end."""

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        return await super().run(inp)

    async def _close(self) -> None:
        return None


def _close_marker(history: WorkflowHistory) -> int:
    for ev in history.events:
        if (
            ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and CLOSE_ACTIVITY.encode() in ev.SerializeToString()
        ):
            return ev.event_id
    raise AssertionError("no close-session marker")


async def test_a_divergence_names_the_run_and_the_first_diverging_event(
    exported: Exported, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "WORKFLOWS", [SkipsClosingWorkflow, BatchReflectionWorkflow])
    bundle = load_bundle(exported.path)
    report = await _replay(bundle, offline)
    by_run = {r.run_id: r for r in report.runs}
    closing = [r for r in bundle.runs if not r.continued]  # the runs that end by closing their session
    assert closing and len(report.failed) == len(closing)
    for run in bundle.runs:
        result = by_run[run.run_id]
        if run.continued:  # a run that continued as new never reached the changed code
            assert result.ok, result.failure
            continue
        assert not result.ok and result.divergence is not None
        assert "Nondeterminism" in (result.failure or "")
        d = result.divergence
        assert d.event_id == _close_marker(run.history)
        assert d.event_type == f"MarkerRecorded (local activity {CLOSE_ACTIVITY})"
        assert d.code_did == "completed the workflow"


async def test_split_files_replay_one_by_one(exported: Exported, offline: Path, tmp_path: Path) -> None:
    bundle = load_bundle(exported.path)
    split = tmp_path / "split"
    split.mkdir()
    files = [write_split_file(split, i, run) for i, run in enumerate(bundle.runs)]
    assert sorted(p.name for p in split.iterdir()) == [p.name for p in files]
    temporal = find_temporal_binary()
    for path, run in zip(files, bundle.runs, strict=True):
        data = json.loads(path.read_text())
        assert list(data) == ["events"]  # a plain Temporal history, nothing of rr's around it
        one = load_bundle(path)
        assert [(r.workflow_id, r.run_id, r.parent_workflow_id) for r in one.runs] == [
            (run.workflow_id, run.run_id, run.parent_workflow_id)
        ]
        report = await _replay(one, offline)
        assert report.ok and report.events == run.events, [r.failure for r in report.runs]
        # temporalio's own Replayer reads the file as it is (the history needs no external storage)
        plain = Replayer(workflows=[ReflectionWorkflow], plugins=[PydanticAIPlugin()])
        result = await plain.replay_workflow(
            WorkflowHistory.from_json(run.workflow_id, path.read_text()), raise_on_replay_failure=False
        )
        assert result.replay_failure is None
        # the temporal CLI's only command that reads a history file re-serialises it without complaint
        fixed = tmp_path / f"fixed-{path.name}"
        p = subprocess.run(
            [str(temporal), "workflow", "fix-history-json", "--source", str(path), "--target", str(fixed)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        assert len(json.loads(fixed.read_text())["events"]) == run.events


def test_rr_replay_of_a_changed_workflow_exits_1_naming_the_event(
    exported: Exported, offline: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from reflector.cli import main

    monkeypatch.setattr(worker, "WORKFLOWS", [SkipsClosingWorkflow, BatchReflectionWorkflow])
    bundle = load_bundle(exported.path)
    assert main(["replay", str(exported.path)]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    closing = [r for r in bundle.runs if not r.continued]
    assert len(failed) == len(closing)
    for line, run in zip(failed, closing, strict=True):
        assert f"{run.workflow_id} run {run.chain_index} ({run.run_id})" in line
        event = _close_marker(run.history)
        assert (
            f"first diverging event: event {event} MarkerRecorded (local activity {CLOSE_ACTIVITY}); "
            "the code instead completed the workflow"
        ) in out
    assert f"replay of {exported.root_id} ({exported.path}) FAILED: {len(bundle.runs)} histories" in out

    assert main(["replay", str(exported.path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and report["failed"] == len(closing)
    bad = [r for r in report["runs"] if not r["ok"]]
    assert [r["divergence"]["event_id"] for r in bad] == [_close_marker(r.history) for r in closing]


async def test_a_batch_chain_and_its_children_are_collected_in_order_and_replay(
    client, task_queue, settings, tmp_path: Path
) -> None:
    from reflector.client.audit.histories import iter_runs
    from reflector.testing.tau_runs import tau_run
    from workflows.batch import child_id

    path = tmp_path / "runs.json"
    path.write_text(json.dumps([tau_run(i) for i in range(7)]))
    batch_id = f"exp-b-{uuid.uuid4().hex[:8]}"
    res = await rr.reflect_batch(
        client,
        [path],
        settings,
        task_queue=task_queue,
        batch_id=batch_id,
        split=True,
        concurrency=3,
        children_per_run=3,
    )
    assert res.reflected == 7 and res.continued_as_new == 2
    # a window of 2 child subtrees fetched ahead, one history at a time: the order is still start order
    runs = [r async for r in iter_runs(client, batch_id, settings.blob_dir, concurrency=2)]
    batch_runs = [r for r in runs if r.workflow_id == batch_id]
    assert [(r.chain_index, r.workflow_type, r.parent_workflow_id) for r in batch_runs] == [
        (i, "BatchReflectionWorkflow", None) for i in range(3)
    ]
    assert runs[:3] == batch_runs
    children = [(r.workflow_id, r.parent_workflow_id) for r in runs[3:]]
    assert children == [(child_id(batch_id, i), batch_id) for i in range(7)]
    assert [r.workflow_id for r in (await collect(client, batch_id, settings.blob_dir)).runs] == [
        r.workflow_id for r in runs
    ]
    report = await replay_all(
        iter_runs(client, batch_id, settings.blob_dir),
        root_id=batch_id,
        source="server",
        make_replayer=worker.replay_factory,
        blob_dir=settings.blob_dir,
    )
    assert report.ok and len(report.runs) == 10, [r.failure for r in report.runs if not r.ok]


COMMITTED = Path(__file__).parents[1] / "replay" / "histories" / "heuristic_v3.json"


async def _close_session(wf: ReflectionWorkflow) -> None:
    await workflow.execute_local_activity(
        CLOSE_ACTIVITY,
        CloseSessionInput(session_id=wf.state.session_id),
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=CELL_RETRY,
    )


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)
class TimerInsteadOfForgetting(ReflectionWorkflow):
    """Same name; after closing the sandbox it sleeps instead of forgetting the cached responses."""

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        return await super().run(inp)

    async def _close(self) -> None:
        await _close_session(self)
        await workflow.sleep(1)


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)
class OtherActivityInsteadOfForgetting(ReflectionWorkflow):
    """Same name; after closing the sandbox it schedules another activity type."""

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        return await super().run(inp)

    async def _close(self) -> None:
        await _close_session(self)
        await workflow.execute_activity(SUMMARISE_ACTIVITY, "x", start_to_close_timeout=timedelta(seconds=5))


@pytest.mark.parametrize(
    ("altered", "in_message", "code_did"),
    [
        # the SDK names the event ("Timer machine does not handle this event: HistoryEvent(id: 14, ...)")
        (TimerInsteadOfForgetting, "HistoryEvent(id: 14", "started a timer (1 s)"),
        # the SDK names no event ("Activity type of scheduled event ... does not match ..."): the alignment does
        (OtherActivityInsteadOfForgetting, "does not match", f"scheduled activity {SUMMARISE_ACTIVITY}"),
    ],
)
async def test_the_divergence_of_a_committed_history_is_named_either_way(
    altered: type, in_message: str, code_did: str, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "WORKFLOWS", [altered, BatchReflectionWorkflow])
    bundle = load_bundle(COMMITTED)
    [run] = bundle.runs
    assert run.workflow_id == "recorded-heuristic_v3"  # from the history's start event, not the file name
    forget = next(
        ev for ev in run.history.events if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    )
    report = await _replay(bundle, offline)
    [result] = report.runs
    assert not result.ok and result.divergence is not None
    assert in_message in result.divergence.message
    assert result.divergence.event_id == forget.event_id == 14
    assert result.divergence.event_type == "ActivityTaskScheduled (activity rr.model.forget_responses)"
    assert result.divergence.code_did == code_did


def test_inlining_reads_the_blob_store_and_a_missing_blob_is_named(
    exported: Exported, tmp_path: Path
) -> None:
    from reflector.client.audit.histories import inline_payloads
    from reflector.runtime.storage.blobs import BlobNotFound

    bundle = load_bundle(exported.path)
    raw = [
        WorkflowHistory.from_json(r.workflow_id, text)
        for r, text in zip(bundle.runs, exported.raw, strict=True)
    ]
    with_refs = [h for h in raw if _references([h])]
    assert with_refs
    with pytest.raises(BlobNotFound, match="is missing from .*RR_BLOB_DIR"):
        inline_payloads(with_refs[0].events, tmp_path / "empty")
    inlined = sum(inline_payloads(h.events, exported.blob_dir) for h in raw)
    assert inlined == exported.references
    assert [list(h.events) for h in raw] == [
        list(r.history.events) for r in bundle.runs
    ]  # what the file holds
