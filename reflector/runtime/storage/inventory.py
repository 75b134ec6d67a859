"""What the blob store holds, item by item: listing it, reading the names inside an item, removing one.

`rr gc` (`reflector.runtime.gc`) decides; this module knows the files. The layout is `reflector.runtime.storage.blobs`'s.
An *item* is what is kept or removed as a whole: a blob, a file derived from a blob, a session's
directory (journal and snapshots, or model-response cache), a temp file, or anything else (unknown:
never removed). Symlinks are never followed.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reflector.runtime.storage.blobs import (
    BLOBS_DIR,
    RESPONSES_DIR,
    SESSIONS_DIR,
    TEMP_PREFIXES,
    derived_source,
)

__all__ = [
    "Item",
    "ItemUnit",
    "Names",
    "StoreReader",
    "TRASH_PREFIX",
    "blob_kind",
    "names_in_bytes",
    "names_in_file",
    "remove_item",
    "scan_store",
    "KIND_PAYLOAD",
    "KIND_EXPORT",
    "KIND_ARCHIVE",
    "KIND_INIT",
    "KIND_MANIFEST",
    "KIND_RECORD",
    "KIND_RECORDS",
    "KIND_TRACE",
    "KIND_OTHER",
    "KIND_JOURNAL",
    "KIND_RESPONSES",
    "KIND_TEMP",
    "KIND_UNKNOWN",
]

TRASH_PREFIX = ".gc-"  # one of blobs.TEMP_PREFIXES: a leftover of an interrupted removal is an old temp file

ItemUnit = Literal["blob", "derived", "journal", "responses", "temp", "unknown"]


@dataclass(frozen=True)
class Item:
    """One removable unit of the store: a blob, a derived file, a session's directory, a temp file."""

    path: str  # relative to the store root, '/'-separated
    unit: ItemUnit
    kind: str  # what it holds (the report's rows)
    size: int
    mtime: float  # newest modification time in the unit (a directory: of everything in it)
    key: str = ""  # blob: its sha256; derived: its source's sha256; journal/responses: the session key
    # newest status-change time (ctime) in the unit: set by the kernel to "now" on every write, rename or
    # utime, never to a time of the caller's choosing, so what `rr gc` judges an item's age by (None: the
    # item was described without one, e.g. by a test; its mtime is used)
    changed: float | None = None

    @property
    def age_mark(self) -> float:
        """The time the item's age is counted from (`changed` when known)."""
        return self.mtime if self.changed is None else self.changed


@dataclass(frozen=True)
class Names:
    """Names found in some bytes: blob sha256s, and those of them named by a `TraceRef` (traces)."""

    blobs: frozenset[str] = frozenset()
    traces: frozenset[str] = frozenset()


# ------------------------------------------------------------------------------ names in bytes

_HEX_RUN = re.compile(rb"[0-9a-fA-F]{64,}")
_TRACE_URI = re.compile(rb'"uri"\s{0,8}:\s{0,8}"blob:sha256:([0-9a-fA-F]{64})"')
_OVERLAP = 256  # > the longest match of either pattern that matters (a 64-hex window, a TraceRef uri)
_CHUNK = 1 << 20


def names_in_bytes(data: bytes, known: Container[str]) -> Names:
    """The blob names in `known` that `data` spells out (every 64-character window of a hex run, any case)."""
    blobs: set[str] = set()
    for m in _HEX_RUN.finditer(data):
        run = m.group().decode("ascii").lower()
        for i in range(len(run) - 63):
            name = run[i : i + 64]
            if name in known:
                blobs.add(name)
    traces = {m.group(1).decode("ascii").lower() for m in _TRACE_URI.finditer(data)}
    return Names(frozenset(blobs), frozenset(traces & blobs))


def names_in_file(path: Path, known: Container[str]) -> Names:
    blobs: set[str] = set()
    traces: set[str] = set()
    with open(path, "rb") as fh:
        tail = b""
        while chunk := fh.read(_CHUNK):
            found = names_in_bytes(tail + chunk, known)
            blobs |= found.blobs
            traces |= found.traces
            tail = (tail + chunk)[-_OVERLAP:]
    return Names(frozenset(blobs), frozenset(traces))


