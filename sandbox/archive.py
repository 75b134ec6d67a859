"""Archived (compacted) transcripts: `ARCHIVE(sha256)` in a cell, the blob it names in the store.

Who may read which (`ArchiveGrants`): a session may read the transcripts *it* archived (the summarise
activity grants each one to the session when it stores it) and those its ancestors archived (a parent's
grants travel with its export, in a file the worker writes beside the export blob). The list is the
worker's own: grant files in the session's journal directory, written only by the worker (a host can
reach neither), so it survives a rebuild on another worker (the journal's replica) and is never taken
from anything a host wrote. A name outside it gets exactly the error of a missing blob: a host that
learnt another reflection's blob names learns nothing more by asking.

Why a module of its own: the *worker* reads the blob (a locked-down host cannot reach the blob store,
see `sandbox.isolation`) and the *host* checks and decodes what it was sent; both sides apply the
same rules. The name is exactly 64 lowercase hex characters (no path can be formed from it), the
final path component is opened without following symlinks, the size is capped and the content must
hash to its name, so a replay of the cell after a crash reads the same value. Errors are meant for
the model: they name the problem, never the archive's location.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "ARCHIVE_MAX_BYTES",
    "GRANTS_SUFFIX",
    "ArchiveGrants",
    "check_archive_name",
    "not_archived",
    "read_archive_blob",
    "decode_archive",
    "read_archive",
]

ARCHIVE_MAX_BYTES = 256 * 1024**2
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
GRANT_PREFIX, GRANT_SUFFIX = "archive-", ".grant"  # `<journal dir>/archive-<sha256>.grant`
GRANTS_SUFFIX = "grants"  # `<export blob>.grants`: the exporting session's grants, for its children
PULL_EVERY_S = 1.0  # a miss asks the journal's replica at most this often (a host may ask 64 times a cell)


def check_archive_name(sha256_hex: Any) -> str:
    """The digest as an exact `str` (a subclass can lie about its contents); ValueError otherwise."""
    if type(sha256_hex) is not str or not _SHA256_HEX.fullmatch(sha256_hex):
        shown = repr(sha256_hex)[:80] if type(sha256_hex) is str else type(sha256_hex).__name__
        raise ValueError(f"ARCHIVE: expected a sha256 digest as 64 lowercase hex characters, got {shown}")
    return sha256_hex


def read_archive_blob(archive_root: str | None, sha256_hex: Any, max_bytes: int = ARCHIVE_MAX_BYTES) -> bytes:
    """The raw bytes of blob `<archive_root>/sha256/<hex[:2]>/<hex>` (checked name, bounded size)."""
    sha256_hex = check_archive_name(sha256_hex)
    if not archive_root:
        raise FileNotFoundError("ARCHIVE: no transcript archive is configured for this session")
    path = os.path.join(archive_root, "sha256", sha256_hex[:2], sha256_hex)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise not_archived(sha256_hex) from None
    except OSError as exc:
        raise OSError(f"ARCHIVE: archived transcript {sha256_hex} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"ARCHIVE: archived transcript {sha256_hex} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} exceeds {max_bytes:,} bytes")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} exceeds {max_bytes:,} bytes")
    return data


def not_archived(sha256_hex: str) -> FileNotFoundError:
    """The one error for a blob that is missing and for one the session may not read (indistinguishable)."""
    return FileNotFoundError(
        f"ARCHIVE: no archived transcript with sha256 {sha256_hex} (a session reads only the transcripts it "
        "or its parents archived)"
    )


def decode_archive(sha256_hex: str, data: bytes, max_bytes: int = ARCHIVE_MAX_BYTES) -> list[Any]:
    """The JSON list in `data`, which must hash to `sha256_hex`."""
    if len(data) > max_bytes:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} exceeds {max_bytes:,} bytes")
    if hashlib.sha256(data).hexdigest() != sha256_hex:
        raise ValueError(
            f"ARCHIVE: archived transcript {sha256_hex} is corrupt (content does not match its sha256)"
        )
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise TypeError(
            f"ARCHIVE: archived transcript {sha256_hex} is a {type(value).__name__}, expected a list"
        )
    return value


def read_archive(archive_root: str | None, sha256_hex: Any, max_bytes: int = ARCHIVE_MAX_BYTES) -> list[Any]:
    """Read and decode in one process (a host without the OS layer, tests)."""
    name = check_archive_name(sha256_hex)
    return decode_archive(name, read_archive_blob(archive_root, name, max_bytes), max_bytes)


class ArchiveGrants:
    """The archived transcripts one session may read: its own grant files plus its ancestors' list.

    `session_dir`: the session's journal directory (`SessionManager.grant_archive` writes the grant files
    there with the journal's atomic, replicated write); `inherited`: the grants file beside the session's
    inherited export (None: not a child, or an export given as bytes); `pull(path)`: downloads one grant
    file from the journal's replica (another worker may have granted it), at most every `PULL_EVERY_S`
    on a miss; `fetch_inherited` brings the inherited grants file from the shared store when it is not
    local. All of it runs only when a cell calls `ARCHIVE`, never per cell.
    """

    def __init__(
        self,
        session_dir: Path,
        *,
        inherited: Path | None = None,
        pull: Callable[[Path], object] | None = None,
        fetch_inherited: Callable[[Path], object] | None = None,
    ) -> None:
        self.session_dir = session_dir
        self.inherited = inherited
        self._pull = pull
        self._fetch_inherited = fetch_inherited
        self._pulled_at = float("-inf")
        self._ancestors: frozenset[str] | None = None

    @staticmethod
    def grant_name(sha256_hex: str) -> str:
        return f"{GRANT_PREFIX}{check_archive_name(sha256_hex)}{GRANT_SUFFIX}"

    def own(self) -> set[str]:
        """The names granted to this session itself (its journal directory's grant files)."""
        found: set[str] = set()
        try:
            names = os.listdir(self.session_dir)
        except OSError:
            return found
        for name in names:
            sha = name[len(GRANT_PREFIX) : -len(GRANT_SUFFIX)]
            if name.startswith(GRANT_PREFIX) and name.endswith(GRANT_SUFFIX) and _SHA256_HEX.fullmatch(sha):
                found.add(sha)
        return found

    def ancestors(self) -> frozenset[str]:
        """The names the session's ancestors were granted (read once: the export's file never changes)."""
        if self._ancestors is None:
            self._ancestors = frozenset(read_grants_file(self.inherited, self._fetch_inherited))
        return self._ancestors

    def all(self) -> set[str]:
        """Every name this session may read (what its own export passes on to its children)."""
        return self.own() | self.ancestors()

    def allows(self, sha256_hex: str) -> bool:
        """May this session read `sha256_hex`? Local files first; on a miss, the replica (rate-limited)."""
        name = check_archive_name(sha256_hex)
        grant = self.session_dir / self.grant_name(name)
        if grant.exists() or name in self.ancestors():
            return True
        if self._pull is not None and time.monotonic() - self._pulled_at >= PULL_EVERY_S:
            self._pulled_at = time.monotonic()
            try:
                self._pull(grant)
            except Exception:  # the replica failed (S3Unavailable & co): not granted; a retry may find it
                return False
            return grant.exists()
        return False


def grants_blob(names: Iterable[str]) -> bytes:
    """The content of an export's grants file: the sorted names, as a JSON list."""
    return json.dumps(sorted({check_archive_name(n) for n in names})).encode()


def read_grants_file(path: Path | None, fetch: Callable[[Path], object] | None = None) -> set[str]:
    """The names in a grants file (`grants_blob`); nothing for a missing or malformed one (fail closed)."""
    if path is None:
        return set()
    if not path.exists() and fetch is not None:
        try:
            fetch(path)
        except OSError:
            return set()
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return set()
    if not isinstance(value, list):
        return set()
    return {v for v in value if type(v) is str and _SHA256_HEX.fullmatch(v)}
