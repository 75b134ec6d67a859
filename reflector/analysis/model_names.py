"""LiteLLM-style model names (what ACE users pass) mapped onto rr's pydantic-ai `provider:model` names.

ACE's reflector takes LiteLLM spellings (`gpt-4o-mini`, `claude-3-5-sonnet-20241022`, `bedrock/...`,
`openrouter/...`) and sends the ones it does not recognise through a LiteLLM proxy. rr resolves models with
pydantic-ai (`reflector.runtime.models`), so the Python API maps the common spellings onto pydantic-ai providers
(`LITELLM_PREFIXES`, `BARE_FAMILIES`) and refuses the rest with the accepted forms. A name with a `:`
before any `/` is already a pydantic-ai name and is kept (as are registered names such as `heuristic`,
which the caller checks first). Pure string work: no import of pydantic-ai (`from reflector import RRConfig`
stays light).
"""

from __future__ import annotations

__all__ = [
    "HEURISTIC",
    "is_llm",
    "LITELLM_PREFIXES",
    "BARE_FAMILIES",
    "UnmappedModelName",
    "from_litellm",
    "ACCEPTED_FORMS",
]

# the built-in rule-based driver of the tools (`reflector.analysis.heuristic`): not an LLM
HEURISTIC = "heuristic"


def is_llm(name: str) -> bool:
    """Whether the model called `name` is an LLM (every model but the heuristic)."""
    return name != HEURISTIC


# LiteLLM `prefix/model` -> pydantic-ai provider (`provider:model`)
LITELLM_PREFIXES: dict[str, str] = {
    "openai": "openai",
    "anthropic": "anthropic",
    "bedrock": "bedrock",
    "bedrock_converse": "bedrock",
    "openrouter": "openrouter",
    "gemini": "google",
    "vertex_ai": "google-cloud",
    "azure": "azure",
    "azure_ai": "azure",
    "groq": "groq",
    "mistral": "mistral",
    "deepseek": "deepseek",
    "cohere": "cohere",
    "cohere_chat": "cohere",
    "xai": "xai",
    "together_ai": "together",
    "fireworks_ai": "fireworks",
    "ollama": "ollama",
    "ollama_chat": "ollama",
    "huggingface": "huggingface",
    "cerebras": "cerebras",
    "litellm_proxy": "litellm",
}

# bare LiteLLM names (no prefix) -> provider, by how the name starts
BARE_FAMILIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gpt-", "o1", "o3", "o4", "chatgpt-", "codex-"), "openai"),
    (("claude-",), "anthropic"),
    (("gemini-",), "google"),
    (("mistral-", "codestral-", "open-mistral-", "magistral-"), "mistral"),
    (("command-",), "cohere"),
    (("grok-",), "xai"),
    (("deepseek-",), "deepseek"),
)

ACCEPTED_FORMS = (
    "a registered name (heuristic, or one of register_model / RR_PLUGINS), a pydantic-ai name provider:model "
    "(e.g. openai:gpt-4o-mini, anthropic:claude-3-5-sonnet-latest), a pydantic-ai Model instance (RRStep), or a "
    "LiteLLM spelling rr maps: a bare gpt-*/o1*/o3*/o4*/claude-*/gemini-*/mistral-*/command-*/grok-*/deepseek-* "
    f"name, or prefix/model with prefix one of {', '.join(sorted(LITELLM_PREFIXES))}"
)


class UnmappedModelName(ValueError):
    """A model name that is neither pydantic-ai's form nor a LiteLLM spelling rr maps."""


def from_litellm(name: str) -> str:
    """`name` as a pydantic-ai model name: LiteLLM spellings mapped, pydantic-ai names (and names without
    a LiteLLM shape, left to the registry check) unchanged; a `prefix/model` of an unknown prefix raises
    `UnmappedModelName` naming the accepted forms."""
    text = name.strip()
    colon, slash = text.find(":"), text.find("/")
    if colon != -1 and (slash == -1 or colon < slash):
        return text  # provider:model (pydantic-ai), e.g. bedrock:us.anthropic.claude-...:0
    if slash != -1:
        prefix, rest = text[:slash], text[slash + 1 :]
        provider = LITELLM_PREFIXES.get(prefix.lower())
        if provider is None or not rest.strip():
            raise UnmappedModelName(
                f"model {name!r}: LiteLLM prefix {prefix!r} has no pydantic-ai provider rr "
                f"maps it to; accepted: {ACCEPTED_FORMS}"
            )
        return f"{provider}:{rest}"
    for starts, provider in BARE_FAMILIES:
        if text.lower().startswith(starts):
            return f"{provider}:{text}"
    return text
