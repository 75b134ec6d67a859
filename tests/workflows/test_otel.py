"""RR_OTEL tracing: the spans of a real reflection form one tree, exported once however often it replays.

A real worker (every workflow task replays the whole history: `max_cached_workflows=0`) runs a reflection
whose scripted model runs a cell and recurses into one child; the spans are collected in process with
the SDK's `InMemorySpanExporter` (installed in place of the OTLP exporter) and checked by span ids:

  StartWorkflow:ReflectionWorkflow (client)
  └ RunWorkflow:ReflectionWorkflow (the root)
    └ invoke_agent rr_reflector
      ├ chat scripted-plan (a model request) └ StartActivity:…model_request_local └ RunActivity:…
      ├ execute_tool execute_code └ StartActivity:rr.sandbox.run_cell └ RunActivity:rr.sandbox.run_cell
      └ execute_tool recurse └ StartChildWorkflow:ReflectionWorkflow
                               └ RunWorkflow:ReflectionWorkflow (the child) └ invoke_agent └ chat …

Also: provider requests (regular activities), a continue-as-new chain, committed histories replayed with
tracing on, `rr reflect` exporting over OTLP to a local collector, and RR_OTEL=logfire (when installed).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

import worker
from reflector import client as rr
from reflector.contract import WORKFLOW_NAME, ReflectionConfig, ReflectorOutput
from reflector.runtime import telemetry
from reflector.runtime.models import prepare_workflow_side
from reflector.runtime.settings import Settings
from reflector.testing.openai_server import OpenAIServer
from reflector.testing.otlp_collector import CollectedSpan, OTLPCollector
from tests.support import prefork
from tests.support.fixtures import write_trace
from tests.support.user_env import user_env

ROOT_CELL = "print('root cell', len(traces['steps']))"
CHILD_CELL = "print('child cell')"
PLAN = {"code": [ROOT_CELL], "children": [{"code": [CHILD_CELL], "children": [], "after": []}], "after": []}
LOCAL_REQUEST = "agent__rr_reflector__model_request_local"
PROVIDER_REQUEST = "agent__rr_reflector__model_request"
CELL = "rr.sandbox.run_cell"
LONG_TASK_TIMEOUT = timedelta(seconds=60)
EXAMPLE = Path(__file__).parents[2] / "reflector" / "examples" / "failed_math.json"
COMMITTED = sorted((Path(__file__).parents[1] / "replay" / "histories").glob("*.json"))
prepare_workflow_side(["openai-chat"])  # as tests/replay/test_replay.py: provider_v1 used an OpenAI model


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing installed for this test only, exporting to memory."""
    mem = InMemorySpanExporter()
    telemetry.install("otlp", processors=[SimpleSpanProcessor(mem)])
    try:
        yield mem
    finally:
        telemetry.uninstall()


@pytest.fixture
async def traced(
    temporal_server: Any, settings: Settings, exporter: InMemorySpanExporter
) -> AsyncIterator[tuple[Client, str, Settings]]:
    """A client with RR_OTEL on and a worker on it (its tracing comes from the client) that never caches a
    workflow: every workflow task replays the history from the start."""
    traced_settings = dataclasses.replace(settings, otel="otlp")
    client = await rr.connect(temporal_server.address, settings=traced_settings)
    tq = f"rr-otel-{uuid.uuid4().hex[:6]}"
    async with worker.build_worker(client, tq, max_cached_workflows=0, settings=traced_settings):
        yield client, tq, traced_settings


async def _reflect(
    client: Client, tq: str, settings: Settings, tmp_path: Path, model: str, question: str
) -> tuple[ReflectorOutput, str]:
    """Run a reflection as `rr.start_reflection` does, with a long workflow-task timeout (its children inherit
    it). Why: with caching off, a workflow task completed while a local activity still runs (the SDK completes
    held tasks every 0.8 x timeout) evicts the workflow and cancels the activity, which then runs again and is
    traced again (a real second run, not a replay). Seen once on a loaded machine with the default 4 s: the SDK
    warned "Eviction requested while local activities are still in flight" and the tree had an extra span."""
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref, question=question, ground_truth="408", config=ReflectionConfig(model=model, recursion="always")
    )
    handle = await client.start_workflow(
        WORKFLOW_NAME,
        inp,
        id=f"otel-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
        task_timeout=LONG_TASK_TIMEOUT,
        result_type=ReflectorOutput,
    )
    return await handle.result(), handle.id


