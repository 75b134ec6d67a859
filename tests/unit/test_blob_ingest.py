"""`BlobStore.ingest`: a large trace is copied into the store once and scanned from the copy.

The digest, what the scan read and the stored blob must be the same bytes, whatever happens to the
source meanwhile; nothing is stored when the scan fails.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO

import pytest

from reflector.runtime.storage.blobs import BlobStore


def test_the_scan_reads_the_stored_bytes_even_if_the_source_changes(tmp_path: Path) -> None:
    src = tmp_path / "t.jsonl"
    original = b'{"role": "user", "content": "q"}\n' * 50_000
    src.write_bytes(original)
    store = BlobStore(tmp_path / "store")
    seen: list[bytes] = []

    def scan(fh: IO[bytes]) -> int:
        seen.append(fh.read(1000))
        src.write_bytes(b"changed\n" * 10)  # the user rewrites the file while it is being scanned
        while block := fh.read(1 << 16):
            seen.append(block)
        return 7

    digest, size, got = store.ingest(src, scan, chunk=4096)
    assert got == 7
    assert b"".join(seen) == original
    assert (digest, size) == (hashlib.sha256(original).hexdigest(), len(original))
    assert store.path_for(digest).read_bytes() == original


def test_a_partial_scan_still_hashes_the_whole_file(tmp_path: Path) -> None:
    src = tmp_path / "t.json"
    src.write_bytes(b"[" + b"1, " * 100_000 + b"1]")
    store = BlobStore(tmp_path / "store")
    digest, size, _ = store.ingest(src, lambda fh: fh.read(10), chunk=1000)
    assert digest == hashlib.sha256(src.read_bytes()).hexdigest() and size == src.stat().st_size
    assert store.path_for(digest).read_bytes() == src.read_bytes()


def test_nothing_is_stored_when_the_scan_fails(tmp_path: Path) -> None:
    src = tmp_path / "t.json"
    src.write_bytes(b"[1, 2, 3]")
    store = BlobStore(tmp_path / "store")

    def scan(fh: IO[bytes]) -> None:
        fh.read(2)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        store.ingest(src, scan)
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
