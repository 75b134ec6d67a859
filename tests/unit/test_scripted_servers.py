"""The fault script of the local provider servers (`reflector.testing.scripted_http`), over raw HTTP:
what each fault sends, and that the request log and the `completed` counter stay right for each."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from reflector.testing.anthropic_server import AnthropicServer
from reflector.testing.openai_server import OpenAIServer
from reflector.testing.scripted_http import NO_REPLY, Fault, ScriptedServer, request_key

CHAT = "/v1/chat/completions"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _post(
    server: ScriptedServer, path: str = CHAT, body: dict[str, Any] = BODY, timeout: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    host, port = server.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _wait_for(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_faults_apply_in_order_then_normal_replies() -> None:
    with OpenAIServer() as server:
        server.faults.extend([Fault.rate_limited(3), Fault.server_error(), Fault.unauthorized()])
        status, headers, data = _post(server)
        assert status == 429 and headers["retry-after"] == "3"
        assert json.loads(data)["error"]["code"] == "rate_limit_exceeded"
        assert _post(server)[0] == 500
        status, _, data = _post(server)
        assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        status, _, data = _post(server)
        assert status == 200 and json.loads(data)["object"] == "chat.completion"
    assert server.statuses() == [429, 500, 401, 200]
    assert [r.fault for r in server.requests] == ["429", "500", "401", None]
    assert [r.seq for r in server.requests] == [1, 2, 3, 4]
    assert server.completed == {request_key(CHAT, BODY): 1}  # only the answer counts
    assert server.ok_requests() == [server.requests[-1]]


def test_fault_at_a_request_number() -> None:
    with OpenAIServer() as server:
        server.fault_at(2, Fault.model_not_found("m"))
        codes = [_post(server, body={**BODY, "n": i})[0] for i in range(3)]
    assert codes == [200, 404, 200]
    assert sum(server.completed.values()) == 2


def test_truncated_body_is_cut_and_not_counted() -> None:
    with OpenAIServer() as server:
        server.faults.append(Fault.truncated())
        with pytest.raises(http.client.IncompleteRead):
            _post(server)
        assert _post(server)[0] == 200  # the same request again: answered once
    assert server.statuses() == ["truncated", 200]
    assert server.requests[0].status == 200  # what the status line said
    assert list(server.completed.values()) == [1] and not server.duplicated_completions()


def test_malformed_json_is_not_counted() -> None:
    with OpenAIServer() as server:
        server.faults.append(Fault.malformed())
        status, headers, data = _post(server)
        assert status == 200 and headers["content-type"] == "application/json"
        with pytest.raises(ValueError):
            json.loads(data)
    assert server.statuses() == ["malformed"] and not server.completed


def test_held_reply_is_abandoned_when_the_client_gives_up() -> None:
    with OpenAIServer() as server:
        server.faults.append(Fault.timeout(hold_s=30))
        with pytest.raises(socket.timeout):
            _post(server, timeout=0.3)
        _wait_for(lambda: server.abandoned == 1)  # the server noticed the client had gone
        assert _post(server)[0] == 200
    assert [r.status for r in server.requests] == [NO_REPLY, 200]
    assert server.statuses() == ["timeout", 200]
    assert server.abandoned == 1 and list(server.completed.values()) == [1]


def test_held_reply_is_answered_to_a_patient_client() -> None:
    with OpenAIServer() as server:
        server.faults.append(Fault.timeout(hold_s=0.2))
        assert _post(server)[0] == 200
    assert server.statuses() == [200] and server.requests[0].fault == "timeout"
    assert list(server.completed.values()) == [1] and server.abandoned == 0


def test_anthropic_errors_and_replies() -> None:
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    with AnthropicServer(prompt_tokens=7, completion_tokens=3) as server:
        assert server.sdk_base_url + "/v1" == server.base_url
        server.faults.extend([Fault.rate_limited(4), Fault.unauthorized(), Fault.model_not_found("claude-x")])
        status, headers, data = _post(server, "/v1/messages?beta=true", body)
        assert status == 429 and headers["retry-after"] == "4"
        assert json.loads(data) == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "Rate limit reached for requests"},
        }
        assert json.loads(_post(server, "/v1/messages", body)[2])["error"]["type"] == "authentication_error"
        assert json.loads(_post(server, "/v1/messages", body)[2])["error"]["type"] == "not_found_error"
        status, _, data = _post(server, "/v1/messages?beta=true", body)
    reply = json.loads(data)
    assert status == 200 and reply["type"] == "message" and reply["stop_reason"] == "tool_use"
    [block] = reply["content"]
    assert block["type"] == "tool_use" and block["name"] == "execute_code" and "code" in block["input"]
    assert reply["usage"]["input_tokens"] == 7 and reply["usage"]["output_tokens"] == 3
    assert server.statuses() == [429, 401, 404, 200]


def test_anthropic_final_answer_quotes_the_tool_result() -> None:
    with AnthropicServer() as server:
        body = {
            "model": "c",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "execute_code",
                            "input": {"code": "print(1)"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "steps 4\n"}],
                        }
                    ],
                },
            ],
        }
        [block] = json.loads(_post(server, "/v1/messages", body)[2])["content"]
    assert block["name"] == "final_result" and block["input"]["error_identification"] == "cell said: steps 4"
