"""One clear line for a model provider's error (what a failed reflection reports as its `error`).

pydantic-ai raises a provider's HTTP error as a `ModelHTTPError` that is also an instance of its category
(`ModelAuthenticationError`, `ModelNotFoundError`, `ModelRateLimitError`, ...), and its message is the raw
``status_code: 401, model_name: ..., body: {...}``. `describe` turns it into what happened, the status and
the provider's own complaint, e.g. ``authentication failed (HTTP 401): Incorrect API key provided
[invalid_api_key] (model 'gpt-4o')``. Pure (no I/O, no clock): it runs in workflow code.
"""

from __future__ import annotations

from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelContextWindowExceededError,
    ModelHTTPError,
    ModelNotFoundError,
    ModelQuotaExceededError,
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelRequestTimeout,
    ModelServerError,
    ModelTimeoutError,
    ModelUnavailableError,
)

__all__ = ["describe", "provider_complaint"]

# most specific first: a category's subclasses before it
_WHAT: tuple[tuple[type[ModelAPIError], str], ...] = (
    (ModelAuthenticationError, "authentication failed"),
    (ModelNotFoundError, "model not found"),
    (ModelContextWindowExceededError, "context window exceeded"),
    (ModelRequestRejectedError, "request rejected"),
    (ModelQuotaExceededError, "quota exceeded"),
    (ModelRateLimitError, "rate limited"),
    (ModelUnavailableError, "provider unavailable"),
    (ModelServerError, "provider server error"),
    (ModelTimeoutError, "provider request timed out"),
    (ModelRequestTimeout, "provider request timed out"),
    (ModelConnectionError, "provider connection failed"),
)
_MAX_CHARS = 300


def provider_complaint(body: object) -> str | None:
    """The provider's error message (and code) from an error body: OpenAI's error object
    (``{"message", "type", "code"}``, or wrapped in ``{"error": ...}``) or Anthropic's
    (``{"type": "error", "error": {"type", "message"}}``)."""
    if not isinstance(body, dict):
        return str(body)[:_MAX_CHARS] if body else None
    inner = body.get("error")
    err = inner if isinstance(inner, dict) else body
    message = err.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    code = err.get("code") or err.get("type")
    tag = f" [{code}]" if isinstance(code, str) and code and code != "error" else ""
    return f"{' '.join(message.split())[:_MAX_CHARS]}{tag}"


def describe(error: BaseException) -> str:
    """One line for `error`: a model error as what happened, its HTTP status and the provider's complaint;
    anything else as ``Type: message``."""
    if not isinstance(error, ModelAPIError):
        return f"{type(error).__name__}: {error}"
    what = next((w for cls, w in _WHAT if isinstance(error, cls)), "model request failed")
    status = f" (HTTP {error.status_code})" if isinstance(error, ModelHTTPError) else ""
    said = provider_complaint(error.body)
    line = f"{what}{status}: {said or ' '.join(str(error.message).split())[:_MAX_CHARS]}"
    if isinstance(error, ModelHTTPError) and error.suggested_model_id:
        line += f"; did you mean {error.suggested_model_id!r}?"
    return f"{line} (model {error.model_name!r})"
