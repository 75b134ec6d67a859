"""`rr server`, `rr worker`: the embedded Temporal dev server in the foreground; a worker (or N under one
supervisor, each a `reflector/cli/worker_child.py`)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from reflector.runtime.settings import Settings


def _server(args: argparse.Namespace, settings: Settings) -> int:
    from reflector.runtime.foreground import run_foreground
    from reflector.runtime.settings import usable_dir

    usable_dir(settings.home, "RR_HOME")
    return run_foreground(settings.db_file, port=args.port, ui_port=args.ui_port, home=settings.home)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from reflector.runtime.supervisor import run_supervisor, worker_processes

    processes = worker_processes(args.processes)
    if processes > 1:
        from reflector.runtime.connection import check_reachable

        check_reachable(settings)  # before N children each import the worker to find the server is not there
        return run_supervisor(processes, cmd=[sys.executable, "-m", "reflector.cli.worker_child"])
    from reflector.client import configure_core_logging

    configure_core_logging(worker_warnings=True)
    from worker import run_worker

    asyncio.run(run_worker(settings))
    return 0
