"""`SessionManager`: live sandbox hosts per session, made durable by a journal of completed cells.

Why a journal and not snapshots: namespaces hold functions, classes and generators that do not
serialise, but cells are deterministic (fixed hash seed, no clock, no randomness), so replaying the
source of every completed cell in a fresh host rebuilds the same state. The journal is the cell
source keyed by the workflow-assigned `seq`, written atomically after the cell completed in a live
host. Cells that were killed (timeout, crash) or ran out of memory are *not* journaled and their host
is discarded, so in every path - crashed or not - their effects are gone and the next cell sees
exactly the state of the previous completed cells.

Fast path: the live host for the session has run exactly seq-1 -> run the cell directly.
Recovery path (new worker, dead host, retry of the same seq, host evicted above the cap: `sandbox.eviction`
says which): fresh host, replay the journal entries with seq < current in order (output discarded), then
run the cell.

Bounded recovery (`snapshot_every=N`): a periodic snapshot of the host's namespace lets a recovery replay
only the later entries (`sandbox.recovery` says how, and why correctness never depends on it).

First-cell latency: new hosts come from a `HostPool` of pre-spawned idle hosts (`pool_size`).

Child sessions (`recurse`): `export_namespace(parent, seq, ...)` returns a self-contained copy of the
parent's state after cell `seq` (bytes; see `sandbox.host.snapshot.take_export`) without running or
journaling anything; a child's `run_cell(..., inherit=those bytes)` loads it into every host it starts
for the session, right after `start` and before the snapshot / journal replay, so the inherited state is
part of the child's starting point (its start key includes the export's digest: a live host started with
another `inherit` is never reused, snapshots likewise). The child only ever holds a copy.

Archived transcripts: hosts get `archive_root` (the blob store) so cells can run `history.extend(ARCHIVE(
"<sha256>"))`, journaled like any other and replayed from the same immutable blob (kept while rebuildable).

Durability (`fsync`): `sandbox.journal` says what a session keeps with and without it; fsync costs a disk
flush per cell (~9% of the worker's CPU under load), so workers on one machine may prefer `fsync=False`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import tempfile
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sandbox import isolation as isolation_defaults
from sandbox.archive import GRANTS_SUFFIX, ArchiveGrants
from sandbox.eviction import Parking, eviction_order, over_cap
from sandbox.executor import SubprocessExecutor
from sandbox.isolation import IsolationMode
from sandbox.journal import Journal, RebuildFailed, Replica
from sandbox.pool import HostPool
from sandbox.protocol import (
    MAX_LIVE_HOSTS,
    SESSION_ID_PATTERN,
    CellResult,
    Executor,
    ExecutorFactory,
    Inherit,
    SandboxLimits,
)
from sandbox.recovery import _DISCARD_KINDS as _DISCARD_KINDS  # activities/rerun.py reads it here
from sandbox.recovery import (
    _inherit_source,
    _Live,
    _start_key,
    _Stats,
    fresh_host,
    replay_journal,
    take_snapshot,
)

T = TypeVar("T")

__all__ = [
    "SessionManager",
    "RESTORED_NOTE",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_SNAPSHOT_EVERY",
    "SandboxExportError",
]

DEFAULT_POOL_SIZE = 2
DEFAULT_SNAPSHOT_EVERY = 25
RESTORED_NOTE = (
    "the session state was restored from the previous cells (this cell's effects are discarded; "
    "variables from earlier completed cells are intact)"
)
_SESSION_ID = re.compile(SESSION_ID_PATTERN)


class SandboxExportError(RuntimeError):
    """The namespace could not be exported (the session cannot be rebuilt, or the host failed)."""


class SessionManager:
    """Maps session ids to live executors and rebuilds them from the on-disk journal when needed."""

    def __init__(
        self,
        journal_root: str | os.PathLike[str],
        *,
        executor_factory: ExecutorFactory | None = None,
        max_live: int = MAX_LIVE_HOSTS,
        host_memory: int | None = None,
        fsync: bool = True,
        pool_size: int = DEFAULT_POOL_SIZE,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        archive_root: str | os.PathLike[str] | None = None,
        isolation: IsolationMode | None = None,
        zygote: bool = True,
        replica: Replica | None = None,
        archive_fetch: Callable[[str], object] | None = None,
        grants_fetch: Callable[[Path], object] | None = None,
    ) -> None:
        """`pool_size` idle hosts are kept warm (default factory only; 0 disables the pool); `snapshot_every`
        cells a snapshot bounds the replay on recovery (0 disables snapshots); `archive_root` is the blob store
        `ARCHIVE(sha256)` reads from (default factory only; None: `ARCHIVE` raises a clear error in the cell);
        `isolation`: the OS layer of the hosts (default factory only; None: `sandbox.isolation.DEFAULT_MODE`,
        `auto`; the worker passes its `RR_SANDBOX_ISOLATION`); `zygote`: fork the hosts from the worker's fork
        server (default factory only; `sandbox.zygote`; the worker passes its `RR_SANDBOX_ZYGOTE`).
        `max_live`: live hosts kept (those whose next cell is furthest off are stopped first,
        `sandbox.eviction`; the worker passes its `RR_MAX_LIVE_SANDBOXES`); `host_memory`: bytes per host on
        average (the worker's `HOST_MEMORY_BYTES`): hosts also stop while theirs exceeds `max_live` x that.

        `fsync`: flush every journal entry, snapshot and their directory to disk first (`sandbox.journal`).
        """
        self.journal = Journal(journal_root, fsync=fsync, replica=replica)
        self.journal_root = self.journal.root
        self.archive_root = Path(archive_root) if archive_root is not None else None
        self.archive_fetch = archive_fetch
        self.grants_fetch = grants_fetch  # brings an inherited export's grants file (`ArchiveGrants`) from S3
        self.snapshot_every = max(0, snapshot_every)
        self.pool: HostPool | None = None
        self.isolation: IsolationMode = isolation or isolation_defaults.DEFAULT_MODE
        self.zygote = zygote
        if executor_factory is None:
            self.pool = (
                HostPool(pool_size, isolation=self.isolation, zygote=zygote) if pool_size > 0 else None
            )
            executor_factory = self._pooled_factory
        self._factory = executor_factory
        self._max_live = max(1, max_live)
        self._max_memory = None if host_memory is None else self._max_live * host_memory
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._parked = Parking(4 * self._max_live)
        self._locks: dict[str, asyncio.Lock] = {}
        self.stats = _Stats()

    def _pooled_factory(self, limits: SandboxLimits) -> Executor:
        return SubprocessExecutor(
            limits,
            restart_note=RESTORED_NOTE,
            pool=self.pool,
            index_data=self.snapshot_every > 0,
            archive_root=self.archive_root,
            archive_fetch=self.archive_fetch,
            isolation=self.isolation,
            zygote=self.zygote,
        )

    # -- public API --------------------------------------------------------------------------------
    async def prewarm(self) -> None:
        """Fill the host pool and wait until it is warm (optional: it also fills on first use)."""
        if self.pool is not None:
            await self.pool.wait_full()

    async def run_cell(
        self,
        session_id: str,
        seq: int,
        code: str,
        *,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        limits: SandboxLimits,
        inherit: Inherit | None = None,
    ) -> CellResult:
        """Run cell number `seq` (1-based, assigned by the workflow) of a session.

        Idempotent per seq: retrying a seq after a crash re-runs it on the state of cells < seq, so a
        cell like `counter += 1` is never applied twice.

        `inherit`: for a child session, the parent's export (`export_namespace`), as bytes or as the
        path of the immutable blob holding them; pass the same value with every cell of the session.
        It is loaded into each host started for the session before the journal replay.
        """
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        if seq < 1:
            raise ValueError("seq starts at 1")
        async with self._lock(session_id):
            start_key = _start_key(trace_path, trace_format, extra_vars, limits, inherit)
            live = self._live.get(session_id)
            rebuilt: dict[str, Any] | None = None
            result: CellResult | None = None
            if (
                live is not None
                and live.last_seq == seq - 1
                and live.start_key == start_key
                and live.executor.alive
            ):
                self._live.move_to_end(session_id)
                live.busy()
                await self._io(self.journal.forget, session_id, seq, only_this=True)
                result = await live.executor.run_cell(code)
                if result.error_kind == "crash":
                    # The host may have died before this cell (killed between cells, OOM killer):
                    # rebuild from the journal and run the cell once more on a known state.
                    result = None
            if result is None:
                await self._drop(session_id)
                try:
                    live, rebuilt = await self._rebuild(
                        session_id, seq, start_key, trace_path, trace_format, extra_vars, limits, inherit
                    )
                except RebuildFailed as exc:
                    return CellResult(ok=False, error_kind="crash", error=str(exc), host_restarted=True)
                result = await live.executor.run_cell(code)
            assert live is not None
            return await self._after(session_id, seq, code, live, result, rebuilt)

    async def export_namespace(
        self,
        session_id: str,
        seq: int,
        *,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        limits: SandboxLimits,
        inherit: Inherit | None = None,
    ) -> tuple[bytes, list[str]]:
        """Export the session's state after cell `seq` for a child session: (bytes, skipped names).

        `seq` is the last cell the session completed (0: the starting state); the start arguments
        (including the session's own `inherit`, if it is itself a child) are those of its `run_cell`.
        Uses the live host if it is exactly at `seq`, else rebuilds it from the journal entries
        <= seq (snapshot + replay, as `run_cell` does); runs no cell, and writes or removes no
        journal entry. The bytes hold the non-callable user variables (by value), `history` and the
        registered helpers (by source); `skipped` names the user variables not carried (functions
        and classes defined in cells, modules, unpicklable values; `history` if some of its items
        were dropped). The scaffolding (`traces`, extra variables, preloaded functions) is never
        exported. Raises `SandboxExportError` if the state cannot be rebuilt or the host fails.

        The bytes are read back from `export_to_file`'s file (kept for tests and callers that want
        bytes; the worker's export activity streams the file into the blob store instead).
        """
        with tempfile.TemporaryDirectory(prefix="rr-export-") as directory:
            path, skipped = await self.export_to_file(
                session_id,
                seq,
                Path(directory),
                trace_path=trace_path,
                trace_format=trace_format,
                extra_vars=extra_vars,
                limits=limits,
                inherit=inherit,
            )
            return await asyncio.to_thread(path.read_bytes), skipped

    async def export_to_file(
        self,
        session_id: str,
        seq: int,
        directory: Path,
        *,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        limits: SandboxLimits,
        inherit: Inherit | None = None,
    ) -> tuple[Path, list[str]]:
        """`export_namespace`, the export streamed into a new file in `directory` (the caller owns it):
        (its path, skipped names). A host's export is host-written bytes of any size up to its memory
        limit; the worker holds one chunk of it at a time."""
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        if seq < 0:
            raise ValueError("seq must be >= 0")
        async with self._lock(session_id):
            start_key = _start_key(trace_path, trace_format, extra_vars, limits, inherit)
            rebuilt = False
            while True:
                live = self._live.get(session_id)
                if not (
                    live is not None
                    and live.last_seq == seq
                    and live.start_key == start_key
                    and live.executor.alive
                ):
                    await self._drop(session_id)
                    rebuilt = True
                    try:
                        live, _ = await self._rebuild(
                            session_id,
                            seq + 1,
                            start_key,
                            trace_path,
                            trace_format,
                            extra_vars,
                            limits,
                            inherit,
                            forget=False,
                        )
                    except RebuildFailed as exc:
                        raise SandboxExportError(str(exc)) from None
                export = getattr(live.executor, "export_to", None)
                if export is None:
                    raise SandboxExportError("this executor cannot export a namespace")
                path, resp = await export(directory)
                if path is not None:
                    self._live.move_to_end(session_id)
                    live.idle()
                    return path, [str(n) for n in resp.get("skipped") or []]
                # Never keep a host whose export failed; a live host that had died gets one rebuild.
                await self._drop(session_id)
                if rebuilt or not resp.get("died"):
                    break
            raise SandboxExportError(f"the namespace could not be exported: {resp.get('error')}")

    async def close_session(self, session_id: str, *, delete_journal: bool = False) -> None:
        """Stop the session's host; optionally delete its journal (the session is over)."""
        async with self._lock(session_id):
            await self._drop(session_id)
            self._parked.forget(session_id)
            if delete_journal:
                await self._io(self.journal.delete, session_id)
        self._locks.pop(session_id, None)

    async def close_all(self) -> None:
        """Stop every live host and the idle pool (journals are kept: a later manager can continue)."""
        for session_id in list(self._live):
            await self.close_session(session_id)
        if self.pool is not None:
            await self.pool.close()

    def executor_for(self, session_id: str) -> Executor | None:
        """The live executor of a session, if any (diagnostics and tests)."""
        live = self._live.get(session_id)
        return live.executor if live else None

    async def grant_archive(self, session_id: str, sha256_hex: str) -> None:
        """Let the session read archived transcript `sha256_hex` (it archived it): a grant file in its journal
        directory, written by the worker only (see `sandbox.archive`), replicated like a journal entry."""
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        directory = self.journal.session_dir(session_id)
        directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"sha256": sha256_hex, "granted_at": time.time()}).encode()
        await self._io(self.journal.write_atomic, directory / ArchiveGrants.grant_name(sha256_hex), data)

    def archive_grants(self, session_id: str, inherit: Inherit | None = None) -> ArchiveGrants:
        """The archived transcripts the session may read: its own grants, and its ancestors' (the grants file
        beside the export it inherits, when that is a content-addressed file; an export given as bytes
        carries none)."""
        inherited = None
        if inherit is not None and not isinstance(inherit, bytes | bytearray | memoryview):
            path = Path(inherit)
            inherited = path.with_name(f"{path.name}.{GRANTS_SUFFIX}")
        return ArchiveGrants(
            self.journal.session_dir(session_id),
            inherited=inherited,
            pull=getattr(self.journal.replica, "pull", None),  # one grant file from S3 (another worker's)
            fetch_inherited=self.grants_fetch,
        )

    def journal_entries(self, session_id: str) -> list[tuple[int, str]]:
        """All journal entries of a session as (seq, code), in seq order."""
        return self.journal.entries(session_id)

    # -- internals ---------------------------------------------------------------------------------
    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A journal operation: inline on local files; on the replica's threads when there is one (network)."""
        if self.journal.replica is None:
            return fn(*args, **kwargs)
        return await self.journal.replica.run(functools.partial(fn, *args, **kwargs))

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    async def _rebuild(
        self,
        session_id: str,
        seq: int,
        start_key: str,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        limits: SandboxLimits,
        inherit: Inherit | None = None,
        *,
        forget: bool = True,
    ) -> tuple[_Live, dict[str, Any]]:
        """A fresh host at the state after the journal entries < seq (registered as live).

        `forget`: remove the entries >= seq first (they are about to be re-run); exports keep them.
        """
        t0 = time.perf_counter()
        synced = await self._io(self.journal.sync, session_id)  # another worker may have run it (replica)
        if forget:
            await self._io(self.journal.forget, session_id, seq, only_this=False)
        entries = [(s, c) for s, c in self.journal_entries(session_id) if s < seq]
        grants = self.archive_grants(session_id, inherit)
        blob = await _inherit_source(inherit)

        def fresh() -> Awaitable[Executor]:
            return fresh_host(self._factory, trace_path, trace_format, extra_vars, limits, blob, grants)

        executor, replayed, snap_seq = await replay_journal(
            fresh, self.journal, self.stats, session_id, seq, start_key, entries
        )
        live = _Live(executor=executor, last_seq=seq - 1, start_key=start_key)
        self._parked.resume(session_id, live)  # evicted before: it keeps its session's rhythm
        self._live[session_id] = live
        self._live.move_to_end(session_id)
        await self._evict(keep=session_id)
        self.stats.rebuilds += 1
        self.stats.cells_replayed += replayed
        info: dict[str, Any] = {
            "cells_replayed": replayed,
            "rebuild_ms": (time.perf_counter() - t0) * 1000,
        }
        if snap_seq:
            info["snapshot_seq"] = snap_seq
        if self.journal.replica is not None:
            info["journal_synced"] = synced
        return live, info

    async def _maybe_snapshot(self, session_id: str, seq: int, live: _Live, meta: dict[str, Any]) -> None:
        if not self.snapshot_every or seq % self.snapshot_every:
            return
        keep_from = seq - self.snapshot_every  # keep the newest two
        await take_snapshot(self.journal, self._io, self.stats, session_id, seq, live, keep_from, meta)

    async def _after(
        self,
        session_id: str,
        seq: int,
        code: str,
        live: _Live,
        result: CellResult,
        rebuilt: dict[str, Any] | None,
    ) -> CellResult:
        if result.error_kind in _DISCARD_KINDS:
            # The host may hold this cell's partial effects (memory) or be dead (timeout, crash):
            # drop it so the next cell rebuilds from the journal, as a crashed worker would.
            await self._drop(session_id)
        meta = dict(result.meta)
        if result.error_kind not in _DISCARD_KINDS:
            await self._io(self.journal.write_entry, session_id, seq, code)
            live.last_seq = seq
            await self._maybe_snapshot(session_id, seq, live, meta)
        meta["seq"] = seq
        restarted = result.host_restarted
        if rebuilt is not None:
            meta.update(rebuilt)
            restarted = True
        live.idle()
        if self._max_memory is not None:
            live.measure()
            if over_cap(
                self._live, self._max_live, self._max_memory
            ):  # this host grew: stop idle others (this one is still the session's)
                await self._evict(keep=session_id)
        return CellResult(
            ok=result.ok,
            stdout=result.stdout,
            error=result.error,
            error_kind=result.error_kind,
            duration_ms=result.duration_ms,
            truncated=result.truncated,
            submitted=result.submitted,
            host_restarted=restarted,
            meta=meta,
        )

    async def _drop(self, session_id: str) -> None:
        live = self._live.pop(session_id, None)
        if live is not None:
            await live.executor.close()

    async def _evict(self, keep: str) -> None:
        """Close idle hosts above the cap, furthest next cell first (`sandbox.eviction`); journals restore them."""
        idle = {sid: live for sid, live in self._live.items() if sid != keep and not self._lock(sid).locked()}
        for session_id in eviction_order(idle, time.monotonic()):
            if not over_cap(self._live, self._max_live, self._max_memory):
                return
            if (live := self._live.get(session_id)) is None or self._lock(session_id).locked():
                continue  # used again while an earlier one was being stopped
            self.stats.evictions += 1
            self._parked.park(session_id, live)
            await self._drop(session_id)
