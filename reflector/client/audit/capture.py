"""What each model request was given, rebuilt by replaying the history (model inputs are not stored).

An in-process model's request is a local activity whose input is never recorded; a provider request's
input is in its `ActivityTaskScheduled` event, but only for histories recorded since the provider patch.
Either way the workflow rebuilds the request from the history, so replaying it against the current
code (temporalio's `Replayer`, `worker.make_replayer`) reproduces every request's params. The model-request
wrapper in `workflows.local_model` calls `request_capture` with them (workflow side, during replay too);
this module installs a callback there for the length of one replay and summarises what it sees. It
never changes a command: the callback only reads the params. Where a history does record the input (a
provider request's activity), `reflector.client.audit.build` shows that instead: it is what was sent, while the
replay rebuilds the request with today's code. `reflector/` never imports the workflows:
the replayer and the hook's installer come from the composition root (`worker.audit_replay_hooks`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

__all__ = [
    "ToolResultSeen",
    "RequestInput",
    "ReplayCapture",
    "ReplayHooks",
    "summarise_messages",
    "replay_inputs",
]

EXCERPT_CHARS = 400
REFUSAL = "REFUSED:"  # how a tool says it did not run (the loop guard's refusal of a repeated failing cell)
LAST_RESULTS = 3


RequestCallback = Callable[[Any], None]


@dataclass(frozen=True)
class ReplayHooks:
    """What replaying for an audit needs from the composition root (`worker.audit_replay_hooks`)."""

    make_replayer: Callable[
        [Path | str, Sequence[str] | None], Replayer
    ]  # (blob dir, models used) -> replayer
    install: Callable[
        [RequestCallback | None], RequestCallback | None
    ]  # sets the workflow-side hook, returns the old


class ToolResultSeen(BaseModel):
    """A tool result the model saw in its request (the most recent ones are kept)."""

    tool: str
    call_id: str = ""
    chars: int = 0
    excerpt: str = ""


class RequestInput(BaseModel):
    """A summary of what one model request was given."""

    messages: int = 0
    chars: int = 0
    tools_offered: list[str] = Field(default_factory=list)
    last_tool_results: list[ToolResultSeen] = Field(default_factory=list)
    refused_calls: list[str] = Field(
        default_factory=list
    )  # call ids whose result was a refusal (no cell ran)
    source: str = "replay"  # "replay" or "activity input"


class ReplayCapture(BaseModel):
    """Per history (index in the list replayed): the inputs of its model requests, in request order."""

    inputs: dict[int, list[RequestInput]] = Field(default_factory=dict)
    failures: dict[int, str] = Field(default_factory=dict)  # history index -> why its replay failed


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _part_text(part: Any) -> str:
    content = getattr(part, "content", None)
    if content is None:
        content = getattr(part, "args", None)
    if content is None and isinstance(part, dict):
        content = part.get("content", part.get("args"))
    return _text(content if content is not None else "")


def _part_kind(part: Any) -> str:
    kind = getattr(part, "part_kind", None)
    if kind is None and isinstance(part, dict):
        kind = part.get("part_kind")
    return str(kind or "")


def _attr(part: Any, name: str) -> str:
    value = getattr(part, name, None)
    if value is None and isinstance(part, dict):
        value = part.get(name)
    return str(value or "")


def summarise_messages(messages: Sequence[Any], tools: Sequence[str], source: str) -> RequestInput:
    """Summarise a request's messages (pydantic-ai `ModelMessage`s, or their JSON dicts)."""
    chars = 0
    results: list[ToolResultSeen] = []
    refused: list[str] = []
    for message in messages:
        parts = getattr(message, "parts", None)
        if parts is None and isinstance(message, dict):
            parts = message.get("parts", [])
        for part in parts or []:
            text = _part_text(part)
            chars += len(text)
            if _part_kind(part) in ("tool-return", "retry-prompt") and _attr(part, "tool_name"):
                call_id = _attr(part, "tool_call_id")
                results.append(
                    ToolResultSeen(
                        tool=_attr(part, "tool_name"),
                        call_id=call_id,
                        chars=len(text),
                        excerpt=text[:EXCERPT_CHARS],
                    )
                )
                if call_id and text.startswith(REFUSAL):
                    refused.append(call_id)
    return RequestInput(
        messages=len(messages),
        chars=chars,
        tools_offered=sorted(tools),
        last_tool_results=results[-LAST_RESULTS:],
        refused_calls=refused,
        source=source,
    )


def _tools_of(params: Any) -> list[str]:
    mrp = getattr(params, "model_request_parameters", None)
    names = [t.name for t in getattr(mrp, "function_tools", []) or []]
    return names + [t.name for t in getattr(mrp, "output_tools", []) or []]


class _Collector:
    """The callback installed in `workflows.local_model` while one replay runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.target: tuple[str, int] | None = None  # (workflow id, history index) being replayed
        self.seen: dict[int, list[RequestInput]] = {}

    def __call__(self, params: Any) -> None:
        try:
            target = self.target
            if (
                target is None
                or workflow.info().workflow_id != target[0]
                or not workflow.unsafe.is_replaying()
            ):
                return  # another workflow of this process (a live worker's), never ours
            summary = summarise_messages(getattr(params, "messages", []) or [], _tools_of(params), "replay")
            with self.lock:
                self.seen.setdefault(target[1], []).append(summary)
        except Exception:
            return


_install_lock = threading.Lock()


async def replay_inputs(
    histories: Sequence[WorkflowHistory],
    blob_dir: Path | str,
    hooks: ReplayHooks,
    models: Sequence[str] | None = None,
) -> ReplayCapture:
    """Replay `histories` one after the other and capture every model request's input (`models`: the
    models they use, prepared for the replay; None: every shipped provider family)."""
    collector = _Collector()
    failures: dict[int, str] = {}
    replayer = hooks.make_replayer(blob_dir, models)

    async def feed() -> AsyncIterator[WorkflowHistory]:
        for index, history in enumerate(histories):
            collector.target = (history.workflow_id, index)
            yield history

    with _install_lock:
        previous = hooks.install(collector)
    try:
        async with replayer.workflow_replay_iterator(feed()) as results:
            index = 0
            async for result in results:
                if result.replay_failure is not None:
                    failures[index] = f"{type(result.replay_failure).__name__}: {result.replay_failure}"
                index += 1
    except Exception as e:
        failures[-1] = f"replay stopped: {type(e).__name__}: {e}"
    finally:
        collector.target = None
        with _install_lock:
            hooks.install(previous)
    return ReplayCapture(inputs=dict(collector.seen), failures=failures)