def files_under(path: Path) -> Iterator[Path]:
    """Regular files at or under `path`, never following a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        yield path
    elif stat.S_ISDIR(st.st_mode):
        for entry in _scandir(path):
            yield from files_under(Path(entry.path))


class StoreReader:
    """Reads the names inside store items (each item once); `known` are the names worth finding."""

    def __init__(self, root: Path, items: Iterable[Item]) -> None:
        self.root = root
        self.known: frozenset[str] = frozenset(i.key for i in items if i.unit in ("blob", "derived"))
        self._cache: dict[str, Names] = {}

    def names_in(self, item: Item) -> Names:
        return self._read(item.path)

    def names_in_blob(self, sha256: str) -> Names:
        return self._read(f"{BLOBS_DIR}/{sha256[:2]}/{sha256}")

    def _read(self, rel: str) -> Names:
        cached = self._cache.get(rel)
        if cached is not None:
            return cached
        blobs: set[str] = set()
        traces: set[str] = set()
        for path in files_under(self.root / rel):
            try:
                found = names_in_file(path, self.known)
            except FileNotFoundError:  # removed meanwhile (a journal entry being rewritten)
                continue
            blobs |= found.blobs
            traces |= found.traces
        names = self._cache[rel] = Names(frozenset(blobs), frozenset(traces))
        return names


# ------------------------------------------------------------------------------- the store


KIND_PAYLOAD = "payload"
KIND_EXPORT = "export"
KIND_ARCHIVE = "archive"
KIND_INIT = "sandbox-init"
KIND_MANIFEST = "batch-manifest"
KIND_RECORD = "batch-record"
KIND_RECORDS = "batch-records"
KIND_TRACE = "trace"
KIND_OTHER = "trace/other"  # a trace, or a blob whose content is not recognised
KIND_JOURNAL = "journal"
KIND_RESPONSES = "response-cache"
KIND_TEMP = "temp"
KIND_UNKNOWN = "unknown"
_HEAD = 1024


def blob_kind(head: bytes) -> str:
    """What a blob holds, from its first bytes (for the report: rr writes no type next to a blob)."""
    if head.startswith(b"\n") and b"\n\x08encoding\x12" in head[:24]:
        return KIND_PAYLOAD  # a serialized Payload (deterministic: its metadata's `encoding` comes first)
    if head.startswith(b"\x80"):
        return KIND_EXPORT  # a pickle: a sandbox namespace exported for a child session
    if head.startswith(b'[{"parts":'):
        return KIND_ARCHIVE  # a transcript (pydantic-ai messages) archived at a compaction
    if head.startswith(b'{"skillbook": '):
        return KIND_INIT
    if head.startswith(b'{"index":'):
        return KIND_RECORD if b'"status":"' in head else KIND_MANIFEST
    if head.startswith(b'[{"index":'):
        return KIND_RECORDS
    return KIND_OTHER


_FAN = re.compile(r"^[0-9a-f]{2}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _scandir(path: Path | str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _measure(path: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of a file, or of a directory and everything in it (symlinks not followed)."""
    size, newest, _changed = _measure_all(path)
    return size, newest


def _measure_all(path: Path) -> tuple[int, float, float]:
    """(bytes, newest mtime, newest ctime) of a file, or of a directory and everything in it."""
    st = os.lstat(path)
    size, newest, changed = (st.st_size if stat.S_ISREG(st.st_mode) else 0), st.st_mtime, st.st_ctime
    if stat.S_ISDIR(st.st_mode):
        for entry in _scandir(path):
            try:
                s, m, c = _measure_all(Path(entry.path))
            except FileNotFoundError:
                continue
            size, newest, changed = size + s, max(newest, m), max(changed, c)
    return size, newest, changed


def _item(root: Path, path: Path, unit: ItemUnit, kind: str, key: str = "") -> Item | None:
    try:
        size, mtime, changed = _measure_all(path)
    except FileNotFoundError:  # removed while we looked
        return None
    return Item(path.relative_to(root).as_posix(), unit, kind, size, mtime, key, changed)


def _blob_item(root: Path, path: Path, sha256: str) -> Item | None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_HEAD)
    except FileNotFoundError:
        return None
    return _item(root, path, "blob", blob_kind(head), sha256)


