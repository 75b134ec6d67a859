"""OpenAI-style message lists (and Anthropic content parts), bare or in a wrapper dict."""

from __future__ import annotations

from collections import Counter
from typing import Any

from reflector.analysis.traces.agents import agent_of, is_chat_role
from reflector.analysis.traces.view import (
    _args_str,
    _as_dict,
    _first_text,
    _last_answer,
    _opt_float,
    _opt_str,
    _part_type,
    _run_view,
    _step,
    _text,
    looks_like_error,
)

# chat roles some exports spell their own way (LangChain `human` / `ai`, Gemini `model`, Magentic-One `human`)
_ROLE_SYNONYMS = {"human": "user", "ai": "assistant", "model": "assistant"}


def _messages_steps(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI-style (and Anthropic content-part) messages -> canonical steps."""
    steps: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for msg in messages:
        steps.extend(_message_steps(msg, call_names, len(steps)))
    return steps


def _message_steps(msg: Any, call_names: dict[str, str], first: int) -> list[dict[str, Any]]:
    """The steps of one message, numbered from `first`. `call_names` (tool-call id -> tool name) is
    read to name tool results and extended with this message's calls: the only state carried from
    one message to the next (the lazy view keeps the names it resolves in its index)."""
    if not isinstance(msg, dict):
        return [_step(first, "unknown", _text(msg))]
    role = str(msg.get("role", "unknown"))
    actor, addressee = (None, None) if role in ("tool", "function") else agent_of(msg)
    if actor is not None and ("role" not in msg or not is_chat_role(role)):
        role = "assistant"  # the role names the agent (Magentic-One), or a named speaker has none: an agent's turn
    role = _ROLE_SYNONYMS.get(role, role)
    content = msg.get("content")
    calls = _openai_calls(msg.get("tool_calls") or msg.get("function_call"), call_names)
    calls += _anthropic_calls(content, call_names)
    if role in ("tool", "function"):
        name = msg.get("name") or call_names.get(str(msg.get("tool_call_id")))
        text = _text(content)
        err = bool(msg.get("is_error")) or looks_like_error(text)
        return [_step(first, "tool", text, calls, name, err)]
    results = _anthropic_results(content, call_names)
    text = (
        _text([p for p in content if _part_type(p) != "tool_result"])
        if isinstance(content, list)
        else _text(content)
    )
    steps: list[dict[str, Any]] = []
    if text or calls or not results:
        steps.append(_step(first, role, text, calls, actor=actor, addressee=addressee))
    for name, rtext, err in results:
        steps.append(_step(first + len(steps), "tool", rtext, None, name, err))
    return steps


def _actor(msg: dict[str, Any]) -> str | None:
    """The agent a (non-tool) message names, by the one rule of `reflector.analysis.traces.agents` (`name`, a
    framework's agent field, a role that is not a chat role). A tool message's `name` is the tool's, so
    it is never read as an actor."""
    if str(msg.get("role")) in ("tool", "function"):
        return None
    return agent_of(msg)[0]


def _openai_calls(raw: Any, call_names: dict[str, str]) -> list[dict[str, str]]:
    items = raw if isinstance(raw, list) else [raw] if isinstance(raw, dict) else []
    calls: list[dict[str, str]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        fn = _as_dict(item.get("function")) or item
        name = str(fn.get("name", ""))
        calls.append({"name": name, "arguments": _args_str(fn.get("arguments"))})
        if item.get("id"):
            call_names[str(item["id"])] = name
    return calls


def _anthropic_calls(content: Any, call_names: dict[str, str]) -> list[dict[str, str]]:
    calls: list[dict[str, str]] = []
    for part in content if isinstance(content, list) else []:
        if _part_type(part) in ("tool_use", "toolCall"):
            name = str(part.get("name", ""))
            calls.append({"name": name, "arguments": _args_str(part.get("input", part.get("arguments")))})
            if part.get("id"):
                call_names[str(part["id"])] = name
    return calls


def _anthropic_results(content: Any, call_names: dict[str, str]) -> list[tuple[str | None, str, bool]]:
    out: list[tuple[str | None, str, bool]] = []
    for part in content if isinstance(content, list) else []:
        if _part_type(part) == "tool_result":
            text = _text(part.get("content"))
            name = call_names.get(str(part.get("tool_use_id")))
            out.append((name, text, bool(part.get("is_error")) or looks_like_error(text)))
    return out


def _norm_messages(data: Any) -> dict[str, Any]:
    wrapper = data if isinstance(data, dict) else {}
    messages = wrapper.get("messages", []) if wrapper else data
    steps = _messages_steps(messages)
    extra = {k: v for k, v in wrapper.items() if k != "messages" and isinstance(v, (str, int, float, bool))}
    return _run_view(
        "messages",
        data,
        steps,
        question=_opt_str(wrapper.get("question") or wrapper.get("task")) or _first_text(steps, "user"),
        ground_truth=_opt_str(wrapper.get("ground_truth")),
        feedback=_opt_str(wrapper.get("feedback")),
        final_answer=_opt_str(wrapper.get("final_answer")) or _last_answer(steps),
        reward=_opt_float(wrapper.get("reward")),
        metadata={"roles": dict(Counter(s["role"] for s in steps)), **extra},
    )
