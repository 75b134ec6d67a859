"""`rr server`, `rr worker`: the embedded Temporal dev server in the foreground; a worker (or N under one
supervisor, each a `reflector/cli/worker_child.py`)."""

from __future__ import annotations

import argparse
import sys

from reflector.runtime.settings import Settings


def _server(args: argparse.Namespace, settings: Settings) -> int:
    from reflector.runtime.foreground import run_foreground
    from reflector.runtime.settings import usable_dir

    usable_dir(settings.home, "RR_HOME")
    if args.stop:
        return _stop_server(settings)
    return run_foreground(settings.db_file, port=args.port, ui_port=args.ui_port, home=settings.home)


def _stop_server(settings: Settings) -> int:
    """`rr server --stop`: stop the home's embedded server if nothing uses it (a lingering one)."""
    from reflector.runtime.homeserver import live_server, stop_idle

    running = live_server(settings.home)
    if running is None:
        print(f"rr server: no embedded server of {settings.home} is running")
        return 0
    if not running.managed:
        print(
            f"rr server: the server of {settings.home} on {running.address} runs in the foreground (`rr server`, "
            f"pid {running.keeper_pid}): stop it there (Ctrl-C)",
            file=sys.stderr,
        )
        return 1
    if stop_idle(settings.home):
        print(f"rr server: stopped the embedded server of {settings.home} (pid {running.server_pid})")
        return 0
    print(
        f"rr server: the embedded server of {settings.home} on {running.address} is in use by an rr process of "
        "this home; it stops RR_EMBEDDED_LINGER_S after the last one ends",
        file=sys.stderr,
    )
    return 1


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from reflector.runtime.supervisor import run_supervisor, worker_processes

    processes = worker_processes(args.processes)
    if processes > 1:
        from reflector.runtime.connection import check_reachable

        check_reachable(settings)  # before N children each import the worker to find the server is not there
        return run_supervisor(processes, cmd=[sys.executable, "-m", "reflector.cli.worker_child"])
    from reflector.client import configure_core_logging

    configure_core_logging(worker_warnings=True)
    from reflector.runtime import event_loop
    from worker import run_worker

    event_loop.run(run_worker(settings), settings.event_loop)
    return 0
