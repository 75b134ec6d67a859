"""Replay every history of a reflection against the current code, naming the first diverging event.

`replay_runs` streams `RunHistory`s (from `histories.iter_runs`, or a loaded export file) through ONE
temporalio `Replayer` (`worker.replay_factory`). The replayer's workflow runner records the commands the
code produced at each activation; on a failure the SDK's nondeterminism message is parsed for the event
it names (`HistoryEvent(id: N, ...)`, or `LocalActivity(seq)` / `Activity(seq)` / `Timer(seq)` /
`ChildWorkflow(seq)`, mapped to its event), and the recorded commands, aligned with the history's
command events, say what the code did there instead (and give the event when the message names none).
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
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

_LA_MARKER = "core_local_activity"
_PATCH_MARKER = "core_patch"


@dataclass(frozen=True)
class Divergence:
    event_id: int | None  # the first diverging event of the history (None: the code went past the history)
    event_type: str  # e.g. "MarkerRecorded (local activity rr.sandbox.prepare_session)"
    code_did: str  # what the code did there instead
    message: str  # the SDK's message

    def describe(self) -> str:
        where = f"event {self.event_id} {self.event_type}" if self.event_id is not None else self.event_type
        return f"first diverging event: {where}; the code instead {self.code_did}"


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
# Aligning commands with the history's command events
# ---------------------------------------------------------------------------------------------


def _marker_data(ev: HistoryEvent, key: str) -> dict[str, Any]:
    payloads = ev.marker_recorded_event_attributes.details.get(key)
    if payloads is None or not payloads.payloads:
        return {}
    try:
        data = json.loads(payloads.payloads[0].data)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _event_label(ev: HistoryEvent) -> tuple[str, str] | None:
    """(kind, detail) of an event a command produces; None for events no command makes (or that are skipped)."""
    t = ev.event_type
    if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return "activity", ev.activity_task_scheduled_event_attributes.activity_type.name
    if t == EventType.EVENT_TYPE_MARKER_RECORDED:
        name = ev.marker_recorded_event_attributes.marker_name
        if name == _LA_MARKER:
            return "local activity", str(_marker_data(ev, "data").get("activity_type", "?"))
        return None  # patch markers (and their search-attribute upserts) are not compared
    if t == EventType.EVENT_TYPE_TIMER_STARTED:
        return "timer", ""
    if t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
        a = ev.start_child_workflow_execution_initiated_event_attributes
        return "child workflow", f"{a.workflow_type.name} {a.workflow_id}"
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        return "complete", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return "fail", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
        return "continue as new", ""
    if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
        return "cancel", ""
    if t == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
        return "signal external", ""
    if t == EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
        return "cancel external", ""
    return None


def _command_label(c: WorkflowCommand) -> tuple[str, str] | None:
    v = c.WhichOneof("variant")
    if v == "schedule_activity":
        return "activity", c.schedule_activity.activity_type
    if v == "schedule_local_activity":
        return "local activity", c.schedule_local_activity.activity_type
    if v == "start_timer":
        return "timer", f"{c.start_timer.start_to_fire_timeout.ToTimedelta().total_seconds():g} s"
    if v == "start_child_workflow_execution":
        s = c.start_child_workflow_execution
        return "child workflow", f"{s.workflow_type} {s.workflow_id}"
    if v == "complete_workflow_execution":
        return "complete", ""
    if v == "fail_workflow_execution":
        return "fail", c.fail_workflow_execution.failure.message[:200]
    if v == "continue_as_new_workflow_execution":
        return "continue as new", ""
    if v == "cancel_workflow_execution":
        return "cancel", ""
    if v == "signal_external_workflow_execution":
        return "signal external", ""
    if v == "request_cancel_external_workflow_execution":
        return "cancel external", ""
    return None  # queries, patches, upserts, cancellations of its own commands: not compared


_EVENT_WORDS = {
    "local activity": "MarkerRecorded",
    "activity": "ActivityTaskScheduled",
    "timer": "TimerStarted",
    "child workflow": "StartChildWorkflowExecutionInitiated",
    "complete": "WorkflowExecutionCompleted",
    "fail": "WorkflowExecutionFailed",
    "continue as new": "WorkflowExecutionContinuedAsNew",
    "cancel": "WorkflowExecutionCanceled",
    "signal external": "SignalExternalWorkflowExecutionInitiated",
    "cancel external": "RequestCancelExternalWorkflowExecutionInitiated",
}


def _type_name(ev: HistoryEvent) -> str:
    name = EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")
    return "".join(w.capitalize() for w in name.split("_"))


def _describe_event(ev: HistoryEvent) -> str:
    label = _event_label(ev)
    kind = _type_name(ev)
    if label is None:
        return kind
    what, detail = label
    if what in ("local activity", "activity", "child workflow") and detail:
        return f"{kind} ({what} {detail})"
    return kind


def _describe_command(label: tuple[str, str] | None) -> str:
    if label is None:
        return (
            "issued no further command (its code had returned or was waiting on something the history lacks)"
        )
    what, detail = label
    return {
        "local activity": f"scheduled local activity {detail}",
        "activity": f"scheduled activity {detail}",
        "timer": f"started a timer ({detail})",
        "child workflow": f"started child workflow {detail}",
        "complete": "completed the workflow",
        "fail": f"failed the workflow ({detail})" if detail else "failed the workflow",
        "continue as new": "continued as new",
        "cancel": "cancelled the workflow",
        "signal external": "signalled an external workflow",
        "cancel external": "requested cancellation of an external workflow",
    }[what]


_EVENT_IN_MESSAGE = re.compile(r"HistoryEvent\(id: (\d+)|event[_ ]id[:= ]+(\d+)", re.IGNORECASE)
_SEQ_IN_MESSAGE = re.compile(r"\b(LocalActivity|Activity|Timer|ChildWorkflow\w*)\((\d+)\)")
_CORE_MESSAGE = re.compile(r'message: "(.*?)", source:', re.DOTALL)


def _core_message(failure: BaseException) -> str:
    text = str(failure)
    m = _CORE_MESSAGE.search(text)
    return (m.group(1) if m else text).strip()


def _event_for_seq(events: Iterable[HistoryEvent], kind: str, seq: int) -> HistoryEvent | None:
    children = 0
    for ev in events:
        t = ev.event_type
        if (
            kind == "LocalActivity"
            and t == EventType.EVENT_TYPE_MARKER_RECORDED
            and ev.marker_recorded_event_attributes.marker_name == _LA_MARKER
        ):
            if _marker_data(ev, "data").get("seq") == seq:
                return ev
        elif kind == "Activity" and t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if ev.activity_task_scheduled_event_attributes.activity_id == str(seq):
                return ev
        elif kind == "Timer" and t == EventType.EVENT_TYPE_TIMER_STARTED:
            if ev.timer_started_event_attributes.timer_id == str(seq):
                return ev
        elif (
            kind.startswith("ChildWorkflow")
            and t == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ):
            children += 1
            if children == seq:
                return ev
    return None


def divergence_of(
    failure: BaseException, history: WorkflowHistory, commands: list[WorkflowCommand]
) -> Divergence | None:
    """The first diverging event of `history` under `failure`, and what the code (`commands`) did there.

    None for a failure that is not a nondeterminism error (e.g. the workflow task raised) when neither its
    message nor the commands point at an event."""
    message = _core_message(failure)
    history_cmds = [(ev, lab) for ev in history.events if (lab := _event_label(ev)) is not None]
    code = [lab for c in commands if (lab := _command_label(c)) is not None]
    by_id = {ev.event_id: ev for ev in history.events}
    named: HistoryEvent | None = None
    if (m := _EVENT_IN_MESSAGE.search(message)) is not None:
        named = by_id.get(int(m.group(1) or m.group(2)))
    elif (m := _SEQ_IN_MESSAGE.search(message)) is not None:
        named = _event_for_seq(history.events, m.group(1), int(m.group(2)))
    first_mismatch = next(
        (i for i, (_ev, lab) in enumerate(history_cmds) if i >= len(code) or code[i] != lab), None
    )
    if named is None and first_mismatch is None and not isinstance(failure, workflow.NondeterminismError):
        return None
    index: int | None
    if named is not None:
        index = next((i for i, (ev, _lab) in enumerate(history_cmds) if ev.event_id == named.event_id), None)
        target: HistoryEvent | None = named
    else:
        index = first_mismatch
        target = history_cmds[index][0] if index is not None else None
    if index is not None:
        did = _describe_command(code[index] if index < len(code) else None)
    elif first_mismatch is None and len(code) > len(history_cmds):
        did = _describe_command(code[len(history_cmds)])
    else:
        did = "(the recorded commands do not show it)"
    if target is None:
        if len(code) > len(history_cmds):
            return Divergence(
                None,
                f"past the end of the history ({_EVENT_WORDS[code[len(history_cmds)][0]]} "
                "expected by the code)",
                did,
                message,
            )
        return Divergence(None, "(not found in the history)", did, message)
    return Divergence(target.event_id, _describe_event(target), did, message)


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
