"""Model resolution: any pydantic-ai model string, the built-in `heuristic`, and registered extras.

The same resolver runs workflow-side (to plan the request) and inside the model-request activity
(to build the live model), so it must be deterministic and do no I/O. Provider SDK retries are
turned off for the providers we build ourselves: Temporal's retry policy owns retries, and SDK
retries inside an activity would hide failures from the history and multiply latency.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model, infer_model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers import Provider, infer_provider, infer_provider_class

from reflector.analysis.heuristic import make_heuristic_model
from reflector.analysis.model_names import HEURISTIC, is_llm
from reflector.runtime.settings import WORKER_MODELS_ENV, SettingError, Settings

__all__ = [
    "HEURISTIC",
    "UnknownModelError",
    "register_model",
    "resolve_model",
    "check_model_name",
    "prepare_workflow_side",
    "WORKER_MODELS_ENV",
    "workflow_side_model",
    "answers_in_process",
    "IN_PROCESS_MODEL_TYPES",
    "load_plugins",
    "is_llm",
]

log = logging.getLogger("rr.models")

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
    """The OpenAI and Anthropic clients without SDK retries and with an HTTP timeout of
    `RR_PROVIDER_TIMEOUT_S` (a provider that hangs fails the attempt, and Temporal retries it)."""
    if name in _OPENAI_FAMILY:
        from openai import AsyncOpenAI
        from pydantic_ai.providers.openai import OpenAIProvider

        from reflector.runtime import lean_openai

        lean_openai.install_if_enabled()  # rr's workers: the SDK's body walk skipped where it changes nothing
        return OpenAIProvider(openai_client=AsyncOpenAI(max_retries=0, timeout=_provider_timeout_s()))
    if name == "anthropic":
        from anthropic import AsyncAnthropic
        from pydantic_ai.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            anthropic_client=AsyncAnthropic(max_retries=0, timeout=_provider_timeout_s())
        )
    return infer_provider(name)


def _provider_timeout_s() -> float:
    return Settings.from_env().provider_timeout_s


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
    """Fail fast (before a workflow starts) on a model name no worker can use: the client checks the
    name's syntax and provider, never its credentials (only workers call the provider).

    A registered name (`register_model`, `heuristic`, the plugins of `RR_PLUGINS`, loaded first) is
    known by name. A `provider:model` name must have both parts, a provider pydantic-ai knows (and
    whose SDK is installed), and a model that provider accepts, which is checked by building the
    workflow-side model on a placeholder key (`_build_workflow_side`): a missing API key is not an
    error here. A provider that needs more configuration than a key to be built at all (a base URL,
    an Azure endpoint, an AWS region) is left to the workers too: that configuration is theirs.
    Raises `UnknownModelError` with the reason.
    """
    load_plugins()
    if name in _factories or name == HEURISTIC:
        return
    if not name.strip():
        raise UnknownModelError(
            "the model name is empty: give a registered name (e.g. heuristic) or "
            "provider:model (e.g. openai:gpt-4o)"
        )
    fam, colon, model_name = name.partition(":")
    if colon and (not fam.strip() or not model_name.strip()):
        raise UnknownModelError(
            f"model {name!r}: expected provider:model with both parts, e.g. openai:gpt-4o"
        )
    if colon:
        try:
            infer_provider_class(fam)
        except Exception as e:  # ValueError: unknown provider; ImportError: its SDK is not installed
            raise UnknownModelError(f"model {name!r} cannot be used: {e}") from e
        try:
            _placeholder_provider(fam)
        except Exception:  # e.g. OLLAMA_BASE_URL, AZURE_OPENAI_ENDPOINT, an AWS region: the workers' settings
            return
    try:
        _build_workflow_side(name)
    except UnknownModelError as e:
        if colon:
            raise
        from reflector.analysis.model_names import (
            ACCEPTED_FORMS,  # the CLI's and the API's one line (issue 27)
        )

        raise UnknownModelError(f"{e}; accepted: {ACCEPTED_FORMS}") from e


_WORKFLOW_SIDE_KEY = "rr-workflow-side-placeholder"
_workflow_side: dict[str, Model] = {}
# Provider prefixes (`prefix:model`) prepared at worker start, and why the others cannot be used here.
_prepared_families: set[str] = set()
_unavailable_families: dict[str, str] = {}
_prepared = False  # prepare_workflow_side ran in this process (a replayer alone never calls it)
# Prefixes pydantic-ai accepts without a known model name of its own (OpenAI-compatible servers etc.);
# the prefixes of `known_model_names()` are added to these.
_EXTRA_FAMILIES = (
    "openai",
    "openai-chat",
    "openai-responses",
    "openai-codex",
    "openai-chatgpt",
    "azure",
    "azure-responses",
    "alibaba",
    "cerebras",
    "crusoe",
    "deepseek",
    "fireworks",
    "github",
    "github-copilot",
    "heroku",
    "litellm",
    "meta",
    "moonshotai",
    "nebius",
    "ollama",
    "openrouter",
    "ovhcloud",
    "sambanova",
    "snowflake",
    "together",
    "vercel",
    "vllm",
    "zai",
    "system-one",
    "gateway/openai-chat",
    "gateway/openai-responses",
)
_SAMPLE_NAMES = {"openrouter": "openai/gpt-4o"}  # prefixes that only accept names of a certain shape


_placeholder_providers: dict[str, Provider[Any]] = {}
# The provider families whose SDKs this project installs (pyproject extras): what `rr worker`
# prepares by default (~2 s at start). A first import of one of these SDKs inside workflow code was
# seen to trip the deadlock detector mid-import and leave the SDK half-imported for the whole process.
SHIPPED_FAMILIES = ("openai", "openai-chat", "openai-responses", "anthropic", "google")


def _placeholder_provider(name: str) -> Provider[Any]:
    """A provider with a placeholder key; one per family, built when it is prepared (an SDK client
    costs an SSL context and more: workflow code reuses the prepared one)."""
    if name in _placeholder_providers:
        return _placeholder_providers[name]
    try:
        return infer_provider_class(name)(api_key=_WORKFLOW_SIDE_KEY)  # type: ignore[call-arg]
    except Exception:  # a sample name the family refuses; the imports are done
        return infer_provider(name)


def _family(name: str) -> str | None:
    return name.split(":", 1)[0] if ":" in name else None


def _build_workflow_side(name: str) -> Model:
    try:
        return infer_model(name, provider_factory=_placeholder_provider)
    except Exception as e:  # ImportError (SDK not installed), UserError (configuration
        raise UnknownModelError(f"model {name!r} cannot be used: {e}") from e


def _prepare_family(fam: str, samples: dict[str, str]) -> None:
    if fam in _prepared_families or fam in _unavailable_families:
        return
    try:
        _placeholder_providers[fam] = _placeholder_provider(fam)
    except Exception as e:  # ImportError (SDK not installed), UserError (configuration
        _unavailable_families[fam] = f"{type(e).__name__}: {e}"
        return
    _prepared_families.add(fam)
    try:  # imports the model class and what its constructor loads
        infer_model(
            f"{fam}:{_SAMPLE_NAMES.get(fam, samples.get(fam, 'rr-prepare'))}",
            provider_factory=_placeholder_provider,
        )
    except Exception:  # a sample name the family refuses; the imports are done
        pass


def prepare_workflow_side(
    models: Iterable[str] | None = None, *, settings: Settings | None = None
) -> list[str]:
    """Build, before a worker polls, everything workflow code needs to resolve a model; returns the names built.

    Workflow code must never import a module or load data: an activation that takes more than 2 s
    trips the SDK's deadlock detector (TMPRL1101) and can leave a workflow slot used forever, and a
    first import of a provider SDK or of genai-prices' data takes that long on a loaded machine. So
    this imports and builds here, once per process:

    - genai-prices' data snapshot (every `Model.__init__` loads it, and usage/price lookups read it);
    - every pydantic-ai profile module (OpenAI-compatible providers pick one by the model's vendor);
    - for the provider prefix (family) of each model this worker serves, a placeholder provider
      (kept, workflow code reuses it) and a model of that family: its SDK, provider and model modules
      are imported, so any model name of that family first seen in workflow code resolves without
      importing anything. A family that fails here (SDK not installed, required configuration
      missing) is remembered, and a model of it is refused in workflow code without trying again;
    - the workflow-side objects of `heuristic`, of every registered model and of the served models.

    The served models are `RR_MODEL`, `models` and the comma-separated entries of `RR_WORKER_MODELS`
    (of `settings`, default: the environment's)
    (model names, bare provider prefixes such as `openai-chat`, or `*` for every provider family whose
    SDK is installed); `rr worker` adds `SHIPPED_FAMILIES` unless `RR_WORKER_MODELS` is set. Not every installed family by default: their SDK imports cost seconds at each
    worker start (openai ~0.4 s, google-genai ~0.5 s, anthropic ~1.2 s idle; 11 s for all of them on
    a loaded 2-core machine). A model of a family not prepared is still built in workflow code, with
    its imports, and logged as a warning. Calling this again only does what is missing.
    """
    global _prepared
    import pkgutil

    import pydantic_ai.profiles
    from genai_prices.data_snapshot import get_snapshot
    from pydantic_ai.models import known_model_names

    _prepared = True
    get_snapshot()
    for info in pkgutil.iter_modules(pydantic_ai.profiles.__path__, pydantic_ai.profiles.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # a profile whose optional dependency is missing
            continue
    samples: dict[str, str] = {}
    for known in known_model_names():
        fam = _family(known)
        if fam is not None:
            samples.setdefault(fam, known.split(":", 1)[1])
    served = settings or Settings.from_env()
    default = (served.model or "").strip()
    listed = list(served.worker_models)
    every = "*" in listed
    listed = [x for x in listed if x != "*"]
    given = list(models or [])
    wanted = [
        *([default] if default else []),
        *(x for x in given if ":" in x),
        *(x for x in listed if ":" in x),
    ]
    families = {f for f in map(_family, wanted) if f} | {x for x in [*listed, *given] if ":" not in x}
    if every:
        families |= {*samples, *_EXTRA_FAMILIES}
    with warnings.catch_warnings():  # deprecation notices of providers nobody asked for
        warnings.simplefilter("ignore")
        for fam in sorted(families):
            _prepare_family(fam, samples)
    for unprefixed in (
        "rr-prepare",
        "test",
    ):  # the error path (name suggestions) and pydantic-ai's test model
        try:
            infer_model(unprefixed)
        except Exception:  # a profile whose optional dependency is missing
            pass
    built = []
    for name in dict.fromkeys([HEURISTIC, *_factories, *wanted]):
        try:
            if name in _factories or name == HEURISTIC:
                resolve_model(name)
            else:
                _workflow_side[name] = _build_workflow_side(name)
        except UnknownModelError as e:
            log.warning("model %r cannot be used by this worker: %s", name, e)
            continue
        built.append(name)
    return built


def workflow_side_model(name: str) -> Model:
    """The model object the workflow plans with; it never sends a request.

    `TemporalDurability` routes every request to an activity, where `resolve_model` builds the real
    client. Building the workflow-side object with a placeholder key means replaying a history
    (`rr replay`, audits) needs no provider credentials.

    This runs in workflow code, so it uses what `prepare_workflow_side` built or imported: a name it
    built is returned as is; another name of a prepared provider family is built on the prepared
    provider without importing anything; a family that could not be prepared is refused with the
    reason. Only a family the worker was not told to serve is built here from scratch (and logged).
    """
    if name in _factories or name == HEURISTIC:
        return resolve_model(name)  # built by prepare_workflow_side, or a factory registered since
    model = _workflow_side.get(name)
    if model is not None:
        return model
    fam = _family(name)
    if fam is not None and fam in _unavailable_families:
        raise UnknownModelError(f"model {name!r} cannot be used on this worker: {_unavailable_families[fam]}")
    before = len(sys.modules)
    model = _build_workflow_side(name)
    if len(sys.modules) != before and _prepared:
        log.warning(
            "building model %r imported %d modules in workflow code (a slow first activation); "
            "list it or its provider in %s so that workers prepare it at start",
            name,
            len(sys.modules) - before,
            WORKER_MODELS_ENV,
        )
    _workflow_side[name] = model
    return model


IN_PROCESS_MODEL_TYPES: tuple[type[Model], ...] = (FunctionModel, TestModel)
"""Models that answer inside the worker process (the heuristic is a `FunctionModel`): no provider round trip."""


def answers_in_process(name: str | None) -> bool:
    """Whether the model called `name` (None: the agent's default, the heuristic) answers inside the
    worker process rather than over the network. Workflow-side (deterministic: it depends only on
    the name and on what every worker registers). A name that cannot be resolved here counts as a
    network model (its request then fails in the activity, with the provider's reason)."""
    if name is None or name == HEURISTIC:
        return True
    try:
        model = workflow_side_model(name)
    except UnknownModelError:
        return False
    return isinstance(model, IN_PROCESS_MODEL_TYPES)


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the comma-separated modules in `spec` (default: `RR_PLUGINS`); they register models or tools.

    A module that cannot be imported (missing, or failing at import) is a `SettingError` naming it.
    """
    names = (
        [x.strip() for x in spec.split(",") if x.strip()] if spec is not None else Settings.from_env().plugins
    )
    loaded = []
    for mod in names:
        try:
            importlib.import_module(mod)
        except Exception as e:  # ImportError, or anything the plugin's own import raises
            raise SettingError(f"RR_PLUGINS: cannot import {mod!r}: {type(e).__name__}: {e}") from None
        loaded.append(mod)
    return loaded
