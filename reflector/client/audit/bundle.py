"""One reflection's histories as data (`RunHistory`, `HistoryBundle`) and as the export file that holds them
(`reflector.client.audit.histories` reads them from the server).

The export file (`rr export`) is a JSON object

    {"rr_export": 1, "root": <workflow id>, "histories": [
        {"workflow_id", "run_id", "parent_workflow_id", "chain_index", "workflow_type", "events": [...]}, ...]}

where each entry's `{"events": [...]}` is exactly Temporal's JSON history format (what
`temporal workflow show --output json` prints and `WorkflowHistory.from_json` reads). `load_bundle` reads
such a file or one plain Temporal JSON history.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import WorkflowHistory

__all__ = [
    "EXPORT_VERSION",
    "CLOSE_EVENTS",
    "BundleError",
    "RunHistory",
    "HistoryBundle",
    "BundleWriter",
    "dump_bundle",
    "load_bundle",
    "plain_history_json",
    "split_file_name",
    "write_split_file",
]

EXPORT_VERSION = 1

CLOSE_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


class BundleError(ValueError):
    """A file that is not an `rr export` file nor a Temporal JSON history (one line, for the CLI)."""


@dataclass(frozen=True)
class RunHistory:
    workflow_id: str
    run_id: str
    parent_workflow_id: str | None  # None for the root
    chain_index: int  # 0 = first run of this workflow id's continue-as-new chain
    workflow_type: str  # ReflectionWorkflow / BatchReflectionWorkflow
    history: WorkflowHistory  # every external payload inlined

    @property
    def events(self) -> int:
        return len(self.history.events)

    @property
    def running(self) -> bool:
        """The run had not closed when its history was read: a partial history."""
        events = self.history.events
        return not events or events[-1].event_type not in CLOSE_EVENTS

    @property
    def continued(self) -> bool:
        """The run ended by continuing as new (a later run of the chain follows)."""
        events = self.history.events
        return (
            bool(events) and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        )


@dataclass(frozen=True)
class HistoryBundle:
    root_id: str
    runs: list[RunHistory]  # the root's chain in order, then each child's chain, depth-first in start order

    @property
    def events(self) -> int:
        return sum(r.events for r in self.runs)

    @property
    def running(self) -> list[RunHistory]:
        """The runs whose history is partial (the reflection, or part of it, was still running)."""
        return [r for r in self.runs if r.running]


def _started(history: WorkflowHistory) -> Any:
    if not history.events or not history.events[0].HasField("workflow_execution_started_event_attributes"):
        raise BundleError(
            f"the history of {history.workflow_id} does not begin with WorkflowExecutionStarted"
        )
    return history.events[0].workflow_execution_started_event_attributes


def _events_json(history: WorkflowHistory) -> list[Any]:
    events: list[Any] = json_format.MessageToDict(History(events=history.events)).get("events", [])
    return events


def plain_history_json(run: RunHistory) -> str:
    """One run as a plain Temporal JSON history (`{"events": [...]}`), indented like the temporal CLI prints it."""
    return json.dumps({"events": _events_json(run.history)}, indent=2) + "\n"


def split_file_name(position: int, run: RunHistory) -> str:
    """The file name of `run` in an `rr export --split` directory: bundle order, workflow id, chain index."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run.workflow_id)[:150]
    return f"{position:05d}-{safe}-run{run.chain_index}.json"


def write_split_file(directory: Path, position: int, run: RunHistory) -> Path:
    """Write `run` as a plain Temporal JSON history into `directory` (`rr export --split`); returns its path."""
    path = Path(directory) / split_file_name(position, run)
    path.write_text(plain_history_json(run), encoding="utf-8")
    return path


class BundleWriter:
    """Writes an export file entry by entry (a batch's bundle never has to be held whole)."""

    def __init__(self, out: TextIO, root_id: str) -> None:
        self.out, self.count = out, 0
        out.write(f'{{"rr_export": {EXPORT_VERSION}, "root": {json.dumps(root_id)}, "histories": [')

    def add(self, run: RunHistory) -> None:
        entry = {
            "workflow_id": run.workflow_id,
            "run_id": run.run_id,
            "parent_workflow_id": run.parent_workflow_id,
            "chain_index": run.chain_index,
            "workflow_type": run.workflow_type,
            "events": _events_json(run.history),
        }
        self.out.write(("," if self.count else "") + "\n" + json.dumps(entry, separators=(",", ":")))
        self.count += 1

    def close(self) -> None:
        self.out.write("\n]}\n")


