"""`rr gc` against a real server and a real worker: it removes orphans and nothing a retained workflow needs.

A private dev server (gc reads every execution of its namespace, so other tests' workflows, whose blobs
live in other stores, must not be in it), a private blob store and a worker subprocess on both. Every
file in the store is made older than the grace period before gc runs, so only references protect them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus

import reflector.testing.scripted  # noqa: F401  (registers the scripted models in this process too)
import worker
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime import gc, gc_sources
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import RESPONSES_DIR, SESSIONS_DIR, BlobStore
from reflector.runtime.storage.payloads import stored_digest
from tests.support import prefork
from tests.support.fixtures import completed_activities, write_trace
from tests.support.procs import REPO_ROOT, WorkerProcess

pytestmark = [pytest.mark.server, pytest.mark.slow]

OLD = time.time() - 3 * 3600  # older than the default grace period (1 h)
# gc counts an item's age from its ctime, which no utime moves back (a breached host could back-date an
# mtime): the CLI test lets this much real time pass instead, and runs gc with it as the grace period
GRACE_S = 10.0


@dataclass
class Env:
    client: Client
    settings: Settings
    blob_dir: Path
    cli_env: dict[str, str]


@pytest.fixture(scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    root = tmp_path_factory.mktemp("gc")
    home, blob_dir = root / "home", root / "home" / "blobs"
    home.mkdir()
    mp = pytest.MonkeyPatch()
    mp.delenv("RR_BLOB_DIR", raising=False)
    mp.setenv("RR_WORKER_MODELS", "heuristic")  # the in-process replayer prepares no provider SDK
    server = DevServer(root / "temporal.sqlite", ui=False, log_file=root / "server.log")
    server.start(timeout=60)
    tq = f"rr-gc-{uuid.uuid4().hex[:6]}"
    cli_env = {
        "RR_HOME": str(home),
        "RR_BLOB_DIR": str(blob_dir),
        "TEMPORAL_ADDRESS": server.address,
        "RR_TASK_QUEUE": tq,
        "RR_WORKER_MODELS": "heuristic",
    }
    proc = WorkerProcess(cli_env, root / "worker.log")
    try:
        proc.wait_ready(60)
        settings = replace(
            Settings.from_env(),
            home=home,
            address=server.address,
            address_explicit=True,
            task_queue_setting=tq,
        )
        assert settings.blob_dir == blob_dir
        yield Env(await connect(server.address, settings=settings), settings, blob_dir, cli_env)
    finally:
        proc.stop()
        server.stop()
        mp.undo()


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def age_everything(root: Path, but: set[Path] = set()) -> None:  # noqa: B006
    for p in [root, *root.rglob("*")]:
        if p not in but:
            os.utime(p, (OLD, OLD), follow_symlinks=False)


def rr_gc(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return prefork.run(
        [sys.executable, "-m", "reflector.cli", "gc", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env.cli_env},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def history_has(client: Client, wid: str, activity: str, count: int = 1, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = (await client.get_workflow_handle(wid).fetch_history()).events
        if sum(r.name == activity for r in completed_activities(events)) >= count:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{wid}: no {count} x {activity} in the history")


async def visibility_settled(client: Client, executions: int, timeout: float = 30.0) -> None:
    """Wait until the server's list (visibility, updated after a close) shows `executions`, none running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = [e async for e in client.list_workflows()]
        if len(listed) == executions and all(e.status != WorkflowExecutionStatus.RUNNING for e in listed):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the server's list never showed {executions} closed executions")


def plan(
    code: list[str],
    children: list[dict[str, object]] | None = None,
    after: list[str] | None = None,
    **extra: object,
) -> dict[str, object]:
    return {"code": code, "children": children or [], "after": after or [], **extra}


def plant_orphans(root: Path) -> set[str]:
    """Things nothing names (the set gc must remove once they are older than its grace period)."""
    store = BlobStore(root)
    orphan = store.put_bytes(f"an orphan {uuid.uuid4()}".encode())
    payload = Payload(metadata={"encoding": b"json/plain"}, data=f'{{"o": "{uuid.uuid4()}"}}'.encode())
    orphan_payload = store.put_bytes(payload.SerializeToString(deterministic=True))
    store.derived_path(orphan, "index").write_bytes(b"an index of an orphan")
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    (root / "sessions" / ghost).mkdir(parents=True)
    (root / "sessions" / ghost / "00000001.json").write_text('{"seq": 1, "code": "x = 1"}')
    (root / "responses" / ghost).mkdir(parents=True)
    (root / "responses" / ghost / "run.1.json").write_text("{}")
    (root / ".incoming-leftover").write_bytes(b"half an upload")
    (root / "notes.txt").write_text("not rr's: never removed")
    rel = {
        store.path_for(orphan),
        store.path_for(orphan_payload),
        store.derived_path(orphan, "index"),
        root / "sessions" / ghost,
        root / "responses" / ghost,
        root / ".incoming-leftover",
    }
    return {p.relative_to(root).as_posix() for p in rel}


