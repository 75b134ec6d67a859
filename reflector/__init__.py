"""Durable Recursive Reflector: domain code (types, settings, blob store, traces, models, client, CLI).

The Python API (`reflector.api`): `from reflector import reflect, areflect, RRConfig, ReflectorOutput, RRStep`.
Its names are imported on first use: the sandbox host and the workers import `reflector.traces` and
`reflector.toolkit`, which must not pay for pydantic, temporalio or pydantic-ai.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reflector.api import RRConfig, RRStep, areflect, reflect
    from reflector.contract import ReflectorDeps as RRDeps
    from reflector.contract import ReflectorOutput
    from reflector.trace_sandbox import ExecutionResult, ExecutionTimeoutError, TraceSandbox

__all__ = ["reflect", "areflect", "RRConfig", "RRStep", "ReflectorOutput", "RRDeps", "TraceSandbox",
           "ExecutionResult", "ExecutionTimeoutError"]

_API = {"reflect", "areflect", "RRConfig", "RRStep", "ReflectorOutput"}
# ACE's other public names of its RR (`ace.steps.rr_step.__all__`), as rr has them: where they live, their name there
_ACE_NAMES = {"RRDeps": ("reflector.contract", "ReflectorDeps"), "TraceSandbox": ("reflector.trace_sandbox", "TraceSandbox"),
              "ExecutionResult": ("reflector.trace_sandbox", "ExecutionResult"),
              "ExecutionTimeoutError": ("reflector.trace_sandbox", "ExecutionTimeoutError")}


def __getattr__(name: str) -> Any:
    if name in _API:
        from reflector import api

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
