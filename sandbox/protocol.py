"""The executor protocol: how the worker side talks to a sandbox backend.

A backend (subprocess host today; a container, gVisor or nsjail host tomorrow) implements
`Executor`. Workflows never import this package; activities do. `SessionManager`
(`sandbox.sessions`) makes executors durable; what it is given and returns is defined here too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "CellResult",
    "SandboxLimits",
    "Executor",
    "ErrorKind",
    "ExecutorFactory",
    "Inherit",
    "MAX_LIVE_HOSTS",
]

# Live sandbox hosts a `SessionManager` keeps when not told (those whose next cell is furthest off are stopped;
# their state comes back from the journal). A worker passes its `RR_MAX_LIVE_SANDBOXES`, whose default is sized
# from the machine (`sandbox.capacity`).
MAX_LIVE_HOSTS = 256
SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:@=+-]{1,200}$"  # session ids usable as a file name as they are

ErrorKind = Literal["syntax", "guard", "runtime", "timeout", "memory", "crash", "output"]


@dataclass(frozen=True)
class SandboxLimits:
    """Named limits of one sandbox host (memory, CPU time, wall clock per cell, output size)."""

    cell_timeout_s: float = 60.0
    max_output_chars: int = 50_000
    memory_bytes: int = 4 * 1024**3
    cpu_seconds_per_cell: int = 120
    file_size_bytes: int = 16 * 1024**2
    max_processes: int = 0


@dataclass(frozen=True)
class CellResult:
    """Outcome of one cell. `ok` is False for any error the model should see and correct."""

    ok: bool
    stdout: str = ""
    error: str | None = None
    error_kind: ErrorKind | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    submitted: Any | None = None
    host_restarted: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    """One live sandbox session (one host process holding one namespace)."""

    async def start(self, trace_path: str | None, trace_format: str, extra_vars: dict[str, Any]) -> None: ...

    async def run_cell(self, code: str) -> CellResult: ...

    async def close(self) -> None: ...

    @property
    def alive(self) -> bool: ...


ExecutorFactory = Callable[[SandboxLimits], Executor]
# A parent's namespace export: the bytes, or the path of an immutable file holding them (a
# content-addressed blob: read only when a host is (re)started, so cells do not pay for loading it).
Inherit = bytes | os.PathLike[str]
