"""Tool schemas customised once per worker, not once per model request (worker CPU per model request).

Before every request pydantic-ai runs each tool's JSON schema through the model profile's schema
transformer (`pydantic_ai.models._customize_tool_def`: a deep copy of the schema, then a walk that
rewrites it for the provider, e.g. OpenAI's strict mode). rr's tools and its output tool (the
reflection, with its nested learnings) are the same at every request of every reflection, so this is
the same work again and again: 10-13% of rr's worker-process CPU per step at 300 reflections in flight
(py-spy, `bench/throughput.py`).

`install()` memoises that function: the result for a schema is kept with a copy of the schema it was
made from and reused only while the schema is equal to that copy (a dict comparison, in C), for the
same tool name, transformer and `strict`. The lookup is by content, not by the schema object: a
durable model request gets its tool definitions decoded from the activity's input, new dicts at every
request (a cache keyed by `id(schema)` never hit there). The customised schema is shared between
requests: pydantic-ai's model classes only read it (they put it into the request body as it is).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

__all__ = ["install", "cached_customize", "MAX_ENTRIES"]

MAX_ENTRIES = 256  # distinct (tool name, transformer, strict) of one worker: its tools' (a few dozen at most)
VARIANTS = 4  # schemas kept per key (one tool name whose schema differs between agents or versions)

_installed = False
_original: Any = None  # pydantic-ai's own function, once replaced
_cache: dict[tuple[str, Any, Any], list[tuple[dict[str, Any], Any]]] = {}


def cached_customize(original: Any, transformer: Any, tool_def: Any) -> Any:
    """`original(transformer, tool_def)`, memoised by the schema's content (see the module doc)."""
    schema = tool_def.parameters_json_schema
    key = (tool_def.name, transformer, tool_def.strict)
    variants = _cache.get(key)
    if variants is not None:
        for made_from, done in variants:
            if made_from == schema:
                return replace(
                    tool_def, parameters_json_schema=done.parameters_json_schema, strict=done.strict
                )
    done = original(transformer, tool_def)
    if variants is None:
        if len(_cache) >= MAX_ENTRIES:
            _cache.clear()
        variants = _cache[key] = []
    elif len(variants) >= VARIANTS:
        variants.pop(0)
    variants.append((copy.deepcopy(schema), done))
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
