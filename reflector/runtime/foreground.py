"""`rr server`: the embedded Temporal dev server (`reflector.runtime.devserver`) in the foreground."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

from reflector.runtime.devserver import LOOPBACK, DevServer, is_reachable

__all__ = ["run_foreground"]


def run_foreground(db_file: Path, port: int = 7233, ui_port: int = 8233, home: Path | None = None) -> int:
    """Run the dev server in the foreground for ``rr server``; returns its exit code.

    A subprocess (not ``exec``) so we can print where it listens first, refuse an occupied port
    with a clear message, and return a code. SIGINT/SIGTERM/SIGHUP are forwarded to the child,
    which runs in its own session so a terminal Ctrl-C reaches it exactly once (through us).
    """
    address = f"{LOOPBACK}:{port}"
    if home is not None:
        from reflector.runtime.homeserver import live_server, stop_idle

        running = live_server(home)
        if running is not None and stop_idle(home):  # one lingering after its last user makes way
            print(
                f"rr server: stopped the embedded server of {home} (pid {running.server_pid}), which no rr "
                "process used",
                file=sys.stderr,
                flush=True,
            )
            running = None
        if running is not None:
            print(
                f"rr server: the embedded server of {home} is already running on {running.address} "
                f"(pid {running.server_pid}); its clients use it",
                file=sys.stderr,
            )
            return 1
    if is_reachable(address, timeout=0.5):
        print(
            f"rr server: {address} is already in use (a Temporal server may already be running, e.g. the "
            "embedded server of another RR_HOME, which stops RR_EMBEDDED_LINGER_S after its last use); "
            "set TEMPORAL_ADDRESS to use it, or choose another port.",
            file=sys.stderr,
        )
        return 1
    server = DevServer(db_file, port=port, ui_port=ui_port, ui=True)
    argv = server.command()
    try:
        db_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"rr server: cannot create {db_file.parent}: {exc}", file=sys.stderr)
        return 1
    print(f"Temporal address: {address}", flush=True)
    print(f"Temporal Web UI:  {server.ui_url}", flush=True)
    print(f"SQLite file:      {db_file}", flush=True)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        print(f"rr server: cannot launch {argv[0]}: {exc}", file=sys.stderr)
        return 1

    keeper_fd: int | None = None
    if home is not None:  # the home's clients find it in RR_HOME/server.json (`reflector.runtime.homeserver`)
        from reflector.runtime.homeserver import register_foreground, unregister_foreground

        keeper_fd = register_foreground(home, address, server.ui_url, proc.pid)
        if keeper_fd is None:
            proc.terminate()
            proc.wait()
            print(f"rr server: another embedded server of {home} started meanwhile", file=sys.stderr)
            return 1

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    forwarded = [signal.SIGINT, signal.SIGTERM]
    if hasattr(signal, "SIGHUP"):
        forwarded.append(signal.SIGHUP)
    # Signal handlers can only be installed from the main thread (the CLI's case).
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, forward) for sig in forwarded} if in_main else {}
    try:
        return proc.wait()
    finally:
        if keeper_fd is not None:
            unregister_foreground(home, keeper_fd)  # type: ignore[arg-type]
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # e.g. an exception escaped the wait loop
            proc.kill()
            proc.wait()
