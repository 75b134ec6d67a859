"""Workflow-cache evictions of a benchmark worker process, one log line each.

temporalio logs every eviction of a run from the worker's workflow cache at debug level
(`temporalio.worker._workflow`: "Evicting workflow with run ID ..., message: <why>"). A benchmark
worker prints them as `EVICTION: <why>` so that `bench.throughput` can count them per point: a run
evicted before it finished (cache full, a task handed out from the shared queue, a failed
activation) is replayed from its first event when its next task comes.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["MARK", "print_evictions"]

MARK = "EVICTION: "


class _Evictions(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if (
            str(record.msg).startswith("Evicting workflow")
            and isinstance(record.args, tuple)
            and len(record.args) == 2
        ):
            why = str(record.args[1]).replace("\n", " ")
            sys.stdout.write(f"{MARK}{why}\n")
            sys.stdout.flush()
        elif record.levelno >= logging.INFO:  # what the logger would have passed on at its usual level
            logging.getLogger().handle(record)


def print_evictions() -> None:
    """Print each eviction of this process's workers (the logger's other debug lines are off unless
    temporalio's LOG_PROTOS is set)."""
    logger = logging.getLogger("temporalio.worker._workflow")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # its debug lines go to this handler only
    logger.addHandler(_Evictions(level=logging.DEBUG))
