"""How bench/tokens.py counts: a Chat Completions request as OpenAI bills it, and a modelled prefix cache.

Tokens are tiktoken's `o200k_base` (GPT-4o's encoding) from the copy litellm bundles (found, not imported: no
download); without it, a stand-in of one pseudo-token per 4 UTF-8 bytes, named as such in `TOKENIZER`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["TOKENIZER", "tokens_of", "request_tokens", "cached_tokens", "MIN_CACHED", "CACHE_STEP"]

MIN_CACHED, CACHE_STEP = 1024, 128  # OpenAI's automatic prompt caching: from 1,024 tokens, in 128-token steps


def _encoder() -> tuple[Any, str]:
    """tiktoken's o200k_base from litellm's bundled copy (offline; litellm is found, not imported: importing it
    tries to download a price list), or None and the stand-in's name."""
    try:
        import importlib.util

        import tiktoken

        spec = importlib.util.find_spec("litellm")
        if spec is not None and spec.submodule_search_locations:
            bundled = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled))
        return tiktoken.get_encoding("o200k_base"), "tiktoken o200k_base"
    except Exception as e:  # no tiktoken, no encoding files: the stand-in
        print(f"tiktoken unavailable ({type(e).__name__}: {e}); counting ceil(bytes/4)", file=sys.stderr)
        return None, "stand-in: ceil(UTF-8 bytes / 4), not a tokenizer"


ENC, TOKENIZER = _encoder()


def tokens_of(text: str) -> list[int]:
    """The token ids of `text` (the stand-in: one pseudo-token per 4 bytes, stable for prefix comparison)."""
    if not text:
        return []
    if ENC is not None:
        return list(ENC.encode(text, disallowed_special=()))
    data = text.encode()
    return [hash(data[i : i + 4]) for i in range(0, len(data), 4)]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content)


def request_tokens(body: dict[str, Any]) -> list[int]:
    """A Chat Completions request as the token sequence it is billed as, in prompt order (tools, then
    messages): the sum of the parts the module docstring lists."""
    seq: list[int] = []
    tools = body.get("tools") or []
    if tools:
        seq += tokens_of(json.dumps([t.get("function", t) for t in tools], separators=(",", ":")))
    for m in body.get("messages") or []:
        seq += [0, 0, 0]  # per-message framing
        seq += tokens_of(str(m.get("role", "")))
        seq += tokens_of(_text(m.get("content")))
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            seq += tokens_of(str(fn.get("name", ""))) + tokens_of(str(fn.get("arguments", "")))
    return seq + [0, 0, 0]  # the reply's priming


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cached_tokens(seqs: list[list[int]]) -> list[int]:
    """Per request: the tokens an automatic prefix cache would read (the module docstring's rule)."""
    out = []
    for k, seq in enumerate(seqs):
        best = max((_common_prefix(seq, prev) for prev in seqs[:k]), default=0)
        out.append(best // CACHE_STEP * CACHE_STEP if best >= MIN_CACHED else 0)
    return out
