"""Provider SDK retries are off for every provider family we support: Temporal's retry policy owns
retries (an SDK retry inside an activity attempt would be invisible in the history and could pay a
request twice). The OpenAI protocol is also checked end to end over a local HTTP server
(`tests/workflows/test_openai_protocol.py`); these check the clients the resolver builds."""

from __future__ import annotations

from typing import Any

import pytest

from reflector.runtime import models


def _wrapped(name: str) -> Any:
    models._instances.pop(name, None)
    return models.resolve_model(name)


def test_openai_and_anthropic_clients_do_not_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    for name in ("openai:gpt-4o", "openai-chat:gpt-4o"):
        assert _wrapped(name).client.max_retries == 0
    assert _wrapped("anthropic:claude-sonnet-4-5").client.max_retries == 0


def test_google_client_does_not_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """google-genai retries only with `HttpRetryOptions` (none are set: one attempt), and retries
    connection errors implicitly only on its aiohttp transport, which it does not use here: without aiohttp
    installed, or with it (ace-framework brings it) for the Gemini API, whose client is httpx's (google-genai
    2.34 takes aiohttp only for Vertex AI with a client certificate)."""
    import tenacity

    monkeypatch.setenv("GOOGLE_API_KEY", "test")
    api = _wrapped("google:gemini-2.5-flash").client._api_client
    assert api._http_options.retry_options is None
    stop = api._async_retry.stop
    assert isinstance(stop, tenacity.stop_after_attempt) and stop.max_attempt_number == 1
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return
    assert not api._use_aiohttp()
