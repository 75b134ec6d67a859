"""Provider prompt caching: one rule for every way a reflection is started.

Every model request of a session re-sends the same prefix (tool definitions, instructions, the task prompt)
and the conversation so far; a provider with a prompt cache serves that prefix from its cache at about a
tenth of the input price. rr turns it on through pydantic-ai's model settings:

- `cache` (pydantic-ai's portable setting): Anthropic cache points on the tool definitions, the instructions
  and the growing conversation; Bedrock's and OpenRouter's equivalents; OpenAI's explicit breakpoints on
  the models that have them. A retention (`"5m"`, `"1h"`) is snapped by pydantic-ai to the provider's tiers.
- `openai_prompt_cache_key` (OpenAI, which caches prefixes of 1,024 tokens and more by itself): a key per
  session, so the session's requests are routed to the machine that holds its prefix. The key is a hash of
  the session's workflow id: no trace or user name reaches the provider.

On by default (`DEFAULT_CACHE`); the caller's own settings win: `cache: False` turns it off (and with it the
key), any provider-specific cache setting (`anthropic_cache*`, `openai_prompt_cache_key`, ...) is left to
pydantic-ai as given. ACE's `RRConfig(cache_prompts=..., cache_ttl=...)` writes `cache` through the same rule.
Models of other providers (the heuristic, test and registered models) get no cache settings. Pure: called
in workflow code.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["CACHING_FAMILIES", "OPENAI_FAMILIES", "DEFAULT_CACHE", "with_prompt_cache", "cache_key", "caches"]

CACHING_FAMILIES = (
    "anthropic",
    "bedrock",
    "openai",
    "openai-chat",
    "openai-responses",
    "google",
    "google-cloud",
    "openrouter",
)
"""Providers (the `provider:` of a model name) whose pydantic-ai models honour the `cache` setting."""
OPENAI_FAMILIES = ("openai", "openai-chat", "openai-responses")
"""Providers that take `openai_prompt_cache_key`."""
DEFAULT_CACHE: bool | str = True
"""The `cache` setting when the caller gave none: on, with the provider's default retention."""
_PROVIDER_SPECIFIC = (
    "anthropic_cache",
    "bedrock_cache",
    "openrouter_cache",
    "openai_cache",
    "openai_prompt_cache",
)


def _family(model: str) -> str:
    return model.split(":", 1)[0] if ":" in model else ""


def caches(model: str) -> bool:
    """Whether `model`'s provider has a prompt cache rr turns on."""
    return _family(model) in CACHING_FAMILIES


def cache_key(session_id: str) -> str:
    """The `openai_prompt_cache_key` of a session (a hash of its workflow id; OpenAI caps keys at 64 chars)."""
    return "rr-" + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def with_prompt_cache(
    model: str,
    given: dict[str, Any] | None,
    *,
    cache: bool | str = DEFAULT_CACHE,
    session_id: str | None = None,
) -> dict[str, Any] | None:
    """`given` model settings with prompt caching added for `model`'s provider (the module docstring's rule).

    `cache`: the setting to add when `given` has none (`True`, `False` or a retention); `session_id`: the
    session whose OpenAI requests share a cache key (None: no key, e.g. on the client before a session exists).
    `given` None stays None unless something is added (the workflow then adds its temperature 0)."""
    if not caches(model):
        return given
    settings = dict(given or {})
    if any(k.startswith(_PROVIDER_SPECIFIC) for k in settings):
        return given  # the caller configured the provider's own caching: theirs, untouched
    settings.setdefault("cache", cache)
    if settings["cache"] is not False and session_id is not None and _family(model) in OPENAI_FAMILIES:
        settings["openai_prompt_cache_key"] = cache_key(session_id)
    return settings
