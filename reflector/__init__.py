"""Durable Recursive Reflector: domain code (types, settings, blob store, traces, models, client, CLI).

The Python API (`reflector.api`): `from reflector import reflect, areflect, RRConfig, ReflectorOutput, RRStep`.
Its names are imported on first use: the sandbox host and the workers import `reflector.traces` and
`reflector.toolkit`, which must not pay for pydantic, temporalio or pydantic-ai.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reflector.api import RRConfig, RRStep, areflect, reflect
    from reflector.contract import ReflectorOutput

__all__ = ["reflect", "areflect", "RRConfig", "RRStep", "ReflectorOutput"]

_API = {"reflect", "areflect", "RRConfig", "RRStep", "ReflectorOutput"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from reflector import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reflector' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
