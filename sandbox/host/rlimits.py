"""The host's OS resource limits (rlimits): the process-wide ones set before any model code, and the CPU
budget re-armed before each cell (the hard wall timeout is the worker's: it kills the host)."""

from __future__ import annotations

import resource
from typing import Any

__all__ = ["CPU_SLACK_S", "apply_rlimits"]

CPU_SLACK_S = 1  # added to the per-cell CPU budget to absorb rounding of getrusage


def apply_rlimits(limits: dict[str, Any]) -> None:
    """Apply the process-wide OS limits; done first thing in the host, before any model code."""

    def setlim(which: int, value: int) -> None:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            soft, hard = resource.getrlimit(which)
            capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (capped, hard))

    if limits.get("memory_bytes"):
        setlim(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    if limits.get("file_size_bytes") is not None:
        setlim(resource.RLIMIT_FSIZE, int(limits["file_size_bytes"]))
    setlim(resource.RLIMIT_CORE, 0)
    try:
        setlim(resource.RLIMIT_NPROC, int(limits.get("max_processes", 0)))
    except (ValueError, OSError):
        pass  # best effort: root ignores NPROC, and fork is unreachable from cells anyway


def _arm_cpu_budget(seconds: int) -> None:
    """Raise the soft CPU limit to used + budget so each cell gets its own CPU allowance."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds + CPU_SLACK_S
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
