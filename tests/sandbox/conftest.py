"""Shared fixtures for the sandbox tests: small limits so the whole suite stays fast."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.executor import SubprocessExecutor
from sandbox.protocol import CellResult, SandboxLimits

# RLIMIT_AS must leave room for the interpreter; small enough that a memory bomb fails fast.
TEST_LIMITS = SandboxLimits(
    cell_timeout_s=2.0,
    max_output_chars=2_000,
    memory_bytes=512 * 1024**2,
    cpu_seconds_per_cell=10,
    file_size_bytes=1024**2,
)

SECRET_NAME = "RR_TEST_SECRET"
SECRET_VALUE = "s3cr3t-value-that-must-not-leak"


@pytest.fixture(autouse=True)
def _worker_unaffected() -> object:
    """The test process plays the worker: cells must not change its env, cwd or stdout."""
    os.environ[SECRET_NAME] = SECRET_VALUE
    env_before = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    cwd_before = os.getcwd()
    yield
    assert {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"} == env_before
    assert os.getcwd() == cwd_before


@pytest.fixture
async def executor() -> AsyncIterator[SubprocessExecutor]:
    ex = SubprocessExecutor(TEST_LIMITS)
    await ex.start(None, "auto", {"task": {"question": "q"}, "skillbook": "- skill one"})
    yield ex
    await ex.close()


@pytest.fixture
def trace_file(tmp_path: Path) -> str:
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps({"question": "What is 2+2?", "steps": [{"role": "user", "content": "hi"}] * 3})
    )
    return str(path)


@pytest.fixture
async def breached(trace_file: str) -> AsyncIterator[SubprocessExecutor]:
    """A host with the language guards switched off (the test-only unguarded op): an attacker with the real
    builtins, for the tests that prove what the OS layer and the worker still hold."""
    ex = SubprocessExecutor(TEST_LIMITS, isolation="auto", unguarded_for_tests=True)
    await ex.start(trace_file, "auto", {"task": {"question": "q"}})
    yield ex
    await ex.close()


GUARD = ("guard",)
CONTAINED = ("guard", "runtime")


async def attempt(
    ex: SubprocessExecutor,
    code: str,
    kinds: tuple[str, ...] = GUARD,
    *,
    never_printed: tuple[str, ...] = (),
    never_shown: tuple[str, ...] = (),
) -> CellResult:
    """Run an attack, check it was refused/contained, then check the executor still works.

    `never_printed`: texts the cell's stdout must not contain; `never_shown`: nor stdout or error.
    """
    result = await ex.run_cell(code)
    assert not result.ok, f"attack not refused: {result}"
    assert result.error_kind in kinds, result
    assert result.error
    text = result.stdout + (result.error or "")
    assert SECRET_VALUE not in text
    assert not any(m in result.stdout for m in never_printed), result
    assert not any(m in text for m in never_shown), result
    follow = await ex.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n", follow
    return result
