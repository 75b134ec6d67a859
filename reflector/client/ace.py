"""ACE's drop-in pipeline step (`RRStep`): reflects on each sample of a pipeline as `reflect` does, and hands
its skill tags and learnings to ACE's SkillManager."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from reflector.client.api import RRConfig, areflect, log, reflect
from reflector.contract import ReflectorOutput

if TYPE_CHECKING:
    from pydantic_ai.models import Model


def _field(ctx: object, name: str) -> Any:
    if isinstance(ctx, Mapping):
        return ctx.get(name)
    return getattr(ctx, name, None)


class RRStep:
    """The reflector as an ACE pipeline step and as a drop-in for ACE's `RRStep`.

    `RRStep(model=None, config=None, prompt_template=None, model_settings=None, **defaults)`, as ACE builds
    it (`RRStep("gpt-4o-mini", config=RRConfig(...))`): `model` a name (pydantic-ai's `provider:model`, a
    LiteLLM spelling, a registered name) or a pydantic-ai `Model` instance (registered in this process under
    a generated name: the in-process worker resolves it; a worker elsewhere cannot); None: `config.model`.
    An `RRConfig` as the first argument is taken as the config (rr's older form), and ACE's own
    `RecursiveConfig` dataclass is read field by field. `model_settings` overrides the config's.
    `prompt_template` is accepted and ignored, with a warning: rr's prompts are its own (each reflection's
    history records them). `defaults` are default arguments of every reflection (those of `reflect` but
    `traces`/`config`, e.g. `mode`, `settings`, `timeout`); `mode` defaults to "online" for a step.

    As a step (`requires` trace and skillbook, `provides` reflections): `step(ctx)` reflects on `ctx.trace`
    (anything `reflect` takes) with `ctx.skillbook`, in `ctx.mode`, with `ctx.injected_skill_ids`, and returns
    the context with `reflections` set to a tuple of one `ReflectorOutput`. `ctx` may be a mapping (a copy
    with the key set is returned) or an object: one with `replace(**kw)` (ACE's frozen `ACEStepContext`), a
    dataclass (`dataclasses.replace`), a pydantic model (`model_copy`), else the object itself with the
    attribute set. Without a trace it reflects on `ctx.agent_output` (with `ctx.sample.question` /
    `ground_truth`), and with neither on an empty trace `{}` (as ACE does). ACE's `Pipeline` awaits
    `__call_async__` (`acall`) on its event loop.

    As a reflector: `step.reflect(...)` / `await step.areflect(...)` are `reflect` / `areflect` with the
    step's config and defaults, and ACE's keywords (`trace=`, `injected_skill_ids=`, `mode=`). As ACE's
    reflector, a reflection that fails once started (the workflow failed, the server went away, `timeout`)
    is not raised: its output says why in `raw["error"]`. Bad input (a `ValueError`, `TypeError`) is raised.
    """

    requires: ClassVar[frozenset[str]] = frozenset({"trace", "skillbook"})
    provides: ClassVar[frozenset[str]] = frozenset({"reflections"})
    _OWN = ("traces", "trace", "config")

    def __init__(
        self,
        model: str | Model | RRConfig | None = None,
        config: RRConfig | Any = None,
        prompt_template: str | None = None,
        model_settings: Mapping[str, Any] | None = None,
        handoff: bool = True,
        **defaults: Any,
    ) -> None:
        known = set(inspect.signature(areflect).parameters) - set(self._OWN)
        unknown = sorted(set(defaults) - known)
        if unknown:
            raise TypeError(
                f"RRStep got unknown default(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        if isinstance(model, RRConfig):
            if config is not None:
                raise TypeError(
                    "RRStep got two configs: RRStep(model, config=RRConfig(...)) takes the model first"
                )
            model, config = None, model
        cfg = _as_rrconfig(config)
        changes: dict[str, Any] = {}
        if model is not None:
            changes["model"] = _model_name(model)
        if model_settings is not None:
            changes["model_settings"] = dict(model_settings)
        if changes:
            cfg = RRConfig.model_validate({**{k: getattr(cfg, k) for k in RRConfig.model_fields}, **changes})
        if prompt_template is not None:
            warnings.warn(
                "RRStep: prompt_template is ignored: rr's prompts are its own (each reflection's history "
                "records the prompts it was given)",
                stacklevel=2,
            )
        self.prompt_template = prompt_template
        self.handoff = handoff
        self.config = cfg
        self.defaults: dict[str, Any] = {"mode": "online", **defaults}

    def __repr__(self) -> str:
        return f"RRStep(config={self.config!r}, defaults={self.defaults!r})"

    def _kwargs(self, given: dict[str, Any]) -> dict[str, Any]:
        return {**self.defaults, **given, "config": given.get("config") or self.config}

    def reflect(self, **kwargs: Any) -> ReflectorOutput:
        """`reflector.reflect` with this step's config and defaults (ACE's `reflect`: a failed run's output
        has `raw["error"]`)."""
        try:
            out = reflect(**self._kwargs(kwargs))
        except Exception as e:
            if not isinstance(e, _run_failures()):
                raise
            return _failed_output(e)
        return _handed_off(out) if self.handoff else out

    async def areflect(self, **kwargs: Any) -> ReflectorOutput:
        """`reflector.areflect` with this step's config and defaults."""
        try:
            out = await areflect(**self._kwargs(kwargs))
        except Exception as e:
            if not isinstance(e, _run_failures()):
                raise
            return _failed_output(e)
        return _handed_off(out) if self.handoff else out

    def _from_ctx(self, ctx: object) -> dict[str, Any]:
        trace = _field(ctx, "trace")
        kwargs: dict[str, Any] = {"skillbook": _field(ctx, "skillbook")}
        mode = _field(ctx, "mode")
        if mode is not None:
            kwargs["mode"] = mode
        injected = _field(ctx, "injected_skill_ids")
        if isinstance(injected, (list, tuple)) and injected:
            kwargs["injected_skill_ids"] = tuple(str(i) for i in injected)
        if trace is None:
            agent_output = _field(ctx, "agent_output")
            if agent_output is None:
                kwargs["traces"] = {}  # ACE's RRStep reflects on `ctx.trace or {}`
                return kwargs
            kwargs["agent_output"] = agent_output
            sample = _field(ctx, "sample")
            for name in ("question", "ground_truth"):
                value = _field(sample, name) if sample is not None else None
                if isinstance(value, str):
                    kwargs[name] = value
        else:
            kwargs["traces"] = trace
        return kwargs

    def __call__(self, ctx: Any) -> Any:
        out = self.reflect(**self._from_ctx(ctx))
        return _with_reflections(ctx, (out,))

    async def acall(self, ctx: Any) -> Any:
        """`step(ctx)` for async pipelines."""
        out = await self.areflect(**self._from_ctx(ctx))
        return _with_reflections(ctx, (out,))

    __call_async__ = acall  # what ACE's Pipeline awaits on its event loop


