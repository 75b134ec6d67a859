"""What the scripted provider servers share: the HTTP plumbing, the request log, the answer counter and
the fault script (`openai_server`, `anthropic_server`; loopback only, no network).

A subclass speaks one provider protocol: `_route` answers a request from its JSON body alone (the
servers are stateless, like the real services) and `_error_body` writes an error in the provider's
shape. Everything else is here:

- ``requests``: every request received, in order, with the status the server sent (0: nothing, the
  client had gone away while the reply was held) and the fault applied to it, if any;
- ``completed``: the requests *answered* (status 200, a whole valid reply written to a client still
  connected), keyed by `request_key`: a key counted twice is a request sent again after it had been
  answered, i.e. paid twice. A faulted reply (an error status, a truncated or malformed body, a reply
  held until the client gave up) is never counted: the client got no answer it could use;
- ``faults``: a script of `Fault`s applied to the next requests, one each, in order
  (``server.faults.extend([...])``); `fault_at` applies one to the n-th request received instead
  (1-based, counting every request). `fail_next` is the older shorthand for HTTP error statuses.

The faults: an HTTP error status with the provider's error body (``Fault.http``; 429 with a
``Retry-After`` header, 500, 401, 404 ``model_not_found`` ...), a reply held longer than the client's
HTTP timeout (``Fault.timeout``), a truncated body (``Fault.truncated``: the headers announce the whole
reply, half of it is sent, then the connection is closed) and malformed JSON (``Fault.malformed``: 200
with a body that is not JSON).
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
from typing import Any, Literal, Self, cast

from reflector.contract import EXECUTE_CODE_TOOL

__all__ = [
    "Fault",
    "FaultKind",
    "RecordedRequest",
    "ScriptedServer",
    "request_key",
    "NO_REPLY",
    "CELL_CODE",
    "CELL_TOOL",
    "cell_code",
    "reflection_args",
]

CELL_CODE = "print('steps', len(traces.get('steps', [])))"
CELL_TOOL = EXECUTE_CODE_TOOL

NO_REPLY = 0  # the status recorded for a request the server never answered (the client went away first)
_POLL_S = 0.02  # how often a held reply checks whether its client is still there

FaultKind = Literal["http", "timeout", "truncated", "malformed"]


def cell_code(k: int) -> str:
    """The code of the server's `k`-th `execute_code` call (0: `CELL_CODE`)."""
    return CELL_CODE if k == 0 else f"print('cell', {k}, {k} * len(traces))"


def reflection_args(cell_outputs: list[str], who: str = "local OpenAI server") -> dict[str, Any]:
    """The arguments of the output tool call: a reflection quoting what the cells printed."""
    quoted = " | ".join(o.strip() for o in cell_outputs)
    return {
        "reasoning": f"the {who} read {len(cell_outputs)} cell output(s)",
        "error_identification": f"cell said: {quoted}",
        "root_cause_analysis": "root cause from the local server",
        "correct_approach": "approach from the local server",
        "key_insight": "insight from the local server",
        "extracted_learnings": [
            {
                "learning": "inspect the trace first",
                "atomicity_score": 0.8,
                "evidence": quoted,
                "justification": "j",
            }
        ],
        "skill_tags": [],
    }


def request_key(path: str, body: dict[str, Any]) -> str:
    """What identifies a request's content (any base URL prefix before ``/v1/`` ignored): the same key
    means the same request sent again."""
    endpoint = path.split("?", 1)[0].rstrip("/").rsplit("/v1/", 1)[-1]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{endpoint}\n{canonical}".encode()).hexdigest()


