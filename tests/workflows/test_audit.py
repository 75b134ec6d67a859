"""`rr audit`: the decision timeline rebuilt from a real reflection's histories, checked against what happened.

One reflection (`scripted-audit`, tests/support/audit_script.py) makes every kind of decision: cells, a
child, a sandbox host SIGKILLed mid-session (the next cell is rebuilt on a new host), a compaction with
continue-as-new, and learnings whose citations hold, cite a missing cell, quote unprinted text or cite
nothing. The audit (server and exported-file paths, text, JSON and the CLI) must show exactly that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

import tests.support.audit_script as script
from reflector import client as rr
from reflector.analysis.citations import check_citations
from reflector.client.audit.build import audit_file, audit_workflow
from reflector.client.audit.histories import collect, dump_bundle
from reflector.client.audit.render_text import render_text
from reflector.client.audit.timeline import (
    Audit,
    CellItem,
    ChildItem,
    CompactionItem,
    ModelRequestItem,
    RunItem,
)
from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL, ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from tests.support import prefork
from tests.support.fixtures import completed_activities, write_trace
from tests.support.user_env import user_env
from worker import audit_replay_hooks

REPO_ROOT = Path(__file__).resolve().parents[2]
HISTORIES = REPO_ROOT / "tests" / "replay" / "histories"
HOOKS = audit_replay_hooks()  # the replayer and the workflow-side capture of model requests


async def _reflect(
    client: Client, tq: str, settings: Settings, tmp_path: Path
) -> tuple[ReflectorOutput, str]:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref,
        question="What is 17 * 24?",
        ground_truth="408",
        config=ReflectionConfig(
            model=script.NAME, context_window=3_000, max_compactions=3, recursion="always"
        ),
    )
    handle = await rr.start_reflection(client, inp, tq, f"audit-{uuid.uuid4().hex[:8]}")
    return await handle.result(), handle.id


@pytest.fixture(scope="module")
async def reflection(client, task_queue, settings, tmp_path_factory) -> tuple[ReflectorOutput, str, Audit]:
    out, wf_id = await _reflect(client, task_queue, settings, tmp_path_factory.mktemp("audit"))
    return out, wf_id, await audit_workflow(client, wf_id, settings.blob_dir, HOOKS)


def _cell(audit_session, needle: str) -> CellItem:
    return next(c for c in audit_session.cells() if needle in c.code)


async def test_timeline_matches_what_the_reflection_did(reflection, client) -> None:
    out, wf_id, audit = reflection
    root = audit.session
    rt = out.raw["rr_trace"]
    assert rt["compactions"] >= 1 and rt["continued_as_new"] >= 1, rt  # the script did what it is for
    # one run item per run of the chain, the later ones continued as new
    runs = [i for i in root.items if isinstance(i, RunItem)]
    assert len(runs) == len(root.run_ids) == rt["continued_as_new"] + 1
    assert [r.reason for r in runs[1:]] == ["continued as new"] * (len(runs) - 1)

    # cells: code from the execute_code call, output from the outcome, ids as the model saw them
    alpha = _cell(root, "alpha = 42")
    assert (
        alpha.seq == script.ALPHA_CELL
        and alpha.output == "alpha 42\n"
        and alpha.ok
        and alpha.origin == "model"
    )
    assert root.cells()[0].origin == "prefill" and root.cells()[0].seq == 1
    big = [c for c in root.cells() if "join(['yy']" in c.code]
    assert big and big[0].host_restarted and big[0].cells_replayed >= 1  # rebuilt after its host was killed
    assert not any(c.host_restarted for c in big[1:]) and audit.cells_rebuilt == 1
    assert [c.seq for c in root.cells()] == sorted({c.seq for c in root.cells()})  # ids unique and increasing
    assert sum(c.origin == "model" for c in root.cells()) == rt["cells"]

    # the compaction: its summary is the one the summarise activity returned; the archive cell follows it
    compactions = [i for i in root.items if isinstance(i, CompactionItem)]
    assert len(compactions) == rt["compactions"]
    assert compactions[0].summary.startswith("scripted summary:")
    archive = [c for c in root.cells() if c.origin == "compaction"]
    assert len(archive) == len(compactions) and compactions[0].archive_ref in archive[0].code
    after = root.items.index(compactions[0])
    assert any(isinstance(i, RunItem) and i.index == 1 for i in root.items[after:])

    # model requests: every one rebuilt by replay; each decision is the response's tool call
    requests = root.requests()
    turns = [r for r in out.raw["usage_records"] if r["workflow_id"] == wf_id and r["kind"] == "turn"]
    assert len(requests) == len(turns) and audit.inputs_rebuilt
    assert all(r.given is not None and r.given.source == "replay" for r in requests)
    asked_alpha = next(r for r in requests if any(c.call_id == "a0" for c in r.tool_calls))
    assert asked_alpha.tool_calls[0].tool == EXECUTE_CODE_TOOL and "alpha = 42" in str(
        asked_alpha.tool_calls[0].args
    )
    saw_alpha = requests[requests.index(asked_alpha) + 1]
    assert saw_alpha.given is not None
    assert any(r.call_id == "a0" and "alpha 42" in r.excerpt for r in saw_alpha.given.last_tool_results)
    assert saw_alpha.given.messages > asked_alpha.given.messages
    assert [r.input_tokens for r in requests] == [t["input_tokens"] for t in turns]

    # the child: nested under the recurse call that started it, with its own session and result
    [child] = root.children()
    recurse_req = root.items[root.items.index(child) - 1]
    while not isinstance(recurse_req, ModelRequestItem):
        recurse_req = root.items[root.items.index(recurse_req) - 1]
    assert [c.tool for c in recurse_req.tool_calls] == [RECURSE_TOOL] and child.call_id == "r0"
    assert child.prompt == script.CHILD_PROMPT and child.status == "completed"
    [call] = out.raw["rr_trace"]["subagent_calls"]
    assert child.workflow_id == call["child_workflow_id"] and child.requests == call["usage"]["requests"]
    assert child.session is not None and child.session.depth == 1
    assert any(c.output == "child saw 4 steps\n" for c in child.session.cells())
    assert [learning.citations[0].supported for learning in child.session.reflection.learnings] == [True]

    # budget over time: cumulative, ending at the tree total the workflow reported
    usage = out.raw["usage"]
    assert root.budget[-1].requests == usage["requests"] and root.budget[-1].tokens == usage["total_tokens"]
    assert [p.requests for p in root.budget] == sorted(p.requests for p in root.budget)
    assert audit.requests == usage["requests"] and audit.tokens == usage["total_tokens"]
    assert audit.children == 1 and audit.compactions == rt["compactions"] and audit.status == "completed"


async def test_learnings_link_to_their_cells_and_unsupported_ones_are_marked(reflection) -> None:
    out, wf_id, audit = reflection
    learnings = audit.session.reflection.learnings
    assert [learning.source for learning in learnings] == ["workflow"] * 4  # checked by the workflow itself
    ok, missing, unprinted, uncited = learnings
    assert [(c.cell, c.supported, c.anchor) for c in ok.citations] == [
        (script.ALPHA_CELL, True, f"cell-{wf_id}-{script.ALPHA_CELL}")
    ]
    assert [(c.cell, c.exists, c.anchor) for c in missing.citations] == [(99, False, "")]
    assert [(c.cell, c.exists, c.printed) for c in unprinted.citations] == [(script.ALPHA_CELL, True, False)]
    assert uncited.uncited
    # the audit's own check, on the outputs it read from the history, agrees with the workflow's
    shown = {c.seq: c.output for s in [audit.session] for c in s.cells() if c.origin != "compaction"}
    assert check_citations(out.extracted_learnings, shown) == out.citations


async def test_text_and_json_renderings(reflection) -> None:
    out, wf_id, audit = reflection
    text = render_text(audit)
    assert f"audit of {wf_id}" in text and "[cell 3]" in text and "alpha 42" in text
    assert "rebuilt after a crash" in text and "COMPACTION" in text and "scripted summary:" in text
    assert f"child {out.raw['rr_trace']['subagent_calls'][0]['child_workflow_id']}" in text
    assert "UNSUPPORTED: no such cell" in text and "UNSUPPORTED: not printed" in text and "UNCITED" in text
    again = Audit.model_validate_json(audit.model_dump_json())
    assert again == audit
    assert (
        isinstance(again.session.children()[0], ChildItem) and again.session.children()[0].session is not None
    )


async def test_exported_file_audits_offline_like_the_server(reflection, client, settings, tmp_path) -> None:
    out, wf_id, audit = reflection
    path = tmp_path / "export.json"
    path.write_text(dump_bundle(await collect(client, wf_id, settings.blob_dir)))
    offline = await audit_file(
        path, tmp_path / "no-blobs", HOOKS
    )  # payloads are inlined: no blob store needed
    assert offline.model_dump(exclude={"source"}) == audit.model_dump(exclude={"source"})
    # and through the CLI, in a process that knows nothing of this server
    env = user_env()
    env.update({"RR_HOME": str(tmp_path / "home"), "RR_PLUGINS": "tests.support.audit_script"})
    p = prefork.run(
        [sys.executable, "-m", "reflector.cli", "audit", str(path), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    assert Audit.model_validate_json(p.stdout).model_dump(exclude={"source"}) == audit.model_dump(
        exclude={"source"}
    )
    p = prefork.run(
        [sys.executable, "-m", "reflector.cli", "audit", str(tmp_path / "missing.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 2 and p.stderr == f"rr: error: {tmp_path / 'missing.json'}: no such file\n"


async def test_a_rerun_audit_links_to_its_origin_and_marks_what_it_reused(
    reflection, client, task_queue, settings
) -> None:
    from reflector.client.rerun import plan_rerun

    _, origin_id, origin = reflection
    plan = await plan_rerun(
        client, settings, origin_id, 4
    )  # steps 1-3 (alpha cell, recurse, first big cell) reused
    handle = await rr.start_reflection(client, plan.input, task_queue, f"audit-rerun-{uuid.uuid4().hex[:8]}")
    out = await handle.result()
    audit = await audit_workflow(client, handle.id, settings.blob_dir, HOOKS)
    assert audit.rerun is not None and audit.rerun["origin"] == origin_id and audit.rerun["from_step"] == 4
    requests = audit.session.requests()
    assert [r.path for r in requests[:3]] == ["reused"] * 3 and "reused" not in {r.path for r in requests[3:]}
    assert [c.tool for r in requests[:3] for c in r.tool_calls] == [
        c.tool for r in origin.session.requests()[:3] for c in r.tool_calls
    ]
    alpha = _cell(audit.session, "alpha = 42")
    assert alpha.reused and alpha.output == "alpha 42\n" and alpha.seq == script.ALPHA_CELL
    [child] = audit.session.children()
    assert (
        child.reused
        and child.status == "reused"
        and child.workflow_id == origin.session.children()[0].workflow_id
    )
    # the budget counts only what the rerun paid (the live part), like its ledger
    summaries = [i for i in audit.session.items if isinstance(i, CompactionItem) and not i.reused]
    assert (
        audit.session.budget[-1].requests
        == out.raw["usage"]["requests"]
        == len(requests) - 3 + len(summaries)
    )
    assert "rerun of " + origin_id + " from step 4" in render_text(audit)


async def test_cells_refused_by_the_loop_guard_take_no_cell(client, task_queue, settings, tmp_path) -> None:
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, config=ReflectionConfig(model="scripted-loop"))
    handle = await rr.start_reflection(client, inp, task_queue, f"audit-loop-{uuid.uuid4().hex[:8]}")
    out = await handle.result()
    audit = await audit_workflow(client, handle.id, settings.blob_dir, HOOKS)
    requests = audit.session.requests()
    calls = [c.call_id for r in requests for c in r.tool_calls if c.tool == EXECUTE_CODE_TOOL]
    cells = [c for c in audit.session.cells() if c.origin == "model"]
    refused = [cid for r in requests if r.given is not None for cid in r.given.refused_calls]
    assert len(cells) == out.raw["rr_trace"]["cells"] and refused  # the guard refused some
    # the last call was refused too and ended the session (no request followed to show its refusal)
    assert out.raw["rr_trace"]["stop_reason"] == "error"
    assert [c.call_id for c in cells] == [cid for cid in calls[:-1] if cid not in refused]
    assert all(not c.ok and "ZeroDivisionError" in (c.error or c.output) for c in cells)


@pytest.mark.parametrize("name", ["stateful_v1", "provider_v1", "heuristic_v3"])
async def test_committed_histories_audit_with_citations_checked_by_the_audit(name: str, tmp_path) -> None:
    import reflector.testing.scripted  # noqa: F401
    from reflector.runtime.models import prepare_workflow_side

    prepare_workflow_side(["openai-chat"])
    path = HISTORIES / f"{name}.json"
    audit = await audit_file(path, tmp_path, HOOKS)
    events = json.loads(path.read_text())["events"]
    from temporalio.client import WorkflowHistory

    history = WorkflowHistory.from_json(name, {"events": events})
    requests = [r for r in completed_activities(history.events) if r.is_model_request]
    cells = [r for r in completed_activities(history.events) if r.name == "rr.sandbox.run_cell"]
    assert len(audit.session.requests()) == len(requests)
    assert len([c for c in audit.session.cells() if c.origin != "prefill"]) == len(cells)
    assert all(r.given is not None for r in audit.session.requests())
    assert [c.output for c in audit.session.cells()[1:]] == [c.result_json()["output"] for c in cells]
    # recorded before the workflow checked citations: the audit checks them (and marks what is uncited)
    assert all(learning.source == "audit" for learning in audit.session.reflection.learnings)
    assert audit.status == "completed"


@pytest.mark.slow
async def test_a_killed_worker_shows_as_a_crash_survived(temporal_server, tmp_path, monkeypatch) -> None:
    """SIGKILL the worker (and its sandbox host) during the slow cell; a second worker finishes. The audit
    names both workers, the timed-out workflow task and the time without progress before the cell's result."""
    import asyncio
    import time

    from reflector.client import connect
    from tests.support.blob_dirs import EXTRA_BLOB_DIRS
    from tests.support.procs import WorkerProcess, read_model_log

    home = tmp_path / "home"
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"audit-crash-{uuid.uuid4().hex[:6]}",
        "RR_TEST_MODEL_LOG": str(tmp_path / "model.log"),
        "RR_TEST_SLOW_LOOP": "30000000",
        "RR_STICKY_TIMEOUT_S": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    EXTRA_BLOB_DIRS.append(home / "blobs")
    settings = Settings.from_env()
    client = await connect(env["TEMPORAL_ADDRESS"], settings=settings)
    inp = rr.build_input(
        rr.upload_trace(write_trace(tmp_path), settings),
        question="What is 17 * 24?",
        ground_truth="408",
        config=ReflectionConfig(model="scripted-stateful"),
    )
    w1 = WorkerProcess(env, tmp_path / "w1.log")
    w2: WorkerProcess | None = None
    try:
        w1.wait_ready()
        handle = await rr.start_reflection(
            client, inp, env["RR_TASK_QUEUE"], f"audit-crash-{uuid.uuid4().hex[:8]}"
        )
        journal = home / "blobs" / "sessions" / handle.id
        deadline = time.monotonic() + 60
        # the model asked for the slow cell (its 5th message) and the cell before it is journaled: kill inside it
        while not (
            any(e["n"] == 5 for e in read_model_log(Path(env["RR_TEST_MODEL_LOG"])))
            and (journal / f"{4:08d}.json").exists()
        ):
            assert time.monotonic() < deadline, "the slow cell never started"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.4)
        w1.kill()
        w2 = WorkerProcess(env, tmp_path / "w2.log")
        w2.wait_ready()
        out = await asyncio.wait_for(handle.result(), 120)
        audit = await audit_workflow(client, handle.id, settings.blob_dir, HOOKS)
    finally:
        w1.stop()
        if w2:
            w2.stop()
    incidents = [i for i in audit.session.items if i.kind == "incident"]
    changed = [i for i in incidents if i.what == "worker changed"]
    assert len(changed) == 1, incidents
    assert changed[0].previous_worker.startswith(f"{w1.proc.pid}@")
    assert changed[0].worker.startswith(f"{w2.proc.pid}@")
    assert changed[0].gap_s is not None and changed[0].gap_s > 0
    assert any(i.what == "workflow task timed out" for i in incidents)
    slow = _cell(audit.session, "for i in range")
    assert slow.output.startswith("slow done 30000000")  # run again, to the end, by the second worker
    assert audit.session.items.index(changed[0]) < audit.session.items.index(slow)
    assert audit.incidents == len(incidents) and audit.status == "completed"
    assert "worker changed" in render_text(audit)
    assert out.raw["rr_trace"]["cells"] == len([c for c in audit.session.cells() if c.origin == "model"])


