"""Replay every history of a reflection against the current code, naming the first diverging event.

`replay_runs` streams `RunHistory`s (from `histories.iter_runs`, or a loaded export file) through ONE
temporalio `Replayer` (`worker.replay_factory`). The replayer's workflow runner records the commands the
code produced at each activation; on a failure, `reflector.client.audit.divergence` names the first diverging
event and what the code did there instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_commands import WorkflowCommand
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.client import WorkflowHistory
from temporalio.worker import (
    Replayer,
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)

from reflector.client.audit.divergence import Divergence, _core_message, divergence_of
from reflector.client.audit.histories import RunHistory

__all__ = [
    "Divergence",
    "RunReplay",
    "ReplayReport",
    "CommandRecorder",
    "recording_replayer",
    "as_stream",
    "replay_runs",
    "replay_all",
    "divergence_of",
    "render_line",
    "render_summary",
]


@dataclass(frozen=True)
class RunReplay:
    workflow_id: str
    run_id: str
    parent_workflow_id: str | None
    chain_index: int
    workflow_type: str
    events: int
    running: bool  # a partial history (the run had not closed when it was read)
    failure: str | None = None  # None: replayed cleanly
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "parent_workflow_id": self.parent_workflow_id,
            "chain_index": self.chain_index,
            "workflow_type": self.workflow_type,
            "events": self.events,
            "running": self.running,
            "ok": self.ok,
        }
        if self.failure is not None:
            out["failure"] = self.failure
        if self.divergence is not None:
            d = self.divergence
            out["divergence"] = {
                "event_id": d.event_id,
                "event_type": d.event_type,
                "code_did": d.code_did,
                "message": d.message,
            }
        return out


@dataclass
class ReplayReport:
    root_id: str
    source: str  # "server" or the file replayed
    runs: list[RunReplay] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    @property
    def failed(self) -> list[RunReplay]:
        return [r for r in self.runs if not r.ok]

    @property
    def partial(self) -> list[RunReplay]:
        return [r for r in self.runs if r.running]

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.failed

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root_id,
            "source": self.source,
            "ok": self.ok,
            "histories": len(self.runs),
            "events": self.events,
            "seconds": round(self.seconds, 4),
            "events_per_s": round(self.events_per_s, 1),
            "failed": len(self.failed),
            "partial": len(self.partial),
            "runs": [r.to_json() for r in self.runs],
        }


# ---------------------------------------------------------------------------------------------
# What the code did: the commands of every activation, recorded by the replayer's workflow runner
# ---------------------------------------------------------------------------------------------


class _RecordingInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance, log: list[WorkflowCommand]) -> None:
        self._inner, self._log = inner, log

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._inner.activate(act)
        if completion.HasField("successful"):
            self._log.extend(completion.successful.commands)
        return completion

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()

    def __getattr__(self, name: str) -> Any:  # anything else the worker reads (deadlock diagnostics)
        return getattr(self._inner, name)


class CommandRecorder(WorkflowRunner):
    """An unsandboxed runner that records each run's commands (only reads them: replay is unchanged)."""

    def __init__(self) -> None:
        self._inner = UnsandboxedWorkflowRunner()
        self.commands: dict[str, list[WorkflowCommand]] = {}

    def prepare_workflow(self, defn: Any) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        log = self.commands.setdefault(det.info.run_id, [])
        log.clear()  # a run evicted and rebuilt starts its commands again
        return _RecordingInstance(self._inner.create_instance(det), log)

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


# ---------------------------------------------------------------------------------------------
# Replaying
# ---------------------------------------------------------------------------------------------


def _failure_text(failure: BaseException) -> str:
    text = _core_message(failure)
    first = text.splitlines()[0] if text else repr(failure)
    return f"{type(failure).__name__}: {first}"[:500]


async def as_stream(runs: Iterable[RunHistory]) -> AsyncIterator[RunHistory]:
    """Loaded runs (`load_bundle(...).runs`) as the stream `replay_runs` takes."""
    for run in runs:
        yield run


