"""Model resolution: any pydantic-ai model string, the built-in `heuristic`, and registered extras.

The same resolver runs workflow-side (to plan the request) and inside the model-request activity
(to build the live model), so it must be deterministic and do no I/O. Provider SDK retries are
turned off for the providers we build ourselves: Temporal's retry policy owns retries, and SDK
retries inside an activity would hide failures from the history and multiply latency.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from pydantic_ai.capabilities import ResolveModelId
from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model, infer_model
from pydantic_ai.providers import Provider, infer_provider, infer_provider_class
from temporalio import workflow

from reflector.heuristic import make_heuristic_model

__all__ = [
    "HEURISTIC",
    "UnknownModelError",
    "register_model",
    "resolve_model",
    "check_model_name",
    "model_resolver",
    "load_plugins",
    "is_llm",
]

HEURISTIC = "heuristic"

ModelFactory = Callable[[], Model]
_factories: dict[str, ModelFactory] = {}
_instances: dict[str, Model] = {}


class UnknownModelError(UserError, ValueError):
    """The model name cannot be built here (unknown name, missing provider package or credentials).

    A `UserError`, so that raised in workflow code it fails the workflow with this message instead
    of failing the workflow task (which Temporal would retry forever).
    """


def register_model(name: str, model: Model | ModelFactory) -> None:
    """Register a model under `name` (used by `heuristic`, tests and plugins).

    Registration must happen in every worker process (at import time of a plugin module listed in
    `RR_PLUGINS`), because the activity rebuilds the model from its name.
    """
    if isinstance(model, Model):
        instance = model
        _factories[name] = lambda: instance
    else:
        _factories[name] = model
    _instances.pop(name, None)


_OPENAI_FAMILY = ("openai", "openai-chat", "openai-responses")


def _no_retry_provider(name: str) -> Provider[Any]:
    if name in _OPENAI_FAMILY:
        from openai import AsyncOpenAI
        from pydantic_ai.providers.openai import OpenAIProvider

        return OpenAIProvider(openai_client=AsyncOpenAI(max_retries=0))
    if name == "anthropic":
        from anthropic import AsyncAnthropic
        from pydantic_ai.providers.anthropic import AnthropicProvider

        return AnthropicProvider(anthropic_client=AsyncAnthropic(max_retries=0))
    return infer_provider(name)


def resolve_model(name: str) -> Model:
    """Build (once per process) the model called `name`."""
    if name in _instances:
        return _instances[name]
    if name == HEURISTIC and name not in _factories:
        _factories[HEURISTIC] = make_heuristic_model
    factory = _factories.get(name)
    try:
        model = factory() if factory is not None else infer_model(name, provider_factory=_no_retry_provider)
    except Exception as e:  # provider packages raise many types for a missing key or a bad name
        raise UnknownModelError(f"model {name!r} cannot be used: {e}") from e
    _instances[name] = model
    return model


def check_model_name(name: str) -> None:
    """Fail fast (before a workflow starts) on a model that cannot be built in this process.

    Plugins named in `RR_PLUGINS` are loaded first, so models they register are known here too.
    """
    load_plugins()
    resolve_model(name)


def is_llm(name: str) -> bool:
    return name != HEURISTIC


_WORKFLOW_SIDE_KEY = "rr-workflow-side-placeholder"
_workflow_side: dict[str, Model] = {}


def _placeholder_provider(name: str) -> Provider[Any]:
    try:
        return infer_provider_class(name)(api_key=_WORKFLOW_SIDE_KEY)  # type: ignore[call-arg]
    except Exception:
        return infer_provider(name)


def workflow_side_model(name: str) -> Model:
    """The model object the workflow plans with; it never sends a request.

    `TemporalDurability` routes every request to an activity, where `resolve_model` builds the real
    client. Building the workflow-side object with a placeholder key means replaying a history
    (`rr replay`, audits) needs no provider credentials.
    """
    if name in _factories or name == HEURISTIC:
        return resolve_model(name)
    if name not in _workflow_side:
        try:
            _workflow_side[name] = infer_model(name, provider_factory=_placeholder_provider)
        except Exception as e:
            raise UnknownModelError(f"model {name!r} cannot be used: {e}") from e
    return _workflow_side[name]


async def _resolve(_ctx: Any, model_id: str) -> Model | None:
    if workflow.in_workflow():
        return workflow_side_model(model_id)
    return resolve_model(model_id)


def model_resolver() -> ResolveModelId[Any]:
    """The capability that lets `agent.run(model='heuristic')` and registered names resolve."""
    return ResolveModelId(_resolve)


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the comma-separated modules in `RR_PLUGINS` (they register models or tools)."""
    spec = spec if spec is not None else os.environ.get("RR_PLUGINS", "")
    loaded = []
    for mod in filter(None, (s.strip() for s in spec.split(","))):
        importlib.import_module(mod)
        loaded.append(mod)
    return loaded