async def test_without_replay_inputs_come_from_recorded_activity_inputs_or_are_marked(tmp_path) -> None:
    """Provider-style requests (regular activities) record their input: the audit shows it (it is what was
    sent), with or without a replay; local requests record none, and without a replay they are marked."""
    import reflector.testing.scripted  # noqa: F401
    from reflector.client.audit.build import build_audit
    from reflector.client.audit.capture import ReplayCapture
    from reflector.client.audit.histories import load_bundle

    bundle = load_bundle(HISTORIES / "stateful_v1.json")
    fallback = build_audit(bundle, ReplayCapture(failures={0: "replay skipped"}), tmp_path, "test")
    requests = fallback.session.requests()
    assert requests and all(r.given is not None and r.given.source == "activity input" for r in requests)
    assert not fallback.inputs_rebuilt and fallback.session.replay_failure == "replay skipped"
    replayed = await audit_file(HISTORIES / "stateful_v1.json", tmp_path, HOOKS)
    assert [r.given for r in requests] == [r.given for r in replayed.session.requests()]
    # what was sent then: the recorded request offered no `recurse` (replayed with today's code, it does)
    assert requests[0].given is not None and requests[0].given.tools_offered == [
        "execute_code",
        "final_result",
        "think",
    ]
    local = build_audit(
        load_bundle(HISTORIES / "stateful_v3.json"), ReplayCapture(failures={0: "x"}), tmp_path, "t"
    )
    assert local.session.requests() and all(r.given is None for r in local.session.requests())
    assert "not rebuilt" in render_text(local)
