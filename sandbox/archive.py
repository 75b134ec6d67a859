"""Archived (compacted) transcripts: `ARCHIVE(sha256)` in a cell, the blob it names in the store.

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
from typing import Any

__all__ = ["ARCHIVE_MAX_BYTES", "check_archive_name", "read_archive_blob", "decode_archive", "read_archive"]

ARCHIVE_MAX_BYTES = 256 * 1024**2
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


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
        raise FileNotFoundError(f"ARCHIVE: no archived transcript with sha256 {sha256_hex}") from None
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


def decode_archive(sha256_hex: str, data: bytes, max_bytes: int = ARCHIVE_MAX_BYTES) -> list[Any]:
    """The JSON list in `data`, which must hash to `sha256_hex`."""
    if len(data) > max_bytes:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} exceeds {max_bytes:,} bytes")
    if hashlib.sha256(data).hexdigest() != sha256_hex:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} is corrupt (content does not match its sha256)")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"ARCHIVE: archived transcript {sha256_hex} is not valid JSON: {exc}") from None
    if not isinstance(value, list):
        raise TypeError(f"ARCHIVE: archived transcript {sha256_hex} is a {type(value).__name__}, expected a list")
    return value


def read_archive(archive_root: str | None, sha256_hex: Any, max_bytes: int = ARCHIVE_MAX_BYTES) -> list[Any]:
    """Read and decode in one process (a host without the OS layer, tests)."""
    name = check_archive_name(sha256_hex)
    return decode_archive(name, read_archive_blob(archive_root, name, max_bytes), max_bytes)
