"""A local, scripted OpenAI-compatible HTTP server for protocol tests (loopback only, no network).

It speaks the two OpenAI protocols pydantic-ai uses, non-streaming:

- Chat Completions, ``POST /v1/chat/completions`` (`OpenAIChatModel`, model strings ``openai-chat:…``);
- Responses, ``POST /v1/responses`` (`OpenAIResponsesModel`, which is what ``openai:…`` resolves to).

Like the real service it is stateless: every reply is decided from the request alone. When no tool
result answers an ``execute_code`` call yet, it calls ``execute_code``; otherwise it calls the output
tool ``final_result`` with a reflection whose ``error_identification`` quotes the cell output.

It records every request (path, headers, JSON body, status, fault) in ``requests`` and injects
provider faults from a script (``faults``, ``fault_at``, ``fail_next``: HTTP errors such as a 429 with
``Retry-After``, 500, 401 or 404 ``model_not_found``, replies held past the client's timeout, truncated
bodies, malformed JSON; see `reflector.testing.scripted_http`, shared with `anthropic_server`). Each
successful reply reports ``prompt_tokens``/``completion_tokens`` (and ``cached_tokens`` of the prompt, 0 unless
set) so usage accounting can be asserted exactly.

For crash and chaos runs (all off by default): ``cells`` makes it call ``execute_code`` that many times
before answering (still decided from the request alone), ``latency_s`` holds every reply that long (a
provider round trip, during which a client can be killed), and ``completed`` counts the requests it
*answered* (status 200, the whole reply written to a client still connected), keyed by
`request_key` (the endpoint and the canonical JSON body): a key counted twice is a request sent again
after it had been answered, i.e. paid twice; ``answers`` keeps when and on which path each answer went
(clients can be told apart by a base URL prefix such as ``http://host:port/w03/v1``: every path ending
in an endpoint is served); ``nodelay`` sends each reply without Nagle's delay, so that an answer counted
is an answer delivered. A request whose client went away during ``latency_s`` is not answered: it is
counted in ``abandoned`` and logged with status 0 (`NO_REPLY`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from reflector.contract import OUTPUT_TOOL
from reflector.testing.scripted_http import (
    CELL_CODE,
    CELL_TOOL,
    Fault,
    RecordedRequest,
    Reply,
    ScriptedServer,
    cell_code,
    reflection_args,
    request_key,
)

__all__ = ["OpenAIServer", "RecordedRequest", "Fault", "CELL_CODE", "cell_code", "request_key"]


def _reflection(cell_outputs: list[str]) -> dict[str, Any]:
    return reflection_args(cell_outputs, "local OpenAI server")


def _chat_cell_outputs(messages: list[dict[str, Any]]) -> list[str]:
    """Contents of `role: tool` messages that answer an `execute_code` call (Chat Completions)."""
    cell_ids = {
        tc["id"]
        for m in messages
        if m.get("role") == "assistant"
        for tc in m.get("tool_calls") or []
        if tc.get("function", {}).get("name") == CELL_TOOL
    }
    out = []
    for m in messages:
        if m.get("role") == "tool" and m.get("tool_call_id") in cell_ids:
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            out.append(str(content))
    return out


def _responses_cell_outputs(items: list[dict[str, Any]] | str) -> list[str]:
    """Outputs of `function_call_output` items that answer an `execute_code` call (Responses)."""
    if isinstance(items, str):
        return []
    cell_ids = {
        i["call_id"] for i in items if i.get("type") == "function_call" and i.get("name") == CELL_TOOL
    }
    out = []
    for i in items:
        if i.get("type") == "function_call_output" and i.get("call_id") in cell_ids:
            output = i.get("output")
            if isinstance(output, list):
                output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
            out.append(str(output))
    return out


@dataclass
class OpenAIServer(ScriptedServer):
    """Start with ``start()`` (or use as a context manager); ``base_url`` ends in ``/v1``."""

    thread_name = "openai-server"

    def _error_body(self, fault: Fault) -> dict[str, Any]:
        kind = {429: "rate_limit_exceeded", 401: "invalid_request_error", 404: "invalid_request_error"}.get(
            fault.status, "server_error"
        )
        return {"error": {"message": fault.message, "type": kind, "param": None, "code": fault.code}}

    def _usage_chat(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _route(self, path: str, body: dict[str, Any], n: int) -> Reply:
        endpoint = path.split("?", 1)[0].rstrip("/")
        if endpoint.endswith("/chat/completions"):
            return 200, self._chat(body, n), {}
        if endpoint.endswith("/responses"):
            return 200, self._responses(body, n), {}
        return 404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}}, {}

    def _chat(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        outputs = _chat_cell_outputs(body.get("messages") or [])
        if len(outputs) >= self.cells:
            name, args = OUTPUT_TOOL, _reflection(outputs)
        else:
            name, args = CELL_TOOL, {"code": self.code(len(outputs))}
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "unknown"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "logprobs": None,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "refusal": None,
                        "tool_calls": [
                            {
                                "id": f"call_{n}",
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)},
                            }
                        ],
                    },
                }
            ],
            "usage": self._usage_chat(),
        }

    def _responses(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        outputs = _responses_cell_outputs(body.get("input") or [])
        if len(outputs) >= self.cells:
            name, args = OUTPUT_TOOL, _reflection(outputs)
        else:
            name, args = CELL_TOOL, {"code": self.code(len(outputs))}
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "error": None,
            "incomplete_details": None,
            "model": body.get("model", "unknown"),
            "output": [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": name,
                    "arguments": json.dumps(args),
                    "status": "completed",
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }
