"""`rr gc`: remove from the blob store what no retained workflow needs any more.

What the store holds (layout: `reflector.runtime.storage.blobs`) and what names each thing:

| kind | where | named by |
|---|---|---|
| trace | `sha256/` | a `TraceRef` (`blob:sha256:<hex>`): a reflection's input, a batch manifest |
| payload | `sha256/` | an external-storage reference (`rr-blobs` claim) anywhere in a history |
| sandbox-init | `sha256/` | `init_ref` (the prepare activity's result, a continuation) |
| export | `sha256/` | `export_ref`, a child's `inherit_ref` |
| archive | `sha256/` | `archive_ref` (summarise's result), `ARCHIVE("<hex>")` in a cell (journal) |
| batch-manifest, batch-record(s) | `sha256/` | a batch's `ManifestRef`, its cursor's `record_pages`, `record_run` results |
| derived:<suffix> (a trace index) | `sha256/<xx>/<hex>.<suffix>` | its source blob (`blobs.derived_source`) |
| journal | `sessions/<session key>/` | the workflow id (`contract.session_key`): cell journal and snapshots |
| response-cache | `responses/<session key>/` | the workflow id: cached model responses |
| temp | dot-files (`blobs.TEMP_PREFIXES`) | nobody: a write in progress, or the leftover of one |
| unknown | anything else | never removed |

A blob's kind is read from its first bytes (for the report only: no decision depends on it).

What is kept:
1. every blob whose sha256 appears, as 64 hex characters in any form (`blob:sha256:<hex>`, a bare
   `init_ref`, a claim, `ARCHIVE("<hex>")`), in the history of a *retained* execution: every
   execution the server lists in the namespace, running or closed and still within retention
   (children and each run of a continue-as-new chain are executions of their own). Externally stored
   payloads are read from the store and scanned too;
2. the journal and the response cache of every retained execution's workflow id;
3. everything younger than the grace period (`--min-age`, default 1 h): a client uploads a trace
   before its workflow starts, a worker writes a blob before the history records its name (storing a
   blob again refreshes it, `BlobStore.put_bytes`). Age is counted from the newest *status change*
   (ctime) in the item, which the kernel sets to "now" on every write, rename or utime: a modification
   time can be set to any value by whoever may change the file (a breached sandbox host keeps a non-root
   worker's uid), so a back-dated blob would look old and be removed while a workflow is about to name
   it, and a forward-dated one would never age; a ctime can only be made younger;
4. every unknown file;
5. transitively, every blob named inside something kept (a manifest lists traces, a payload holds an
   input, a journal holds `ARCHIVE` cells, an unknown file may name anything); traces (blobs named by a
   `TraceRef`) and derived files are not read for names;
6. every derived file whose source is kept (or named), and the source of every kept derived file,
   except a trace index of an older format (`index-v<N>` below `INDEX_VERSION`): this rr never reads
   it and builds the current one when it needs it.
Everything else is removed: old blobs nothing names, journals and response caches of executions the
server no longer has, old temp files.

Fail closed: if listing the executions, reading any history or any payload it stores in this store
fails (or a payload is stored elsewhere), `GCRefused` is raised before anything is removed.

Removal (`remove_item`) renames the item away, checks its mtime again and only then deletes it: a
blob stored again meanwhile (its mtime refreshed) is put back. The store must belong to this
namespace: blobs that only another namespace's (or server's) workflows name are not seen.

`decide` is the pure part: the store's listing, the references and a reader of the names inside a kept
item go in, a `Plan` comes out. `reflector.runtime.storage.inventory` lists the store (`scan_store`), reads
names in files and removes an item; `collect_references` reads the server; `run_gc` runs them in order.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reflector.analysis.traces.index_file import INDEX_VERSION
from reflector.runtime.gc_sources import (
    Execution,
    GCRefused,
    References,
    TemporalSource,
    WorkflowSource,
    collect_references,
)
from reflector.runtime.storage.inventory import (
    KIND_OTHER,
    KIND_TRACE,
    Item,
    Names,
    StoreReader,
    remove_item,
    scan_store,
)

__all__ = [
    "DEFAULT_MIN_AGE_S",
    "GCRefused",
    "References",
    "Verdict",
    "Plan",
    "Tally",
    "Report",
    "Execution",
    "WorkflowSource",
    "TemporalSource",
    "decide",
    "collect_references",
    "execute",
    "run_gc",
    "parse_duration",
    "render_report",
]


DEFAULT_MIN_AGE_S = 3600.0


# why an item is kept
UNKNOWN = "not a file rr writes (never removed)"


YOUNG = "younger than the grace period"


REFERENCED = "named in a retained workflow's history"


RETAINED_SESSION = "session of a retained workflow"


NAMED = "named inside a kept blob or session"


DERIVED = "derived from a kept blob"


SOURCE = "source of a kept derived file"


@dataclass(frozen=True)
class Verdict:
    item: Item
    keep: bool
    reason: str


@dataclass
class Tally:
    count: int = 0
    bytes: int = 0

    def add(self, item: Item) -> None:
        self.count += 1
        self.bytes += item.size


def _tally(items: Iterable[Item]) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    for item in items:
        out.setdefault(item.kind, Tally()).add(item)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Plan:
    verdicts: tuple[Verdict, ...]

    @property
    def removals(self) -> list[Item]:
        return [v.item for v in self.verdicts if not v.keep]

    @property
    def kept(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.keep]


def decide(
    items: Iterable[Item],
    refs: References,
    *,
    now: float,
    min_age_s: float,
    names_in: Callable[[Item], Names],
) -> Plan:
    """Which items to keep and why; the rest is removed (see the module doc for the rules).

    `names_in(item)` returns the names inside an item; it is asked only about kept items, at most once
    each, and never about a trace or a derived file.
    """
    items = list(items)
    blobs = {i.key: i for i in items if i.unit == "blob"}
    derived: dict[str, list[Item]] = {}
    for i in items:
        if i.unit == "derived" and not _superseded(i):
            derived.setdefault(i.key, []).append(i)
    traces = set(refs.traces)
    why: dict[str, str] = {}
    queue: list[Item] = []

    def keep(item: Item, reason: str) -> None:
        if item.path not in why:
            why[item.path] = reason
            queue.append(item)

    def keep_named(name: str) -> None:
        blob = blobs.get(name)
        if blob is not None:
            keep(blob, NAMED)
        for d in derived.get(name, ()):  # also when the source itself is gone
            keep(d, DERIVED)

    for item in items:
        if item.unit == "unknown":
            keep(item, UNKNOWN)
        elif now - item.age_mark < min_age_s:
            keep(item, YOUNG)
        elif _superseded(item):
            continue
        elif item.unit in ("blob", "derived") and item.key in refs.blobs:
            keep(item, REFERENCED if item.unit == "blob" else DERIVED)
        elif item.unit in ("journal", "responses") and item.key in refs.sessions:
            keep(item, RETAINED_SESSION)
    while queue:
        item = queue.pop()
        if item.unit == "derived":
            source = blobs.get(item.key)
            if source is not None:
                keep(source, SOURCE)
            continue
        if item.unit == "blob":
            for d in derived.get(item.key, ()):
                keep(d, DERIVED)
            if item.key in traces:
                continue
        found = names_in(item)
        traces |= found.traces
        for name in found.blobs:
            keep_named(name)
    verdicts = []
    for item in items:
        if item.unit == "blob" and item.key in traces and item.kind == KIND_OTHER:
            item = Item(item.path, item.unit, KIND_TRACE, item.size, item.mtime, item.key, item.changed)
        reason = why.get(item.path)
        verdicts.append(Verdict(item, reason is not None, reason or _removal_reason(item)))
    return Plan(tuple(verdicts))


_INDEX_KIND = re.compile(r"derived:index-v(\d+)")


def _superseded(item: Item) -> bool:
    """A trace index of an older format than this rr's (`index_file.INDEX_VERSION`)."""
    m = _INDEX_KIND.fullmatch(item.kind) if item.unit == "derived" else None
    return m is not None and int(m.group(1)) < INDEX_VERSION


