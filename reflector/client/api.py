"""The Python API: ACE's drop-in reflector (`reflect` / `areflect`; its pipeline step `RRStep` is `ace.py`).

Each call reflects as `rr reflect` does (`reflector.client`): the trace goes through `upload_trace` (size
limits, format detection, the blob store), the reflection is a `ReflectionWorkflow` on the configured
Temporal server (`TEMPORAL_ADDRESS` or a profile: durable, any worker may run it) or, with none
configured, on the embedded dev server with an in-process worker, both stopped before the call returns.

Temporal's core (Rust) runs on threads of a core runtime. One left alive at interpreter exit can call into
Python while CPython finalizes and abort the process (`Fatal Python error: PyGILState_Release`, SIGABRT;
temporalio/sdk-python#300; the CLI ends with `os._exit`, a library cannot). So every call runs on a core
runtime of its own, installed as temporalio's default while calls are in progress (the embedded server's
readiness check, the client and the in-process worker all use it) and released when the last call
ends: its clients and worker are shut down and collected, and its threads have ended before the call
returns. The default restored is the one found before the first call (an idle runtime when there was none).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from reflector.analysis.ledger import UsageSummary
from reflector.analysis.prompt_cache import caches, with_prompt_cache
from reflector.client.api_core import _acall_core_runtime, _call_core_runtime
from reflector.client.api_traces import (
    IN_MEMORY,
    Traces,
    _Answer,
    _answer,
    _minimal_trace,
    _skillbook_text,
    _trace_file,
)
from reflector.contract import ReflectionConfig, ReflectorOutput

if TYPE_CHECKING:
    from pydantic_ai.usage import UsageLimits

    from reflector.contract import ReflectionInput
    from reflector.runtime.settings import Settings

__all__ = ["RRConfig", "ReflectorOutput", "UsageSummary", "reflect", "areflect", "Traces"]

log = logging.getLogger("rr.api")


# RRConfig's names for ReflectionConfig's fields (the others are the same)
_RR_NAMES = {"cell_timeout_s": "timeout"}


class RRConfig(BaseModel):
    """The seed's reflector settings, mapped onto `reflector.contract.ReflectionConfig` (the durable config).

    Mutable like ACE's `RRConfig` dataclass: an assignment is validated as the constructor is. Invalid
    values raise a pydantic `ValidationError` (a `ValueError`) naming the field. `model` may be a
    LiteLLM spelling (`gpt-4o-mini`, `bedrock/...`: `reflector.analysis.model_names`). `usage_callback`: as ACE's,
    `callback(usage, model_id)` once per completed model request of the tree (children and compaction
    summaries included; `usage` a pydantic-ai `RequestUsage`), read from the reflection's histories when
    it has finished; a callback that takes one argument gets the `reflector.analysis.ledger.UsageSummary` once
    instead (`input_tokens`, `output_tokens`, `total_tokens`, `requests`: what
    `ReflectorOutput.raw["usage"]` holds). Its exceptions are logged, never raised (as ACE's).
    `cache_prompts` / `cache_ttl` set pydantic-ai's prompt caching (`cache` model setting) for the providers
    that have it (`reflector.analysis.prompt_cache.CACHING_FAMILIES`); elsewhere they do nothing.
    """

    model_config = ConfigDict(validate_assignment=True, extra="forbid", arbitrary_types_allowed=True)

    model: str | None = None  # None: the settings' RR_MODEL, else "heuristic"
    model_settings: dict[str, Any] | None = None
    max_tokens: int = 500_000
    max_requests: int = 50
    context_window: int = 128_000
    max_depth: int = 2
    child_budget_fraction: float = 0.5
    max_compactions: int = 3
    microcompact_keep_recent: int = 3
    timeout: float = 60.0  # seconds per sandbox cell (ReflectionConfig.cell_timeout_s)
    max_output_chars: int = 50_000
    usage_callback: Callable[..., object] | None = None
    cache_prompts: bool = True  # ACE's default
    cache_ttl: Literal["5m", "1h"] = "5m"

    @model_validator(mode="after")
    def _valid_for_the_workflow(self) -> RRConfig:
        self._build(self.model or "heuristic")
        return self

    def build_usage_limits(self, remaining_tokens: int | None = None) -> UsageLimits:
        """ACE's: pydantic-ai `UsageLimits` of this budget (rr's workflow enforces the budget itself)."""
        from pydantic_ai.usage import UsageLimits

        return UsageLimits(
            total_tokens_limit=remaining_tokens or self.max_tokens, request_limit=self.max_requests
        )

    def to_reflection_config(self, settings: Settings | None = None) -> ReflectionConfig:
        """The durable config; `model` None resolves to `settings.model` (RR_MODEL; default: the
        environment's settings), else "heuristic"."""
        model = self.model
        if model is None:
            from reflector.runtime.settings import Settings

            model = (settings or Settings.from_env()).model
        return self._build(model or "heuristic")

    def _build(self, model: str) -> ReflectionConfig:
        from reflector.analysis.model_names import from_litellm

        fields = self.model_dump(exclude={"usage_callback", "timeout", "model", "cache_prompts", "cache_ttl"})
        models = sys.modules.get("reflector.runtime.models")  # imported by whoever registered a model
        if models is None or model not in models._factories:  # a registered name is never remapped
            model = from_litellm(model)
        fields["model_settings"] = _cache_settings(
            model, self.model_settings, self.cache_prompts, self.cache_ttl
        )
        try:
            return ReflectionConfig(**fields, model=model, cell_timeout_s=self.timeout)
        except ValidationError as e:  # ReflectionConfig's rules, told with RRConfig's names
            raise ValueError(
                "; ".join(
                    f"{_RR_NAMES.get(str(err['loc'][0]), str(err['loc'][0])) if err['loc'] else 'config'}: "
                    f"{err['msg']} (got {err.get('input')!r})"
                    for err in e.errors()
                )
            ) from None


def _cache_settings(model: str, given: dict[str, Any] | None, cache: bool, ttl: str) -> dict[str, Any] | None:
    """The model settings with ACE's `cache_prompts` / `cache_ttl` as pydantic-ai's `cache` setting, for a
    provider that has it (`reflector.analysis.prompt_cache`: the workflow applies the same rule, with caching on,
    to a config that says nothing); the settings unchanged otherwise (a `cache` the caller set wins). Settings are
    added to the workflow's default (temperature 0) only when there were none."""
    if not caches(model):
        return given
    return with_prompt_cache(model, given or {"temperature": 0.0}, cache=ttl if cache else False)


def _api_error(exc: BaseException) -> BaseException:
    """The CLI's one-line failures (`rr reflect`) as exceptions of the API."""
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from reflector.client import ReflectError

    if isinstance(exc, WorkflowFailureError):
        cause = exc.cause
        return ReflectError(f"reflection failed: {getattr(cause, 'message', None) or cause or exc}")
    if isinstance(exc, RPCError):
        return ReflectError(f"Temporal error: {exc}")
    return exc


async def _run(
    inp: ReflectionInput,
    settings: Settings,
    trace_name: str,
    workflow_id: str | None,
    timeout: float | None,
    per_request: Callable[[Any, str], object] | None = None,
) -> ReflectorOutput:
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from reflector import client as c
    from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

    def no_worker(waited: float) -> None:
        log.warning(
            "no worker is polling task queue %r: reflection %s has waited %.0f s for one (start `rr "
            "worker` with the same TEMPORAL_ADDRESS, RR_TASK_QUEUE and blob store)",
            settings.task_queue,
            wf_id,
            waited,
        )

    wf_id = ""
    try:
        async with c.runtime(
            settings, announce=log.info, in_process_worker=in_process_worker([inp.config.model])
        ) as rt:
            handle = await c.start_reflection(
                rt.client, inp, settings.task_queue, workflow_id, trace_name=trace_name
            )
            wf_id = handle.id
            log.info(
                "started reflection %s (trace %s, %s bytes) on %s",
                wf_id,
                inp.trace.format,
                inp.trace.size,
                rt.address,
            )
            await rt.ensure_worker(handle)
            waiting = c.wait_for_result(
                handle, on_no_worker=no_worker, no_worker_after_s=settings.no_worker_warn_s
            )
            try:
                out = await asyncio.wait_for(waiting, timeout)
                if per_request is not None:
                    await _report_requests(rt.client, wf_id, settings, inp.config.model, per_request)
                return out
            except TimeoutError:
                where = (
                    f"it is saved on this RR_HOME's embedded server: `rr result {wf_id}` (same RR_HOME) follows it"
                    if rt.embedded_server
                    else f"it goes on durably on {rt.address}: `rr result {wf_id}`"
                )
                raise TimeoutError(
                    f"reflection {wf_id} did not finish within {timeout:g} s; {where}"
                ) from None
    except (WorkflowFailureError, RPCError) as e:
        raise _api_error(e) from e


async def areflect(
    *,
    question: str = "",
    agent_output: object = None,
    skillbook: object = None,
    ground_truth: str | None = None,
    feedback: str | None = None,
    traces: Traces = None,
    config: RRConfig | None = None,
    mode: Literal["online", "offline"] = "offline",
    workflow_id: str | None = None,
    settings: Settings | None = None,
    timeout: float | None = None,
    trace: object = None,
    injected_skill_ids: Sequence[str] = (),
) -> ReflectorOutput:
    """`reflect` for async code (the same arguments; runs on the caller's event loop)."""
    async with _acall_core_runtime():
        return await _reflect(
            question=question,
            agent_output=agent_output,
            skillbook=skillbook,
            ground_truth=ground_truth,
            feedback=feedback,
            traces=_traces_arg(traces, trace),
            config=config,
            mode=mode,
            workflow_id=workflow_id,
            settings=settings,
            timeout=timeout,
            injected_skill_ids=tuple(injected_skill_ids),
        )


def _traces_arg(traces: Traces, trace: object) -> Any:
    """`traces` (rr's name) or `trace` (the keyword ACE's ReflectStep passes a raw trace with), not both."""
    if trace is not None and traces is not None:
        raise ValueError("pass the trace once: traces= or trace= (ACE's name for it), not both")
    return traces if trace is None else trace


async def _reflect(
    *,
    question: str,
    agent_output: object,
    skillbook: object,
    ground_truth: str | None,
    feedback: str | None,
    traces: Any,
    config: RRConfig | None,
    mode: Literal["online", "offline"],
    workflow_id: str | None,
    settings: Settings | None,
    timeout: float | None,
    injected_skill_ids: tuple[str, ...] = (),
) -> ReflectorOutput:
    from reflector import client as c
    from reflector.runtime.settings import Settings

    cfg = config or RRConfig()
    settings = settings or Settings.from_env()
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if mode not in ("online", "offline"):
        raise ValueError(f"mode must be 'online' or 'offline', got {mode!r}")
    rconf = cfg.to_reflection_config(settings)
    _check_model(rconf.model)
    c.check_id(workflow_id)  # the caps (`reflector.analysis.limits`) before anything is stored
    c.check_task_texts(question=question, ground_truth=ground_truth, feedback=feedback)
    answer = _answer(agent_output)
    if traces is not None and answer is not None and not answer.final_answer.strip() and not answer.reasoning:
        answer = None  # ACE's ReflectStep passes AgentOutput(reasoning="", final_answer="") with a raw trace
    if injected_skill_ids:
        traces = _with_injected(traces, injected_skill_ids, question, answer, ground_truth, feedback)
    with _trace_file(traces, answer, question, ground_truth, feedback, settings) as (path, name):
        try:
            trace = await asyncio.to_thread(c.upload_trace, path, settings)
        except (ValueError, c.ReflectError) as e:
            if name != IN_MEMORY or str(path) not in str(e):
                raise
            raise type(e)(str(e).replace(str(path), IN_MEMORY)) from None
    # in a thread: a skillbook is checked and stored in the blob store (it may be 100 MB)
    inp = await asyncio.to_thread(
        functools.partial(
            c.build_input,
            trace,
            question=question,
            ground_truth=ground_truth,
            feedback=feedback,
            skillbook=_skillbook_text(skillbook),
            mode=mode,
            config=rconf,
            settings=settings,
        )
    )
    per_request = _per_request_callback(cfg.usage_callback)
    out = await _run(inp, settings, name, workflow_id, timeout, per_request)
    if cfg.usage_callback is not None and per_request is None:
        try:
            cfg.usage_callback(UsageSummary.model_validate(out.raw.get("usage") or {}))
        except Exception:  # ACE's rule: a broken meter never loses the reflection
            log.exception("usage_callback failed")
    return _with_ace_raw(out)


def _check_model(name: str) -> None:
    """A model name no worker could build, refused before anything is stored (the CLI's one line, which
    names the accepted forms for a name that is not provider:model)."""
    from reflector.runtime.models import check_model_name

    check_model_name(name)


def _with_injected(
    traces: Any,
    ids: tuple[str, ...],
    question: str,
    answer: _Answer | None,
    ground_truth: str | None,
    feedback: str | None,
) -> Any:
    """ACE's `injected_skill_ids` (the skills rendered into the agent's prompt: the attribution scope) in
    the trace, as ACE's reflector puts them (`traces["injected_skill_ids"]`); a trace that is not a dict
    (a path, JSON text, a list) is left as it is."""
    if traces is None:
        return {**_minimal_trace(question, answer, ground_truth, feedback), "injected_skill_ids": list(ids)}
    if isinstance(traces, Mapping) and "injected_skill_ids" not in traces:
        return {**traces, "injected_skill_ids": list(ids)}
    return traces


def _with_ace_raw(out: ReflectorOutput) -> ReflectorOutput:
    """`out` with the top-level `raw` keys ACE's reflector writes (`iterations`, `compactions`, `depth`,
    `timed_out`, and `timeout` when the budget stopped it), from rr's `raw["rr_trace"]`; keys there are kept."""
    found = out.raw.get("rr_trace")
    run: dict[str, Any] = found if isinstance(found, dict) else {}
    stopped = str(run.get("stop_reason") or "completed")
    budget = stopped in ("token_budget", "request_budget", "max_compactions")
    ace = {
        "iterations": run.get("total_iterations", 0),
        "compactions": run.get("compactions", 0),
        "depth": run.get("depth", 0),
        "timed_out": bool(run.get("timed_out")) or budget,
    }
    if budget:
        ace["timeout"] = True
    return out.model_copy(update={"raw": {**ace, **out.raw}})


def _per_request_callback(callback: Callable[..., object] | None) -> Callable[[Any, str], object] | None:
    """ACE's `usage_callback(usage, model_id)` form (two positional arguments, or `*args`), else None (rr's
    one-argument form gets the `UsageSummary` once)."""
    if callback is None:
        return None
    try:
        params = list(inspect.signature(callback).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: call it ACE's way
        return callback
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or len(positional) >= 2:
        return callback
    return None


async def _report_requests(
    client: Any, workflow_id: str, settings: Settings, model: str, callback: Callable[[Any, str], object]
) -> None:
    """Call ACE's per-request `usage_callback` for every completed model request of the reflection's tree
    (its histories: each session's requests and compaction summaries in order, a child's where it started);
    the callback's exceptions are logged and swallowed (ACE's `MeteredModel` does the same)."""
    from pydantic_ai.usage import RequestUsage

    from reflector.client.audit.build import build_audit
    from reflector.client.audit.capture import ReplayCapture
    from reflector.client.audit.histories import collect
    from reflector.client.audit.timeline import ChildItem, CompactionItem, ModelRequestItem, Session

    try:
        bundle = await collect(client, workflow_id, settings.blob_dir)
        audit = build_audit(bundle, ReplayCapture(), settings.blob_dir, "server")
    except Exception:  # the reflection is done; a meter that cannot be read does not lose it
        log.exception("usage_callback: the histories of %s could not be read", workflow_id)
        return

    def walk(session: Session) -> Iterator[tuple[int, int, str]]:
        for item in session.items:
            if isinstance(item, ModelRequestItem) and item.failed is None and item.path != "reused":
                yield item.input_tokens, item.output_tokens, item.model
            elif isinstance(item, CompactionItem) and not item.reused:
                yield item.input_tokens, item.output_tokens, item.model
            elif isinstance(item, ChildItem) and item.session is not None:
                yield from walk(item.session)

    for input_tokens, output_tokens, used in walk(audit.session):
        try:
            callback(RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens), used or model)
        except Exception:
            log.exception("usage_callback failed")


def reflect(
    *,
    question: str = "",
    agent_output: object = None,
    skillbook: object = None,
    ground_truth: str | None = None,
    feedback: str | None = None,
    traces: Traces = None,
    config: RRConfig | None = None,
    mode: Literal["online", "offline"] = "offline",
    workflow_id: str | None = None,
    settings: Settings | None = None,
    timeout: float | None = None,
    trace: object = None,
    injected_skill_ids: Sequence[str] = (),
) -> ReflectorOutput:
    """Reflect on an agent's run and return the `ReflectorOutput` (synchronous; `areflect` is the async twin).

    - `traces`: a file path (str or Path); a dict or a list (e.g. messages or steps); a str holding the
      trace's JSON / JSON-lines text (a str naming an existing file is that file; one starting with `{` or
      `[` is JSON; a one-word str that looks like a path is "trace file not found"; any other str is plain
      text, a one-step trace); a pydantic model, a dataclass or an object with attributes (their data), a
      number; or None, to reflect on `agent_output` alone (an ACE trace is built from `question`,
      `agent_output`, `ground_truth` and `feedback`). In-memory traces are stored like a file.
    - `agent_output`: the agent's answer, a str or ACE's `AgentOutput` (`final_answer`, `reasoning`,
      `skill_ids`). It is put where the trace readers find the final answer (see `_place_answer`): a dict
      trace's `final_answer` key; a list of messages or steps is wrapped in a dict that has it. A trace that
      already ends with that answer is used as is; one whose final answer differs, or a format whose reader
      takes the answer from the trace itself (tau-bench, OpenClaw, OTel, a batch), is a `ValueError`.
    - `skillbook`: its text, or an object with `as_prompt()` (ACE's Skillbook); `mode="online"` tags the
      skills the trace cites.
    - `config`: `RRConfig` (limits, model); `settings`: a `reflector.runtime.settings.Settings` (default: from the
      environment: TEMPORAL_ADDRESS, RR_HOME, ...); `workflow_id`: the reflection's id (default: generated);
      `timeout`: seconds to wait for the result (`TimeoutError`; on a server the reflection goes on).

    Runs on the configured Temporal server, else on the embedded dev server with an in-process worker
    (both stopped before this returns). Called where an event loop runs (a Jupyter cell, async code, ACE's
    pipeline), it runs on a thread of its own and blocks until done, as ACE's reflector does (`await
    areflect(...)` does not block the loop). ACE's keywords: `trace=` (the same as `traces=`),
    `injected_skill_ids=` (the skills rendered into the agent's prompt, put in a dict trace as
    `injected_skill_ids`). Errors: a bad trace or argument is a
    `ValueError` (`reflector.analysis.traces.TraceError`, `reflector.runtime.settings.SettingError`, pydantic's
    `ValidationError`); a refused trace, an unreachable server or a failed reflection is a
    `reflector.client.ReflectError`; messages are the CLI's one-liners.
    """

    def run() -> ReflectorOutput:
        with _call_core_runtime():  # released once the event loop is closed: nothing of it holds the runtime
            return asyncio.run(
                _reflect(
                    question=question,
                    agent_output=agent_output,
                    skillbook=skillbook,
                    ground_truth=ground_truth,
                    feedback=feedback,
                    traces=_traces_arg(traces, trace),
                    config=config,
                    mode=mode,
                    workflow_id=workflow_id,
                    settings=settings,
                    timeout=timeout,
                    injected_skill_ids=tuple(injected_skill_ids),
                )
            )

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # an event loop runs in this thread (Jupyter, async code, ACE's pipeline): run on a thread of its own,
    # as ACE's reflector does (this blocks the loop until the reflection ends; `await areflect` does not)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rr-reflect") as pool:
        return pool.submit(run).result()
