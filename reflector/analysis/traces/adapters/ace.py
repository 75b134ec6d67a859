"""ACE reflector inputs: question, generator output (reasoning / final answer), ground truth, feedback."""

from __future__ import annotations

from typing import Any

from reflector.analysis.traces.adapters.messages import _actor, _message_steps, _messages_steps
from reflector.analysis.traces.agents import agent_of
from reflector.analysis.traces.detect import _ACE_KEYS
from reflector.analysis.traces.view import (
    _args_str,
    _batch_view,
    _last_answer,
    _opt_float,
    _opt_str,
    _run_view,
    _step,
    _text,
    looks_like_error,
    said_text,
)


def _norm_ace(data: Any) -> dict[str, Any]:
    if isinstance(data, list):
        return _batch_view("ace", data, [_norm_ace_run(x) for x in data])
    return _norm_ace_run(data)


def _norm_ace_run(d: dict[str, Any]) -> dict[str, Any]:
    """ACE reflector inputs: question, generator output (reasoning/final answer), truth, feedback."""
    out = d.get("agent_output") or d.get("generator_output")
    out_d = out if isinstance(out, dict) else {}
    steps = _ace_base_steps(d)
    trace = d.get("trace")
    if isinstance(trace, (str, dict)) and trace:
        steps.append(_step(len(steps), "assistant", trace if isinstance(trace, str) else _args_str(trace)))
    reasoning = d.get("reasoning") or out_d.get("reasoning")
    if reasoning:
        steps.append(_step(len(steps), "assistant", _text(reasoning)))
    if isinstance(out, str) and out.strip():
        steps.append(_step(len(steps), "assistant", out))
    answer = d.get(
        "answer"
    )  # ACE's EvaluateStep trace: {"question", "reasoning", "answer", "skill_ids", ...}
    if isinstance(answer, str) and answer.strip():
        steps.append(_step(len(steps), "assistant", answer))
    final = (
        d.get("final_answer")
        or out_d.get("final_answer")
        or (out if isinstance(out, str) else None)
        or (answer if isinstance(answer, str) else None)
        or _agent_steps_answer(d)
    )
    skill_ids = d.get("skill_ids") or out_d.get("skill_ids") or _agent_steps_skill_ids(d)
    meta: dict[str, Any] = {
        k: v
        for k, v in d.items()
        if k not in _ACE_KEYS | {"steps", "messages", "reward"} and isinstance(v, (str, int, float, bool))
    }
    if skill_ids:
        meta["skill_ids"] = list(skill_ids)
    injected = d.get("injected_skill_ids")  # ACE: the skills rendered into the agent's prompt (its scope)
    if isinstance(injected, list) and injected:
        meta["injected_skill_ids"] = [str(i) for i in injected]
    prompted = _system_prompt_names(d.get("system_prompt"))
    if prompted:
        meta["system_prompts"] = prompted
    return _run_view(
        "ace",
        d,
        steps,
        question=_opt_str(d.get("question") or d.get("task")),
        ground_truth=_opt_str(d.get("ground_truth")),
        feedback=_opt_str(d.get("feedback")),
        final_answer=_opt_str(final) or (_history_answer(steps) if _is_history(d) else _last_answer(steps)),
        reward=_opt_float(d.get("reward")),
        metadata=meta,
    )


def _is_agent_step(raw: dict[str, Any]) -> bool:
    """ACE's own step shape (`{"role": "agent", "reasoning", "answer", "skill_ids"}`, as its RR builds it from an
    `AgentOutput`): a structured record, not a chat message (no `content`, no tool calls)."""
    return (
        "content" not in raw
        and "tool_calls" not in raw
        and bool({"reasoning", "answer", "final_answer", "skill_ids"} & raw.keys())
    )


def _agent_steps(d: dict[str, Any]) -> list[dict[str, Any]]:
    steps = d.get("steps")
    return [s for s in steps if isinstance(s, dict) and _is_agent_step(s)] if isinstance(steps, list) else []


def _agent_steps_answer(d: dict[str, Any]) -> str | None:
    """The answer of the last ACE agent step that has one."""
    for s in reversed(_agent_steps(d)):
        value = s.get("answer") or s.get("final_answer")
        if isinstance(value, str) and value.strip():
            return value
    return None


