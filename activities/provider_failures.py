"""Keep a failed provider request's failure small enough for the history to record it.

A model request that fails with a provider error (a 429, a 500, a timeout ...) fails its activity
attempt with pydantic-ai's `ApplicationError` (the model error encoded in its details; a 429's
`Retry-After` as its `next_retry_delay`), chained to the model error and the SDK's error, each with
its Python stack trace. Temporal keeps the last failure of an activity that is retried and records it
in the next attempt's `ActivityTaskStarted` event, but only up to
``limit.mutableStateActivityFailureSize.error`` (4 KB by default): beyond that the history shows just
"Failure exceeds size limit." and which fault an attempt survived is lost. The stack traces are what
exceeds it (tens of pydantic-ai and SDK frames per exception) and say nothing about the provider's
fault, so this interceptor drops them (the full traceback is logged at DEBUG first, logger
``rr.provider``); messages, details, type, `non_retryable` and `next_retry_delay` are unchanged.

The worker's own log line for such an attempt (temporalio's "Completing activity as failed", with the
traceback of three chained exceptions) becomes one line saying what the provider complained of and
whether Temporal retries it; a non-retryable one (authentication, unknown model ...) is logged at INFO,
as the reflection itself reports it (its `error`, `rr reflect`'s last line).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic_ai.exceptions import ModelAPIError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from reflector.analysis.provider_errors import describe

__all__ = ["CompactProviderFailures", "compact_provider_failure", "ProviderFailureLogLine"]

log = logging.getLogger("rr.provider")


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__  # what Temporal's failure converter follows
    return out


def _model_error(error: BaseException) -> ModelAPIError | None:
    """The provider error behind an activity's `ApplicationError`, if it is one."""
    if not isinstance(error, ApplicationError):
        return None
    return next((e for e in _chain(error)[1:] if isinstance(e, ModelAPIError)), None)


def compact_provider_failure(error: BaseException) -> bool:
    """Drop the stack traces of `error` and of its causes if it is a provider error's `ApplicationError`
    (a `ModelAPIError` in its cause chain); returns whether it did."""
    if _model_error(error) is None:
        return False
    for e in _chain(error):
        e.__traceback__ = None
    return True


class ProviderFailureLogLine(logging.Filter):
    """On temporalio's activity logger: a failed provider attempt as one line, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cause = _model_error(exc) if exc is not None else None
        if cause is None or not isinstance(exc, ApplicationError):
            return True
        info = getattr(record, "temporal_activity", None) or {}
        outcome = "not retried" if exc.non_retryable else "Temporal retries it"
        record.msg = "model request of workflow %s failed at attempt %s (%s): %s"
        record.args = (info.get("workflow_id", "?"), info.get("attempt", "?"), outcome, describe(cause))
        record.exc_info, record.exc_text = None, None
        if exc.non_retryable:
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def _install_log_line() -> None:
    logger = logging.getLogger(activity.logger.logger.name)
    if not any(isinstance(f, ProviderFailureLogLine) for f in logger.filters):
        logger.addFilter(ProviderFailureLogLine())


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except ApplicationError as e:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s attempt %d failed",
                    activity.info().activity_type,
                    activity.info().attempt,
                    exc_info=True,
                )
            if compact_provider_failure(e):
                raise e from e.__cause__  # a traceback starting here: one frame
            raise


class CompactProviderFailures(Interceptor):
    """The worker interceptor (`worker.build_worker`) that applies `compact_provider_failure`; building it
    also puts `ProviderFailureLogLine` on temporalio's activity logger (once per process)."""

    def __init__(self) -> None:
        _install_log_line()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)
