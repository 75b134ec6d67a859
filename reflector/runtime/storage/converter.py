"""One payload converter instance for the whole process.

The SDK builds a fresh `DataConverter` (and so instantiates its `payload_converter_class`) for every
workflow activation, every activity task and, with external storage configured, every payload
sequence it visits (`DataConverter._with_store_context` is a `dataclasses.replace`). pydantic-ai's
converter assembles a composite of six converters each time: measured at ≈ 7% of the worker's
Python time in `bench/throughput.py` (py-spy). The converter holds no per-use state (its adapters
are cached module-wide by pydantic-ai), so every instantiation can return the same object.
"""

from __future__ import annotations

import threading
from abc import ABCMeta
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIPayloadConverter

__all__ = ["SharedPayloadConverter"]


class _OneInstance(ABCMeta):
    _lock = threading.Lock()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a configured converter is not the shared one
            return super().__call__(*args, **kwargs)
        instance = cls.__dict__.get("_instance")
        if instance is None:
            with _OneInstance._lock:
                instance = cls.__dict__.get("_instance")
                if instance is None:
                    instance = super().__call__()
                    type.__setattr__(cls, "_instance", instance)
        return instance


class SharedPayloadConverter(PydanticAIPayloadConverter, metaclass=_OneInstance):
    """pydantic-ai's payload converter; `SharedPayloadConverter()` always returns the same instance.

    A subclass of `PydanticAIPayloadConverter`, so `PydanticAIPlugin` keeps it as it is.
    """