async def test_gc_removes_orphans_and_keeps_what_running_and_finished_workflows_need(
    env: Env, tmp_path: Path
) -> None:
    client, root = env.client, env.blob_dir
    tq = env.settings.task_queue
    ref = rr.upload_trace(write_trace(tmp_path), env.settings)
    trace_index = BlobStore(root).derived_path(ref.sha256, "index")
    trace_index.write_bytes(b"derived from the trace: alive while the trace is")
    # a finished reflection (the heuristic model)
    done = await rr.start_reflection(
        client,
        rr.build_input(ref, question="What is 17 * 24?", ground_truth="408"),
        tq,
        f"gc-done-{uuid.uuid4().hex[:6]}",
    )
    out_done = await done.result()
    # a running one, blocked after its first cell until the gate opens; afterwards it starts a child
    # (an export of its namespace) and runs another cell (the trace, its init blob and journal again)
    gate = tmp_path / "gate"
    # (its first cell prints over the 16 KiB payload threshold: its output is a stored payload)
    tree = plan(
        ["data = {'a': 1}\nprint('root', data, 'x' * 20000)"],
        children=[plan(["print('child sees', data)"])],
        after=["print('after the gate', data, len(traces['steps']))"],
        gate_after=1,
    )
    running = await rr.start_reflection(
        client,
        rr.build_input(
            ref,
            question=f"GATE:{gate} PLAN:{json.dumps(tree)}",
            config=ReflectionConfig(model="scripted-plan-gated", recursion="always"),
        ),
        tq,
        f"gc-running-{uuid.uuid4().hex[:6]}",
    )
    await history_has(client, running.id, "rr.sandbox.run_cell")  # its first cell is recorded; now it waits
    # the layout gc reads is the one the worker writes (journal, response cache)
    assert (root / SESSIONS_DIR / running.id).is_dir() and (root / RESPONSES_DIR / running.id).is_dir()

    orphans = plant_orphans(root)
    age_everything(root)
    time.sleep(GRACE_S + 0.5)  # everything so far is past the grace period (by its ctime too)
    young_data = f"a young orphan {uuid.uuid4()}".encode()
    young = BlobStore(root).path_for(BlobStore(root).put_bytes(young_data))
    before = files(root)

    dry = rr_gc(env, "--dry-run", "--json", "--min-age", f"{GRACE_S:g}s")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    listed = [e async for e in client.list_workflows()]
    assert planned["dry_run"] is True and planned["executions"] == len(listed) and planned["running"] == 1
    assert set(planned["paths"]) == orphans
    assert files(root) == before
    assert planned["removed"]["journal"] == {"count": 1, "bytes": len('{"seq": 1, "code": "x = 1"}')}
    assert planned["kept"]["payload"]["count"] >= 1 and planned["kept"]["journal"]["count"] == 2

    BlobStore(root).put_bytes(young_data)  # stored again: young again (the dry run took a few seconds)
    real = rr_gc(env, "--min-age", f"{GRACE_S:g}s")  # the human-readable report, for real
    assert real.returncode == 0, real.stderr
    assert "removed: 6 items" in real.stdout and "1 running" in real.stdout
    gone = {f for f in before if any(f == o or f.startswith(o + "/") for o in orphans)}
    assert files(root) == before - gone
    assert young.exists() and trace_index.exists() and (root / "notes.txt").exists()

    # the running reflection goes on with what gc left: a child, another cell, an answer
    gate.write_text("open")
    out = ReflectorOutput.model_validate(await asyncio.wait_for(running.result(), 60))
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw.get("error")
    assert "after the gate {'a': 1} 4" in out.error_identification
    [call] = out.raw["rr_trace"]["subagent_calls"]
    child = ReflectorOutput.model_validate(
        await client.get_workflow_handle(call["child_workflow_id"]).result()
    )
    assert "child sees {'a': 1}" in child.error_identification

    # with every workflow closed (and listed so: visibility follows a close) and no grace period at all,
    # gc removes only what nobody names ...
    await visibility_settled(client, len(listed) + 1)  # the child came since
    report = await gc.run_gc(gc.TemporalSource(client), root, min_age_s=0)
    assert report.executions == len(listed) + 1 and report.running == 0  # the child came since
    assert report.removed_paths == [young.relative_to(root).as_posix()]
    # ... and the finished reflections still replay and answer
    for wid in (done.id, running.id, call["child_workflow_id"]):
        replayed = await worker.replay(client, wid, env.settings)
        assert replayed.events > 0 and not replayed.running
    assert (await rr.fetch_result(client, done.id)).model_dump() == out_done.model_dump()


def _stored_payloads(events: Sequence[HistoryEvent]) -> list[str]:
    holders = gc_sources._payload_holders(HistoryEvent.DESCRIPTOR)
    return [
        d for e in events for p in gc_sources._payloads(e, holders) if (d := stored_digest(p)) is not None
    ]


