"""The Python API: ACE's drop-in reflector (`reflect` / `areflect`) and pipeline step (`RRStep`).

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
import contextlib
import dataclasses
import functools
import gc
import inspect
import json
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.ledger import UsageSummary

if TYPE_CHECKING:
    from pydantic_ai.models import Model
    from pydantic_ai.usage import UsageLimits

    from reflector.contract import ReflectionInput
    from reflector.settings import Settings

__all__ = ["RRConfig", "RRStep", "ReflectorOutput", "UsageSummary", "reflect", "areflect", "Traces"]

log = logging.getLogger("rr.api")

Traces = str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | BaseModel | object | None
"""A trace for `reflect`: a file path; a dict or list (e.g. a list of messages or steps); a str holding the
trace's JSON or JSON-lines text (a str naming an existing file is that file), or plain text (a one-step
trace); a pydantic model, a dataclass or any object with attributes (its data); or None (a trace is built
from `question`, `agent_output`, `ground_truth`, `feedback`)."""

IN_MEMORY = "<in-memory trace>"  # how an in-memory trace is named in messages and `rr list`
_TEXT_START = ("{", "[")  # a str trace whose text starts so (after blanks) is JSON / JSONL text

# RRConfig's names for ReflectionConfig's fields (the others are the same)
_RR_NAMES = {"cell_timeout_s": "timeout"}


class RRConfig(BaseModel):
    """The seed's reflector settings, mapped onto `reflector.contract.ReflectionConfig` (the durable config).

    Mutable like ACE's `RRConfig` dataclass: an assignment is validated as the constructor is. Invalid
    values raise a pydantic `ValidationError` (a `ValueError`) naming the field. `model` may be a
    LiteLLM spelling (`gpt-4o-mini`, `bedrock/...`: `reflector.model_names`). `usage_callback`: as ACE's,
    `callback(usage, model_id)` once per completed model request of the tree (children and compaction
    summaries included; `usage` a pydantic-ai `RequestUsage`), read from the reflection's histories when
    it has finished; a callback that takes one argument gets the `reflector.ledger.UsageSummary` once
    instead (`input_tokens`, `output_tokens`, `total_tokens`, `requests`: what
    `ReflectorOutput.raw["usage"]` holds). Its exceptions are logged, never raised (as ACE's).
    `cache_prompts` / `cache_ttl` turn on pydantic-ai's prompt caching (`cache` model setting) for the
    providers that have it (`CACHING_FAMILIES`); elsewhere they do nothing.
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

        return UsageLimits(total_tokens_limit=remaining_tokens or self.max_tokens, request_limit=self.max_requests)

    def to_reflection_config(self, settings: Settings | None = None) -> ReflectionConfig:
        """The durable config; `model` None resolves to `settings.model` (RR_MODEL; default: the
        environment's settings), else "heuristic"."""
        model = self.model
        if model is None:
            from reflector.settings import Settings

            model = (settings or Settings.from_env()).model
        return self._build(model or "heuristic")

    def _build(self, model: str) -> ReflectionConfig:
        from reflector.model_names import from_litellm

        fields = self.model_dump(exclude={"usage_callback", "timeout", "model", "cache_prompts", "cache_ttl"})
        models = sys.modules.get("reflector.models")  # imported by whoever registered a model
        if models is None or model not in models._factories:  # a registered name is never remapped
            model = from_litellm(model)
        fields["model_settings"] = _cache_settings(model, self.model_settings, self.cache_prompts, self.cache_ttl)
        try:
            return ReflectionConfig(**fields, model=model, cell_timeout_s=self.timeout)
        except ValidationError as e:  # ReflectionConfig's rules, told with RRConfig's names
            raise ValueError("; ".join(
                f"{_RR_NAMES.get(str(err['loc'][0]), str(err['loc'][0])) if err['loc'] else 'config'}: "
                f"{err['msg']} (got {err.get('input')!r})" for err in e.errors()
            )) from None


CACHING_FAMILIES = ("anthropic", "bedrock", "openai", "openai-chat", "openai-responses", "google", "google-cloud",
                    "openrouter")
"""Providers whose pydantic-ai models honour the `cache` model setting (`cache_prompts` maps onto it)."""


def _cache_settings(model: str, given: dict[str, Any] | None, cache: bool, ttl: str) -> dict[str, Any] | None:
    """The model settings with ACE's `cache_prompts` / `cache_ttl` as pydantic-ai's `cache` setting, for a
    provider that has it; the settings unchanged otherwise (a `cache` the caller set wins). Settings are
    added to the workflow's default (temperature 0) only when there were none."""
    family = model.split(":", 1)[0] if ":" in model else ""
    if family not in CACHING_FAMILIES or (given and "cache" in given):
        return given
    return {**(given or {"temperature": 0.0}), "cache": ttl if cache else False}


# --------------------------------------------------------------------------------- the answer and the trace


@dataclasses.dataclass(frozen=True)
class _Answer:
    """`agent_output` as the trace readers know it: ACE's `AgentOutput` fields."""

    final_answer: str
    reasoning: str | None = None
    skill_ids: tuple[str, ...] = ()


def _answer(agent_output: object) -> _Answer | None:
    """A str (the final answer), a mapping or an object (ACE's `AgentOutput`) with `final_answer` (and
    optionally `reasoning`, `skill_ids`), or None."""
    if agent_output is None:
        return None
    if isinstance(agent_output, str):
        return _Answer(agent_output)
    get: Callable[[str], Any]
    if isinstance(agent_output, Mapping):
        get = agent_output.get
    else:
        def get(name: str) -> Any:
            return getattr(agent_output, name, None)
    final = get("final_answer")
    if not isinstance(final, str):
        raise ValueError(f"agent_output must be a str, or have a str `final_answer` (like ACE's AgentOutput); "
                         f"got {type(agent_output).__name__}")
    reasoning = get("reasoning")
    ids = get("skill_ids") or ()
    return _Answer(final, reasoning if isinstance(reasoning, str) and reasoning else None,
                   tuple(str(i) for i in ids) if isinstance(ids, (list, tuple)) else ())


def _minimal_trace(question: str, answer: _Answer | None, ground_truth: str | None,
                   feedback: str | None) -> dict[str, Any]:
    """traces=None: an ACE trace of the answer (the seed's "reflect on an answer")."""
    if answer is None:
        raise ValueError("nothing to reflect on: pass traces= (a path, a dict, a list or JSON text), "
                         "or agent_output= (the answer to reflect on)")
    out: dict[str, Any] = {"question": question}
    if answer.reasoning or answer.skill_ids:
        out["agent_output"] = {"reasoning": answer.reasoning or "", "final_answer": answer.final_answer,
                               "skill_ids": list(answer.skill_ids)}
    else:
        out["agent_output"] = answer.final_answer
    if ground_truth is not None:
        out["ground_truth"] = ground_truth
    if feedback is not None:
        out["feedback"] = feedback
    return out


def _place_answer(data: Any, answer: _Answer | None) -> Any:
    """`data` with `answer` where the trace readers find the final answer (`data` itself when it already says so).

    - a dict trace (ACE, a messages wrapper, or a shape not recognised): its `final_answer` key (and, when
      absent, `reasoning` / `skill_ids`); a different `final_answer` already there is a `ValueError`;
    - a list of messages: wrapped as `{"messages": [...], "final_answer": ...}`; a list of free-form steps:
      `{"steps": [...], "final_answer": ...}`;
    - a tau-bench, OpenClaw, OTel trace or a batch (a list of runs) whose own final answer differs: a
      `ValueError` (their readers take the final answer from the trace; it cannot be replaced).
    """
    from reflector.traces import TraceError, detect_format, normalize

    if answer is None:
        return data
    fmt = detect_format(data)
    try:
        view = normalize(data)
    except TraceError:
        view = {}
    if "runs" not in view and (view.get("final_answer") or "").strip() == answer.final_answer.strip():
        return data  # the trace already ends with this answer
    if isinstance(data, Mapping) and fmt in ("ace", "messages", "unknown"):
        given = data.get("final_answer")
        if given is not None and str(given).strip() != answer.final_answer.strip():
            raise ValueError(f"agent_output differs from the trace's final_answer ({str(given)[:80]!r}): pass "
                             "the answer once, in the trace or as agent_output")
        placed = {**data, "final_answer": answer.final_answer}
        if fmt != "messages":
            if answer.reasoning and "reasoning" not in data:
                placed["reasoning"] = answer.reasoning
            if answer.skill_ids and "skill_ids" not in data:
                placed["skill_ids"] = list(answer.skill_ids)
        return placed
    if isinstance(data, list) and fmt == "messages":
        return {"messages": data, "final_answer": answer.final_answer}
    if isinstance(data, list) and fmt == "unknown":
        return {"steps": data, "final_answer": answer.final_answer}
    what = f"a batch of {len(view['runs'])} runs" if "runs" in view else f"a {fmt} trace"
    raise ValueError(f"agent_output cannot be placed in {what}: its reader takes the final answer from the "
                     "trace itself; leave agent_output out, or put the answer in the trace")


def _jsonable(value: object) -> Any:
    """`json.dumps`' fallback for the objects traces built in Python hold."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    public = _public_vars(value)
    if public is not None:  # an object the agent produced (ACE passes whatever it got): its attributes
        return public
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable (not a dict, list, str, "
                    "number, dataclass, pydantic model or object with attributes)")


def _public_vars(value: object) -> dict[str, Any] | None:
    """An object's public attributes (`__dict__`, else `__slots__`), None when it has neither."""
    if callable(value) or inspect.ismodule(value) or inspect.isgenerator(value) or inspect.iscoroutine(value):
        return None  # code, not data
    names: list[str] | None = None
    if hasattr(value, "__dict__") and isinstance(vars(value), dict):
        names = list(vars(value))
    elif (slots := getattr(type(value), "__slots__", None)) is not None:
        names = [slots] if isinstance(slots, str) else list(slots)
    if names is None:
        return None
    return {n: getattr(value, n) for n in names if not n.startswith("_") and hasattr(value, n)}


def _plain_trace(value: object) -> Any:
    """A trace of another shape than dict / list / str / path / pydantic model, as JSON-able data: a dataclass
    or an object (its attributes), a tuple (a list), a number or bool (text). None: not representable."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, bool | int | float):
        return _text_trace(json.dumps(value))
    if isinstance(value, (bytes, bytearray)):
        return _text_trace(bytes(value).decode("utf-8", "replace"))
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return _public_vars(value)


def _text_trace(text: str) -> dict[str, Any]:
    """Plain text (not JSON, not a file): a one-step trace, the text as the agent's step."""
    return {"steps": [{"role": "assistant", "content": text}]}


def _looks_like_path(s: str) -> bool:
    """A one-line str with no blanks that names a file (a separator or a trace extension): a mistyped path is
    an error ("trace file not found"), not a trace of that text."""
    text = s.strip()
    return ("\n" not in text and " " not in text and len(text) < 4096
            and (os.sep in text or text.endswith((".json", ".jsonl", ".ndjson", ".txt", ".log"))))


def _dump(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError) as e:  # ValueError: a circular reference
        raise ValueError(f"the trace cannot be stored as JSON: {e}") from None


@contextlib.contextmanager
def _trace_file(traces: Traces, answer: _Answer | None, question: str, ground_truth: str | None,
                feedback: str | None, settings: Settings) -> Iterator[tuple[Path, str]]:
    """(a file holding the trace, its name for `rr list`): the user's file, or a temporary one in
    RR_HOME/tmp (removed on exit) for an in-memory trace or one `agent_output` was placed in."""
    from reflector.traces import parse_trace_bytes, read_trace_file

    text: str | None = None
    if traces is None:
        text = _dump(_minimal_trace(question, answer, ground_truth, feedback))
    elif isinstance(traces, os.PathLike) or (isinstance(traces, str) and _is_file(traces)):
        path = Path(traces)
        if answer is None:
            yield path, path.name
            return
        if not path.is_file():
            from reflector.traces import TraceError

            raise TraceError(f"trace file not found: {path}")
        if path.stat().st_size >= settings.lazy_trace_bytes:
            raise ValueError(f"agent_output with the trace file {path} ({path.stat().st_size:,} bytes): put the "
                             f"final answer in the file (traces of {settings.lazy_trace_bytes:,} bytes or more are "
                             "not rewritten), or leave agent_output out")
        data, _fmt = read_trace_file(path, settings.max_trace_bytes)
        placed = _place_answer(data, answer)
        if placed is data:
            yield path, path.name
            return
        text = _dump(placed)
    elif isinstance(traces, str) and not traces.lstrip().startswith(_TEXT_START):
        if _looks_like_path(traces) or not traces.strip():
            from reflector.traces import TraceError

            raise TraceError(f"trace file not found: {traces[:200]} (a str trace is a file path, the trace's "
                             "JSON / JSON-lines text, or plain text with blanks in it)")
        text = _dump(_place_answer(_text_trace(traces), answer))
    elif isinstance(traces, str):
        text = traces
        if answer is not None:
            data, _fmt = parse_trace_bytes(traces.encode("utf-8"), IN_MEMORY)
            placed = _place_answer(data, answer)
            text = traces if placed is data else _dump(placed)
    elif isinstance(traces, (Mapping, list, tuple, BaseModel)):
        data = traces.model_dump(mode="json") if isinstance(traces, BaseModel) else traces
        text = _dump(_place_answer(list(data) if isinstance(data, tuple) else dict(data) if isinstance(
            data, Mapping) else data, answer))
    else:
        plain = _plain_trace(traces)
        if plain is None:
            raise ValueError(f"traces must be a path, a dict, a list, JSON or plain text, a dataclass, a pydantic "
                             f"model, an object with attributes, or None; got {type(traces).__name__}, which has "
                             "none of those shapes")
        text = _dump(_place_answer(plain, answer))
    from reflector.settings import usable_dir

    tmp_dir = usable_dir(settings.home / "tmp", "RR_HOME")
    fd, name = tempfile.mkstemp(prefix="api-", suffix=".json", dir=tmp_dir)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        yield tmp, IN_MEMORY
    finally:
        tmp.unlink(missing_ok=True)


def _is_file(s: str) -> bool:
    if "\n" in s or len(s) > 4096 or s.lstrip().startswith(_TEXT_START):
        return False
    try:
        return Path(s).is_file()
    except (OSError, ValueError):
        return False


def _skillbook_text(skillbook: object) -> str:
    """ReflectionInput.skillbook: a str as is; an object with `as_prompt()` (ACE's Skillbook) its prompt; else `str()`."""
    if skillbook is None:
        return ""
    if isinstance(skillbook, str):
        return skillbook
    as_prompt = getattr(skillbook, "as_prompt", None)
    if callable(as_prompt):
        return str(as_prompt() or "")
    return str(skillbook)


# --------------------------------------------------------------------------------- Temporal's core runtime

_core_lock = threading.Lock()
_core_users = 0
_core_previous: Any = None  # temporalio.runtime.Runtime: the default before the first call in progress
_core_threads_before: set[str] | None = None
_THREADS_GONE_WAIT_S = 5.0  # a wait only where threads are left; their exit can lag on a loaded machine


@contextlib.contextmanager
def _call_core_runtime() -> Iterator[None]:
    """Install a core runtime of the calls in progress as temporalio's default; when the last call ends,
    restore the previous default, collect the call's clients and worker, and with them the runtime, and wait
    for its threads to end (see the module docstring). Its core logs go through Python logging
    (`temporalio.core`), as the CLI's do (`reflector.client.configure_core_logging`)."""
    global _core_users, _core_previous, _core_threads_before
    from temporalio.runtime import Runtime

    from reflector.client import configure_core_logging

    with _core_lock:
        if _core_users == 0:
            _core_previous = Runtime.default()
            _core_threads_before = _threads()
            configure_core_logging(worker_warnings=True)  # a new runtime, the default from now on
        _core_users += 1
    try:
        yield
    finally:
        before: set[str] | None = None
        with _core_lock:
            _core_users -= 1
            last = _core_users == 0
            if last:
                Runtime.set_default(_core_previous, error_if_already_set=False)
                before, _core_previous, _core_threads_before = _core_threads_before, None, None
        gc.collect()  # clients and workers in reference cycles would keep the runtime alive
        if last and before is not None:  # (and so would the core's deferred drops: see _wait_core_threads_gone)
            _wait_core_threads_gone(before)


def _threads() -> set[str] | None:
    """This process's thread ids (Linux: /proc), None where they cannot be listed."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _wait_core_threads_gone(before: set[str]) -> None:
    """Wait until the core runtime threads started since `before` have ended: dropping the runtime stops
    them, and the last ones exit a few milliseconds after the drop returns.

    The runtime is dropped only once nothing holds it, and the core's own threads can hold it through Python:
    a core task that ends drops its Python objects (the asyncio future of a poll, the context it ran in)
    without the GIL, and PyO3 then only *queues* those reference drops, applied the next time any thread
    enters PyO3 (`_apply_deferred_core_drops`). The last poll's future ends with the worker's shutdown
    error, whose traceback reaches the worker, its client and so the runtime: when that queued drop came
    after the call's last entry into the core (a loaded machine, about one call in 40), nothing applied it
    and the runtime with its threads stayed until the process exited, `gc.collect()` or not. So every
    look is preceded by an entry into PyO3 and a collection."""
    deadline = time.monotonic() + _THREADS_GONE_WAIT_S
    while True:
        _apply_deferred_core_drops()
        gc.collect()
        left = []
        for tid in (_threads() or set()) - before:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read().startswith("tokio"):
                        left.append(tid)
            except OSError:  # it has just ended
                pass
        if not left:
            return
        if time.monotonic() > deadline:
            log.debug("%d Temporal core threads still running %.0f s after the call's runtime was released",
                      len(left), _THREADS_GONE_WAIT_S)
            return
        time.sleep(0.01)


def _apply_deferred_core_drops() -> bool:
    """Enter PyO3 once (build and drop an empty bridge object): PyO3 applies the reference drops that the
    core's threads queued while they did not hold the GIL (see `_wait_core_threads_gone`). False where the
    bridge has no such object (another temporalio: then only the collection helps)."""
    try:
        from temporalio.bridge.temporal_sdk_bridge import CustomSlotSupplier

        CustomSlotSupplier(None)
    except Exception:
        log.debug("could not enter Temporal's core bridge to apply its deferred reference drops", exc_info=True)
        return False
    return True


# --------------------------------------------------------------------------------- reflect


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


async def _run(inp: ReflectionInput, settings: Settings, trace_name: str, workflow_id: str | None,
               timeout: float | None, per_request: Callable[[Any, str], object] | None = None) -> ReflectorOutput:
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from reflector import client as c
    from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

    def no_worker(waited: float) -> None:
        log.warning("no worker is polling task queue %r: reflection %s has waited %.0f s for one (start `rr "
                    "worker` with the same TEMPORAL_ADDRESS, RR_TASK_QUEUE and blob store)", settings.task_queue,
                    wf_id, waited)

    wf_id = ""
    try:
        async with c.runtime(settings, announce=log.info,
                             in_process_worker=in_process_worker([inp.config.model])) as rt:
            handle = await c.start_reflection(rt.client, inp, settings.task_queue, workflow_id, trace_name=trace_name)
            wf_id = handle.id
            log.info("started reflection %s (trace %s, %s bytes) on %s", wf_id, inp.trace.format, inp.trace.size,
                     rt.address)
            await rt.ensure_worker(handle)
            waiting = c.wait_for_result(handle, on_no_worker=no_worker, no_worker_after_s=settings.no_worker_warn_s)
            try:
                out = await asyncio.wait_for(waiting, timeout)
                if per_request is not None:
                    await _report_requests(rt.client, wf_id, settings, inp.config.model, per_request)
                return out
            except TimeoutError:
                where = (f"it is saved on this RR_HOME's embedded server: `rr result {wf_id}` (same RR_HOME) follows it"
                         if rt.embedded_server else f"it goes on durably on {rt.address}: `rr result {wf_id}`")
                raise TimeoutError(f"reflection {wf_id} did not finish within {timeout:g} s; {where}") from None
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
    with _call_core_runtime():
        return await _reflect(question=question, agent_output=agent_output, skillbook=skillbook,
                              ground_truth=ground_truth, feedback=feedback, traces=_traces_arg(traces, trace),
                              config=config, mode=mode, workflow_id=workflow_id, settings=settings, timeout=timeout,
                              injected_skill_ids=tuple(injected_skill_ids))


def _traces_arg(traces: Traces, trace: object) -> Any:
    """`traces` (rr's name) or `trace` (the keyword ACE's ReflectStep passes a raw trace with), not both."""
    if trace is not None and traces is not None:
        raise ValueError("pass the trace once: traces= or trace= (ACE's name for it), not both")
    return traces if trace is None else trace


async def _reflect(*, question: str, agent_output: object, skillbook: object, ground_truth: str | None,
                   feedback: str | None, traces: Any, config: RRConfig | None, mode: Literal["online", "offline"],
                   workflow_id: str | None, settings: Settings | None, timeout: float | None,
                   injected_skill_ids: tuple[str, ...] = ()) -> ReflectorOutput:
    from reflector import client as c
    from reflector.settings import Settings

    cfg = config or RRConfig()
    settings = settings or Settings.from_env()
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if mode not in ("online", "offline"):
        raise ValueError(f"mode must be 'online' or 'offline', got {mode!r}")
    rconf = cfg.to_reflection_config(settings)
    _check_model(rconf.model)
    c.check_id(workflow_id)  # the caps (`reflector.limits`) before anything is stored
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
    inp = await asyncio.to_thread(functools.partial(
        c.build_input, trace, question=question, ground_truth=ground_truth, feedback=feedback,
        skillbook=_skillbook_text(skillbook), mode=mode, config=rconf, settings=settings))
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
    from reflector.models import check_model_name

    check_model_name(name)


def _with_injected(traces: Any, ids: tuple[str, ...], question: str, answer: _Answer | None,
                   ground_truth: str | None, feedback: str | None) -> Any:
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
    ace = {"iterations": run.get("total_iterations", 0), "compactions": run.get("compactions", 0),
           "depth": run.get("depth", 0), "timed_out": bool(run.get("timed_out")) or budget}
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


async def _report_requests(client: Any, workflow_id: str, settings: Settings, model: str,
                           callback: Callable[[Any, str], object]) -> None:
    """Call ACE's per-request `usage_callback` for every completed model request of the reflection's tree
    (its histories: each session's requests and compaction summaries in order, a child's where it started);
    the callback's exceptions are logged and swallowed (ACE's `MeteredModel` does the same)."""
    from pydantic_ai.usage import RequestUsage

    from reflector.audit.build import build_audit
    from reflector.audit.capture import ReplayCapture
    from reflector.audit.histories import collect
    from reflector.audit.timeline import ChildItem, CompactionItem, ModelRequestItem, Session

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
    - `config`: `RRConfig` (limits, model); `settings`: a `reflector.settings.Settings` (default: from the
      environment: TEMPORAL_ADDRESS, RR_HOME, ...); `workflow_id`: the reflection's id (default: generated);
      `timeout`: seconds to wait for the result (`TimeoutError`; on a server the reflection goes on).

    Runs on the configured Temporal server, else on the embedded dev server with an in-process worker
    (both stopped before this returns). Called where an event loop runs (a Jupyter cell, async code, ACE's
    pipeline), it runs on a thread of its own and blocks until done, as ACE's reflector does (`await
    areflect(...)` does not block the loop). ACE's keywords: `trace=` (the same as `traces=`),
    `injected_skill_ids=` (the skills rendered into the agent's prompt, put in a dict trace as
    `injected_skill_ids`). Errors: a bad trace or argument is a
    `ValueError` (`reflector.traces.TraceError`, `reflector.settings.SettingError`, pydantic's
    `ValidationError`); a refused trace, an unreachable server or a failed reflection is a
    `reflector.client.ReflectError`; messages are the CLI's one-liners.
    """
    def run() -> ReflectorOutput:
        with _call_core_runtime():  # released once the event loop is closed: nothing of it holds the runtime
            return asyncio.run(_reflect(
                question=question, agent_output=agent_output, skillbook=skillbook, ground_truth=ground_truth,
                feedback=feedback, traces=_traces_arg(traces, trace), config=config, mode=mode,
                workflow_id=workflow_id, settings=settings, timeout=timeout,
                injected_skill_ids=tuple(injected_skill_ids),
            ))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # an event loop runs in this thread (Jupyter, async code, ACE's pipeline): run on a thread of its own,
    # as ACE's reflector does (this blocks the loop until the reflection ends; `await areflect` does not)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rr-reflect") as pool:
        return pool.submit(run).result()


