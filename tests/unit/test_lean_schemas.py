"""Tool schemas customised once per worker (reflector.runtime.lean_schemas) send the same requests.

A pydantic-ai agent with a tool and rr's output tool makes three Chat Completions requests against the
local OpenAI-compatible server, once with pydantic-ai's own per-request customisation and once memoised:
the bodies on the wire are the same, and the memoised run customised each schema once.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pydantic_ai.models as pai_models
import pytest
from pydantic_ai.profiles.openai import OpenAIJsonSchemaTransformer

from reflector.contract import OUTPUT_TOOL
from reflector.runtime import lean_schemas
from tests.support.openai_agent import run_agent


async def _run_agent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return await run_agent(monkeypatch, "lean-schemas")


async def test_memoised_schemas_send_the_same_requests_and_are_customised_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = lean_schemas._original if lean_schemas._installed else pai_models._customize_tool_def
    monkeypatch.setattr(pai_models, "_customize_tool_def", original)  # pydantic-ai's own, per request
    plain = await _run_agent(monkeypatch)
    calls: list[str] = []

    def counted(transformer: Any, tool_def: Any) -> Any:
        calls.append(tool_def.name)
        return original(transformer, tool_def)

    lean_schemas._cache.clear()
    monkeypatch.setattr(
        pai_models,
        "_customize_tool_def",
        lambda transformer, tool_def: lean_schemas.cached_customize(counted, transformer, tool_def),
    )
    memoised = await _run_agent(monkeypatch)
    assert len(plain) == 3
    assert memoised == plain  # the same JSON on the wire
    assert sorted(calls) == sorted({"execute_code", OUTPUT_TOOL})  # each schema customised once, not 3 times


@dataclass
class _Tool:
    name: str
    parameters_json_schema: dict[str, Any]
    strict: bool | None = None


def test_a_schema_changed_in_place_is_customised_again() -> None:
    seen: list[dict[str, Any]] = []

    def original(transformer: Any, tool_def: Any) -> Any:
        seen.append(dict(tool_def.parameters_json_schema))
        return tool_def

    lean_schemas._cache.clear()
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    tool = _Tool("t", schema)
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, tool)
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, tool)
    assert len(seen) == 1
    schema["properties"]["b"] = {"type": "integer"}  # same dict object, new content
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, tool)
    assert len(seen) == 2 and "b" in seen[1]["properties"]
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, _Tool("t", schema, strict=True))
    assert len(seen) == 3  # another strictness is another result


def test_an_equal_schema_decoded_again_is_not_customised_again() -> None:
    """A durable model request decodes its tool definitions from the activity input: new dicts with
    the same content every time. They hit; a different schema under the same name does not."""
    seen: list[dict[str, Any]] = []

    def original(transformer: Any, tool_def: Any) -> Any:
        seen.append(tool_def.parameters_json_schema)
        return tool_def

    lean_schemas._cache.clear()
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for _ in range(3):
        lean_schemas.cached_customize(
            original, OpenAIJsonSchemaTransformer, _Tool("t", copy.deepcopy(schema))
        )
    assert len(seen) == 1
    other = {"type": "object", "properties": {"b": {"type": "integer"}}}
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, _Tool("t", other))
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, _Tool("t", copy.deepcopy(schema)))
    lean_schemas.cached_customize(original, OpenAIJsonSchemaTransformer, _Tool("t", copy.deepcopy(other)))
    assert len(seen) == 2  # both variants kept