ReplayerFactory = Callable[[Path | str, WorkflowRunner, Sequence[str] | None], Replayer]
"""`(blob_dir, workflow runner, models) -> Replayer`: the composition root's (`worker.replay_factory`);
reflector/ never imports the workflows itself. `models`: the ones the histories use (None: every family)."""


def recording_replayer(
    blob_dir: Path | str, make_replayer: ReplayerFactory, models: Sequence[str] | None = None
) -> tuple[Replayer, CommandRecorder]:
    """A replayer from `make_replayer` with a `CommandRecorder` as its runner (building it loads the models)."""
    recorder = CommandRecorder()
    return make_replayer(blob_dir, recorder, models), recorder


async def replay_runs(
    runs: AsyncIterator[RunHistory], *, replayer: tuple[Replayer, CommandRecorder]
) -> AsyncIterator[RunReplay]:
    """Replay each run as it comes (one replayer for all); yields one `RunReplay` per run, in order."""
    replayer_, recorder = replayer
    pushed: deque[RunHistory] = deque()

    async def histories() -> AsyncIterator[WorkflowHistory]:
        async for run in runs:
            pushed.append(run)
            yield run.history

    async with replayer_.workflow_replay_iterator(histories()) as results:
        async for result in results:
            run = pushed.popleft()
            commands = (
                recorder.commands.pop(run.history.run_id, None)
                or recorder.commands.pop(run.run_id, None)
                or []
            )
            recorder.commands.clear()
            failure = result.replay_failure
            divergence = None
            if failure is not None:
                divergence = divergence_of(failure, run.history, commands)
            yield RunReplay(
                workflow_id=run.workflow_id,
                run_id=run.run_id,
                parent_workflow_id=run.parent_workflow_id,
                chain_index=run.chain_index,
                workflow_type=run.workflow_type,
                events=run.events,
                running=run.running,
                failure=None if failure is None else _failure_text(failure),
                divergence=divergence,
            )


async def replay_all(
    runs: AsyncIterator[RunHistory],
    *,
    root_id: str,
    source: str,
    blob_dir: Path | str,
    make_replayer: ReplayerFactory,
    models: Sequence[str] | None = None,
    on_run: Callable[[RunReplay], None] | None = None,
) -> ReplayReport:
    """`replay_runs`, gathered into a report with its wall time (which includes reading a streamed source);
    `on_run` sees each result as it comes."""
    report = ReplayReport(root_id, source)
    replayer = recording_replayer(blob_dir, make_replayer, models)  # not timed: the figure is the replay's
    start = time.perf_counter()
    try:
        async for r in replay_runs(runs, replayer=replayer):
            report.runs.append(r)
            if on_run is not None:
                on_run(r)
    finally:
        report.seconds = time.perf_counter() - start
    return report


def render_line(r: RunReplay) -> str:
    run = f"{r.workflow_id} run {r.chain_index} ({r.run_id})"
    partial = " (partial history: still running)" if r.running else ""
    if r.ok:
        return f"OK      {run}: {r.events} events{partial}"
    line = f"FAILED  {run}: {r.events} events{partial}: {r.failure}"
    if r.divergence is not None:
        line += f"\n        {r.divergence.describe()}"
    return line


def render_summary(report: ReplayReport) -> str:
    n = len(report.runs)
    head = (
        f"replay of {report.root_id} ({report.source}) {'OK' if report.ok else 'FAILED'}: {n} "
        f"histor{'y' if n == 1 else 'ies'}, {report.events} events in {report.seconds:.2f} s "
        f"({report.events_per_s:,.0f} events/s) against the current code"
    )
    notes = []
    if report.failed:
        notes.append(f"{len(report.failed)} failed")
    if report.partial:
        notes.append(
            f"partial history of a running reflection: {len(report.partial)} of the runs had not closed "
            "(replayed as far as they go)"
        )
    return head + (f"; {', '.join(notes)}" if notes else "")