def _removal_reason(item: Item) -> str:
    if item.unit == "temp":
        return "an unfinished write older than the grace period"
    if _superseded(item):
        return "a trace index of an older format (the current one is built when needed)"
    if item.unit in ("journal", "responses"):
        return "session of no retained workflow"
    if item.unit == "derived":
        return "its source blob is removed"
    return "named by no retained workflow"


@dataclass
class Executed:
    removed: list[Item] = field(default_factory=list)
    spared: list[tuple[Item, str]] = field(default_factory=list)


def execute(
    root: Path, items: Iterable[Item], *, min_age_s: float, clock: Callable[[], float] = time.time
) -> Executed:
    done = Executed()
    for item in items:
        try:
            why = remove_item(root, item, min_age_s=min_age_s, clock=clock)
        except OSError as e:  # e.g. a file of another user: the rest is still removed
            why = f"could not be removed: {e.strerror or e}"
        if why is None:
            done.removed.append(item)
        else:
            done.spared.append((item, why))
    return done


@dataclass
class Report:
    store: str
    namespace: str
    dry_run: bool
    min_age_s: float
    executions: int = 0
    running: int = 0
    removed: dict[str, Tally] = field(default_factory=dict)  # by kind: removed (dry run: would be)
    kept: dict[str, Tally] = field(default_factory=dict)
    kept_reasons: dict[str, int] = field(default_factory=dict)
    removed_paths: list[str] = field(default_factory=list)
    spared: list[str] = field(default_factory=list)  # condemned, then found written again: kept

    def to_json(self) -> dict[str, Any]:
        def tallies(t: dict[str, Tally]) -> dict[str, dict[str, int]]:
            return {k: {"count": v.count, "bytes": v.bytes} for k, v in t.items()}

        return {
            "store": self.store,
            "namespace": self.namespace,
            "dry_run": self.dry_run,
            "min_age_s": self.min_age_s,
            "executions": self.executions,
            "running": self.running,
            "removed": tallies(self.removed),  # a dry run: what would be removed
            "kept": tallies(self.kept),
            "kept_reasons": self.kept_reasons,
            "paths": self.removed_paths,
            "spared": self.spared,
        }


