"""Model requests as local activities, made idempotent by a response cache on the blob store.

This is the path of in-process models (`heuristic`, function models); a provider model's requests are
pydantic-ai's regular activities and need no cache (`workflows.durability`).

A local activity's result reaches the history (as a marker) only when its workflow task completes,
and the workflow task of a reflection stays open while the session works through local activities
(the SDK heartbeats it every 0.8 x task timeout, flushing the markers recorded so far). A worker
that dies in between would lose those markers, and the new worker would re-run the requests: a model
request paid twice. So the activity writes each response, before returning it, to
`<blob dir>/responses/<session>/<run id>.<activity id>.json` and a re-executed attempt of the same
request (same run, same deterministic local-activity id) returns the stored response instead of
calling the provider; an attempt that finds the same request still in flight in this process (its
workflow task timed out under overload and was replayed here) awaits it instead of sending another. Like the sandbox journals, the directory must be shared by the workers that can
take over a workflow (it is, for the embedded default and the compose file); the workflow deletes its
entries once they are all recorded in the history (`forget`).

A worker that is shutting down does not start new requests: the attempt fails with a retry delay
above the local retry threshold, so the retry waits on a workflow timer, the workflow task ends and
another worker continues the reflection (a graceful stop never waits for a whole reflection).

Writes are atomic (temp file + rename) but not fsynced: they must survive the death of the worker
process, which the page cache does.

The request itself is handed over in process (`handed_over`), not serialized: a local activity runs
in the worker process whose workflow scheduled it, and its input is not recorded in the history (only
its result is, in the marker). Encoding the whole message history into the local activity's input and
decoding it again in the activity was ≈ 15% of the worker's Python time per step (py-spy,
`bench/throughput.py`) and grows with the history. The model then receives the workflow's message
objects, as it does in a plain (non-durable) pydantic-ai run; the response still goes through the
payload converter into the marker, and the workflow reads it from there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.messages import ModelResponse
from temporalio import activity
from temporalio.exceptions import ApplicationError

from reflector.contract import FORGET_ACTIVITY, session_key
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import RESPONSES_DIR
from reflector.runtime.storage.stores import blocking, mirror_for

if TYPE_CHECKING:
    from reflector.runtime.storage.s3 import S3Mirror

__all__ = [
    "configure",
    "cache_for",
    "CACHE",
    "ResponseCache",
    "cached_request_activity",
    "handed_over",
    "NOT_HANDED_OVER_ERROR",
    "forget",
    "forget_responses",
    "response_dir",
    "sweep",
    "STALE_AFTER_S",
    "DRAINING_ERROR",
    "LOCAL_RETRY_THRESHOLD",
]

NOT_HANDED_OVER_ERROR = "ModelRequestNotHandedOver"
DRAINING_ERROR = "WorkerDraining"
DRAIN_RETRY_DELAY = timedelta(seconds=1)
LOCAL_RETRY_THRESHOLD = timedelta(milliseconds=500)
"""Local-activity retries that wait longer than this wait on a workflow timer (the workflow task ends)."""


class _QuietHandover(logging.Filter):
    """Drops temporalio's "Completing activity as failed" warning (with its traceback) for a hand-over: a
    stopping worker (an `rr reflect` that ends beside another of its home) giving a model request of someone
    else's reflection to another worker is the designed path, not an error of the user's command."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, ApplicationError) and exc.type == DRAINING_ERROR)


logging.getLogger("temporalio.activity").addFilter(_QuietHandover())

STALE_AFTER_S = 7 * 24 * 3600.0
_ADAPTER: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)


@dataclass(frozen=True)
class ResponseCache:
    """Where one worker's responses live: `<blob dir>/responses`, and with `RR_BLOB_URL=s3://...` the mirror
    that shares them through S3."""

    root: Path
    mirror: S3Mirror | None = None


CACHE: ContextVar[ResponseCache | None] = ContextVar("rr_response_cache", default=None)
"""The cache of the worker running the current activity (bound by `activities.scope.BindWorkerScope`)."""
_default: ResponseCache | None = None  # outside a worker (tools, tests): the process default
_in_flight: dict[Path, asyncio.Future[ModelResponse]] = {}
_handed: dict[str, tuple[Any, Any]] = {}
_keys = itertools.count()


@contextmanager
def handed_over(params: Any, deps: Any) -> Iterator[str]:
    """Make `(params, deps)` available to the local activity of this process under the yielded key,
    until the block ends (the workflow has its result: every attempt, retries included, is over).

    Workflow-side: the key is the activity's input. It is not deterministic and need not be: a local
    activity's input is never recorded nor compared on replay. The entry lives as long as the
    workflow's frame is inside the block: it is released when the block exits, also when the workflow
    is evicted (its tasks are cancelled) or its coroutine is closed or collected. A workflow that a
    stopped in-process worker leaves suspended keeps it, as it keeps the rest of its state.
    """
    key = f"{os.getpid()}-{next(_keys)}"
    _handed[key] = (params, deps)
    try:
        yield key
    finally:
        _handed.pop(key, None)


