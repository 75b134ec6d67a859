"""tau-bench trajectories (one run, or a batch of runs), and the canonical rendering of a tool call."""

from __future__ import annotations

import json
from typing import Any

from reflector.analysis.traces.adapters.messages import _messages_steps
from reflector.analysis.traces.read import _FAIL, _loads_embedded
from reflector.analysis.traces.view import (
    _args_str,
    _as_dict,
    _as_list,
    _batch_view,
    _opt_float,
    _opt_str,
    _run_view,
    _text,
)

__all__ = ["render_call"]


def _norm_tau(data: Any) -> dict[str, Any]:
    if isinstance(data, list):
        return _batch_view("tau-bench", data, [_norm_tau_run(r) for r in data])
    return _norm_tau_run(data)


def render_call(name: str, kwargs: Any) -> str:
    """`name(k=v, ...)` with sorted keys and compact JSON values: comparable across sources."""
    if isinstance(kwargs, str):
        parsed = _loads_embedded(kwargs)
        if parsed is _FAIL:
            return f"{name}({kwargs})"
        kwargs = parsed
    if not isinstance(kwargs, dict):
        return f"{name}({_args_str(kwargs)})"
    args = ", ".join(f"{k}={_compact(kwargs[k])}" for k in sorted(kwargs))
    return f"{name}({args})"


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(_canon(value), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _canon(value: Any) -> Any:
    """Integral floats become ints so that 250.0 and 250 render the same."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _norm_tau_run(run: dict[str, Any]) -> dict[str, Any]:
    """One tau-bench trajectory. What the agent said and what it did are kept apart, both as recorded:
    `final_answer` is the text of its last message, verbatim; `actions` are its tool calls and
    `expected_actions` / `expected_outputs` the task's ground truth, compared with them (actions with
    actions) by `reflector.analysis.answers`. There is no text ground truth to compare the answer with."""
    info = _as_dict(run.get("info"))
    task = _as_dict(info.get("task"))
    traj = _as_list(run.get("traj"))
    steps = _messages_steps(traj)
    expected: list[dict[str, Any]] = [
        {"name": str(a.get("name")), "arguments": a.get("kwargs") if a.get("kwargs") is not None else {}}
        for a in _as_list(task.get("actions"))
        if isinstance(a, dict)
    ]
    actions = _tau_actions(steps)
    reward = _opt_float(run.get("reward"))
    view = _run_view(
        "tau-bench",
        run,
        steps,
        question=_opt_str(task.get("instruction")),
        feedback=_tau_feedback(info.get("reward_info"), reward),
        final_answer=_last_message_text(traj),
        reward=reward,
        metadata={
            "id": f"task{run.get('task_id')}-trial{run.get('trial')}",
            "task_id": run.get("task_id"),
            "trial": run.get("trial"),
            "user_id": task.get("user_id"),
            "n_expected_actions": len(expected),
            "n_agent_actions": len(actions),
        },
    )
    view["actions"] = actions
    view["expected_actions"] = expected
    view["expected_outputs"] = [str(o) for o in _as_list(task.get("outputs"))]
    return view


def _last_message_text(messages: list[Any]) -> str | None:
    """The text of the agent's last message that has any, exactly as recorded (None if it never wrote)."""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            text = _text(msg.get("content"))
            if text.strip():
                return text
    return None


def _tau_actions(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool call of the agent, in order: name, arguments (parsed when they are JSON), the step
    that made it, and whether its result reads like an error (None: no result recorded)."""
    actions: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for s in steps:
        if s["role"] == "assistant":
            for c in s["tool_calls"]:
                args = _loads_embedded(c["arguments"]) if c["arguments"].strip() else {}
                action = {
                    "name": c["name"],
                    "arguments": c["arguments"] if args is _FAIL else args,
                    "step": s["index"],
                    "is_error": None,
                }
                actions.append(action)
                pending.append(action)
        elif s["role"] == "tool" and s["tool_name"]:
            match = next((a for a in pending if a["name"] == s["tool_name"]), None)
            if match is not None:
                pending.remove(match)
                match["is_error"] = bool(s["is_error"])
    return actions


def _tau_feedback(reward_info: Any, reward: float | None) -> str:
    if not isinstance(reward_info, dict):
        return f"reward={reward}; no reward_info recorded"
    parts = [f"reward={reward_info.get('reward', reward)}"]
    detail = _as_dict(reward_info.get("info"))
    for key in ("r_actions", "r_outputs"):
        if key in detail:
            parts.append(f"{key}={detail[key]}")
    outs = detail.get("outputs")
    if isinstance(outs, dict):
        missing = [str(k) for k, ok in outs.items() if not ok]
        if missing:
            parts.append("expected outputs the agent never stated: " + ", ".join(missing))
    if detail.get("r_actions") == 0:
        parts.append("the database state after the agent's actions differs from the expected one")
    return "; ".join(parts)
