"""Rebuilding a session's host (`sandbox.sessions` says when and why): the identity of its starting point,
a fresh host started from it (with the inherited export of a child session), the latest snapshot restored
and the later journal entries replayed, and the periodic snapshots that bound that replay.

Bounded recovery (`snapshot_every=N`): after every N-th journaled cell the host is asked for a
snapshot of its namespace (`sandbox.host.snapshot`: picklable user variables, helpers as source,
references into the preloaded data), written atomically next to the journal as
`snapshot-<seq>.pkl` with a `.json` sidecar holding the host's starting point. Recovery then loads
the latest snapshot with seq < current and replays only the later entries. Snapshots are skipped
whenever they could not reproduce the state exactly (a function or class defined in a cell, a
generator, ...): the full replay stays the fallback, so correctness never depends on them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.archive import ArchiveGrants
from sandbox.capacity import host_memory
from sandbox.eviction import next_pause
from sandbox.journal import Journal, RebuildFailed, inherit_digest, load_inherit
from sandbox.protocol import Executor, ExecutorFactory, Inherit, SandboxLimits

__all__ = ["fresh_host", "replay_journal", "take_snapshot"]

# Results after which the host's state is not the journal's state: discard the host.
_DISCARD_KINDS = frozenset({"timeout", "crash", "memory"})


@dataclass
class _Live:
    executor: Executor
    last_seq: int
    start_key: str
    idle_since: float = field(default_factory=time.monotonic)  # when its last cell (or export) ended
    pause_s: float | None = None  # its session's usual pause between cells (`sandbox.eviction`)
    memory: int = 0  # bytes, after its last cell (`measure`)
    host_pid: int | None = None

    def busy(self) -> None:
        """A cell begins: the pause that ends here joins the session's estimate."""
        self.pause_s = next_pause(self.pause_s, time.monotonic() - self.idle_since)

    def idle(self) -> None:
        self.idle_since = time.monotonic()

    def measure(self) -> None:
        """Read the host's memory (`sandbox.capacity.host_memory`; its pid is looked up once)."""
        if self.host_pid is None:
            self.host_pid = getattr(self.executor, "host_pid", None)
        self.memory = host_memory(self.host_pid)


@dataclass
class _Stats:
    rebuilds: int = 0
    cells_replayed: int = 0
    evictions: int = 0
    snapshots_written: int = 0
    snapshots_refused: int = 0
    snapshots_restored: int = 0
    snapshot_restore_failures: int = 0


async def fresh_host(
    factory: ExecutorFactory,
    trace_path: str | None,
    trace_format: str,
    extra_vars: dict[str, Any],
    limits: SandboxLimits,
    inherit: bytes | os.PathLike[str] | None = None,
    grants: ArchiveGrants | None = None,
) -> Executor:
    """A new host at the session's starting point (no cell run); `RebuildFailed` if it cannot start."""
    executor = factory(limits)
    if grants is not None and hasattr(executor, "archive_allowed"):
        executor.archive_allowed = grants.allows  # the archived transcripts this session may read
    try:
        if inherit is None:
            await executor.start(trace_path, trace_format, extra_vars)
        else:  # an Executor that takes an inherited namespace (SubprocessExecutor does)
            start: Any = executor.start
            await start(trace_path, trace_format, extra_vars, inherit=inherit)
    except Exception as exc:
        await executor.close()
        raise RebuildFailed(f"the sandbox could not be started: {exc}") from None
    return executor