async def run_gc(
    source: WorkflowSource,
    root: Path | str,
    *,
    min_age_s: float = DEFAULT_MIN_AGE_S,
    dry_run: bool = False,
    clock: Callable[[], float] = time.time,
) -> Report:
    """List the store, read the server, decide, and (unless `dry_run`) remove. `GCRefused`: nothing removed."""
    if min_age_s < 0:
        raise ValueError(f"min_age_s must be >= 0, got {min_age_s}")
    root = Path(root)
    now = clock()  # before the listing: an item is judged by its age when the store was read
    items = scan_store(root)
    reader = StoreReader(root, items)
    refs = await collect_references(source, reader)
    plan = decide(items, refs, now=now, min_age_s=min_age_s, names_in=reader.names_in)
    report = Report(str(root), source.namespace, dry_run, min_age_s, refs.executions, refs.running)
    removals = plan.removals
    kept = [v.item for v in plan.kept]
    if not dry_run:
        done = execute(root, removals, min_age_s=min_age_s, clock=clock)
        removals = done.removed
        kept += [item for item, _why in done.spared]
        report.spared = [item.path for item, _why in done.spared]
    report.removed, report.kept = _tally(removals), _tally(kept)
    report.removed_paths = [i.path for i in removals]
    for v in plan.kept:
        report.kept_reasons[v.reason] = report.kept_reasons.get(v.reason, 0) + 1
    return report


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in `30`, `90s`, `15m`, `1h`, `2d` (ValueError otherwise)."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"not a duration: {text!r} (e.g. 3600, 90s, 15m, 1h, 2d)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def render_report(report: Report) -> str:
    head = "would remove (dry run)" if report.dry_run else "removed"
    total = Tally(
        sum(t.count for t in report.removed.values()), sum(t.bytes for t in report.removed.values())
    )
    lines = [
        f"gc of {report.store}: {report.executions} retained workflow executions ({report.running} running) "
        f"in namespace {report.namespace!r}; grace period {report.min_age_s:g} s",
        f"{head}: {total.count} items, {_size(total.bytes)}",
    ]
    lines += [f"  {kind:<16} {t.count:>7}  {_size(t.bytes):>10}" for kind, t in report.removed.items()]
    kept = Tally(sum(t.count for t in report.kept.values()), sum(t.bytes for t in report.kept.values()))
    lines.append(f"kept: {kept.count} items, {_size(kept.bytes)}")
    lines += [f"  {kind:<16} {t.count:>7}  {_size(t.bytes):>10}" for kind, t in report.kept.items()]
    lines += [f"  {n:>7} {reason}" for reason, n in sorted(report.kept_reasons.items())]
    if report.spared:
        lines.append(f"spared: {len(report.spared)} items written again while gc ran")
    return "\n".join(lines) + "\n"
