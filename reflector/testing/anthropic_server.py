"""A local, scripted Anthropic Messages server for protocol tests (loopback only, no network).

It speaks ``POST /v1/messages`` (non-streaming; pydantic-ai's `AnthropicModel`, model strings
``anthropic:…``, sends it as ``/v1/messages?beta=true``). Point the SDK at it with
``ANTHROPIC_BASE_URL`` = ``base_url`` without the ``/v1`` (the SDK adds it) and any ``ANTHROPIC_API_KEY``.

Like `openai_server` (whose request log, answer counter and fault script it shares through
`reflector.testing.scripted_http`) it is stateless: while no ``tool_result`` answers an
``execute_code`` call it calls ``execute_code``, then the output tool ``final_result`` with a
reflection quoting the cell outputs. HTTP error faults are written as Anthropic errors
(``{"type": "error", "error": {"type": "rate_limit_error", ...}}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reflector.contract import OUTPUT_TOOL
from reflector.testing.scripted_http import (
    CELL_TOOL,
    Fault,
    Reply,
    ScriptedServer,
    reflection_args,
)

__all__ = ["AnthropicServer", "ERROR_TYPES"]

# HTTP status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _cell_outputs(messages: list[dict[str, Any]]) -> list[str]:
    """Contents of `tool_result` blocks that answer an `execute_code` call."""
    blocks = [
        b for m in messages if isinstance(m.get("content"), list) for b in m["content"] if isinstance(b, dict)
    ]
    cell_ids = {b.get("id") for b in blocks if b.get("type") == "tool_use" and b.get("name") == CELL_TOOL}
    return [
        _text(b.get("content"))
        for b in blocks
        if b.get("type") == "tool_result" and b.get("tool_use_id") in cell_ids
    ]


@dataclass
class AnthropicServer(ScriptedServer):
    """Start with ``start()`` (or use as a context manager); ``base_url`` ends in ``/v1``."""

    thread_name = "anthropic-server"

    @property
    def sdk_base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` is set to (the SDK appends ``/v1/messages``)."""
        return self.base_url.removesuffix("/v1")

    def _error_body(self, fault: Fault) -> dict[str, Any]:
        kind = ERROR_TYPES.get(fault.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": fault.message}}

    def _route(self, path: str, body: dict[str, Any], n: int) -> Reply:
        if path.split("?", 1)[0].rstrip("/").endswith("/messages"):
            return 200, self._message(body, n), {}
        return 404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {path}"}}, {}

    def _message(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        outputs = _cell_outputs(body.get("messages") or [])
        if len(outputs) >= self.cells:
            name, args = OUTPUT_TOOL, reflection_args(outputs, "local Anthropic server")
        else:
            name, args = CELL_TOOL, {"code": self.code(len(outputs))}
        return {
            "id": f"msg_{n:024d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "unknown"),
            "content": [{"type": "tool_use", "id": f"toolu_{n:024d}", "name": name, "input": args}],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.prompt_tokens,
                "output_tokens": self.completion_tokens,
                "cache_creation_input_tokens": self.cache_write_tokens,
                "cache_read_input_tokens": self.cached_tokens,
            },
        }
