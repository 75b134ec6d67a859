"""Shared fixtures: one real Temporal dev server per session, isolated rr homes, shared traces.

Why a real dev server (not ``WorkflowEnvironment.start_local``): it is the same binary and flags
the product runs embedded, it never tries to download anything, and a single session-wide
server keeps the suite fast (a start costs well under a second here, a stop about one second).
Tests isolate themselves by unique workflow ids / task queues, not by separate servers; tests
that need different server settings (dynamic config) use ``temporal_server_factory``.

Add new fixtures under their own section below; keep this file free of test logic.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandbox.isolation
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings
from tests.support.user_env import SUITE_SETTINGS

# A suite started as a background job of a non-interactive shell (`./.ci/run &`) inherits SIGINT ignored, and
# every `rr` subprocess would inherit that too (exec keeps an ignored signal): the tests that press Ctrl-C
# need it delivered. A handled signal is reset to the default in the children, which then handle it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hosts the tests build directly (without a worker) follow RR_SANDBOX_ISOLATION too: on a machine without
# Landlock, `RR_SANDBOX_ISOLATION=language-only pytest` runs the suite without the OS layer.
sandbox.isolation.DEFAULT_MODE = Settings.from_env().sandbox_isolation

# The homes the suite's commands create stop their embedded servers with their last user (`user_env`)
for _name, _value in SUITE_SETTINGS.items():
    os.environ.setdefault(_name, _value)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"


# --------------------------------------------------------------------------------------------
# pytest-xdist
# --------------------------------------------------------------------------------------------


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (`addopts`): two workers per core this process may run on, 2 to 8. The suite's tests wait
    on servers, subprocesses and timers for much of their time; two workers on two cores left ~37 % of the
    cores idle (8 min 40 s), four keep them ~83 % busy (6 min 30 s, `BENCHMARKS.md`)."""
    affinity = getattr(os, "sched_getaffinity", None)  # (Linux; macOS has none)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(2, min(8, 2 * cores))


# --------------------------------------------------------------------------------------------
# Temporal server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """What tests need to reach a running dev server."""

    address: str
    db_file: Path | None
    namespace: str
    ui_url: str | None
    server: DevServer


def _info(server: DevServer) -> ServerInfo:
    return ServerInfo(
        address=server.address,
        db_file=server.db_file,
        namespace=server.namespace,
        ui_url=server.ui_url,
        server=server,
    )


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A dev server on a free loopback port with a temp SQLite file, shared by the session (by one
    pytest-xdist worker's tests). Before it stops, every finished reflection and batch history it holds
    is replayed against the current code: a failure is an error of the session (at this teardown)."""
    import asyncio

    from tests.support.blob_dirs import EXTRA_BLOB_DIRS
    from tests.support.replay_all import replay_server_histories

    root = tmp_path_factory.mktemp("temporal")
    server = DevServer(root / "temporal.sqlite", ui=False, log_file=root / "server.log")
    server.start(timeout=60)
    failures: list[str] = []
    try:
        yield _info(server)
        _replayed, failures = asyncio.run(
            replay_server_histories(server.address, EXTRA_BLOB_DIRS, root / "failed-replays")
        )
    finally:
        server.stop()
    assert not failures, "histories that do not replay against the current code:\n" + "\n".join(failures)


StartServer = Callable[..., ServerInfo]


@pytest.fixture
def temporal_server_factory(tmp_path: Path) -> Iterator[StartServer]:
    """Start extra, test-private servers, e.g. ``start(dynamic_config={...})``; all stopped after.

    Keyword arguments: ``dynamic_config`` (mapping), ``in_memory`` (default False: a temp SQLite
    file), ``ui`` (default False), ``extra_args``.
    """
    started: list[DevServer] = []

    def start(
        *,
        dynamic_config: Mapping[str, object] | None = None,
        in_memory: bool = False,
        ui: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> ServerInfo:
        index = len(started)
        server = DevServer(
            None if in_memory else tmp_path / f"temporal-{index}.sqlite",
            ui=ui,
            dynamic_config=dynamic_config,
            extra_args=extra_args,
            log_file=tmp_path / f"temporal-{index}.log",
        )
        started.append(server)
        server.start(timeout=60)
        return _info(server)

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()


# --------------------------------------------------------------------------------------------
# Environment and data
# --------------------------------------------------------------------------------------------


@pytest.fixture
def rr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``RR_HOME`` (blobs default under it: ``RR_BLOB_DIR`` is unset)."""
    home = tmp_path / "rr-home"
    home.mkdir()
    monkeypatch.setenv("RR_HOME", str(home))
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The team's real trace corpus in ``../shared/traces``; skipped in a user's clone."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(
            f"../shared/traces is absent (a user's clone has no ../shared): looked for {SHARED_TRACES}"
        )
    return SHARED_TRACES
