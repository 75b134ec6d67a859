"""`reflector.analysis.provider_errors.describe`: a provider's error as one clear line (a failed reflection's `error`)."""

from __future__ import annotations

from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelAuthenticationError,
    ModelHTTPError,
    ModelNotFoundError,
    ModelRateLimitError,
    ModelServerError,
    ModelTimeoutError,
    UnexpectedModelBehavior,
)

from reflector.analysis.provider_errors import describe, provider_complaint


def test_openai_authentication_error() -> None:
    body = {
        "message": "Incorrect API key provided: sk-x.",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
    e = ModelHTTPError.for_category(ModelAuthenticationError, status_code=401, model_name="gpt-4o", body=body)
    assert describe(e) == (
        "authentication failed (HTTP 401): Incorrect API key provided: sk-x. [invalid_api_key] "
        "(model 'gpt-4o')"
    )


def test_anthropic_not_found_error() -> None:
    body = {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-nope"}}
    e = ModelHTTPError.for_category(ModelNotFoundError, status_code=404, model_name="claude-nope", body=body)
    assert (
        describe(e)
        == "model not found (HTTP 404): model: claude-nope [not_found_error] (model 'claude-nope')"
    )


def test_suggested_model_is_named() -> None:
    body = {"message": "The model `gpt-4p` does not exist", "code": "model_not_found"}
    e = ModelHTTPError.for_category(
        ModelNotFoundError,
        status_code=404,
        model_name="gpt-4p",
        body=body,
        suggested_model_id="openai:gpt-4o",
    )
    assert describe(e).endswith("[model_not_found]; did you mean 'openai:gpt-4o'? (model 'gpt-4p')")


def test_other_categories() -> None:
    e429 = ModelHTTPError.for_category(
        ModelRateLimitError, status_code=429, model_name="m", body={"message": "slow down"}
    )
    assert describe(e429) == "rate limited (HTTP 429): slow down (model 'm')"
    e500 = ModelHTTPError.for_category(
        ModelServerError, status_code=500, model_name="m", body="<html>oops</html>"
    )
    assert describe(e500) == "provider server error (HTTP 500): <html>oops</html> (model 'm')"
    assert (
        describe(ModelTimeoutError("m", "Request timed out."))
        == "provider request timed out: Request timed out. (model 'm')"
    )
    plain = ModelAPIError("m", "Failed to decode response as JSON:\n  Expecting value")
    assert (
        describe(plain)
        == "model request failed: Failed to decode response as JSON: Expecting value (model 'm')"
    )
    assert describe(ModelHTTPError(418, "m", None)).startswith(
        "model request failed (HTTP 418): status_code: 418"
    )


def test_non_model_errors_keep_their_type() -> None:
    assert describe(UnexpectedModelBehavior("bad tool call")) == "UnexpectedModelBehavior: bad tool call"


def test_complaint_shapes() -> None:
    assert provider_complaint(None) is None
    assert provider_complaint({"error": {"message": "no", "code": "c"}}) == "no [c]"
    assert provider_complaint({"message": ""}) is None
    assert provider_complaint({"message": "x" * 1000}) == "x" * 300
