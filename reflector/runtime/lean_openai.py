"""A cheaper request body for the OpenAI SDK's Chat Completions `create` (worker CPU per model request).

Before it sends a request, the OpenAI SDK walks the whole body against its parameter types
(`openai._utils._transform`): at every dict, list and union of the message history it strips type
annotations, checks TypedDict-ness and looks for `PropertyInfo` aliases (renamed keys) and formats
(dates, base64 of files). For a Chat Completions request that walk changes nothing but dropping
omitted top-level parameters: no parameter type of the endpoint carries an alias, and pydantic-ai
builds the body from plain JSON values (no dates, no file objects). It was ~12% of rr's worker-process
CPU per step (py-spy, `bench/throughput.py` at 0.2 s x 50), for a body rebuilt node by node.

`install()` replaces the SDK's transform *for that endpoint's body only* by an exact shortcut:
when the parameter type tree has no alias (checked once, by walking the types the way the SDK
does) and the body is plain JSON (dict, list, str, int, float, bool, None, recursively), the result is the
body without its omitted top-level values, which is what the SDK's walk returns for such a body.
Anything else (another SDK version whose types grew an alias, a body holding another kind of
value) goes through the SDK's own transform, unchanged.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["install", "enable", "install_if_enabled", "has_alias", "plain_json", "lean_body"]

_installed = False
_enabled = False
_JSON_SCALARS = (str, int, float, bool, type(None))


def plain_json(value: object, depth: int = 0) -> bool:
    """Whether `value` is JSON data as `json.loads` would build it (dict keys are str)."""
    if isinstance(value, _JSON_SCALARS):
        return True
    if depth > 64:
        return False
    if type(value) is dict:
        return all(type(k) is str and plain_json(v, depth + 1) for k, v in value.items())
    if type(value) is list:
        return all(plain_json(v, depth + 1) for v in value)
    return False


def has_alias(tp: object, _seen: set[int] | None = None) -> bool:
    """Whether any part of the parameter type `tp` carries an SDK `PropertyInfo` alias (a renamed key)
    or a format (a value the SDK rewrites)."""
    from openai._utils._transform import PropertyInfo

    seen = _seen if _seen is not None else set()
    if id(tp) in seen:
        return False
    seen.add(id(tp))
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        if any(
            isinstance(m, PropertyInfo) and (m.alias is not None or m.format is not None) for m in args[1:]
        ):
            return True
        return has_alias(args[0], seen)
    if typing.is_typeddict(tp):
        from openai._utils._transform import get_type_hints

        hints = get_type_hints(tp, include_extras=True)
        return any(has_alias(h, seen) for h in hints.values())
    return any(has_alias(a, seen) for a in typing.get_args(tp))


def lean_body(data: Mapping[str, Any]) -> dict[str, Any]:
    """The body without its omitted (`omit` / `NOT_GIVEN`) top-level values."""
    from openai._utils import is_given

    return {k: v for k, v in data.items() if is_given(v)}


def enable() -> None:
    """Use the shortcut in this process (rr's workers): now if the OpenAI SDK is already imported, else when
    rr first builds an OpenAI provider (`install_if_enabled`). Processes that never call this (e.g. the
    benchmarks' anchor, a plain pydantic-ai worker) keep the SDK's transform."""
    global _enabled
    _enabled = True
    import sys

    if "openai" in sys.modules:
        install()


def install_if_enabled() -> None:
    if _enabled:
        install()


def install() -> bool:
    """Route the Chat Completions `create` body through the shortcut (once per process); returns whether
    the shortcut is in use (False: this SDK's parameter types need the full transform)."""
    global _installed
    if _installed:
        return True
    from openai.resources.chat.completions import completions as module
    from openai.types.chat import completion_create_params as params

    lean_types = (params.CompletionCreateParamsNonStreaming, params.CompletionCreateParamsStreaming)
    if any(has_alias(t) for t in lean_types):
        return False
    sdk_transform = module.async_maybe_transform  # type: ignore[attr-defined]

    async def maybe_transform(data: object, expected_type: object) -> Any:
        if expected_type in lean_types and isinstance(data, dict):
            body = lean_body(data)
            if plain_json(body):
                return body
        return await sdk_transform(data, expected_type)

    module.async_maybe_transform = maybe_transform  # type: ignore[attr-defined]
    _installed = True
    return True
