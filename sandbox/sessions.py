"""`SessionManager`: live sandbox hosts per session, made durable by a journal of completed cells.

Why a journal and not snapshots: namespaces hold functions, classes and generators that do not
serialise, but cells are deterministic (fixed hash seed, no clock, no randomness), so replaying the
source of every completed cell in a fresh host rebuilds the same state. The journal is the cell
source keyed by the workflow-assigned `seq`, written atomically after the cell completed in a live
host. Cells that were killed (timeout, crash) or ran out of memory are *not* journaled and their host
is discarded, so in every path - crashed or not - their effects are gone and the next cell sees
exactly the state of the previous completed cells.

Fast path: the live host for the session has run exactly seq-1 -> run the cell directly.
Recovery path (new worker, dead host, retry of the same seq, host evicted): fresh host, replay the
journal entries with seq < current in order (output discarded), then run the cell.

Bounded recovery (`snapshot_every=N`): after every N-th journaled cell the host is asked for a
snapshot of its namespace (`sandbox.snapshot`: picklable user variables, helpers as source,
references into the preloaded data), written atomically next to the journal as
`snapshot-<seq>.pkl` with a `.json` sidecar holding the host's starting point. Recovery then loads
the latest snapshot with seq < current and replays only the later entries. Snapshots are skipped
whenever they could not reproduce the state exactly (a function or class defined in a cell, a
generator, ...): the full replay stays the fallback, so correctness never depends on them.

First-cell latency: new hosts come from a `HostPool` of pre-spawned idle hosts (`pool_size`).

Child sessions (`recurse`): `export_namespace(parent, seq, ...)` returns a self-contained copy of the
parent's state after cell `seq` (bytes; see `sandbox.snapshot.take_export`) without running or
journaling anything; a child's `run_cell(..., inherit=those bytes)` loads it into every host it
starts for the session, right after `start` and before the snapshot / journal replay, so the
inherited state is part of the child's starting point (its start key includes the export's digest:
a live host started with another `inherit` is never reused, snapshots likewise). The child only ever
holds a copy: nothing it does can reach the parent's host or journal.

Archived transcripts: hosts get `archive_root` (the blob store) so cells can run
`history.extend(ARCHIVE("<sha256>"))`; such a cell is journaled like any other, and a replay reads
the same immutable blob again. The blobs must stay in the store while the session can be rebuilt.

Durability (`fsync`): every journal entry, snapshot and sidecar is written to a temp file and renamed
into place, so a reader sees a whole file or none. With `fsync=True` the file and its directory are
fsynced before the cell's result is returned: entries survive a power loss / kernel crash. With
`fsync=False` they sit in the page cache: they survive a crash or kill of the worker process (the
kernel still writes them back) but not of the machine; after a machine crash a session may lose its
latest entries and rebuild an *older* state (a later cell then fails visibly, e.g. NameError, rather
than silently diverging - entries are never torn). fsync costs a disk flush per cell (~9% of the
worker's CPU under load), so workers on one machine may prefer `fsync=False`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.executor import HostPool, SubprocessExecutor, isolation_mode_from_env
from sandbox.isolation import IsolationMode
from sandbox.protocol import CellResult, Executor, SandboxLimits

__all__ = [
    "SessionManager",
    "ExecutorFactory",
    "RESTORED_NOTE",
    "MAX_LIVE_HOSTS",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_SNAPSHOT_EVERY",
    "Inherit",
    "SandboxExportError",
]

MAX_LIVE_HOSTS = 64
DEFAULT_POOL_SIZE = 2
DEFAULT_SNAPSHOT_EVERY = 25
RESTORED_NOTE = (
    "the session state was restored from the previous cells (this cell's effects are discarded; "
    "variables from earlier completed cells are intact)"
)
# Results after which the host's state is not the journal's state: discard the host.
_DISCARD_KINDS = frozenset({"timeout", "crash", "memory"})
_SESSION_ID = re.compile(r"^[A-Za-z0-9_.:@=+-]{1,200}$")
_SNAPSHOT = re.compile(r"^snapshot-(\d{8})\.pkl$")

ExecutorFactory = Callable[[SandboxLimits], Executor]
# A parent's namespace export: the bytes, or the path of an immutable file holding them (a
# content-addressed blob: read only when a host is (re)started, so cells do not pay for loading it).
Inherit = bytes | os.PathLike[str]
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class SandboxExportError(RuntimeError):
    """The namespace could not be exported (the session cannot be rebuilt, or the host failed)."""


@dataclass
class _Live:
    executor: Executor
    last_seq: int
    start_key: str


@dataclass
class _Stats:
    rebuilds: int = 0
    cells_replayed: int = 0
    evictions: int = 0
    snapshots_written: int = 0
    snapshots_refused: int = 0
    snapshots_restored: int = 0
    snapshot_restore_failures: int = 0


class SessionManager:
    """Maps session ids to live executors and rebuilds them from the on-disk journal when needed."""

    def __init__(
        self,
        journal_root: str | os.PathLike[str],
        *,
        executor_factory: ExecutorFactory | None = None,
        max_live: int = MAX_LIVE_HOSTS,
        fsync: bool = True,
        pool_size: int = DEFAULT_POOL_SIZE,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        archive_root: str | os.PathLike[str] | None = None,
        isolation: IsolationMode | None = None,
    ) -> None:
        """`pool_size` idle hosts are kept warm (default factory only; 0 disables the pool);
        `snapshot_every` cells a snapshot bounds the replay on recovery (0 disables snapshots);
        `archive_root` is the blob store `ARCHIVE(sha256)` reads from (default factory only; None:
        `ARCHIVE` raises a clear error in the cell); `isolation`: the OS layer of the hosts (default
        factory only; default `RR_SANDBOX_ISOLATION`, see `sandbox.isolation`).

        `fsync`: flush every journal entry and snapshot (and its directory) to disk before returning.
        Off, the writes still survive a crash of the worker process (page cache) but not of the
        machine; see the module doc for what a session loses then.
        """
        self.journal_root = Path(journal_root)
        self.journal_root.mkdir(parents=True, exist_ok=True)
        self.archive_root = Path(archive_root) if archive_root is not None else None
        self.snapshot_every = max(0, snapshot_every)
        self.pool: HostPool | None = None
        self.isolation: IsolationMode = isolation or isolation_mode_from_env()
        if executor_factory is None:
            self.pool = HostPool(pool_size, isolation=self.isolation) if pool_size > 0 else None
            executor_factory = self._pooled_factory
        self._factory = executor_factory
        self._max_live = max(1, max_live)
        self._fsync = fsync
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.stats = _Stats()

    def _pooled_factory(self, limits: SandboxLimits) -> Executor:
        return SubprocessExecutor(
            limits,
            restart_note=RESTORED_NOTE,
            pool=self.pool,
            index_data=self.snapshot_every > 0,
            archive_root=self.archive_root,
            isolation=self.isolation,
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
                self._forget(session_id, seq, only_this=True)
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
                except _RebuildFailed as exc:
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
        """
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
                    except _RebuildFailed as exc:
                        raise SandboxExportError(str(exc)) from None
                export = getattr(live.executor, "export_namespace", None)
                if export is None:
                    raise SandboxExportError("this executor cannot export a namespace")
                blob, resp = await export()
                if blob is not None:
                    self._live.move_to_end(session_id)
                    return blob, [str(n) for n in resp.get("skipped") or []]
                # Never keep a host whose export failed; a live host that had died gets one rebuild.
                await self._drop(session_id)
                if rebuilt or not resp.get("died"):
                    break
            raise SandboxExportError(f"the namespace could not be exported: {resp.get('error')}")

    async def close_session(self, session_id: str, *, delete_journal: bool = False) -> None:
        """Stop the session's host; optionally delete its journal (the session is over)."""
        async with self._lock(session_id):
            await self._drop(session_id)
            if delete_journal:
                shutil.rmtree(self._session_dir(session_id), ignore_errors=True)
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

    def journal_entries(self, session_id: str) -> list[tuple[int, str]]:
        """All journal entries of a session as (seq, code), in seq order."""
        out: list[tuple[int, str]] = []
        directory = self._session_dir(session_id)
        if not directory.is_dir():
            return out
        for path in sorted(directory.glob("[0-9]*.json")):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            out.append((int(entry["seq"]), str(entry["code"])))
        return out

    # -- internals ---------------------------------------------------------------------------------
    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    def _session_dir(self, session_id: str) -> Path:
        return self.journal_root / session_id

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
        if forget:
            self._forget(session_id, seq, only_this=False)
        entries = [(s, c) for s, c in self.journal_entries(session_id) if s < seq]
        blob = await _load_inherit(inherit)
        executor = await self._fresh(trace_path, trace_format, extra_vars, limits, blob)
        snap_seq = 0
        snapshot = self._latest_snapshot(session_id, seq, start_key) if entries else None
        if snapshot is not None:
            snap_seq, snap_blob = snapshot
            restore = getattr(executor, "restore", None)
            resp = await restore(snap_blob) if restore is not None else {"ok": False}
            if resp.get("ok"):
                self.stats.snapshots_restored += 1
                entries = [(s, c) for s, c in entries if s > snap_seq]
            else:  # never trust a half-restored host: start over with a full replay
                self.stats.snapshot_restore_failures += 1
                snap_seq = 0
                await executor.close()
                executor = await self._fresh(trace_path, trace_format, extra_vars, limits, blob)
        for entry_seq, code in entries:
            replay = await executor.run_cell(code)
            if replay.error_kind in _DISCARD_KINDS:
                await executor.close()
                raise _RebuildFailed(
                    f"the session could not be rebuilt: replaying cell {entry_seq} failed with "
                    f"{replay.error_kind}: {replay.error}"
                )
        live = _Live(executor=executor, last_seq=seq - 1, start_key=start_key)
        self._live[session_id] = live
        self._live.move_to_end(session_id)
        await self._evict(keep=session_id)
        self.stats.rebuilds += 1
        self.stats.cells_replayed += len(entries)
        info: dict[str, Any] = {"cells_replayed": len(entries), "rebuild_ms": (time.perf_counter() - t0) * 1000}
        if snap_seq:
            info["snapshot_seq"] = snap_seq
        return live, info

    async def _fresh(
        self,
        trace_path: str | None,
        trace_format: str,
        extra_vars: dict[str, Any],
        limits: SandboxLimits,
        inherit: bytes | None = None,
    ) -> Executor:
        executor = self._factory(limits)
        try:
            if inherit is None:
                await executor.start(trace_path, trace_format, extra_vars)
            else:  # an Executor that takes an inherited namespace (SubprocessExecutor does)
                start: Any = executor.start
                await start(trace_path, trace_format, extra_vars, inherit=inherit)
        except Exception as exc:
            await executor.close()
            raise _RebuildFailed(f"the sandbox could not be started: {exc}") from None
        return executor

    def _latest_snapshot(self, session_id: str, seq: int, start_key: str) -> tuple[int, bytes] | None:
        """The newest readable snapshot taken after a cell < seq from the same starting point."""
        for snap_seq, path in reversed(self._snapshots(session_id)):
            if snap_seq >= seq:
                continue
            try:
                meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
                if meta.get("start_key") != start_key or meta.get("seq") != snap_seq:
                    continue
                return snap_seq, path.read_bytes()
            except (OSError, ValueError):
                continue
        return None

    def _snapshots(self, session_id: str) -> list[tuple[int, Path]]:
        directory = self._session_dir(session_id)
        if not directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _SNAPSHOT.match(p.name))]
        return sorted(found)

    async def _maybe_snapshot(self, session_id: str, seq: int, live: _Live, meta: dict[str, Any]) -> None:
        if not self.snapshot_every or seq % self.snapshot_every:
            return
        take = getattr(live.executor, "snapshot", None)
        if take is None:
            return
        t0 = time.perf_counter()
        blob, resp = await take()
        if blob is None:
            self.stats.snapshots_refused += 1
            meta["snapshot"] = f"skipped: {resp.get('error')}"
            return
        directory = self._session_dir(session_id)
        self._write_atomic(directory / f"snapshot-{seq:08d}.pkl", blob)
        sidecar = {"seq": seq, "start_key": live.start_key, "size": len(blob)}
        self._write_atomic(directory / f"snapshot-{seq:08d}.json", json.dumps(sidecar).encode())
        for old_seq, path in self._snapshots(session_id):  # keep the newest two
            if old_seq < seq - self.snapshot_every:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    path.with_suffix(".json").unlink()
        self.stats.snapshots_written += 1
        meta["snapshot_ms"] = (time.perf_counter() - t0) * 1000
        meta["snapshot_bytes"] = len(blob)

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
            self._write_entry(session_id, seq, code)
            live.last_seq = seq
            await self._maybe_snapshot(session_id, seq, live, meta)
        meta["seq"] = seq
        restarted = result.host_restarted
        if rebuilt is not None:
            meta.update(rebuilt)
            restarted = True
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

    def _write_entry(self, session_id: str, seq: int, code: str) -> None:
        directory = self._session_dir(session_id)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            if self._fsync:
                _fsync_dir(self.journal_root)
        data = json.dumps({"seq": seq, "code": code}, ensure_ascii=False).encode("utf-8")
        self._write_atomic(directory / f"{seq:08d}.json", data)

    def _write_atomic(self, final: Path, data: bytes) -> None:
        """Temp file + rename (never torn); with `fsync` the file and its directory reach the disk."""
        tmp = final.with_name(f".{final.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            if self._fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, final)
        if self._fsync:
            _fsync_dir(final.parent)

    def _forget(self, session_id: str, seq: int, *, only_this: bool) -> None:
        """Remove journal entries for `seq` (and later ones unless `only_this`): they are being re-run."""
        directory = self._session_dir(session_id)
        if only_this:
            for name in (f"{seq:08d}.json", f"snapshot-{seq:08d}.pkl", f"snapshot-{seq:08d}.json"):
                with contextlib.suppress(FileNotFoundError):
                    (directory / name).unlink()
            return
        if not directory.is_dir():
            return
        for path in directory.glob("[0-9]*.json"):
            with contextlib.suppress(ValueError, FileNotFoundError):
                if int(path.stem) >= seq:
                    path.unlink()
        for snap_seq, path in self._snapshots(session_id):
            if snap_seq >= seq:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    path.with_suffix(".json").unlink()

    async def _drop(self, session_id: str) -> None:
        live = self._live.pop(session_id, None)
        if live is not None:
            await live.executor.close()

    async def _evict(self, keep: str) -> None:
        """Close least-recently-used idle hosts above the cap; their state comes back from the journal."""
        for session_id in list(self._live):
            if len(self._live) <= self._max_live:
                return
            if session_id == keep or self._lock(session_id).locked():
                continue
            self.stats.evictions += 1
            await self._drop(session_id)


class _RebuildFailed(Exception):
    pass


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _inherit_digest(inherit: Inherit) -> str:
    """sha256 of an export; for a path, its content-addressed file name (no read) or the path."""
    if isinstance(inherit, bytes | bytearray | memoryview):
        return hashlib.sha256(inherit).hexdigest()
    path = Path(inherit)
    return path.name if _HEX64.match(path.name) else f"path:{path.resolve()}"


async def _load_inherit(inherit: Inherit | None) -> bytes | None:
    if inherit is None or isinstance(inherit, bytes):
        return inherit
    if isinstance(inherit, bytearray | memoryview):
        return bytes(inherit)
    try:
        return await asyncio.to_thread(Path(inherit).read_bytes)
    except OSError as exc:
        raise _RebuildFailed(f"the inherited namespace could not be read: {exc}") from None


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
        parts.append({"inherit": _inherit_digest(inherit)})
    return json.dumps(parts, sort_keys=True, default=repr)
