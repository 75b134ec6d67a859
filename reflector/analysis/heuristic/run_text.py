"""How the heuristic's statements quote and name what the findings show (`run_draft` has the rules of the
text): quotes, a call's arguments, the failing calls of a tool, and what the cell cannot tell."""

from __future__ import annotations

from typing import Any

from reflector.analysis.diagnosis import value_text

_CANNOT_TELL = "the trace does not say why, and a rule-based reflection cannot tell"


def _q(value: Any, limit: int = 160) -> str:
    return '"' + value_text(value, limit) + '"'


def _args_summary(args: Any, limit: int = 3) -> str:
    """The first scalar arguments of a call, `k=v`, to name it without pasting it."""
    if not isinstance(args, dict):
        return value_text(args, 80)
    items = [f"{k} {value_text(v, 40)}" for k, v in args.items() if not isinstance(v, (dict, list))]
    more = len(args) - min(len(items), limit)
    return ", ".join(items[:limit]) + (f", and {more} more argument(s)" if more > 0 else "")


def _failing_of(f: dict[str, Any], tool: Any) -> dict[str, Any] | None:
    return next((g for g in f.get("failing_calls") or [] if g.get("tool") == tool), None)


def _failure_text(g: dict[str, Any]) -> str:
    """What a group of failing calls shows, without claiming more than the printed counts."""
    n, steps, identical = g.get("n_attempts") or 0, g.get("steps") or [], g.get("identical_retries") or 0
    text = (
        f"{g.get('tool')} failed {n} time(s) (step(s) {', '.join(str(s) for s in steps)}); first error, "
        f"from the tool: {_q(g.get('first_error'), 200)}"
    )
    changed = g.get("changed_args") or []
    if (
        g.get("identical_retries") is None
    ):  # a large trace read off its index: the arguments were not compared
        return text + "; the attempts' arguments were not compared (a large trace, read from its index)"
    if identical:
        text += f"; {identical} retry(ies) repeated the same arguments"
    if changed:
        text += f"; between attempts the agent changed {', '.join(changed)}"
    elif n > 1 and not identical:
        text += "; the attempts' arguments differ"
    text += "; a later call succeeded" if g.get("recovered") else "; no later call of it succeeded"
    return text
