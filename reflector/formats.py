"""Trace format names (stdlib only: imported by the sandbox host, which must start fast)."""

from __future__ import annotations

from typing import Literal

__all__ = ["TraceFormat"]

TraceFormat = Literal["ace", "messages", "openclaw", "tau-bench", "otel", "unknown"]