def _run_failures() -> tuple[type[BaseException], ...]:
    """The failures of a reflection once asked for (not of its input): a failed workflow, an unreachable or
    failing server (`ReflectError`), `timeout` (`TimeoutError`), a dropped connection."""
    from reflector.client import ReflectError

    return (ReflectError, TimeoutError, ConnectionError)


HANDOFF_TAGS = "Skill tags (rr, from the trace's evidence):"


def _handed_off(out: ReflectorOutput) -> ReflectorOutput:
    """`out` with its skill tags and learnings also written at the end of `reasoning`: ACE's SkillManager
    (0.12, 0.13) reads only the five text fields of a reflection (`reasoning`, `error_identification`,
    `root_cause_analysis`, `correct_approach`, `key_insight`), so this is how rr's tags and learnings reach
    it. The structured fields stay as they are. `RRStep(handoff=False)`: the output untouched."""
    lines = []
    if out.skill_tags:
        lines.append(f"{HANDOFF_TAGS} " + "; ".join(f"[{t.id}] {t.tag}" for t in out.skill_tags))
    for i, learning in enumerate(out.extracted_learnings, 1):
        lines.append(
            f"Learning {i}: {learning.learning}"
            + (f" (evidence: {learning.evidence})" if learning.evidence else "")
        )
    if not lines or HANDOFF_TAGS in out.reasoning:
        return out
    return out.model_copy(update={"reasoning": out.reasoning.rstrip() + "\n\n" + "\n".join(lines)})


def _failed_output(exc: BaseException) -> ReflectorOutput:
    """ACE's output of a failed run (its reflector never raises one): the reason in `raw["error"]`."""
    log.error("reflection failed: %s", exc)
    return ReflectorOutput(
        reasoning=f"Recursive analysis failed: {exc}",
        correct_approach="",
        key_insight="",
        raw={"error": str(exc), "error_type": type(exc).__name__},
    )


def _as_rrconfig(config: object) -> RRConfig:
    """An `RRConfig`, None (the defaults), or ACE's `RecursiveConfig` / `AgenticConfig` dataclass (its fields
    rr has, by name; `usage_callback` included). Anything else is a `TypeError`."""
    if config is None:
        return RRConfig()
    if isinstance(config, RRConfig):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        values = {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if f.name in RRConfig.model_fields
        }
        return RRConfig.model_validate(values)
    raise TypeError(
        f"RRStep: config must be an RRConfig (or ACE's RecursiveConfig), got {type(config).__name__}"
    )


_instances: dict[
    int, tuple[object, str]
] = {}  # id -> (the model, kept alive so that its id is not reused; name)


def _model_name(model: object) -> str:
    """A model name for `RRConfig.model`: a str as is; a pydantic-ai `Model` registered under a generated name
    (`instance:<system>:<model name>:<n>`; once per object)."""
    if isinstance(model, str):
        return model
    from pydantic_ai.models import Model

    from reflector.runtime.models import register_model

    if not isinstance(model, Model):
        raise TypeError(
            f"RRStep: model must be a model name or a pydantic-ai Model, got {type(model).__name__}"
        )
    known = _instances.get(id(model))
    if known is not None:
        return known[1]
    name = f"instance:{model.system}:{model.model_name}:{len(_instances) + 1}"
    register_model(name, model)
    _instances[id(model)] = (model, name)
    return name


def _with_reflections(ctx: Any, reflections: tuple[ReflectorOutput, ...]) -> Any:
    if isinstance(ctx, Mapping):
        return {**ctx, "reflections": reflections}
    replace = getattr(ctx, "replace", None)
    if callable(replace):
        return replace(reflections=reflections)
    if dataclasses.is_dataclass(ctx) and not isinstance(ctx, type):
        return dataclasses.replace(ctx, reflections=reflections)
    if isinstance(ctx, BaseModel):
        return ctx.model_copy(update={"reflections": reflections})
    ctx.reflections = reflections
    return ctx
