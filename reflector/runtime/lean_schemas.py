"""Tool schemas customised once per worker, not once per model request (worker CPU per model request).

Before every request pydantic-ai runs each tool's JSON schema through the model profile's schema
transformer (`pydantic_ai.models._customize_tool_def`: a deep copy of the schema, then a walk that
rewrites it for the provider, e.g. OpenAI's strict mode). rr's tools and its output tool (the
reflection, with its nested learnings) are the same at every request of every reflection, so this is
the same work again and again: 10-13% of rr's worker-process CPU per step at 300 reflections in flight
(py-spy, `bench/throughput.py`).

`install()` memoises that function: the result for a schema is kept with a copy of the schema it was
made from and reused only while the schema is still equal to that copy (a dict comparison, in C),
for the same transformer and the same `strict`. The customised schema is shared between requests:
pydantic-ai's model classes only read it (they put it into the request body as it is).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

__all__ = ["install", "cached_customize", "MAX_ENTRIES"]

MAX_ENTRIES = 256  # distinct (schema, transformer, strict) of one worker: its tools' (a few dozen at most)

_installed = False
_original: Any = None  # pydantic-ai's own function, once replaced
_cache: dict[tuple[int, Any, Any], tuple[dict[str, Any], Any]] = {}


def cached_customize(original: Any, transformer: Any, tool_def: Any) -> Any:
    """`original(transformer, tool_def)`, memoised by the schema's content (see the module doc)."""
    schema = tool_def.parameters_json_schema
    key = (id(schema), transformer, tool_def.strict)
    hit = _cache.get(key)
    if hit is not None and hit[0] == schema:
        done = hit[1]
        return replace(tool_def, parameters_json_schema=done.parameters_json_schema, strict=done.strict)
    done = original(transformer, tool_def)
    if len(_cache) >= MAX_ENTRIES:
        _cache.clear()
    _cache[key] = (copy.deepcopy(schema), done)
    return done


def install() -> None:
    """Memoise pydantic-ai's per-request tool-schema customisation in this process (once)."""
    global _installed, _original
    if _installed:
        return
    import pydantic_ai.models as models

    original = _original = models._customize_tool_def

    def customize(transformer: Any, tool_def: Any) -> Any:
        return cached_customize(original, transformer, tool_def)

    models._customize_tool_def = customize
    _installed = True
