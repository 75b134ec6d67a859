"""Fixtures for workflow tests: one rr home, one client and one in-process worker per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import reflector.testing.scripted  # noqa: F401  (registers the scripted models)
from reflector.runtime.settings import Settings


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("rr-home")
    os.environ["RR_HOME"] = str(home)
    os.environ.pop("RR_BLOB_DIR", None)
    return home


@pytest.fixture(scope="session")
def settings(session_home: Path) -> Settings:
    from tests.support.blob_dirs import EXTRA_BLOB_DIRS

    s = Settings.from_env()
    EXTRA_BLOB_DIRS.append(s.blob_dir)  # the session server's final replay (tests/conftest.py) reads it
    return s


@pytest.fixture(scope="session")
async def client(temporal_server, settings: Settings):
    from reflector.client import connect

    # large payloads go to the session home's blob store (never the user's ~/.rr)
    return await connect(temporal_server.address, settings=settings)


@pytest.fixture(scope="session")
async def task_queue(client, settings: Settings) -> AsyncIterator[str]:
    """A worker on a private task queue, running for the whole session in this process."""
    from activities import sandbox as sandbox_activities
    from worker import build_worker

    tq = f"rr-test-{uuid.uuid4().hex[:6]}"
    async with build_worker(client, tq):
        yield tq
    await sandbox_activities.shutdown()