@dataclass(frozen=True)
class Fault:
    """One scripted fault; build it with the class methods."""

    kind: FaultKind
    status: int = 200
    code: str | None = None  # the provider's error code (OpenAI `code`; Anthropic error `type` is derived)
    message: str = ""
    retry_after_s: int | None = None  # sent as `Retry-After` (whole seconds, as HTTP defines it)
    hold_s: float = 0.0  # timeout: how long the reply is held (longer than the client's timeout)

    @property
    def name(self) -> str:
        return str(self.status) if self.kind == "http" else self.kind

    @classmethod
    def http(
        cls, status: int, code: str | None = None, message: str = "", retry_after_s: int | None = None
    ) -> Fault:
        return cls("http", status, code, message or f"scripted failure {status}", retry_after_s)

    @classmethod
    def rate_limited(cls, retry_after_s: int = 1) -> Fault:
        return cls.http(429, "rate_limit_exceeded", "Rate limit reached for requests", retry_after_s)

    @classmethod
    def server_error(cls) -> Fault:
        return cls.http(500, "server_error", "The server had an error while processing your request")

    @classmethod
    def unauthorized(cls) -> Fault:
        return cls.http(401, "invalid_api_key", "Incorrect API key provided")

    @classmethod
    def model_not_found(cls, model: str = "") -> Fault:
        what = f"The model `{model}`" if model else "The model"
        return cls.http(404, "model_not_found", f"{what} does not exist or you do not have access to it.")

    @classmethod
    def timeout(cls, hold_s: float) -> Fault:
        return cls("timeout", hold_s=hold_s)

    @classmethod
    def truncated(cls) -> Fault:
        return cls("truncated")

    @classmethod
    def malformed(cls) -> Fault:
        return cls("malformed")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]
    status: int  # what the server answered (NO_REPLY: nothing, the client had gone)
    fault: str | None = None  # the `Fault.name` applied to this request, if any
    received: float = 0.0  # time.monotonic() when the request had been read
    seq: int = 0  # 1-based arrival number (what `fault_at` counts)


