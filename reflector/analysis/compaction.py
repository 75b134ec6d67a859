"""Compaction policy (pure, runs in workflow code).

Before each model request the workflow estimates the prompt's tokens from its characters and a
chars-per-token ratio calibrated on the provider's reported prompt tokens. Over the threshold it
first *microcompacts* (old `execute_code` results become a placeholder: the data is still in the
sandbox variables) and, if still over, *summarises* (an LLM request in an activity, charged to the
budget) and restarts from [task prompt, summary, continuation]. The pre-compaction transcript is
archived in the blob store and appended to the sandbox variable `history`.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)

from reflector.contract import EXECUTE_CODE_TOOL

__all__ = [
    "PLACEHOLDER",
    "SUMMARY_MARKER",
    "message_chars",
    "microcompact",
    "compacted_history",
    "transcript_json",
]

SUMMARY_MARKER = "SUMMARISE_TRANSCRIPT"
PLACEHOLDER = (
    "[output of an earlier cell removed to save context; the data is still in the sandbox variables, "
    "print a slice again if you need it]"
)
CONTINUATION = (
    "Continue the reflection from the summary above. The full earlier transcript is in the sandbox "
    "variable `history` (a list of messages); your variables and helpers are unchanged."
)


def _part_chars(part: object) -> int:
    content = getattr(part, "content", None)
    if content is None:
        content = getattr(part, "args", None)
    return len(content) if isinstance(content, str) else len(str(content or ""))


def message_chars(messages: list[ModelMessage]) -> int:
    return sum(_part_chars(p) for m in messages for p in m.parts)


def microcompact(messages: list[ModelMessage], keep_recent: int) -> tuple[list[ModelMessage], int]:
    """Replace all but the last `keep_recent` execute_code results with PLACEHOLDER."""
    positions = [
        (i, j)
        for i, m in enumerate(messages)
        if isinstance(m, ModelRequest)
        for j, p in enumerate(m.parts)
        if isinstance(p, ToolReturnPart) and p.tool_name == EXECUTE_CODE_TOOL and p.content != PLACEHOLDER
    ]
    victims = positions[: max(0, len(positions) - keep_recent)]
    if not victims:
        return messages, 0
    out = list(messages)
    for i, j in victims:
        msg = out[i]
        assert isinstance(msg, ModelRequest)
        parts = list(msg.parts)
        part = parts[j]
        assert isinstance(part, ToolReturnPart)
        parts[j] = replace(part, content=PLACEHOLDER)  # type: ignore[arg-type]
        out[i] = replace(msg, parts=parts)
    return out, len(victims)


def compacted_history(messages: list[ModelMessage], summary: str) -> list[ModelMessage]:
    """[original task request, the summary, a continuation prompt]."""
    first = next(m for m in messages if isinstance(m, ModelRequest))
    task_parts = [p for p in first.parts if isinstance(p, UserPromptPart)]
    return [
        replace(first, parts=task_parts),
        ModelResponse(parts=[TextPart(f"Summary of the work so far:\n{summary}")]),
        ModelRequest(parts=[UserPromptPart(CONTINUATION)]),
    ]


def transcript_json(messages: list[ModelMessage]) -> str:
    return ModelMessagesTypeAdapter.dump_json(messages).decode()
