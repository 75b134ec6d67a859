"""One payload converter instance for the whole process.

The SDK builds a fresh `DataConverter` (and so instantiates its `payload_converter_class`) for every
workflow activation, every activity task and, with external storage configured, every payload
sequence it visits (`DataConverter._with_store_context` is a `dataclasses.replace`). pydantic-ai's
converter assembles a composite of six converters each time: measured at ≈ 7% of the worker's
Python time in `bench/throughput.py` (py-spy). The converter holds no per-use state (its adapters
are cached module-wide by pydantic-ai), so every instantiation can return the same object.

Importing this module imports pydantic-ai's Temporal integration; clients that host no worker use
`reflector.runtime.storage.light_converter` instead (the same payloads, without that import).
"""

from __future__ import annotations

from pydantic_ai.durable_exec.temporal import PydanticAIPayloadConverter

from reflector.runtime.storage.light_converter import OneInstance

__all__ = ["SharedPayloadConverter"]


class SharedPayloadConverter(PydanticAIPayloadConverter, metaclass=OneInstance):
    """pydantic-ai's payload converter; `SharedPayloadConverter()` always returns the same instance.

    A subclass of `PydanticAIPayloadConverter`, so `PydanticAIPlugin` keeps it as it is.
    """
