"""The on-disk side of sandbox sessions: each session's cell journal and namespace snapshots.

One directory per session under the journal root: `<seq:08d>.json` per completed cell
(`{"seq", "code"}`), and every N-th cell `snapshot-<seq:08d>.pkl` (the host's pickled namespace, see
`sandbox.host.snapshot`) with a `.json` sidecar holding the host's starting point. Why and when they
are written, replayed and trusted is `sandbox.sessions`' business; this module owns the files.

Durability (`fsync`): every journal entry, snapshot and sidecar is written to a temp file and renamed
into place, so a reader sees a whole file or none. With `fsync=True` the file and its directory are
fsynced before the write returns (before the cell's result is returned): entries survive a power loss /
kernel crash. With `fsync=False` they sit in the page cache: they survive a crash or kill of the worker
process (the kernel still writes them back) but not of the machine; after a machine crash a session may
lose its latest entries and rebuild an *older* state (a later cell then fails visibly, e.g. NameError,
rather than silently diverging - entries are never torn).

Replica (`RR_BLOB_URL=s3://...`): with a `replica` every write is uploaded before the local file is
renamed into place and every removal is applied to it too, so another worker that holds nothing
locally can `sync` a session's directory from it and rebuild the host there. The methods block on the
replica's network calls: `sandbox.sessions` runs them on the replica's thread pool (`Replica.run`).

Inherited namespaces (child sessions): `load_inherit` reads a parent's export (bytes, or the path of
the immutable blob holding them) and `inherit_digest` names it without reading it.
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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sandbox.protocol import Inherit

__all__ = ["Journal", "Replica", "RebuildFailed", "inherit_digest", "load_inherit"]

T = TypeVar("T")


class Replica(Protocol):
    """Where a journal is mirrored (`reflector.runtime.storage.s3.S3Mirror`): paths are local paths under its root."""

    async def run(self, fn: Callable[..., T], *args: Any) -> T: ...
    def push_bytes(self, path: Path | str, data: bytes) -> None: ...
    def remove(self, paths: Iterable[Path | str]) -> None: ...
    def remove_tree(self, directory: Path | str) -> None: ...
    def pull_tree(self, directory: Path | str) -> int: ...


_SNAPSHOT = re.compile(r"^snapshot-(\d{8})\.pkl$")
# a snapshot streamed from a host into the session's directory before it is adopted
# (`SubprocessExecutor._payload_to`): `.snapshot-<random>.incoming`
_INCOMING = re.compile(r"^\.snapshot-[^/]*\.incoming$")
# an unadopted transfer this old was left by a worker that died during it (a transfer takes at most the
# snapshot timeout; a live session takes one snapshot at a time)
STALE_INCOMING_S = 3600.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class RebuildFailed(Exception):
    """A session's host cannot be rebuilt (its starting point cannot be read or started, a replay failed)."""


