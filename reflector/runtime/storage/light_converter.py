"""The payload converter of clients that run no worker, without importing pydantic-ai.

`PydanticAIPayloadConverter` (`reflector.runtime.storage.converter`) can only be imported with pydantic-ai's
whole Temporal integration (the package's `__init__` loads the agent stack): about 1 s of CPU in every
process that imports it, most of what `rr status`, `rr result`, `rr list` or `rr cancel` spends. Those
commands connect a client that never hosts a worker, and such a client needs only the payload converter,
which writes and reads the same bytes as pydantic-ai's:

- encoding: pydantic-ai's converter is temporalio's `PydanticPayloadConverter` with its JSON converter
  replaced by a subclass that overrides decoding only, so both write `pydantic_core.to_json(value)` under
  `json/plain`, and the other encodings (null, binary, protobuf) are temporalio's defaults in both;
- decoding: pydantic-ai validates with a cached `TypeAdapter` and the context `JOURNAL_CONTEXT` (how its
  messages rebuild the files of tool results recorded before files were recorded); this one does too.

`tests/unit/test_light_converter.py` checks both directions on rr's inputs and outputs, pydantic-ai's message
types and the payloads of the committed replay histories. A client that may host a worker in this process
keeps pydantic-ai's plugin and converter (an in-process worker inherits its client's plugins).
"""

from __future__ import annotations

import functools
import threading
from abc import ABCMeta
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DefaultPayloadConverter, JSONPlainPayloadConverter

__all__ = ["JOURNAL_CONTEXT", "LightPayloadConverter", "OneInstance"]

# pydantic_ai.messages._JOURNAL_CONTEXT, spelled out here so that this module does not import pydantic-ai (the
# tests compare the two)
JOURNAL_CONTEXT: Mapping[str, Any] = {"pydantic_ai": {"rebuild_unrecorded_tool_files": True}}


class OneInstance(ABCMeta):
    """A metaclass whose classes, called with no argument, always return one instance per class.

    The SDK builds a fresh `DataConverter` (and so instantiates its `payload_converter_class`) for every
    workflow activation, every activity task and, with external storage configured, every payload sequence
    it visits; a converter that holds no per-use state can be the same object each time.
    """

    _lock = threading.Lock()

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a configured converter is not the shared one
            return super().__call__(*args, **kwargs)
        instance = cls.__dict__.get("_instance")
        if instance is None:
            with OneInstance._lock:
                instance = cls.__dict__.get("_instance")
                if instance is None:
                    instance = super().__call__()
                    type.__setattr__(cls, "_instance", instance)
        return instance


@functools.lru_cache(maxsize=1024)
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint)


class _JournalJSONConverter(PydanticJSONPlainPayloadConverter):
    """temporalio's pydantic JSON converter, decoding with pydantic-ai's journal context."""

    def from_payload(self, payload: Payload, type_hint: type | None = None) -> Any:
        hint: Any = type_hint if type_hint is not None else Any
        try:
            hash(hint)
        except TypeError:  # pydantic accepts some unhashable hints: valid, but not cached
            adapter: TypeAdapter[Any] = TypeAdapter(hint)
        else:
            adapter = _adapter(hint)
        return adapter.validate_json(payload.data, context=JOURNAL_CONTEXT)


class LightPayloadConverter(PydanticPayloadConverter, metaclass=OneInstance):
    """The same payloads as pydantic-ai's converter, for clients that host no worker (see above)."""

    def __init__(self) -> None:
        json_converter = _JournalJSONConverter()
        CompositePayloadConverter.__init__(
            self,
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            ),
        )