# --------------------------------------------------------------------------------- the pipeline step


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

    def __init__(self, model: str | Model | RRConfig | None = None, config: RRConfig | Any = None,
                 prompt_template: str | None = None, model_settings: Mapping[str, Any] | None = None,
                 handoff: bool = True, **defaults: Any) -> None:
        known = set(inspect.signature(areflect).parameters) - set(self._OWN)
        unknown = sorted(set(defaults) - known)
        if unknown:
            raise TypeError(f"RRStep got unknown default(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if isinstance(model, RRConfig):
            if config is not None:
                raise TypeError("RRStep got two configs: RRStep(model, config=RRConfig(...)) takes the model first")
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
            warnings.warn("RRStep: prompt_template is ignored: rr's prompts are its own (each reflection's history "
                          "records the prompts it was given)", stacklevel=2)
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
        lines.append(f"Learning {i}: {learning.learning}" + (f" (evidence: {learning.evidence})" if learning.evidence
                                                            else ""))
    if not lines or HANDOFF_TAGS in out.reasoning:
        return out
    return out.model_copy(update={"reasoning": out.reasoning.rstrip() + "\n\n" + "\n".join(lines)})


def _failed_output(exc: BaseException) -> ReflectorOutput:
    """ACE's output of a failed run (its reflector never raises one): the reason in `raw["error"]`."""
    log.error("reflection failed: %s", exc)
    return ReflectorOutput(reasoning=f"Recursive analysis failed: {exc}", correct_approach="", key_insight="",
                           raw={"error": str(exc), "error_type": type(exc).__name__})


def _as_rrconfig(config: object) -> RRConfig:
    """An `RRConfig`, None (the defaults), or ACE's `RecursiveConfig` / `AgenticConfig` dataclass (its fields
    rr has, by name; `usage_callback` included). Anything else is a `TypeError`."""
    if config is None:
        return RRConfig()
    if isinstance(config, RRConfig):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name in RRConfig.model_fields}
        return RRConfig.model_validate(values)
    raise TypeError(f"RRStep: config must be an RRConfig (or ACE's RecursiveConfig), got {type(config).__name__}")


_instances: dict[int, tuple[object, str]] = {}  # id -> (the model, kept alive so that its id is not reused; name)


def _model_name(model: object) -> str:
    """A model name for `RRConfig.model`: a str as is; a pydantic-ai `Model` registered under a generated name
    (`instance:<system>:<model name>:<n>`; once per object)."""
    if isinstance(model, str):
        return model
    from pydantic_ai.models import Model

    from reflector.models import register_model

    if not isinstance(model, Model):
        raise TypeError(f"RRStep: model must be a model name or a pydantic-ai Model, got {type(model).__name__}")
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