async def replay_journal(
    fresh: Callable[[], Awaitable[Executor]],
    journal: Journal,
    stats: _Stats,
    session_id: str,
    seq: int,
    start_key: str,
    entries: list[tuple[int, str]],
) -> tuple[Executor, int, int]:
    """A host from `fresh()` brought to the state after the `entries` (all < seq): the latest snapshot of
    the same starting point restored, then the later entries replayed. A failed restore starts over in
    another host with a full replay. Returns (the host, entries replayed, the snapshot's seq or 0);
    `RebuildFailed` (the host closed) when it cannot start or a replayed cell is discarded."""
    executor = await fresh()
    snap_seq = 0
    snapshot = journal.latest_snapshot_path(session_id, seq, start_key) if entries else None
    if snapshot is not None:
        snap_seq, snap_path = snapshot  # sent from the file in chunks, never read whole here
        restore = getattr(executor, "restore", None)
        resp = await restore(snap_path) if restore is not None else {"ok": False}
        if resp.get("ok"):
            stats.snapshots_restored += 1
            entries = [(s, c) for s, c in entries if s > snap_seq]
        else:  # never trust a half-restored host: start over with a full replay
            stats.snapshot_restore_failures += 1
            snap_seq = 0
            await executor.close()
            executor = await fresh()
    for entry_seq, code in entries:
        replay = await executor.run_cell(code)
        if replay.error_kind in _DISCARD_KINDS:
            await executor.close()
            raise RebuildFailed(
                f"the session could not be rebuilt: replaying cell {entry_seq} failed with "
                f"{replay.error_kind}: {replay.error}"
            )
    return executor, len(entries), snap_seq


async def take_snapshot(
    journal: Journal,
    io: Callable[..., Awaitable[Any]],
    stats: _Stats,
    session_id: str,
    seq: int,
    live: _Live,
    keep_from: int,
    meta: dict[str, Any],
) -> None:
    """Ask the live host for a snapshot of its namespace after cell `seq` and write it beside the journal
    (`io` runs a journal operation); a refused snapshot is noted in `meta` (the full replay stays)."""
    take = getattr(live.executor, "snapshot", None)
    if take is None:
        return
    t0 = time.perf_counter()
    take_to = getattr(live.executor, "snapshot_to", None)
    if take_to is not None:  # streamed into the session's directory: never whole in worker memory
        path, resp = await take_to(journal.session_dir(session_id))
        if path is None:
            stats.snapshots_refused += 1
            meta["snapshot"] = f"skipped: {resp.get('error')}"
            return
        size = path.stat().st_size
        try:
            await io(journal.adopt_snapshot, session_id, seq, live.start_key, path, keep_from=keep_from)
        finally:
            path.unlink(missing_ok=True)  # adopted: already renamed away
    else:
        blob, resp = await take()
        if blob is None:
            stats.snapshots_refused += 1
            meta["snapshot"] = f"skipped: {resp.get('error')}"
            return
        size = len(blob)
        await io(journal.write_snapshot, session_id, seq, live.start_key, blob, keep_from=keep_from)
    stats.snapshots_written += 1
    meta["snapshot_ms"] = (time.perf_counter() - t0) * 1000
    meta["snapshot_bytes"] = size


async def _inherit_source(inherit: Inherit | None) -> bytes | os.PathLike[str] | None:
    """What a host is started with: the export's file stays a path (the executor sends it in chunks
    and never holds it, whatever size the parent's host wrote), bytes stay bytes; an unreadable file
    is `RebuildFailed`, as `load_inherit` says."""
    if inherit is None or isinstance(inherit, bytes | bytearray | memoryview):
        return await load_inherit(inherit)
    path = Path(inherit)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise RebuildFailed(f"the inherited namespace could not be read: {exc}") from None
    return path


def _start_key(
    trace_path: str | None,
    trace_format: str,
    extra_vars: dict[str, Any],
    limits: SandboxLimits,
    inherit: Inherit | None = None,
) -> str:
    """Identity of a host's starting point: a live host started differently cannot take the fast path."""
    parts: list[Any] = [trace_path, trace_format, extra_vars, repr(limits)]
    if inherit is not None:  # sessions without one keep the key (and the snapshots) they had
        parts.append({"inherit": inherit_digest(inherit)})
    return json.dumps(parts, sort_keys=True, default=repr)
