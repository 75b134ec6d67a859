"""bench/tokens.py's counting: a request as billed, and the modelled prefix cache (its figures rest on these)."""

from __future__ import annotations

import json

from bench.token_count import cached_tokens, request_tokens, tokens_of


def test_a_request_counts_its_tools_messages_and_framing() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    body = {
        "tools": tools,
        "messages": [
            {"role": "system", "content": "You are a reflector."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "content": [{"type": "text", "text": "[cell 2]\nsteps 4"}]},
        ],
    }
    n = len(tokens_of(json.dumps([t["function"] for t in tools], separators=(",", ":"))))
    n += 3 + len(tokens_of("system")) + len(tokens_of("You are a reflector."))
    n += 3 + len(tokens_of("assistant")) + len(tokens_of("f")) + len(tokens_of('{"a": 1}'))
    n += 3 + len(tokens_of("tool")) + len(tokens_of("[cell 2]\nsteps 4"))
    assert len(request_tokens(body)) == n + 3


def test_the_modelled_cache_serves_shared_prefixes_from_1024_tokens_in_steps_of_128() -> None:
    base = list(range(2_000))
    assert cached_tokens([base, base + [1, 2], base[:1_500] + [-1] * 900, base[:1_000] + [-1] * 2_000]) == [
        0,
        1_920,
        1_408,
        0,
    ]
