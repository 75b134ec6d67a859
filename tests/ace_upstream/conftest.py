"""Fixtures of ACE's vendored tests (issue 27): the model name they use is rr's heuristic, and every
reflection runs on the session's dev server with a private RR_HOME and task queue."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

UPSTREAM_MODEL = "bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0"  # TestRRStepIntegration.RR_MODEL


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: ACE's marker for tests that call a model (here: the heuristic)"
    )


@pytest.fixture(autouse=True)
def rr_on_the_session_server(
    temporal_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    from reflector.analysis.heuristic import make_heuristic_model
    from reflector.runtime.models import _factories, register_model
    from tests.support.blob_dirs import EXTRA_BLOB_DIRS

    for name in list(os.environ):
        if name.startswith(("RR_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    home = tmp_path / "rr-home"
    monkeypatch.setenv("RR_HOME", str(home))
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_server.address)
    monkeypatch.setenv("RR_TASK_QUEUE", f"ace-upstream-{uuid.uuid4().hex[:8]}")
    EXTRA_BLOB_DIRS.append(home / "blobs")
    if UPSTREAM_MODEL not in _factories:  # kept for the session: its end replays these histories by that name
        register_model(UPSTREAM_MODEL, make_heuristic_model)  # a registered name is never remapped (LiteLLM)
    yield
