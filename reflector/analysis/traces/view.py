"""The canonical views, and the helpers every adapter builds them with.

Canonical single-run view (`normalize` for one run)::

    {"format", "question", "ground_truth", "feedback", "final_answer", "reward",
     "steps": [{"index", "role", "content", "tool_calls": [{"name", "arguments"}],
                "tool_name", "is_error", "actor", "addressee"}],
     "metadata": {...}, "raw": <the run as read>}

A step's `actor` is the agent that took it when the trace names one, else None, by one rule for every
adapter (`reflector.analysis.traces.agents`): a message's `name`, else a framework's agent field (AutoGen `sender`
/ `source`, CrewAI `agent`, OpenAI Agents SDK `agent.name`, LangGraph `langgraph_node`, OTel
`gen_ai.agent.name`), else a `role` that is not a chat role (`"Orchestrator (thought)"` is `Orchestrator`;
such a step's role is `assistant`); `addressee` is the agent it speaks to when the record says so
(`"Orchestrator (-> WebSurfer)"`), else None. Chat roles alone (user, assistant, ...) name no actor. A
multi-agent conversation (a dict with a `history` of `{"name", "role", "content"}` messages, as in
Who&When) is an ACE run whose steps are that history, one step per message, `index` its position.

A tau-bench run also has `actions` (the agent's tool calls: `{"name", "arguments", "step",
"is_error"}`), `expected_actions` (`{"name", "arguments"}`) and `expected_outputs`; its
`final_answer` is the agent's last message verbatim and its `ground_truth` is None (the ground
truth is actions, compared with actions by `reflector.analysis.answers`, not text).

Canonical batch view (a list of runs, e.g. a whole tau-bench file)::

    {"format", "runs": [<single-run views>], "metadata": {"n_runs", ...}, "raw": <data>}
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from reflector.analysis.traces.detect import TraceFormat

__all__ = ["looks_like_error", "iter_runs"]

_ERROR_SCAN_CHARS = 1000
_ERROR_RE = re.compile(
    r"\b(error|errors|exception|traceback|not found|invalid|no such file|enoent|permission denied)\b"
    r"|exited with code [1-9]",
    re.IGNORECASE,
)
_THINKING_RE = re.compile(r"\[thinking\].*?\[/thinking\]", re.DOTALL)


def looks_like_error(content: str) -> bool:
    """Whether a tool result reads like a failure (checked on its beginning only).

    Only the first characters are scanned: a large successful payload may mention "error"
    somewhere deep inside, while real failures announce themselves up front.
    """
    low = content.lstrip()[:_ERROR_SCAN_CHARS].lower()
    if low.startswith("error"):
        return True
    # the regex is the rule; the substring tests (its words, spelled out: a generator over them
    # cost a tenth of a large trace's index pass) only skip it when none of its words can match
    if not (
        "error" in low
        or "exception" in low
        or "traceback" in low
        or "not found" in low
        or "invalid" in low
        or "no such file" in low
        or "enoent" in low
        or "permission denied" in low
        or "exited with code" in low
    ):
        return False
    return bool(_ERROR_RE.search(low))


def _text(value: Any) -> str:
    """Any content value (str, None, list of parts, dict) as plain text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_part_text(p) for p in value) if t)
    if isinstance(value, dict):
        return _part_text(value)
    return str(value)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return "" if part is None else str(part)
    for key in ("text", "content", "thinking", "output"):
        if key in part and part[key] is not None:
            inner = _text(part[key])
            return f"[thinking] {inner} [/thinking]" if key == "thinking" else inner
    return ""


def _args_str(args: Any) -> str:
    if args is None:
        return ""
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False, default=str)


def _step(
    index: int,
    role: str,
    content: str,
    tool_calls: list[dict[str, str]] | None = None,
    tool_name: str | None = None,
    is_error: bool = False,
    actor: str | None = None,
    addressee: str | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "role": role,
        "content": content,
        "tool_calls": tool_calls or [],
        "tool_name": tool_name,
        "is_error": is_error,
        "actor": actor,
        "addressee": addressee,
    }


def _run_view(
    fmt: TraceFormat,
    raw: Any,
    steps: list[dict[str, Any]],
    *,
    question: str | None = None,
    ground_truth: str | None = None,
    feedback: str | None = None,
    final_answer: str | None = None,
    reward: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta = {"n_steps": len(steps), **(metadata or {})}
    return {
        "format": fmt,
        "question": question,
        "ground_truth": ground_truth,
        "feedback": feedback,
        "final_answer": final_answer,
        "reward": reward,
        "steps": steps,
        "metadata": meta,
        "raw": raw,
    }


def _batch_view(fmt: TraceFormat, raw: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [r["reward"] for r in runs if r.get("reward") is not None]
    meta: dict[str, Any] = {"n_runs": len(runs)}
    if rewards:
        meta["mean_reward"] = round(sum(rewards) / len(rewards), 4)
        meta["n_failed"] = sum(1 for x in rewards if x < 1)
    return {"format": fmt, "runs": runs, "metadata": meta, "raw": raw}


def _opt_str(value: Any) -> str | None:
    """Text of a scalar/content value; None stays None so "no ground truth" stays visible."""
    if value is None:
        return None
    if isinstance(value, (int, float, bool)):
        return str(value)
    return _text(value) if not isinstance(value, dict) else _args_str(value)


def _as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a dict, else {}: lets adapters read optional nested fields safely."""
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _part_type(part: Any) -> str | None:
    return part.get("type") if isinstance(part, dict) else None


def _first_text(steps: list[dict[str, Any]], role: str) -> str | None:
    for s in steps:
        text = _THINKING_RE.sub("", s["content"]).strip()
        if s["role"] == role and text:
            return text
    return None


_END_TOKEN = re.compile(r"\W*terminate\W*", re.IGNORECASE)


def said_text(content: str) -> str | None:
    """A step's text as a run's answer: thinking removed, stripped; None when nothing is left or it is a bare
    end-of-chat token (AutoGen's TERMINATE ends a chat, it answers nothing). The index pass uses the same rule,
    step by step."""
    text = _THINKING_RE.sub("", content).strip()
    return text if text and not _END_TOKEN.fullmatch(text) else None


def _last_answer(steps: list[dict[str, Any]]) -> str | None:
    """The last assistant text that says something (`said_text`): without its thinking blocks, never a bare
    end-of-chat token."""
    for s in reversed(steps):
        if s["role"] == "assistant" and (text := said_text(s["content"])):
            return text
    return None


def iter_runs(view: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The single-run views of a normalised view (itself when it is not a batch)."""
    runs = view.get("runs")
    return runs if isinstance(runs, list) else [view]
