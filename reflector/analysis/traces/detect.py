"""Format detection: which trace shape the parsed data has, decided by structure alone."""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["TraceFormat", "FileFormat", "detect_format"]

TraceFormat = Literal["ace", "messages", "openclaw", "tau-bench", "otel", "unknown"]
FileFormat = Literal["json", "jsonl"]

_ACE_KEYS = frozenset(
    {
        "question",
        "ground_truth",
        "feedback",
        "agent_output",
        "reasoning",
        "trace",
        "final_answer",
        "generator_output",
        "skill_ids",
        "task",
    }
)
_OPENCLAW_EVENTS = frozenset({"session", "message", "custom", "thinking_level_change", "model_change"})


def detect_format(data: Any) -> TraceFormat:
    """Guess the trace shape from its structure (never from the file name)."""
    if isinstance(data, dict):
        return _detect_dict(data)
    if isinstance(data, list):
        return _detect_list(data)
    return "unknown"


def _detect_dict(d: dict[str, Any]) -> TraceFormat:
    if isinstance(d.get("traj"), list):
        return "tau-bench"
    if "resourceSpans" in d or _is_span(d) or isinstance(d.get("spans"), list):
        return "otel"
    if isinstance(d.get("messages"), list):
        return "messages"
    if isinstance(d.get("steps"), list) or _ACE_KEYS & d.keys() or _is_history(d.get("history")):
        return "ace"
    return "unknown"


def _is_history(value: Any) -> bool:
    """A multi-agent conversation: a non-empty list of messages that each say who spoke or in which role."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and "content" in m and ("role" in m or "name" in m) for m in value)
    )


def _detect_list(items: list[Any]) -> TraceFormat:
    dicts = [x for x in items if isinstance(x, dict)]
    if not dicts or len(dicts) != len(items):
        return "unknown"
    if all(isinstance(x.get("traj"), list) for x in dicts):
        return "tau-bench"
    if any(x.get("type") in _OPENCLAW_EVENTS for x in dicts) and any(
        isinstance(x.get("message"), dict) or x.get("type") == "session" for x in dicts
    ):
        return "openclaw"
    if all("role" in x for x in dicts) or (
        _is_history(dicts) and not any(_ACE_KEYS & x.keys() for x in dicts)
    ):
        return "messages"  # chat messages, or a conversation whose messages name their speaker (no role)
    if all(_is_span(x) or "resourceSpans" in x for x in dicts):
        return "otel"
    if all(_ACE_KEYS & x.keys() for x in dicts):
        return "ace"
    return "unknown"


def _is_span(d: dict[str, Any]) -> bool:
    ctx = d.get("context")
    return (
        (isinstance(ctx, dict) and "span_id" in ctx)
        or "span_id" in d
        or "spanId" in d
        or "startTimeUnixNano" in d
    )