class Tree:
    """Finished spans indexed by span id."""

    def __init__(self, spans: tuple[ReadableSpan, ...]) -> None:
        self.spans = spans
        self.by_id = {s.context.span_id: s for s in spans}

    def parent(self, span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, f"{span.name} has no parent"
        found = self.by_id.get(span.parent.span_id)
        assert found is not None, f"the parent of {span.name} was not exported"
        return found

    def children(self, span: ReadableSpan, name: str) -> list[ReadableSpan]:
        return [
            s
            for s in self.spans
            if s.parent is not None and s.parent.span_id == span.context.span_id and s.name == name
        ]

    def only_child(self, span: ReadableSpan, name: str) -> ReadableSpan:
        found = self.children(span, name)
        assert len(found) == 1, (span.name, name, [s.name for s in found])
        return found[0]

    def workflow_span(self, workflow_id: str) -> ReadableSpan:
        found = [
            s
            for s in self.spans
            if s.name == "RunWorkflow:ReflectionWorkflow"
            and (s.attributes or {}).get("temporalWorkflowID") == workflow_id
        ]
        assert len(found) == 1, (workflow_id, len(found))
        return found[0]

    def requests(self, agent: ReadableSpan, activity: str) -> list[ReadableSpan]:
        """The agent run's model-request spans, each with the activity that sent the request under it."""
        chats = [
            s
            for s in self.spans
            if s.parent is not None
            and s.parent.span_id == agent.context.span_id
            and s.name.startswith("chat ")
        ]
        for chat in chats:
            start = self.only_child(chat, f"StartActivity:{activity}")
            self.only_child(start, f"RunActivity:{activity}")
        return chats

    def cells(self, agent: ReadableSpan) -> list[ReadableSpan]:
        """The agent run's cell activity spans (under `execute_tool execute_code`): one per cell, the last run of
        it. A cell's local activity cancelled by an eviction runs again (real work done twice, see `redone` in
        the first test), and its second run may be traced under a span id of its own: each run is a
        `RunActivity` span under the cell's one `StartActivity` span (a replay would add a `StartActivity`)."""
        out = []
        for tool in self.children(agent, "execute_tool execute_code"):
            runs = self.children(self.only_child(tool, f"StartActivity:{CELL}"), f"RunActivity:{CELL}")
            assert runs, f"a cell under {tool.name} never ran"
            out.append(max(runs, key=lambda s: s.start_time or 0))
        return out


def _workflow_tasks(history: WorkflowHistory) -> int:
    return sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events)