class FailingSource(gc.TemporalSource):
    """The server's executions, but the history of one of them cannot be read."""

    def __init__(self, client: Client, broken: str) -> None:
        super().__init__(client)
        self.broken = broken

    async def events(self, execution: gc.Execution) -> AsyncIterator[HistoryEvent]:
        if execution.workflow_id == self.broken:
            raise ConnectionError("the history service is unavailable")
        async for event in super().events(execution):
            yield event


@pytest.fixture
def orphan(env: Env) -> Iterator[Path]:
    store = BlobStore(env.blob_dir)
    path = store.path_for(store.put_bytes(f"an old orphan {uuid.uuid4()}".encode()))
    os.utime(path, (OLD, OLD))
    yield path
    path.unlink(missing_ok=True)


async def test_gc_removes_nothing_when_a_history_cannot_be_read(
    env: Env, tmp_path: Path, orphan: Path
) -> None:
    client, root = env.client, env.blob_dir
    ref = rr.upload_trace(write_trace(tmp_path), env.settings)
    big = plan(["print('x' * 20000)"])  # a cell output over the 16 KiB threshold: an offloaded payload
    handle = await rr.start_reflection(
        client,
        rr.build_input(
            ref, question=f"PLAN:{json.dumps(big)}", config=ReflectionConfig(model="scripted-plan")
        ),
        env.settings.task_queue,
        f"gc-big-{uuid.uuid4().hex[:6]}",
    )
    await handle.result()
    [digest] = _stored_payloads((await handle.fetch_history()).events)
    before = files(root)

    # a history whose server cannot be read
    with pytest.raises(gc.GCRefused, match=f"could not read the history of workflow '{handle.id}'"):
        await gc.run_gc(FailingSource(client, handle.id), root, min_age_s=0)
    assert files(root) == before and orphan.exists()

    # a history naming a stored payload that is missing: what it names cannot be known
    payload_blob = BlobStore(root).path_for(digest)
    aside = tmp_path / "payload"
    payload_blob.rename(aside)
    try:
        with pytest.raises(gc.GCRefused, match=digest):
            await gc.run_gc(gc.TemporalSource(client), root, min_age_s=0)
        failed = rr_gc(env, "--min-age", "0")
        assert failed.returncode == 1 and "gc removed nothing" in failed.stderr and digest in failed.stderr
        assert files(root) == before - {payload_blob.relative_to(root).as_posix()} and orphan.exists()
    finally:
        aside.rename(payload_blob)

    # an unreachable server: refused before anything is read
    down = rr_gc(replace(env, cli_env={**env.cli_env, "TEMPORAL_ADDRESS": "127.0.0.1:9"}))
    assert down.returncode == 2 and "not reachable" in down.stderr and orphan.exists()
    # with everything readable, the orphan goes and the reflection's payload stays
    report = await gc.run_gc(gc.TemporalSource(client), root, min_age_s=0)
    assert orphan.relative_to(root).as_posix() in report.removed_paths and payload_blob.exists()
    assert (
        await client.get_workflow_handle(handle.id).describe()
    ).status == WorkflowExecutionStatus.COMPLETED
    assert (await worker.replay(client, handle.id, env.settings)).events > 0


async def test_gc_keeps_what_every_run_of_a_continue_as_new_chain_needs(env: Env, tmp_path: Path) -> None:
    client, root = env.client, env.blob_dir
    ref = rr.upload_trace(write_trace(tmp_path), env.settings)
    # cells that print a lot in a small context window: summaries (archived transcripts), each followed by
    # a new run of the same workflow id
    cfg = ReflectionConfig(model="scripted-big", context_window=3_000, max_compactions=3)
    handle = await rr.start_reflection(
        client,
        rr.build_input(ref, question="What is 17 * 24?", config=cfg),
        env.settings.task_queue,
        f"gc-chain-{uuid.uuid4().hex[:6]}",
    )
    out = await handle.result()
    chain = out.raw["rr_trace"]["continued_as_new"]
    assert chain >= 1 and out.raw["rr_trace"]["stop_reason"] == "completed"
    runs = [w.run_id async for w in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    histories = [await client.get_workflow_handle(handle.id, run_id=r).fetch_history() for r in runs]
    archives = [
        r.result_json()["archive_ref"]
        for h in histories
        for r in completed_activities(h.events)
        if r.name == "rr.summarise"
    ]
    assert len(runs) == chain + 1 and len(archives) == out.raw["rr_trace"]["compactions"] >= 1

    age_everything(root)
    report = await gc.run_gc(gc.TemporalSource(client), root, clock=lambda: time.time() + 3 * 3600)
    assert all(BlobStore(root).exists(a) for a in archives)  # only the first run's history names the first
    assert report.kept["archive"].count >= len(archives) and (root / SESSIONS_DIR / handle.id).is_dir()
    replayer = worker.make_replayer(root)
    for history in histories:  # every run of the chain still replays from what is left
        await replayer.replay_workflow(history)
