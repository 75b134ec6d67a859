"""A snapshot transfer a dead worker left in a session's directory does not stay as long as the session."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sandbox.journal import STALE_INCOMING_S, Journal


def test_adopting_a_snapshot_removes_stale_transfers_only(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    directory = journal.session_dir("s1")
    directory.mkdir(parents=True)
    stale = directory / ".snapshot-dead1234.incoming"  # a worker SIGKILLed mid-transfer, long ago
    fresh = directory / ".snapshot-live5678.incoming"  # another transfer still being written
    other = directory / ".export-old.incoming"  # not a snapshot transfer: not this sweep's
    for p in (stale, fresh, other):
        p.write_bytes(b"x" * 10)
    old = time.time() - STALE_INCOMING_S - 60
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    src = directory / ".snapshot-now.incoming"
    src.write_bytes(b"pickled namespace")
    journal.adopt_snapshot("s1", 5, "start", src, keep_from=0)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [fresh.name, other.name, "snapshot-00000005.pkl", "snapshot-00000005.json"]
    )
    assert (directory / "snapshot-00000005.pkl").read_bytes() == b"pickled namespace"
