"""ACE reflector inputs: question, generator output (reasoning / final answer), ground truth, feedback."""

from __future__ import annotations

from typing import Any

from reflector.traces.adapters.messages import _messages_steps
from reflector.traces.detect import _ACE_KEYS
from reflector.traces.view import (
    _args_str,
    _batch_view,
    _last_answer,
    _opt_float,
    _opt_str,
    _run_view,
    _step,
    _text,
    looks_like_error,
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
    final = d.get("final_answer") or out_d.get("final_answer") or (out if isinstance(out, str) else None)
    skill_ids = d.get("skill_ids") or out_d.get("skill_ids") or []
    meta: dict[str, Any] = {
        k: v
        for k, v in d.items()
        if k not in _ACE_KEYS | {"steps", "messages", "reward"} and isinstance(v, (str, int, float, bool))
    }
    if skill_ids:
        meta["skill_ids"] = list(skill_ids)
    return _run_view(
        "ace",
        d,
        steps,
        question=_opt_str(d.get("question") or d.get("task")),
        ground_truth=_opt_str(d.get("ground_truth")),
        feedback=_opt_str(d.get("feedback")),
        final_answer=_opt_str(final) or _last_answer(steps),
        reward=_opt_float(d.get("reward")),
        metadata=meta,
    )


def _ace_base_steps(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Structured steps of an ACE dict: `messages`, else `steps`, else a list-valued `trace`."""
    if isinstance(d.get("messages"), list):
        return _messages_steps(d["messages"])
    for key in ("steps", "trace"):
        if isinstance(d.get(key), list):
            return [_ace_step(i, s) for i, s in enumerate(d[key])]
    return []


def _ace_step(index: int, raw: Any) -> dict[str, Any]:
    """A free-form ACE step: a string, or a dict with thought/action/observation-like keys."""
    if not isinstance(raw, dict):
        return _step(index, "assistant", _text(raw))
    if "role" in raw:
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
    return _step(index, "tool" if tool else "assistant", content, calls, tool, err)