def _agent_steps_skill_ids(d: dict[str, Any]) -> list[str]:
    """The skill ids ACE agent steps cite, in order, once each."""
    ids = [str(i) for s in _agent_steps(d) if isinstance(s.get("skill_ids"), list) for i in s["skill_ids"]]
    return list(dict.fromkeys(ids))


def _ace_base_steps(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Structured steps of an ACE dict: `messages`, else a multi-agent `history`, else `steps`, else a
    list-valued `trace`."""
    if isinstance(d.get("messages"), list):
        return _messages_steps(d["messages"])
    if isinstance(d.get("history"), list):
        return _history_steps(d["history"])
    for key in ("steps", "trace"):
        if isinstance(d.get(key), list):
            return [_ace_step(i, s) for i, s in enumerate(d[key])]
    return []


def _history_steps(history: list[Any]) -> list[dict[str, Any]]:
    """A multi-agent conversation (`[{"name", "role", "content"}]`, e.g. Who&When) -> one step per
    message, `index` its position in `history`: failure labels and people cite a conversation by that
    position, so a message that would give several steps (content parts with tool results) is kept as
    one. The speaking agent (`name`) is the step's `actor`; roles in a group chat are only the
    framework's point of view ("user" for every other agent), so they name no one."""
    call_names: dict[str, str] = {}
    return [_history_message_step(msg, call_names, i) for i, msg in enumerate(history)]


def _history_message_step(msg: Any, call_names: dict[str, str], index: int) -> dict[str, Any]:
    """The one step of the conversation's message at position `index` (`call_names` carried along)."""
    parts = _message_steps(msg, call_names, index)
    return parts[0] if len(parts) == 1 else _merged(index, parts, msg)


def _is_history(d: dict[str, Any]) -> bool:
    """Whether the run's steps are a multi-agent `history` (see `_ace_base_steps`)."""
    return not isinstance(d.get("messages"), list) and isinstance(d.get("history"), list)


def _history_answer(steps: list[dict[str, Any]]) -> str | None:
    """The last message of a conversation that says something: in a group chat every agent's turn is
    "user" or "assistant" depending on the framework's point of view, so the role cannot pick the
    answer; a bare end-of-chat token (AutoGen's TERMINATE) is not one."""
    for s in reversed(steps):
        text = said_text(s["content"]) if s["role"] != "tool" else None
        if text:
            return text
    return None


def _merged(index: int, parts: list[dict[str, Any]], msg: Any) -> dict[str, Any]:
    """The steps of one message as one step (the first part's role, every call, any error)."""
    first = parts[0]
    tool = next((p["tool_name"] for p in parts if p["tool_name"]), None)
    return _step(
        index,
        first["role"],
        "\n".join(p["content"] for p in parts if p["content"]),
        [c for p in parts for c in p["tool_calls"]],
        tool,
        any(p["is_error"] for p in parts),
        actor=_actor(msg) if isinstance(msg, dict) else None,
    )


def _system_prompt_names(value: Any) -> list[str]:
    """The agents a multi-agent trace gives a system prompt (`{agent: text}`); the texts stay in raw."""
    return [str(k) for k in value] if isinstance(value, dict) else []


def _ace_step(index: int, raw: Any) -> dict[str, Any]:
    """A free-form ACE step: a string, or a dict with thought/action/observation-like keys."""
    if not isinstance(raw, dict):
        return _step(index, "assistant", _text(raw))
    if "role" in raw and not _is_agent_step(raw):
        sub = _messages_steps([raw])
        base = sub[0] if sub else _step(index, str(raw["role"]), "")
        return {**base, "index": index}
    tool = raw.get("tool") or raw.get("tool_name") or raw.get("action")
    tool = tool if isinstance(tool, str) else None
    parts = [
        f"{k}: {_text(v) if not isinstance(v, dict) else _args_str(v)}"
        for k, v in raw.items()
        if k not in ("tool", "tool_name", "is_error", "error") and v not in (None, "")
    ]
    content = "\n".join(parts)
    observation = _text(raw.get("observation") or raw.get("result") or raw.get("output") or "")
    err = bool(raw.get("is_error") or raw.get("error")) or (bool(tool) and looks_like_error(observation))
    if raw.get("error"):
        content += f"\nerror: {_text(raw['error'])}"
    calls = (
        [{"name": tool, "arguments": _args_str(raw.get("args") or raw.get("arguments") or raw.get("input"))}]
        if tool
        else []
    )
    return _step(index, "tool" if tool else "assistant", content, calls, tool, err, actor=agent_of(raw)[0])
