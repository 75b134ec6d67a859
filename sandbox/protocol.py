"""The executor protocol: how the worker side talks to a sandbox backend.

A backend (subprocess host today; a container, gVisor or nsjail host tomorrow) implements
`Executor`. Workflows never import this package; activities do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = ["CellResult", "SandboxLimits", "Executor", "ErrorKind"]

ErrorKind = Literal["syntax", "guard", "runtime", "timeout", "memory", "crash", "output"]


@dataclass(frozen=True)
class SandboxLimits:
    """Named limits of one sandbox host (see ARCHITECTURE.md section 4)."""

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