def scan_store(root: Path) -> list[Item]:
    """Every item of the store at `root` (nothing when there is no store)."""
    out: list[Item | None] = []
    for top in _scandir(root):
        path = Path(top.path)
        if top.is_symlink():
            out.append(_item(root, path, "unknown", KIND_UNKNOWN))
        elif top.name == BLOBS_DIR and top.is_dir():
            out.extend(_scan_blobs(root, path))
        elif top.name in (SESSIONS_DIR, RESPONSES_DIR) and top.is_dir():
            unit: ItemUnit = "journal" if top.name == SESSIONS_DIR else "responses"
            kind = KIND_JOURNAL if unit == "journal" else KIND_RESPONSES
            for entry in _scandir(path):
                sub = Path(entry.path)
                if entry.name.startswith(TRASH_PREFIX) and not entry.is_symlink():
                    out.append(_item(root, sub, "temp", KIND_TEMP))
                elif entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                    out.append(_item(root, sub, unit, kind, entry.name))
                elif entry.is_file(follow_symlinks=False) and entry.name.startswith(TEMP_PREFIXES):
                    out.append(_item(root, sub, "temp", KIND_TEMP))
                else:
                    out.append(_item(root, sub, "unknown", KIND_UNKNOWN))
        elif top.is_file(follow_symlinks=False) and top.name.startswith(TEMP_PREFIXES):
            out.append(_item(root, path, "temp", KIND_TEMP))
        else:
            out.append(_item(root, path, "unknown", KIND_UNKNOWN))
    return [i for i in out if i is not None]


def _scan_blobs(root: Path, blobs_dir: Path) -> Iterator[Item | None]:
    for fan in _scandir(blobs_dir):
        fan_path = Path(fan.path)
        if not (_FAN.match(fan.name) and fan.is_dir(follow_symlinks=False)):
            yield _item(root, fan_path, "unknown", KIND_UNKNOWN)
            continue
        for entry in _scandir(fan_path):
            path = Path(entry.path)
            if not entry.is_file(follow_symlinks=False):
                yield _item(root, path, "unknown", KIND_UNKNOWN)
            elif _HEX64.match(entry.name) and entry.name[:2] == fan.name:
                yield _blob_item(root, path, entry.name)
            elif (src := derived_source(entry.name)) is not None and src[0][:2] == fan.name:
                yield _item(root, path, "derived", f"derived:{src[1]}", src[0])
            elif entry.name.startswith(TEMP_PREFIXES):
                yield _item(root, path, "temp", KIND_TEMP)
            else:
                yield _item(root, path, "unknown", KIND_UNKNOWN)


# ------------------------------------------------------------------------------- removal


def _put_back(trash: Path, path: Path) -> None:
    try:
        os.rename(trash, path)  # a file: replaces a copy stored meanwhile (the same bytes)
        return
    except OSError:
        if not trash.is_dir():
            raise
    # a session directory written to again meanwhile: move back what the new one does not have
    for entry in _scandir(trash):
        target = path / entry.name
        if not os.path.lexists(target):
            os.rename(entry.path, target)
    try:
        os.rmdir(trash)
    except OSError:  # what is left duplicates newer files: an old `.gc-` temp item for a later gc
        pass


def remove_item(root: Path, item: Item, *, min_age_s: float, clock: Callable[[], float]) -> str | None:
    """Remove an item the plan condemned; None when removed, else why it was spared.

    Rename it away first, then check that nothing touched it since the store was listed (a blob stored
    again has a fresh mtime): a store that comes after the rename finds no blob and writes it anew,
    one that came before makes this check put it back. (`min_age_s` and `clock` are no longer needed:
    the item's age was judged at the listing, by its ctime; they stay for the callers.)
    """
    path = root / item.path
    trash = path.with_name(f"{TRASH_PREFIX}{os.getpid()}-{path.name}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return "gone already"
    try:
        _size, newest = _measure(trash)
    except FileNotFoundError:
        return "gone already"
    # Changed since the listing (a store refreshes a blob's mtime to now): put back. Not "is its mtime
    # recent": a forward-dated mtime (a breached host with the worker's uid) would make it immortal.
    if newest != item.mtime:
        _put_back(trash, path)
        return "written again while gc ran"
    if os.path.isdir(trash) and not os.path.islink(trash):
        shutil.rmtree(trash)
    else:
        os.unlink(trash)
    return None