def _client_gone(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (it sends nothing while awaiting a reply)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _hold(sock: socket.socket, seconds: float) -> bool:
    """Hold a reply up to `seconds`, returning early (False) as soon as the client has gone away."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(_POLL_S, left))
        if _client_gone(sock):
            return False
    return not _client_gone(sock)


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: hundreds of clients connect at once in the benchmarks


Reply = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, extra headers


@dataclass
class ScriptedServer:
    """Start with ``start()`` (or use as a context manager); ``base_url`` ends in ``/v1``."""

    prompt_tokens: int = 100
    completion_tokens: int = 20
    # prompt caching, reported as each provider does: OpenAI's `cached_tokens` are part of `prompt_tokens`;
    # Anthropic reports `input_tokens` (uncached), `cache_read_input_tokens` and `cache_creation_input_tokens`
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # Anthropic only (OpenAI does not report cache writes)
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
    # CPU seconds the handler threads spent on requests (parsing, routing, writing; not the held latency):
    # what a benchmark reports as the provider stand-in's cost, apart from the rest of its process
    cpu_s: float = 0.0
    faults: list[Fault] = field(default_factory=list)  # applied to the next requests, in order
    _faults_at: dict[int, Fault] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _arrivals: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _httpd: _Server | None = None
    _thread: threading.Thread | None = None

    thread_name = "scripted-server"

    # -- control ------------------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next `n` requests with HTTP `status` (500 or 429, whose `Retry-After` is 0)."""
        fault = (
            Fault.rate_limited(0)
            if status == 429
            else Fault.server_error()
            if status == 500
            else Fault.http(status)
        )
        with self._lock:
            self.faults.extend([fault] * n)

    def fault_at(self, n: int, fault: Fault) -> None:
        """Apply `fault` to the `n`-th request received (1-based), before the `faults` script."""
        with self._lock:
            self._faults_at[n] = fault

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = cast(tuple[str, int], self._httpd.server_address[:2])  # an AF_INET server
        return f"http://{host}:{port}/v1"

    def start(self) -> Self:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                if server.nodelay:
                    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def handle_one_request(self) -> None:
                t0 = time.thread_time()
                try:
                    super().handle_one_request()
                finally:
                    spent = time.thread_time() - t0
                    with server._lock:
                        server.cpu_s += spent

            def do_POST(self) -> None:
                server._serve(self)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Self:
        return self if self._httpd is not None else self.start()  # already started: just stopped at the end

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- views for assertions -----------------------------------------------------------------

    def ok_requests(self) -> list[RecordedRequest]:
        """The requests answered with a usable reply (status 200, neither truncated nor malformed)."""
        return [r for r in self.requests if r.status == 200 and r.fault in (None, "timeout")]

    def statuses(self) -> list[int | str]:
        """Each request's outcome in order: its status, or the fault's kind for a reply the client could
        not use (``truncated``, ``malformed``, ``timeout``: held until the client had gone)."""
        return [
            r.fault
            if r.fault in ("truncated", "malformed") or (r.fault == "timeout" and r.status == NO_REPLY)
            else r.status
            for r in self.requests
        ]

    def duplicated_completions(self) -> dict[str, int]:
        """request key -> times answered, for every request answered more than once."""
        with self._lock:
            return {k: n for k, n in self.completed.items() if n > 1}

    # -- what a protocol defines --------------------------------------------------------------

    def _route(self, path: str, body: dict[str, Any], n: int) -> Reply:
        """The reply to a request (n: a fresh id number for the reply's ids)."""
        raise NotImplementedError

    def _error_body(self, fault: Fault) -> dict[str, Any]:
        """An HTTP error fault's body in the provider's shape."""
        raise NotImplementedError

    # -- serving ------------------------------------------------------------------------------

    def _take_fault(self, seq: int) -> Fault | None:
        with self._lock:
            if seq in self._faults_at:
                return self._faults_at.pop(seq)
            return self.faults.pop(0) if self.faults else None

    def _log(
        self,
        h: BaseHTTPRequestHandler,
        body: dict[str, Any],
        status: int,
        fault: Fault | None,
        received: float,
        seq: int,
    ) -> None:
        if self.record:
            rec = RecordedRequest(
                "POST",
                h.path,
                {k.lower(): v for k, v in h.headers.items()},
                body,
                status,
                fault.name if fault is not None else None,
                received,
                seq,
            )
            with self._lock:
                self.requests.append(rec)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        received = time.monotonic()
        seq = next(self._arrivals)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode(errors="replace")}
        fault = self._take_fault(seq)
        hold = fault.hold_s if fault is not None and fault.kind == "timeout" else 0.0
        if self.latency_s > 0 and hold == 0:
            time.sleep(self.latency_s)
            still_there = not _client_gone(h.connection)
        else:
            still_there = _hold(h.connection, hold) if hold > 0 else True
        if not still_there:
            with self._lock:
                self.abandoned += 1
            self._log(h, body, NO_REPLY, fault, received, seq)
            h.close_connection = True
            return
        if fault is not None and fault.kind == "http":
            extra = {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else {}
            status, payload = fault.status, self._error_body(fault)
        else:
            status, payload, extra = self._route(h.path, body, next(self._ids))
        data = json.dumps(payload).encode()
        sent, announced = data, len(data)
        if fault is not None and fault.kind == "truncated":
            sent = data[: len(data) // 2]
        elif fault is not None and fault.kind == "malformed":
            sent = b'{"id": "broken", "object": <html>upstream reset</html>'
            announced = len(sent)
        self._log(h, body, status, fault, received, seq)
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(announced))
        for k, v in extra.items():
            h.send_header(k, v)
        h.end_headers()
        try:
            h.wfile.write(sent)
            h.wfile.flush()
        except OSError:
            h.close_connection = True
            return
        if fault is not None and fault.kind == "truncated":
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if status == 200 and (fault is None or fault.kind == "timeout"):
            key = request_key(h.path, body)
            with self._lock:
                self.completed[key] += 1
                self.answers.setdefault(key, []).append((time.time(), h.path))
