"""The environment of a Python-API test: nothing of the caller's rr / Temporal settings, a private RR_HOME."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.user_env import SUITE_SETTINGS


def isolate(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Drop every RR_* and TEMPORAL_* variable (but `SUITE_SETTINGS`) and point RR_HOME at `home`."""
    for name in list(os.environ):
        if name.startswith(("RR_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    for name, value in SUITE_SETTINGS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RR_HOME", str(home))


def on_session_server(monkeypatch: pytest.MonkeyPatch, home: Path, address: str, queue_prefix: str) -> Path:
    """`isolate`, on the session's server with a private task queue (no other worker takes these reflections);
    the session's final replay reads these histories' payloads from the home's blobs."""
    isolate(monkeypatch, home)
    monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("RR_TASK_QUEUE", f"{queue_prefix}-{uuid.uuid4().hex[:8]}")
    EXTRA_BLOB_DIRS.append(home / "blobs")
    return home