def _take(key: str, name: str) -> tuple[Any, Any]:
    try:
        return _handed[key]
    except KeyError:
        # The workflow that scheduled it is gone from this process (evicted) before the attempt started;
        # the attempt's result would be discarded anyway, and the replayed workflow schedules a new one.
        raise ApplicationError(
            f"{name}: no model request was handed over under {key!r} in this process (its workflow was evicted)",
            type=NOT_HANDED_OVER_ERROR,
            non_retryable=True,
        ) from None


def cache_for(settings: Settings) -> ResponseCache:
    """The response cache on the blob store of `settings` (a worker binds its own to its activities)."""
    return ResponseCache(Path(settings.blob_dir) / RESPONSES_DIR, mirror_for(settings))


def configure(settings: Settings | None = None) -> ResponseCache:
    """Set the process default cache (on the blob store of `settings`, default the environment's)."""
    global _default
    _default = cache_for(settings or Settings.from_env())
    return _default


def _cache() -> ResponseCache:
    """The running worker's cache; outside a worker, the process default."""
    return CACHE.get() or _default or configure()


def response_dir(workflow_id: str, cache: ResponseCache | None = None) -> Path:
    return (cache or _cache()).root / session_key(workflow_id)


def forget(workflow_id: str, cache: ResponseCache | None = None) -> None:
    """Delete a workflow's cached responses (call only once they are all in its history)."""
    cache = cache or _cache()
    if cache.mirror is not None:
        cache.mirror.remove_tree(response_dir(workflow_id, cache))
    shutil.rmtree(response_dir(workflow_id, cache), ignore_errors=True)


@activity.defn(name=FORGET_ACTIVITY)
async def forget_responses(workflow_id: str) -> None:
    """`forget` as a regular activity: scheduling it ends the workflow task, so by the time it runs
    every model response of the workflow is recorded in the history."""
    cache = _cache()
    await blocking(cache.mirror, forget, workflow_id, cache)


def _store_response(mirror: S3Mirror | None, path: Path, data: bytes) -> None:
    """Write a response atomically; with S3 it is uploaded first (another worker may need it)."""
    if mirror is not None:
        mirror.push_bytes(path, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def _stored_response(mirror: S3Mirror | None, path: Path) -> ModelResponse | None:
    """The response an earlier attempt stored (here, or with S3 on any worker), or None.

    With S3 a local miss costs one GET: the attempt that stored it may have run on a worker that died."""
    if mirror is not None and not path.exists():
        await mirror.run(mirror.pull, path)
    try:
        return _ADAPTER.validate_json(path.read_bytes())
    except (FileNotFoundError, ValidationError):  # not yet requested, or an unreadable leftover
        return None


def sweep(max_age_s: float = STALE_AFTER_S, cache: ResponseCache | None = None) -> int:
    """Delete cache dirs untouched for `max_age_s` (workflows that were terminated); returns how many."""
    root, removed = (cache or _cache()).root, 0
    if not root.is_dir():
        return 0
    cutoff = time.time() - max_age_s
    for d in root.iterdir():
        try:
            if d.stat().st_mtime < cutoff:
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def _consume(task: asyncio.Future[ModelResponse]) -> None:
    if not task.cancelled():
        task.exception()


def cached_request_activity(
    inner: Callable[[Any, Any], Awaitable[ModelResponse]], name: str
) -> Callable[[str], Awaitable[ModelResponse]]:
    """An activity named `name` running `inner(params, deps)` (a model request) at most once; its input
    is the key under which the workflow `handed_over` `(params, deps)`.

    The cache key is (workflow id, run id, local-activity id): deterministic across a replay of the
    same run, so a re-executed attempt finds the response its earlier execution stored.
    """

    async def send_and_store(mirror: S3Mirror | None, path: Path, params: Any, deps: Any) -> ModelResponse:
        try:
            response = await inner(params, deps)
            data = _ADAPTER.dump_json(response)
            await blocking(mirror, _store_response, mirror, path, data)
            return response
        finally:
            _in_flight.pop(path, None)

    async def request(key: str) -> ModelResponse:
        info = activity.info()
        if not info.workflow_id or not info.workflow_run_id:
            raise RuntimeError(f"{name} runs only as a workflow's local activity")
        cache = _cache()
        path = response_dir(info.workflow_id, cache) / f"{info.workflow_run_id}.{info.activity_id}.json"
        stored = await _stored_response(cache.mirror, path)
        if stored is not None:
            return stored
        # A request already on the wire (an earlier attempt whose workflow task timed out and was
        # replayed here) is awaited, not sent again; shielded, so cancelling this attempt (eviction)
        # does not abandon a request that is being paid for.
        task = _in_flight.get(path)
        if task is None and activity.is_worker_shutdown():
            # A stopping worker hands the session over instead of starting another request: the retry
            # waits on a workflow timer (the delay is above the local retry threshold), which ends the
            # workflow task, so this worker can exit and another one replays and sends the request.
            raise ApplicationError(
                "the worker is shutting down; the model request is handed to another worker",
                type=DRAINING_ERROR,
                next_retry_delay=DRAIN_RETRY_DELAY,
            )
        if task is None:
            params, deps = _take(key, name)
            task = _in_flight[path] = asyncio.ensure_future(send_and_store(cache.mirror, path, params, deps))
            task.add_done_callback(_consume)  # nobody may be waiting any more (the attempt was cancelled)
        return await asyncio.shield(task)

    request.__name__ = request.__qualname__ = name
    return activity.defn(name=name)(request)
