"""Build the audit timeline (`reflector.client.audit.timeline`) of a reflection from its histories alone.

Every run of every session (the root's continue-as-new chain, each child's) is walked in history order:
model requests (local-activity markers, or the provider's activity events), cells (`run_cell` markers,
their code taken from the `execute_code` call that asked for them), children (child-workflow events,
attached to the `recurse` call that started them), compactions (`rr.summarise`), the faults survived
(activity retries and timeouts, workflow-task timeouts and failures, the worker changing) and the
output. What each model request was given is not in the history: `reflector.client.audit.capture` rebuilds it
by replaying the same histories.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client

from reflector.client.audit.capture import ReplayCapture, ReplayHooks, replay_inputs
from reflector.client.audit.events import models_of
from reflector.client.audit.histories import HistoryBundle, collect, load_bundle
from reflector.client.audit.timeline import Audit, CompactionItem, IncidentItem, Session
from reflector.client.audit.walk import SessionWalk

__all__ = ["build_audit", "audit_bundle", "audit_workflow", "audit_file"]


def build_audit(bundle: HistoryBundle, capture: ReplayCapture, blob_dir: Path | str, source: str) -> Audit:
    """The audit of `bundle` (root chain first, then children), with the model inputs in `capture`."""
    blob = Path(blob_dir)
    walks: dict[str, SessionWalk] = {}
    for index, run in enumerate(bundle.runs):
        walk = walks.get(run.workflow_id)
        if walk is None:
            walk = walks[run.workflow_id] = SessionWalk(Session(workflow_id=run.workflow_id), blob)
        walk.run(run.chain_index, run, capture.inputs.get(index, []))
        if index in capture.failures:
            walk.session.replay_failure = capture.failures[index]
    for walk in walks.values():
        for child in walk.session.children():
            if child.workflow_id in walks:
                child.session = walks[child.workflow_id].session
    root = walks[bundle.root_id].session if bundle.root_id in walks else Session(workflow_id=bundle.root_id)
    sessions = [w.session for w in walks.values()]
    raw = root.reflection.raw
    usage = raw.get("usage") or {}
    last = root.budget[-1] if root.budget else None
    rebuilt = all(r.given is not None for s in sessions for r in s.requests())
    return Audit(
        root_id=bundle.root_id,
        source=source,
        model=root.model,
        trace=root.trace,
        stop_reason=root.reflection.stop_reason,
        status=root.reflection.status,
        requests=int(usage.get("requests", last.requests if last else 0) or 0),
        tokens=int(usage.get("total_tokens", last.tokens if last else 0) or 0),
        cells=sum(1 for s in sessions for c in s.cells() if c.origin == "model"),
        children=sum(len(s.children()) for s in sessions),
        compactions=sum(1 for s in sessions for i in s.items if isinstance(i, CompactionItem)),
        incidents=sum(1 for s in sessions for i in s.items if isinstance(i, IncidentItem)),
        cells_rebuilt=sum(1 for s in sessions for c in s.cells() if c.host_restarted),
        rerun=raw.get("rerun") if isinstance(raw.get("rerun"), dict) else None,
        inputs_rebuilt=rebuilt and not capture.failures,
        session=root,
    )


async def audit_bundle(bundle: HistoryBundle, blob_dir: Path | str, source: str, hooks: ReplayHooks) -> Audit:
    """The audit of `bundle`; `hooks` (`worker.audit_replay_hooks()`) replay it to rebuild the model inputs."""
    capture = await replay_inputs(
        [r.history for r in bundle.runs],
        blob_dir,
        hooks,
        models_of((r.history.events[0] for r in bundle.runs if r.history.events), blob_dir) or None,
    )
    return build_audit(bundle, capture, blob_dir, source)


async def audit_workflow(client: Client, workflow_id: str, blob_dir: Path | str, hooks: ReplayHooks) -> Audit:
    """The audit of reflection `workflow_id` on the server `client` talks to (every run, every child)."""
    return await audit_bundle(await collect(client, workflow_id, Path(blob_dir)), blob_dir, "server", hooks)


async def audit_file(path: Path | str, blob_dir: Path | str, hooks: ReplayHooks) -> Audit:
    """The audit of an exported reflection (`rr export`), or of one run's history in Temporal's JSON format."""
    return await audit_bundle(load_bundle(Path(path)), blob_dir, str(path), hooks)
