"""A local, scripted OpenAI-compatible HTTP server for protocol tests (loopback only, no network).

It speaks the two OpenAI protocols pydantic-ai uses, non-streaming:

- Chat Completions, ``POST /v1/chat/completions`` (`OpenAIChatModel`, model strings ``openai-chat:…``);
- Responses, ``POST /v1/responses`` (`OpenAIResponsesModel`, which is what ``openai:…`` resolves to).

Like the real service it is stateless: every reply is decided from the request alone. When no tool
result answers an ``execute_code`` call yet, it calls ``execute_code``; otherwise it calls the output
tool ``final_result`` with a reflection whose ``error_identification`` quotes the cell output.

It records every request (path, headers, JSON body) in ``requests`` and can fail the next N requests
with an HTTP error (``fail_next``) to exercise retries. Each successful reply reports
``prompt_tokens``/``completion_tokens`` so usage accounting can be asserted exactly.

For crash and chaos runs (all off by default): ``cells`` makes it call ``execute_code`` that many times
before answering (still decided from the request alone), ``latency_s`` holds every reply that long (a
provider round trip, during which a client can be killed), and ``completed`` counts the requests it
*answered* (status 200, the whole reply written to a client still connected), keyed by
`request_key` (the endpoint and the canonical JSON body): a key counted twice is a request sent again
after it had been answered, i.e. paid twice; ``answers`` keeps when and on which path each answer went
(clients can be told apart by a base URL prefix such as ``http://host:port/w03/v1``: every path ending
in an endpoint is served); ``nodelay`` sends each reply without Nagle's delay, so that an answer counted
is an answer delivered. A request whose client went away during ``latency_s`` is not answered and
only counted in ``abandoned``.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from reflector.contract import EXECUTE_CODE_TOOL, OUTPUT_TOOL

__all__ = ["OpenAIServer", "RecordedRequest", "CELL_CODE", "cell_code", "request_key"]

CELL_CODE = "print('steps', len(traces.get('steps', [])))"
CELL_TOOL = EXECUTE_CODE_TOOL


def cell_code(k: int) -> str:
    """The code of the server's `k`-th `execute_code` call (0: `CELL_CODE`)."""
    return CELL_CODE if k == 0 else f"print('cell', {k}, {k} * len(traces))"


def request_key(path: str, body: dict[str, Any]) -> str:
    """What identifies a request's content (any base URL prefix before ``/v1/`` ignored): the same key
    means the same request sent again."""
    endpoint = path.split("?", 1)[0].rstrip("/").rsplit("/v1/", 1)[-1]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{endpoint}\n{canonical}".encode()).hexdigest()


def _client_gone(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (it sends nothing while awaiting a reply)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: hundreds of clients connect at once in the benchmarks


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]
    status: int  # what the server answered


def _reflection(cell_outputs: list[str]) -> dict[str, Any]:
    quoted = " | ".join(o.strip() for o in cell_outputs)
    return {
        "reasoning": f"the local OpenAI server read {len(cell_outputs)} cell output(s)",
        "error_identification": f"cell said: {quoted}",
        "root_cause_analysis": "root cause from the local server",
        "correct_approach": "approach from the local server",
        "key_insight": "insight from the local server",
        "extracted_learnings": [
            {"learning": "inspect the trace first", "atomicity_score": 0.8, "evidence": quoted, "justification": "j"}
        ],
        "skill_tags": [],
    }


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
    cell_ids = {i["call_id"] for i in items if i.get("type") == "function_call" and i.get("name") == CELL_TOOL}
    out = []
    for i in items:
        if i.get("type") == "function_call_output" and i.get("call_id") in cell_ids:
            output = i.get("output")
            if isinstance(output, list):
                output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
            out.append(str(output))
    return out


@dataclass
class OpenAIServer:
    """Start with ``start()`` (or use as a context manager); ``base_url`` ends in ``/v1``."""

    prompt_tokens: int = 100
    completion_tokens: int = 20
    cells: int = 1  # execute_code calls before the final answer
    latency_s: float = 0.0  # how long every reply is held
    # TCP_NODELAY on every connection: the body, written after the headers, then leaves at once instead
    # of waiting up to ~40 ms for the client's delayed ACK (Nagle), so "answered" means "delivered"
    nodelay: bool = False
    code: Callable[[int], str] = cell_code  # the source of the k-th execute_code call
    record: bool = True  # keep every request in `requests` (off for long benchmarks: they are big)
    requests: list[RecordedRequest] = field(default_factory=list)
    completed: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # key -> [(time.time(), path)]
    abandoned: int = 0
    _fail: list[tuple[int, int]] = field(default_factory=list)  # [(remaining, status)]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _httpd: _Server | None = None
    _thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next `n` requests with HTTP `status` (500 or 429) and an OpenAI error body."""
        with self._lock:
            self._fail.append((n, status))

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = cast(tuple[str, int], self._httpd.server_address[:2])  # an AF_INET server
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                if server.nodelay:
                    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                if server.latency_s > 0:
                    time.sleep(server.latency_s)
                    if _client_gone(self.connection):
                        with server._lock:
                            server.abandoned += 1
                        self.close_connection = True
                        return
                status, payload, extra = server._handle(self.path, body)
                if server.record:
                    with server._lock:
                        server.requests.append(RecordedRequest(
                            "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, status
                        ))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True
                    return
                if status == 200:
                    key = request_key(self.path, body)
                    with server._lock:
                        server.completed[key] += 1
                        server.answers.setdefault(key, []).append((time.time(), self.path))

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="openai-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- views for assertions -----------------------------------------------------------------

    def ok_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.status == 200]

    def duplicated_completions(self) -> dict[str, int]:
        """request key -> times answered, for every request answered more than once."""
        with self._lock:
            return {k: n for k, n in self.completed.items() if n > 1}

    # -- protocol -----------------------------------------------------------------------------

    def _take_failure(self) -> int | None:
        with self._lock:
            if not self._fail:
                return None
            n, status = self._fail[0]
            if n <= 1:
                self._fail.pop(0)
            else:
                self._fail[0] = (n - 1, status)
            return status

    def _usage_chat(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def _handle(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        failure = self._take_failure()
        if failure is not None:
            kind = "rate_limit_exceeded" if failure == 429 else "server_error"
            extra = {"Retry-After": "0"} if failure == 429 else {}
            return failure, {"error": {"message": f"scripted failure {failure}", "type": kind, "code": kind}}, extra
        n = next(self._ids)
        if path.rstrip("/").endswith("/chat/completions"):
            return 200, self._chat(body, n), {}
        if path.rstrip("/").endswith("/responses"):
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
            "choices": [{
                "index": 0,
                "finish_reason": "tool_calls",
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [{
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }],
                },
            }],
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
            "output": [{
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": name,
                "arguments": json.dumps(args),
                "status": "completed",
            }],
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }
