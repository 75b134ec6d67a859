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
"""

from __future__ import annotations

import asyncio
import contextlib
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

from sandbox.executor import SubprocessExecutor
from sandbox.protocol import CellResult, Executor, SandboxLimits

__all__ = ["SessionManager", "ExecutorFactory", "RESTORED_NOTE", "MAX_LIVE_HOSTS"]

MAX_LIVE_HOSTS = 64
RESTORED_NOTE = (
    "the session state was restored from the previous cells (this cell's effects are discarded; "
    "variables from earlier completed cells are intact)"
)
# Results after which the host's state is not the journal's state: discard the host.
_DISCARD_KINDS = frozenset({"timeout", "crash", "memory"})
_SESSION_ID = re.compile(r"^[A-Za-z0-9_.:@=+-]{1,200}$")

ExecutorFactory = Callable[[SandboxLimits], Executor]


def _default_factory(limits: SandboxLimits) -> Executor:
    return SubprocessExecutor(limits, restart_note=RESTORED_NOTE)


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


class SessionManager:
    """Maps session ids to live executors and rebuilds them from the on-disk journal when needed."""

    def __init__(
        self,
        journal_root: str | os.PathLike[str],
        *,
        executor_factory: ExecutorFactory = _default_factory,
        max_live: int = MAX_LIVE_HOSTS,
        fsync: bool = True,
    ) -> None:
        self.journal_root = Path(journal_root)
        self.journal_root.mkdir(parents=True, exist_ok=True)
        self._factory = executor_factory
        self._max_live = max(1, max_live)
        self._fsync = fsync
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self.stats = _Stats()

    # -- public API --------------------------------------------------------------------------------
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
    ) -> CellResult:
        """Run cell number `seq` (1-based, assigned by the workflow) of a session.

        Idempotent per seq: retrying a seq after a crash re-runs it on the state of cells < seq, so a
        cell like `counter += 1` is never applied twice.
        """
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"invalid session id {session_id!r}")
        if seq < 1:
            raise ValueError("seq starts at 1")
        async with self._lock(session_id):
            start_key = _start_key(trace_path, trace_format, extra_vars, limits)
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
                        session_id, seq, start_key, trace_path, trace_format, extra_vars, limits
                    )
                except _RebuildFailed as exc:
                    return CellResult(ok=False, error_kind="crash", error=str(exc), host_restarted=True)
                result = await live.executor.run_cell(code)
            assert live is not None
            return await self._after(session_id, seq, code, live, result, rebuilt)

    async def close_session(self, session_id: str, *, delete_journal: bool = False) -> None:
        """Stop the session's host; optionally delete its journal (the session is over)."""
        async with self._lock(session_id):
            await self._drop(session_id)
            if delete_journal:
                shutil.rmtree(self._session_dir(session_id), ignore_errors=True)
        self._locks.pop(session_id, None)

    async def close_all(self) -> None:
        """Stop every live host (journals are kept: a later manager can continue the sessions)."""
        for session_id in list(self._live):
            await self.close_session(session_id)

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
        for path in sorted(directory.glob("*.json")):
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
    ) -> tuple[_Live, dict[str, Any]]:
        t0 = time.perf_counter()
        self._forget(session_id, seq, only_this=False)
        entries = [(s, c) for s, c in self.journal_entries(session_id) if s < seq]
        executor = self._factory(limits)
        try:
            await executor.start(trace_path, trace_format, extra_vars)
        except Exception as exc:
            await executor.close()
            raise _RebuildFailed(f"the sandbox could not be started: {exc}") from None
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
        return live, {"cells_replayed": len(entries), "rebuild_ms": (time.perf_counter() - t0) * 1000}

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
        else:
            self._write_entry(session_id, seq, code)
            live.last_seq = seq
        meta = dict(result.meta)
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
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / f"{seq:08d}.json"
        tmp = directory / f".{seq:08d}.json.tmp"
        data = json.dumps({"seq": seq, "code": code}, ensure_ascii=False).encode("utf-8")
        with open(tmp, "wb") as fh:
            fh.write(data)
            if self._fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, final)

    def _forget(self, session_id: str, seq: int, *, only_this: bool) -> None:
        """Remove journal entries for `seq` (and later ones unless `only_this`): they are being re-run."""
        directory = self._session_dir(session_id)
        if only_this:
            with contextlib.suppress(FileNotFoundError):
                (directory / f"{seq:08d}.json").unlink()
            return
        if not directory.is_dir():
            return
        for path in directory.glob("*.json"):
            with contextlib.suppress(ValueError, FileNotFoundError):
                if int(path.stem) >= seq:
                    path.unlink()

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


def _start_key(
    trace_path: str | None, trace_format: str, extra_vars: dict[str, Any], limits: SandboxLimits
) -> str:
    """Identity of a host's starting point: a live host started differently cannot take the fast path."""
    return json.dumps([trace_path, trace_format, extra_vars, repr(limits)], sort_keys=True, default=repr)
