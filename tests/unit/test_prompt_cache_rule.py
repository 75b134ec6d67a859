"""The prompt-caching rule (`reflector.analysis.prompt_cache`) and the usage it reports (`reflector.analysis.ledger`)."""

from __future__ import annotations

from reflector.analysis.ledger import Ledger, UsageRecord
from reflector.analysis.prompt_cache import cache_key, with_prompt_cache
from reflector.client.api import RRConfig


def test_caching_is_on_where_the_provider_has_it() -> None:
    assert with_prompt_cache("anthropic:claude-x", None) == {"cache": True}
    assert with_prompt_cache("openai-chat:gpt-4o", {"temperature": 0.0}, session_id="rr-1") == {
        "temperature": 0.0,
        "cache": True,
        "openai_prompt_cache_key": cache_key("rr-1"),
    }
    assert with_prompt_cache("openai:gpt-4o", None) == {"cache": True}  # no session yet: no key
    assert with_prompt_cache("anthropic:claude-x", None, session_id="rr-1") == {"cache": True}  # OpenAI only
    for model in ("heuristic", "test", "ollama:llama3", "my-registered-model"):
        assert with_prompt_cache(model, None, session_id="rr-1") is None
        assert with_prompt_cache(model, {"temperature": 0.3}, session_id="rr-1") == {"temperature": 0.3}


def test_the_callers_settings_win() -> None:
    off = {"cache": False}
    assert with_prompt_cache("openai:gpt-4o", off, session_id="rr-1") == off  # off: no key either
    assert with_prompt_cache("anthropic:claude-x", {"cache": "1h"}) == {"cache": "1h"}
    own = {"anthropic_cache_instructions": True}
    assert with_prompt_cache("anthropic:claude-x", own) is own  # the provider's own settings: untouched
    key = {"openai_prompt_cache_key": "mine"}
    assert with_prompt_cache("openai:gpt-4o", key, session_id="rr-1") is key


def test_cache_key_is_a_short_stable_hash() -> None:
    long_id = "rr-batch-" + "x" * 200 + ".r1.r2"
    assert cache_key(long_id) == cache_key(long_id) != cache_key(long_id + "3")
    assert len(cache_key(long_id)) <= 64 and "x" not in cache_key(long_id).removeprefix("rr-")


def test_ace_config_writes_the_same_rule() -> None:
    assert RRConfig(model="openai:gpt-4o").to_reflection_config().model_settings == {
        "temperature": 0.0,
        "cache": "5m",
    }
    assert RRConfig(model="openai:gpt-4o", cache_prompts=False).to_reflection_config().model_settings == {
        "temperature": 0.0,
        "cache": False,
    }
    assert RRConfig(model="heuristic").to_reflection_config().model_settings is None


def test_cache_tokens_are_summed_in_the_ledger() -> None:
    ledger = Ledger(max_tokens=10_000, max_requests=5)
    ledger.charge(
        UsageRecord(input_tokens=1_000, output_tokens=50, cache_read_tokens=800),
        UsageRecord(input_tokens=1_200, output_tokens=40, cache_read_tokens=900, cache_write_tokens=200),
    )
    spent = ledger.spent()
    assert (spent.input_tokens, spent.cache_read_tokens, spent.cache_write_tokens) == (2_200, 1_700, 200)
    assert spent.total_tokens == 2_290  # the budget counts every input token, cached or not
    old = UsageRecord.model_validate({"input_tokens": 5, "output_tokens": 1})  # recorded before the fields
    assert old.cache_read_tokens == 0 and old.cache_write_tokens == 0