class Journal:
    """The journal and snapshot files of every session under `root` (created if missing)."""

    def __init__(
        self, root: str | os.PathLike[str], *, fsync: bool = True, replica: Replica | None = None
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.replica = replica

    def sync(self, session_id: str) -> int:
        """Make the local directory of the session the replica's (no-op without one); entries + snapshots there."""
        if self.replica is None:
            return 0
        return self.replica.pull_tree(self.session_dir(session_id))

    @staticmethod
    def _sweep_incoming(directory: Path, now: float | None = None) -> None:
        """Remove the snapshot transfers a dead worker left in `directory` (older than STALE_INCOMING_S):
        without this they would stay as long as the session's directory, each as big as a snapshot."""
        limit = (time.time() if now is None else now) - STALE_INCOMING_S
        with contextlib.suppress(OSError):
            for entry in os.scandir(directory):
                if _INCOMING.match(entry.name) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < limit:
                            os.unlink(entry.path)

    def _unlink(self, paths: Iterable[Path]) -> None:
        gone = []
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                gone.append(path)
        if gone and self.replica is not None:
            self.replica.remove(gone)

    def session_dir(self, session_id: str) -> Path:
        return self.root / session_id

    def entries(self, session_id: str) -> list[tuple[int, str]]:
        """All journal entries of a session as (seq, code), in seq order."""
        out: list[tuple[int, str]] = []
        directory = self.session_dir(session_id)
        if not directory.is_dir():
            return out
        for path in sorted(directory.glob("[0-9]*.json")):
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            out.append((int(entry["seq"]), str(entry["code"])))
        return out

    def write_entry(self, session_id: str, seq: int, code: str) -> None:
        directory = self.session_dir(session_id)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            if self.fsync:
                _fsync_dir(self.root)
        data = json.dumps({"seq": seq, "code": code}, ensure_ascii=False).encode("utf-8")
        self.write_atomic(directory / f"{seq:08d}.json", data)

    def write_atomic(self, final: Path, data: bytes) -> None:
        """Temp file + rename (never torn); with `fsync` the file and its directory reach the disk.

        With a replica the data is uploaded first: a local file always has its replica copy."""
        if self.replica is not None:
            self.replica.push_bytes(final, data)
        tmp = final.with_name(f".{final.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, final)
        if self.fsync:
            _fsync_dir(final.parent)

    def forget(self, session_id: str, seq: int, *, only_this: bool) -> None:
        """Remove journal entries for `seq` (and later ones unless `only_this`): they are being re-run."""
        directory = self.session_dir(session_id)
        if only_this:
            self._unlink(
                directory / name
                for name in (f"{seq:08d}.json", f"snapshot-{seq:08d}.pkl", f"snapshot-{seq:08d}.json")
            )
            return
        if not directory.is_dir():
            return
        later = []
        for path in directory.glob("[0-9]*.json"):
            with contextlib.suppress(ValueError):
                if int(path.stem) >= seq:
                    later.append(path)
        for snap_seq, path in self.snapshots(session_id):
            if snap_seq >= seq:
                later += [path, path.with_suffix(".json")]
        self._unlink(later)

    def delete(self, session_id: str) -> None:
        """Remove the session's journal and snapshots (the session is over)."""
        if self.replica is not None:
            self.replica.remove_tree(self.session_dir(session_id))
        shutil.rmtree(self.session_dir(session_id), ignore_errors=True)

    def snapshots(self, session_id: str) -> list[tuple[int, Path]]:
        """The session's snapshot files as (seq, path of the .pkl), in seq order."""
        directory = self.session_dir(session_id)
        if not directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _SNAPSHOT.match(p.name))]
        return sorted(found)

    def latest_snapshot(self, session_id: str, seq: int, start_key: str) -> tuple[int, bytes] | None:
        """The newest readable snapshot taken after a cell < seq from the same starting point."""
        for snap_seq, path in reversed(self.snapshots(session_id)):
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

    def latest_snapshot_path(self, session_id: str, seq: int, start_key: str) -> tuple[int, Path] | None:
        """Like `latest_snapshot`, but the file's path: a restore sends it in chunks, never whole."""
        for snap_seq, path in reversed(self.snapshots(session_id)):
            if snap_seq >= seq:
                continue
            try:
                meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if meta.get("start_key") == start_key and meta.get("seq") == snap_seq and path.is_file():
                return snap_seq, path
        return None

    def adopt_snapshot(self, session_id: str, seq: int, start_key: str, src: Path, *, keep_from: int) -> None:
        """`write_snapshot` for a snapshot already streamed into the file `src` in the session's
        directory (`SubprocessExecutor.snapshot_to`): moved into place, never read into memory."""
        directory = self.session_dir(session_id)
        final = directory / f"snapshot-{seq:08d}.pkl"
        if self.fsync:
            with open(src, "rb") as fh:
                os.fsync(fh.fileno())
        if self.replica is not None:
            push_file = getattr(self.replica, "push_file", None)
            if push_file is not None:
                push_file(src, final)
            else:
                self.replica.push_bytes(final, Path(src).read_bytes())
        size = os.stat(src).st_size
        os.replace(src, final)
        if self.fsync:
            _fsync_dir(directory)
        sidecar = {"seq": seq, "start_key": start_key, "size": size}
        self.write_atomic(directory / f"snapshot-{seq:08d}.json", json.dumps(sidecar).encode())
        self._sweep_incoming(directory)
        self._unlink(
            p
            for old_seq, path in self.snapshots(session_id)
            if old_seq < keep_from
            for p in (path, path.with_suffix(".json"))
        )

    def write_snapshot(
        self, session_id: str, seq: int, start_key: str, blob: bytes, *, keep_from: int
    ) -> None:
        """Write the snapshot after cell `seq` and its sidecar; remove the snapshots older than `keep_from`."""
        directory = self.session_dir(session_id)
        self.write_atomic(directory / f"snapshot-{seq:08d}.pkl", blob)
        sidecar = {"seq": seq, "start_key": start_key, "size": len(blob)}
        self.write_atomic(directory / f"snapshot-{seq:08d}.json", json.dumps(sidecar).encode())
        self._unlink(
            p
            for old_seq, path in self.snapshots(session_id)
            if old_seq < keep_from
            for p in (path, path.with_suffix(".json"))
        )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def inherit_digest(inherit: Inherit) -> str:
    """sha256 of an export; for a path, its content-addressed file name (no read) or the path."""
    if isinstance(inherit, bytes | bytearray | memoryview):
        return hashlib.sha256(inherit).hexdigest()
    path = Path(inherit)
    return path.name if _HEX64.match(path.name) else f"path:{path.resolve()}"


async def load_inherit(inherit: Inherit | None) -> bytes | None:
    """The export's bytes (read from its file for a path); `RebuildFailed` if it cannot be read."""
    if inherit is None or isinstance(inherit, bytes):
        return inherit
    if isinstance(inherit, bytearray | memoryview):
        return bytes(inherit)
    try:
        return await asyncio.to_thread(Path(inherit).read_bytes)
    except OSError as exc:
        raise RebuildFailed(f"the inherited namespace could not be read: {exc}") from None
