"""The only module that touches pydantic-ai's and temporalio's private API (see docs/upstream.md).

`TemporalDurability` whose in-process model requests run as local activities on the workflow's
worker, and whose provider requests run as pydantic-ai's regular activities.

Two paths, chosen per request by where the model answers (`reflector.runtime.models.answers_in_process`):

- A model that answers inside the worker (`heuristic`, `FunctionModel`, `TestModel`) runs as a local
  activity (below): no server round trip and no message history in the history per step.
- A provider model (OpenAI, Anthropic, ... : a network round trip of seconds) runs as pydantic-ai's own
  regular model-request activity, in workflows recorded since the `rr-provider-model-activities`
  patch. Why: a local activity keeps its workflow task open while it runs, and the SDK keeps an open
  task alive only by completing it every 0.8 x task timeout, which needs the workflow's activation
  to have been answered first (temporalio/features#168). Hundreds of reflections each holding a task
  through a 3 s request on one worker: the renewals come late, tasks time out, whole histories are
  replayed and the worker collapses (bench/throughput.py, 3 s model, 200 in flight: 415 "Task not
  found" and falling steps/s, even with admission control; see BENCHMARKS.md). As a regular
  activity the request holds no workflow task and no slot while the provider thinks, its result is
  durable in the history the moment it completes (no response cache needed), and a worker that dies
  during it loses only that attempt (retried after the heartbeat timeout).

Why local for in-process models: with pydantic-ai's regular model-request activity every step of a reflection costs two server
round trips (schedule and dispatch the activity, then a new workflow task for its result), and the
activity's input (the whole message history) is written to the history at every step. As a local
activity the request runs inside the open workflow task: no server round trip per step, and only
the response is recorded (as a marker). Measured in `bench/overhead.py` and `bench/throughput.py`.

What keeps it durable: the markers are flushed to the history at least every 0.8 x workflow task
timeout (the SDK's workflow-task heartbeat while local activities run), and every response is
stored in the response cache (`activities.model_requests`) before the activity returns, so a worker
dying between two flushes costs a replay, never a second payment. The request (messages, settings,
tool definitions) is handed to the activity in process rather than serialized into its input
(`activities.model_requests.handed_over`): a local activity runs where its workflow runs, and its
input is never recorded. Everything else (activity name of
the regular request, the run context, errors rebuilt as pydantic-ai's model errors, streaming, the
continue-as-new handler) is pydantic-ai's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.durable_exec._operation import DurableOperation, ModelRequestId
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.durable_exec.temporal._model_errors import (
    model_errors_as_application_errors,
    rebuilt_model_errors,
)
from pydantic_ai.durable_exec.temporal._operation_backend import TemporalBoundOperation
from pydantic_ai.durable_exec.temporal._toolset import (
    model_response_payload_errors,
    non_retryable_subclasses_as_application_errors,
)
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import AgentDepsT
from temporalio import activity, workflow
from temporalio.workflow import ActivityConfig

from activities.model_requests import LOCAL_RETRY_THRESHOLD, cached_request_activity, handed_over
from reflector.contract import AGENT_NAME, LOCAL_MODEL_PATCH, LOCAL_MODEL_SUFFIX, PROVIDER_MODEL_PATCH
from reflector.runtime.models import answers_in_process
from workflows.patches import patch_on
from workflows.rerun import maybe_reused_response
from workflows.state import SessionState, await_cancel_safe

__all__ = [
    "LocalModelDurability",
    "local_model_requests",
    "provider_model_activities",
    "request_capture",
]

request_capture: Callable[[Any], None] | None = None
"""Audit side channel (`reflector.client.audit.capture`): called in workflow code with every model request's
params (pydantic-ai's `ModelRequestParams`), during replay too. None in production; it only records and
never changes a command."""


def local_model_requests() -> bool:
    """Whether this workflow run schedules model requests as local activities (patch marker)."""
    return patch_on(LOCAL_MODEL_PATCH)


def provider_model_activities() -> bool:
    """Whether this workflow run sends provider (network) model requests as regular activities (patch
    marker; asked only when such a request is made, so histories of in-process models do not change)."""
    return patch_on(PROVIDER_MODEL_PATCH)


class _LocalModelRequest:
    """The bound model-request operation, scheduled as a local activity instead of a regular one."""

    def __init__(
        self,
        inner: TemporalBoundOperation[Any, Any, ModelResponse],
        local: Callable[..., Awaitable[ModelResponse]],
        config: ActivityConfig,
        steps: bool = False,
    ) -> None:
        self._inner = inner
        self._local = local
        self._config = config
        self._steps = steps  # the reflector agent's requests: the session's steps (`rr rerun` may reuse them)

    @property
    def operation(self) -> DurableOperation[Any, Any, ModelResponse]:
        return self._inner.operation

    async def __call__(self, params: Any, *, config: object | None = None) -> ModelResponse:
        if request_capture is not None:
            request_capture(params)
        if self._steps and (reused := await maybe_reused_response()) is not None:
            return reused  # `rr rerun`: the origin's recorded response of this step (workflows.rerun)
        if not local_model_requests():
            return await self._inner(params, config=config)
        if not answers_in_process(getattr(params, "model_id", None)) and provider_model_activities():
            return await self._inner(params, config=config)
        _note_cached_response()
        payload = self._inner.operation.parameter_transport.dump(params)
        op_id = cast(ModelRequestId, self._inner.operation.operation_id)
        model_name = getattr(params, "model_id", None) or op_id.model_name
        cfg = self._config
        params_wire, deps = payload
        with (
            rebuilt_model_errors(),
            model_response_payload_errors(model_name),
            handed_over(params_wire, deps) as key,
        ):
            response: ModelResponse = await await_cancel_safe(
                workflow.start_local_activity(
                    self._local,
                    args=[key],
                    start_to_close_timeout=cfg.get("start_to_close_timeout"),
                    schedule_to_close_timeout=cfg.get("schedule_to_close_timeout"),
                    retry_policy=cfg.get("retry_policy"),
                    local_retry_threshold=LOCAL_RETRY_THRESHOLD,
                    summary=f"request model: {model_name}",
                )
            )
        return response


def _note_cached_response() -> None:
    """Tell the session that its response cache holds an entry (its last run forgets them: `_close`)."""
    state = getattr(workflow.instance(), "state", None)
    if isinstance(state, SessionState):
        state.responses_cached = True


class LocalModelDurability(TemporalDurability[AgentDepsT]):
    """`TemporalDurability` with (non-streaming) in-process model requests as cached local activities
    (provider requests keep pydantic-ai's regular activity, see the module doc).

    The local activity is named after pydantic-ai's model-request activity plus `_local`
    (e.g. `rr_reflector__model_request_local`) and must be registered on the worker
    (`local_model_activities`); pydantic-ai's own activities stay registered as before.
    """

    local_request_activity: Callable[[str], Awaitable[ModelResponse]]

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        super()._bind_to_agent(agent)
        ops = self._bound_model_operations
        assert ops is not None
        inner = cast(TemporalBoundOperation[Any, Any, ModelResponse], ops.request)
        name = f"{activity._Definition.must_from_callable(inner.registration).name}{LOCAL_MODEL_SUFFIX}"
        op, runtime, non_retryable = inner.operation, self, self._non_retryable_model_errors

        async def run(params: Any, deps: Any) -> ModelResponse:
            # pydantic-ai's activity body minus its heartbeat loop (local activities do not heartbeat)
            semantic = op.parameter_transport.load((params, deps), runtime=runtime)
            with (
                non_retryable_subclasses_as_application_errors(),
                model_errors_as_application_errors(non_retryable),
            ):
                return await op.handler(semantic)

        self.local_request_activity = cached_request_activity(run, name)
        local = _LocalModelRequest(
            inner, self.local_request_activity, self._model_activity_config, steps=agent.name == AGENT_NAME
        )
        self._bound_model_operations = ops._replace(request=local)


def local_model_activities(*agents: AbstractAgent[Any, Any]) -> list[Callable[..., Any]]:
    """The local model-request activities of `agents`, for the worker's activity list."""
    out: list[Callable[..., Any]] = []
    for agent in agents:
        durability = TemporalDurability.from_agent(agent)
        if not isinstance(durability, LocalModelDurability):
            raise TypeError(f"agent {agent.name!r} has no LocalModelDurability capability")
        out.append(durability.local_request_activity)
    return out


def use_heartbeats_when_due() -> None:
    """pydantic-ai's durable activities (model requests above all) heartbeat only when a beat is due, not at
    their start: one server write less per model request (`reflector.runtime.lean_heartbeats`). The modules
    named are those that call `heartbeating()` (MCP's only when its optional dependency is installed)."""
    from types import ModuleType

    from pydantic_ai.durable_exec.temporal import (
        _dynamic_toolset,
        _function_toolset,
        _operation_backend,
        _toolset,
    )

    from reflector.runtime import lean_heartbeats

    modules: list[ModuleType] = [_toolset, _operation_backend, _function_toolset, _dynamic_toolset]
    try:
        from pydantic_ai.durable_exec.temporal import _mcp_toolset
    except ImportError:  # pydantic-ai's MCP support is optional
        pass
    else:
        modules.append(_mcp_toolset)
    lean_heartbeats.install(_toolset.heartbeating, modules)
