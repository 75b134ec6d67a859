"""A `Diagnosis` from the toolkit's `first_divergence` finding (a plain dict printed by a cell).

Used by the heuristic's draft and by the workflow's budget fallback (whose facts cell, cell 2, prints the
same finding), so both state a divergence the same way.
"""

from __future__ import annotations

import json
from typing import Any

from reflector.contract import DIAGNOSIS_KINDS, Diagnosis

__all__ = ["from_divergence", "value_text", "divergence_summary"]

# How sure a divergence computed against the task's expected actions is: the action and its arguments are
# compared exactly; a missing action's step is where it should have been taken (an estimate).
_CONFIDENCE = {"wrong_arguments": 0.9, "extra_action": 0.85, "missing_action": 0.7, "wrong_information": 0.6}


def value_text(value: Any, limit: int = 120) -> str:
    """A value as the trace has it: a string as is, anything else as compact JSON; shortened."""
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
    )
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def divergence_summary(d: dict[str, Any]) -> str:
    kind, tool, step = d.get("kind"), d.get("tool"), d.get("step")
    if kind == "wrong_arguments":
        return (
            f"At step {step} the agent called {tool} with {d.get('argument')} = {value_text(d.get('actual'))}; "
            f"the task expected {value_text(d.get('expected'))}."
        )
    if kind == "missing_action":
        return f"The agent never made the expected {tool} call; step {step} is where it should have ({d.get('where')})."
    if kind == "extra_action":
        return f"At step {step} the agent called {tool}, a state-changing call the task did not expect."
    if kind == "wrong_information":
        return f"The agent never told the user {value_text(d.get('expected'))}, an output the task expected."
    return f"Step {step}: {kind} ({tool})."


def from_divergence(d: Any, evidence: list[int]) -> Diagnosis | None:
    """The diagnosis a `first_divergence` finding states, or None when it is not one."""
    if not isinstance(d, dict) or d.get("kind") not in DIAGNOSIS_KINDS:
        return None
    kind = str(d["kind"])
    step = d.get("step")
    at_step = d.get("at_step")
    at: dict[str, Any] = at_step if isinstance(at_step, dict) else {}
    where = step if isinstance(step, int) and not isinstance(step, bool) else None
    return Diagnosis(
        kind=kind,
        step=where,
        # the divergence is where the failure shows; a caller that traces a root cause moves `step` back
        # (the heuristic's draft), one that does not (the budget fallback) keeps the two equal
        symptom_step=where,
        actor=at.get("actor") if isinstance(at.get("actor"), str) else None,
        tool=None if d.get("tool") is None else str(d.get("tool")),
        argument=None if d.get("argument") is None else str(d.get("argument")),
        actual=None if d.get("actual") is None else value_text(d.get("actual")),
        expected=None if d.get("expected") is None else value_text(d.get("expected")),
        evidence=evidence,
        confidence=_CONFIDENCE.get(kind, 0.5),
        summary=divergence_summary(d),
    )
