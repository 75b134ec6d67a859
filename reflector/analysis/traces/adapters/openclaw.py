"""OpenClaw session JSONL: session / message / custom events."""

from __future__ import annotations

from collections import Counter
from typing import Any

from reflector.analysis.traces.agents import agent_of
from reflector.analysis.traces.view import (
    _args_str,
    _first_text,
    _last_answer,
    _part_type,
    _run_view,
    _step,
    _text,
    looks_like_error,
)


def _norm_openclaw(events: list[Any]) -> dict[str, Any]:
    """OpenClaw session JSONL: session/message/custom events; message content is a part list."""
    steps: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"event_types": dict(Counter(str(e.get("type")) for e in events))}
    custom: list[Any] = []
    for ev in events:
        etype = ev.get("type")
        if etype == "session":
            meta.update(
                {f"session_{k}": v for k, v in ev.items() if k in ("id", "cwd", "timestamp", "version")}
            )
        elif etype == "custom":
            custom.append({"customType": ev.get("customType"), "data": ev.get("data")})
        elif etype == "message" and isinstance(ev.get("message"), dict):
            steps.append(_openclaw_step(len(steps), ev["message"]))
    if custom:
        meta["custom"] = custom
    models = sorted(
        {
            str(e["message"]["model"])
            for e in events
            if isinstance(e.get("message"), dict) and e["message"].get("model")
        }
    )
    meta["models"] = models
    meta["user_turns"] = sum(1 for s in steps if s["role"] == "user")
    return _run_view(
        "openclaw",
        events,
        steps,
        question=_first_text(steps, "user"),
        final_answer=_last_answer(steps),
        metadata=meta,
    )


def _openclaw_step(index: int, msg: dict[str, Any]) -> dict[str, Any]:
    role = str(msg.get("role", "unknown"))
    parts = msg.get("content")
    content = (
        _text([p for p in parts if _part_type(p) != "toolCall"]) if isinstance(parts, list) else _text(parts)
    )
    calls = [
        {"name": str(p.get("name", "")), "arguments": _args_str(p.get("arguments"))}
        for p in (parts if isinstance(parts, list) else [])
        if _part_type(p) == "toolCall"
    ]
    if role == "toolResult":
        err = bool(msg.get("isError")) or looks_like_error(content)
        return _step(index, "tool", content, calls, msg.get("toolName"), err)
    actor, addressee = agent_of(msg)  # the one actor rule (an OpenClaw session names none today)
    return _step(index, role, content, calls, actor=actor, addressee=addressee)
