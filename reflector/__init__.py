"""Durable Recursive Reflector: domain code (types, settings, blob store, traces, models, client, CLI).

The Python API (`reflector.client.api`): `from reflector import reflect, areflect, RRConfig, ReflectorOutput, RRStep`.
Its names are imported on first use: the sandbox host and the workers import `reflector.analysis.traces` and
`reflector.analysis.toolkit`, which must not pay for pydantic, temporalio or pydantic-ai.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reflector.client.ace import RRStep
    from reflector.client.api import RRConfig, areflect, reflect
    from reflector.client.trace_sandbox import ExecutionResult, ExecutionTimeoutError, TraceSandbox
    from reflector.contract import ReflectorDeps as RRDeps
    from reflector.contract import ReflectorOutput

__all__ = [
    "reflect",
    "areflect",
    "RRConfig",
    "RRStep",
    "ReflectorOutput",
    "RRDeps",
    "TraceSandbox",
    "ExecutionResult",
    "ExecutionTimeoutError",
]

_API = {"reflect", "areflect", "RRConfig", "ReflectorOutput"}
# ACE's other public names of its RR (`ace.steps.rr_step.__all__`), as rr has them: where they live, their name there
_ACE_NAMES = {
    "RRStep": ("reflector.client.ace", "RRStep"),
    "RRDeps": ("reflector.contract", "ReflectorDeps"),
    "TraceSandbox": ("reflector.client.trace_sandbox", "TraceSandbox"),
    "ExecutionResult": ("reflector.client.trace_sandbox", "ExecutionResult"),
    "ExecutionTimeoutError": ("reflector.client.trace_sandbox", "ExecutionTimeoutError"),
}


def __getattr__(name: str) -> Any:
    if name in _API:
        from reflector.client import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    if name in _ACE_NAMES:
        import importlib

        module, attr = _ACE_NAMES[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reflector' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, *_ACE_NAMES})