async def test_a_reflection_and_its_child_form_one_tree_exported_once(
    traced: tuple[Client, str, Settings], exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    client, tq, settings = traced
    out, root_id = await _reflect(client, tq, settings, tmp_path, "scripted-plan", "PLAN:" + json.dumps(PLAN))
    child_id = f"{root_id}.r1"
    child_out = ReflectorOutput.model_validate(await client.get_workflow_handle(child_id).result())
    assert telemetry.flush()
    by_id: dict[int, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        by_id.setdefault(span.context.span_id, []).append(span)
    # no span twice, although every workflow task of both workflows replayed the history before it; the one
    # exception is real work done twice: a local activity in flight when the SDK evicts its workflow (with
    # max_cached_workflows=0 it then cancels it and runs it again: "Eviction requested while local activities
    # are still in flight", seen under load) is traced again, under the same id
    again = [spans[0].name for spans in by_id.values() if len(spans) > 1]
    # (the prepare local activity too: rescheduled after such an eviction, its start span is made again)
    redone = {
        f"RunActivity:{LOCAL_REQUEST}",
        f"RunActivity:{CELL}",
        "StartActivity:rr.sandbox.prepare_session",
        "RunActivity:rr.sandbox.prepare_session",
    }
    assert set(again) <= redone, again
    tree = Tree(tuple(spans[0] for spans in by_id.values()))
    root_history = await client.get_workflow_handle(root_id).fetch_history()
    assert _workflow_tasks(root_history) >= 3  # started the child, got its result, finished: 2+ replays

    # the client's start span -> the root's workflow span -> the agent run
    root_wf = tree.workflow_span(root_id)
    start = tree.parent(root_wf)
    assert start.name == "StartWorkflow:ReflectionWorkflow" and start.parent is None
    root_agent = tree.only_child(root_wf, "invoke_agent rr_reflector")
    tree.only_child(root_wf, "StartActivity:rr.sandbox.prepare_session")

    # model requests: one `chat` span per request the root paid, each over its local activity
    root_requests = tree.requests(root_agent, LOCAL_REQUEST)
    own = [r for r in out.raw["usage_records"] if r["depth"] == 0]
    assert len(root_requests) == len(own) == 3  # run the cell, recurse, answer
    # the cell it ran
    assert len(tree.cells(root_agent)) == out.raw["rr_trace"]["cells"] == 1

    # the child: started by the `recurse` tool, its workflow span under that start, its own requests and cell
    recurse = tree.only_child(root_agent, "execute_tool recurse")
    start_child = tree.only_child(recurse, "StartChildWorkflow:ReflectionWorkflow")
    child_wf = tree.workflow_span(child_id)
    assert tree.parent(child_wf) is start_child
    child_agent = tree.only_child(child_wf, "invoke_agent rr_reflector")
    assert len(tree.requests(child_agent, LOCAL_REQUEST)) == child_out.raw["usage"]["requests"] == 2
    child_cells = tree.cells(child_agent)
    assert len(child_cells) == child_out.raw["rr_trace"]["cells"] == 1
    assert (
        child_cells[0].attributes is not None and child_cells[0].attributes["temporalWorkflowID"] == child_id
    )

    # one trace, every span's parent exported; the totals match: nothing from a replay on top
    assert {s.context.trace_id for s in tree.spans} == {start.context.trace_id}
    assert all(s is start or tree.parent(s) for s in tree.spans)
    names = [s.name for s in tree.spans]
    assert names.count(f"RunActivity:{LOCAL_REQUEST}") == out.raw["usage"]["requests"] == 5
    assert names.count(f"StartActivity:{CELL}") == 2  # (each run again after an eviction: `cells`)
    assert names.count("RunWorkflow:ReflectionWorkflow") == 2

    # the history made with tracing on replays without it (tracing adds no command)
    await worker.make_replayer(settings.blob_dir).replay_workflow(root_history)


async def test_a_continued_reflection_stays_one_trace(
    traced: tuple[Client, str, Settings],
    exporter: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compactions continue the reflection as new runs: each run's workflow span sits under the span of the run
    before it that was current when it continued (Temporal carries the context to the new run)."""
    monkeypatch.setenv("RR_TEST_BIG_CELLS", "8")  # scripted-big: large outputs, so the context fills up
    client, tq, settings = traced
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref, config=ReflectionConfig(model="scripted-big", context_window=3_000, max_compactions=3)
    )
    handle = await client.start_workflow(
        WORKFLOW_NAME,
        inp,
        id=f"otel-can-{uuid.uuid4().hex[:8]}",
        task_queue=tq,
        task_timeout=LONG_TASK_TIMEOUT,
        result_type=ReflectorOutput,
    )
    out = await handle.result()
    assert telemetry.flush()
    tree = Tree(exporter.get_finished_spans())
    runs = out.raw["rr_trace"]["continued_as_new"] + 1
    assert runs >= 2
    assert len({s.context.span_id for s in tree.spans}) == len(tree.spans)
    workflows = [s for s in tree.spans if s.name == "RunWorkflow:ReflectionWorkflow"]
    assert len(workflows) == runs and len({(s.attributes or {})["temporalRunID"] for s in workflows}) == runs
    start = tree.parent(next(s for s in workflows if tree.parent(s).name.startswith("StartWorkflow:")))
    assert {s.context.trace_id for s in tree.spans} == {start.context.trace_id}
    assert all(s is start or tree.parent(s) for s in tree.spans)

    def ancestors(span: ReadableSpan) -> list[ReadableSpan]:
        return [] if span.parent is None else [tree.parent(span), *ancestors(tree.parent(span))]

    # the runs nest: each later run's workflow span has every earlier one among its ancestors
    nested = sorted(workflows, key=lambda w: len(ancestors(w)))
    for i, run in enumerate(nested):
        assert sum(a.name == "RunWorkflow:ReflectionWorkflow" for a in ancestors(run)) == i
    assert [s.name for s in tree.spans].count("RunActivity:rr.summarise") == out.raw["rr_trace"][
        "compactions"
    ]


async def test_provider_requests_are_traced_as_regular_activities(
    traced: tuple[Client, str, Settings],
    exporter: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, tq, settings = traced
    with OpenAIServer(prompt_tokens=100, completion_tokens=20) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        model = f"openai-chat:rr-otel-model-{uuid.uuid4().hex[:8]}"  # a fresh name: models are cached by name
        out, root_id = await _reflect(client, tq, settings, tmp_path, model, "What is 17 * 24?")
    assert telemetry.flush()
    tree = Tree(exporter.get_finished_spans())
    agent = tree.only_child(tree.workflow_span(root_id), "invoke_agent rr_reflector")
    requests = tree.requests(agent, PROVIDER_REQUEST)
    assert len(requests) == out.raw["usage"]["requests"] >= 2
    # pydantic-ai's model attributes on the request span (what a tracing backend shows)
    attrs = requests[0].attributes or {}
    assert attrs["gen_ai.request.model"] == model.split(":", 1)[1]
    assert attrs["gen_ai.usage.input_tokens"] == 100
    assert len(tree.cells(agent)) == out.raw["rr_trace"]["cells"] >= 1
    ids = [s.context.span_id for s in tree.spans]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
async def test_committed_histories_replay_with_tracing_on(path: Path, exporter: InMemorySpanExporter) -> None:
    """Histories recorded without tracing replay with it (same commands), and a replay exports no span."""
    tracing = telemetry.install("otlp")
    replayer = Replayer(workflows=list(worker.WORKFLOWS), plugins=[PydanticAIPlugin(), *tracing.plugins])
    result = await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, path.read_text()))
    assert result.replay_failure is None
    assert telemetry.flush()
    assert exporter.get_finished_spans() == ()


class Received:
    """Spans a collector received, indexed by span id."""

    def __init__(self, spans: list[CollectedSpan]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}
        assert len(self.by_id) == len(spans), "a span id was exported twice"
        roots = [s for s in spans if not s.parent_span_id]
        assert len(roots) == 1, [s.name for s in roots]
        self.root = roots[0]
        assert {s.trace_id for s in spans} == {
            self.root.trace_id
        }  # one trace (progress polls are not traced)
        assert all(s.parent_span_id in self.by_id for s in spans if s is not self.root)

    def kids(self, span: CollectedSpan, name: str) -> list[CollectedSpan]:
        return [s for s in self.spans if s.parent_span_id == span.span_id and s.name == name]

    def only(self, span: CollectedSpan, name: str) -> CollectedSpan:
        found = self.kids(span, name)
        assert len(found) == 1, (
            span.name,
            name,
            [s.name for s in self.spans if s.parent_span_id == span.span_id],
        )
        return found[0]

    def workflow(self, workflow_id: str) -> CollectedSpan:
        [found] = [
            s
            for s in self.spans
            if s.name == "RunWorkflow:ReflectionWorkflow"
            and s.attributes.get("temporalWorkflowID") == workflow_id
        ]
        return found

    def requests(self, agent: CollectedSpan, activity: str) -> list[CollectedSpan]:
        chats = [s for s in self.spans if s.parent_span_id == agent.span_id and s.name.startswith("chat ")]
        for chat in chats:
            self.only(self.only(chat, f"StartActivity:{activity}"), f"RunActivity:{activity}")
        return chats

    def cells(self, agent: CollectedSpan) -> list[CollectedSpan]:
        """One per cell, as `Tree.cells`: a cell run again after an eviction has a `RunActivity` per run."""
        out = []
        for t in self.kids(agent, "execute_tool execute_code"):
            runs = self.kids(self.only(t, f"StartActivity:{CELL}"), f"RunActivity:{CELL}")
            assert runs, f"a cell under {t.name} never ran"
            out.append(runs[-1])
        return out


def test_rr_reflect_exports_its_reflection_over_otlp_before_it_exits(
    temporal_server: Any, tmp_path: Path
) -> None:
    """The CLI end to end: `rr reflect` (its in-process worker takes the reflection) with RR_OTEL=1 sends the
    reflection's tree to the collector the OTEL_* variables name, before it leaves with `os._exit`."""
    base = user_env(("RR_", "TEMPORAL_", "OTEL_"))
    with OTLPCollector() as collector:
        env = {
            **base,
            "RR_HOME": str(tmp_path / "home"),
            "TEMPORAL_ADDRESS": temporal_server.address,
            "RR_TASK_QUEUE": f"rr-otel-cli-{uuid.uuid4().hex[:6]}",
            "RR_OTEL": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_SERVICE_NAME": "rr-cli-test",
        }
        p = prefork.run(
            [sys.executable, "-c", "from reflector.cli import run; run()", "reflect", str(EXAMPLE), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 0, p.stderr
        got = Received(collector.spans)
    out = json.loads(p.stdout)
    assert got.root.name == "StartWorkflow:ReflectionWorkflow"
    assert got.root.attributes["temporalWorkflowID"] == out["raw"]["workflow_id"]
    assert {s.service for s in got.spans} == {"rr-cli-test"}
    agent = got.only(got.only(got.root, "RunWorkflow:ReflectionWorkflow"), "invoke_agent rr_reflector")
    chats = got.requests(agent, LOCAL_REQUEST)
    assert len(chats) == out["raw"]["usage"]["requests"] >= 2
    assert {c.name for c in chats} == {"chat heuristic (rule-based, not an LLM)"}  # the model's model_name
    assert len(got.cells(agent)) == out["raw"]["rr_trace"]["cells"] >= 1


async def test_logfire_mode_exports_the_same_tree_once(
    temporal_server: Any, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RR_OTEL=logfire: the spans go through Logfire's pipeline (here to a local collector), every task replaying."""
    pytest.importorskip("logfire")
    with OTLPCollector() as collector:
        for k, v in {
            "LOGFIRE_SEND_TO_LOGFIRE": "false",
            "LOGFIRE_CONSOLE": "false",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        }.items():
            monkeypatch.setenv(k, v)
        lf_settings = dataclasses.replace(settings, otel="logfire")
        try:
            client = await rr.connect(temporal_server.address, settings=lf_settings)
            tq = f"rr-otel-lf-{uuid.uuid4().hex[:6]}"
            async with worker.build_worker(client, tq, max_cached_workflows=0, settings=lf_settings):
                out, root_id = await _reflect(
                    client, tq, lf_settings, tmp_path, "scripted-plan", "PLAN:" + json.dumps(PLAN)
                )
            assert telemetry.installed() == "logfire" and telemetry.flush()
        finally:
            telemetry.uninstall()
        got = Received(collector.spans)
    root_agent = got.only(got.workflow(root_id), "invoke_agent rr_reflector")
    assert len(got.requests(root_agent, LOCAL_REQUEST)) == 3 and len(got.cells(root_agent)) == 1
    start_child = got.only(
        got.only(root_agent, "execute_tool recurse"), "StartChildWorkflow:ReflectionWorkflow"
    )
    child = got.workflow(f"{root_id}.r1")
    assert child.parent_span_id == start_child.span_id
    child_agent = got.only(child, "invoke_agent rr_reflector")
    assert len(got.requests(child_agent, LOCAL_REQUEST)) == 2 and len(got.cells(child_agent)) == 1
    assert (
        [s.name for s in got.spans].count(f"RunActivity:{LOCAL_REQUEST}") == out.raw["usage"]["requests"] == 5
    )