def dump_bundle(bundle: HistoryBundle) -> str:
    """`bundle` as an export file (the text `rr export` writes)."""
    buf = io.StringIO()
    writer = BundleWriter(buf, bundle.root_id)
    for run in bundle.runs:
        writer.add(run)
    writer.close()
    return buf.getvalue()


def _history(workflow_id: str, events: Any, where: str) -> WorkflowHistory:
    if not isinstance(events, list) or not events:
        raise BundleError(f"{where}: no events")
    try:
        return WorkflowHistory.from_json(workflow_id, {"events": events})
    except (json_format.ParseError, KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{where}: not a Temporal JSON history ({str(e).splitlines()[0][:200]})") from None


def _entries(data: dict[str, Any], path: Path) -> Iterator[RunHistory]:
    version = data.get("rr_export")
    if version != EXPORT_VERSION:
        raise BundleError(
            f"{path}: rr export format {version!r} is not supported (this rr reads {EXPORT_VERSION})"
        )
    entries = data.get("histories")
    if not isinstance(entries, list):
        raise BundleError(f"{path}: an rr export file without a list of histories")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("workflow_id"), str):
            raise BundleError(f"{path}: history {i} is not an export entry (no workflow_id)")
        history = _history(e["workflow_id"], e.get("events"), f"{path}: history {i} ({e['workflow_id']})")
        started = _started(history)
        yield RunHistory(
            workflow_id=e["workflow_id"],
            run_id=str(e.get("run_id") or started.original_execution_run_id),
            parent_workflow_id=e.get("parent_workflow_id"),
            chain_index=int(e.get("chain_index") or 0),
            workflow_type=str(e.get("workflow_type") or started.workflow_type.name),
            history=history,
        )


def _plain(data: dict[str, Any], path: Path) -> RunHistory:
    history = _history(path.stem, data.get("events"), str(path))
    started = _started(history)
    workflow_id = (
        started.workflow_id or path.stem
    )  # servers record the id in the start event; older ones did not
    if workflow_id != history.workflow_id:
        history = WorkflowHistory(workflow_id, history.events)
    parent = started.parent_workflow_execution.workflow_id or None
    return RunHistory(
        workflow_id=workflow_id,
        run_id=started.original_execution_run_id,
        parent_workflow_id=parent,
        # a single history does not say where in its chain it stands: 0 for a first run, 1 for any later one
        chain_index=1 if started.continued_execution_run_id else 0,
        workflow_type=started.workflow_type.name,
        history=history,
    )


def load_bundle(path: Path) -> HistoryBundle:
    """An `rr export` file, or ONE plain Temporal JSON history (`temporal workflow show --output json`,
    a file of `rr export --split`), as a bundle. Raises `BundleError` (one line) for anything else.

    A directory (of `rr export --split`) gives the runs of its `*.json` files in name order."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise BundleError(f"{path}: a directory without *.json history files")
        runs = [run for f in files for run in load_bundle(f).runs]
        roots = [r for r in runs if r.parent_workflow_id is None]
        return HistoryBundle((roots or runs)[0].workflow_id, runs)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{path}: not a text (JSON) file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BundleError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise BundleError(
            f"{path}: neither an rr export file nor a Temporal JSON history (a JSON {type(data).__name__})"
        )
    if "rr_export" in data:
        runs = list(_entries(data, path))
        root = data.get("root")
        return HistoryBundle(str(root) if root else (runs[0].workflow_id if runs else path.stem), runs)
    if "events" in data:
        run = _plain(data, path)
        return HistoryBundle(run.workflow_id, [run])
    raise BundleError(
        f'{path}: neither an rr export file (no "rr_export") nor a Temporal JSON history (no "events")'
    )
