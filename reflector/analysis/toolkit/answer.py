"""`compare_answer`: a final answer against a text ground truth, as the reflector compares them everywhere."""

from __future__ import annotations

from typing import Any

from reflector.analysis.answers import compare_answers

__all__ = ["compare_answer"]


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str.__str__(value) if isinstance(value, str) else repr(value)
    raise TypeError(f"compare_answer: {what} must be a str, a number or None, not {type(value).__name__}")


def compare_answer(final: Any, truth: Any) -> dict[str, Any]:
    """`{"matches": True | False | None, "missing": [truth lines the answer lacks]}`: None without a ground
    truth. A numeric truth is compared with the answer's last number; otherwise every normalised truth
    line must be in the normalised answer (`reflector.analysis.answers`)."""
    ok, missing = compare_answers(_text(final, "final"), _text(truth, "truth"))
    return {"matches": ok, "missing": [str(m) for m in missing]}
