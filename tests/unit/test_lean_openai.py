"""The shortcut for the OpenAI SDK's Chat Completions body (reflector.runtime.lean_openai) changes no request.

Real pydantic-ai requests (an agent with a tool and an output tool, against the local OpenAI-compatible
server) are captured where the SDK transforms them: the shortcut must take every one of them and give
exactly what the SDK's own transform gives. Bodies it cannot prove unchanged go to the SDK.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, TypedDict

import pytest
from openai._utils._transform import PropertyInfo
from openai.resources.chat.completions import completions as sdk_module
from openai.types.chat import completion_create_params as params

from reflector.runtime import lean_openai
from tests.support.openai_agent import run_agent

NON_STREAMING = params.CompletionCreateParamsNonStreaming


class Inner(TypedDict, total=False):
    card_id: Annotated[str, PropertyInfo(alias="cardID")]


class Outer(TypedDict, total=False):
    items: list[Inner | str]


class Plain(TypedDict, total=False):
    items: list[dict[str, str] | None]


async def _sdk_transform(data: object, expected_type: object) -> Any:
    from openai._utils import async_maybe_transform

    return await async_maybe_transform(data, expected_type)


async def _run_agent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return await run_agent(monkeypatch, "lean-test")


async def test_real_requests_take_the_shortcut_and_send_what_the_sdk_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert lean_openai.install()
    installed = sdk_module.async_maybe_transform  # type: ignore[attr-defined]
    taken: list[bool] = []

    async def spy(data: object, expected_type: object) -> Any:
        assert expected_type is NON_STREAMING and isinstance(data, dict)
        taken.append(lean_openai.plain_json(lean_openai.lean_body(data)))
        return await installed(data, expected_type)

    monkeypatch.setattr(sdk_module, "async_maybe_transform", spy)
    lean = await _run_agent(monkeypatch)
    assert taken == [True, True, True], "a pydantic-ai body the shortcut does not take"
    monkeypatch.setattr(sdk_module, "async_maybe_transform", _sdk_transform)  # the SDK's own walk
    sdk = await _run_agent(monkeypatch)
    assert len(lean) == 3
    assert lean == sdk  # the same JSON on the wire


async def test_a_body_that_is_not_plain_json_goes_to_the_sdk() -> None:
    assert lean_openai.install()
    when = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"at": when}}
    assert not lean_openai.plain_json(lean_openai.lean_body(body))
    installed = sdk_module.async_maybe_transform  # type: ignore[attr-defined]
    assert await installed(body, NON_STREAMING) == await _sdk_transform(body, NON_STREAMING)


def test_an_alias_anywhere_in_the_parameter_types_is_found() -> None:
    assert lean_openai.has_alias(Outer)
    assert not lean_openai.has_alias(Plain)
    # the SDK's own Chat Completions parameters have none (else install() keeps the SDK's transform)
    assert not lean_openai.has_alias(NON_STREAMING)


def test_plain_json() -> None:
    assert lean_openai.plain_json({"a": [1, 2.5, "x", None, True, {"b": []}]})
    assert not lean_openai.plain_json({"a": (1, 2)})
    assert not lean_openai.plain_json({1: "x"})
    assert not lean_openai.plain_json({"a": b"bytes"})
