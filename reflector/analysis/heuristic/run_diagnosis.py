"""The heuristic's diagnosis of one run (`run_draft` states it): the decisive failure the findings cell
found, placed at its symptom and traced back to its root cause when the cell could."""

from __future__ import annotations

from typing import Any

from reflector.analysis.diagnosis import from_divergence, value_text
from reflector.analysis.heuristic.run_text import _CANNOT_TELL, _failure_text, _q
from reflector.contract import DIAGNOSIS_KINDS, Diagnosis

__all__ = ["diagnosis_of"]


def _unrecovered(f: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in f.get("failing_calls") or [] if isinstance(g, dict) and g.get("recovered") is False]


def _root(f: dict[str, Any]) -> dict[str, Any] | None:
    r = f.get("root")
    ok = isinstance(r, dict) and isinstance(r.get("root"), dict) and isinstance(r.get("symptom"), dict)
    return r if ok else None


def _with_root(diag: Diagnosis, r: dict[str, Any] | None) -> Diagnosis:
    """`diag` (placed at the symptom) with its root cause, traced back by the cell's `root_cause` (the rule
    that placed it and what it rests on): `step` becomes the root, `symptom_step` keeps the symptom."""
    diag.symptom_step = diag.step
    if r is None or not isinstance(r["root"].get("step"), int) or r["symptom"].get("step") != diag.step:
        return diag
    root = r["root"]
    if root.get("rule") == "symptom":
        diag.confidence = round(min(diag.confidence, 0.6), 2)
        diag.summary += (
            f" Root cause: {root.get('reason')} (rule symptom: the trace shows no earlier step that "
            "caused it)."
        )
        return diag
    diag.step = root["step"]
    diag.actor = root.get("actor") if isinstance(root.get("actor"), str) else None
    diag.confidence = float(r.get("confidence") or 0.5)
    diag.summary = (
        f"Root cause at step {root['step']} (rule {root.get('rule')}): {root.get('reason')}. "
        f"Symptom at step {diag.symptom_step}: {diag.summary}"
    )
    return diag


def diagnosis_of(f: dict[str, Any], cell: int | None) -> Diagnosis | None:
    """The decisive failure, from the findings: the first divergence from the expected actions/outputs,
    else an unrecovered tool failure, else the root cause traced in a conversation, else a wrong final
    answer; each with the root cause the cell traced back from it (`_with_root`)."""
    evidence = [cell] if cell is not None else []
    r = _root(f)
    divergence = from_divergence(f.get("divergence"), evidence)
    if divergence is not None:
        return _with_root(divergence, r)
    unrecovered = _unrecovered(f)
    if unrecovered:
        g = unrecovered[0]
        steps = g.get("steps") or []
        return _with_root(
            Diagnosis(
                kind="tool_error_mishandled",
                step=steps[0] if steps else None,
                tool=g.get("tool"),
                actual=value_text(g.get("first_error")) if g.get("first_error") else None,
                evidence=evidence,
                confidence=0.5,
                summary=_failure_text(g) + ".",
            ),
            r,
        )
    if (
        r is not None
        and r["root"].get("rule") != "symptom"
        and isinstance(r["root"].get("step"), int)
        and f.get("format") != "tau-bench"
        and r["root"].get("kind") in DIAGNOSIS_KINDS
    ):
        root, symptom = r["root"], r["symptom"]
        return Diagnosis(
            kind=root["kind"],
            step=root["step"],
            symptom_step=symptom.get("step"),
            actor=root.get("actor"),
            actual=value_text(f.get("final_answer")) if f.get("final_answer") else None,
            expected=value_text(f.get("ground_truth")) if f.get("ground_truth") else None,
            evidence=evidence,
            confidence=float(r.get("confidence") or 0.3),
            summary=(
                f"Root cause at step {root['step']} (rule {root.get('rule')}): {root.get('reason')}. Symptom at "
                f"step {symptom.get('step')}: {symptom.get('what')}."
            ),
        )
    s = f.get("suspect")
    if isinstance(s, dict) and s.get("kind"):
        return Diagnosis(
            kind=s["kind"],
            step=s.get("step") if isinstance(s.get("step"), int) else None,
            actor=s.get("actor"),
            evidence=evidence,
            confidence=float(s.get("confidence") or 0.3),
            summary=f"A rule-based guess ({s.get('rule')}): {s.get('reason')}",
        )
    w = f.get("wrong_value")
    if f.get("answer_matches") is False and isinstance(w, dict) and isinstance(w.get("step"), int):
        return Diagnosis(
            kind="reasoning_error",
            step=w["step"],
            actual=value_text(w.get("value")),
            expected=value_text(f.get("ground_truth")) if f.get("ground_truth") else None,
            evidence=evidence,
            confidence=0.4,
            summary=(
                f"The final answer's wrong value {w.get('value')} first appears at step {w['step']} (verbatim: "
                f"{_q(w.get('snippet'), 160)}): the error was made there or before."
            ),
        )
    if f.get("answer_matches") is False and r is not None and isinstance(r["symptom"].get("step"), int):
        symptom = r["symptom"]
        return Diagnosis(
            kind="reasoning_error",
            step=symptom["step"],
            symptom_step=symptom["step"],
            actor=r["root"].get("actor"),
            actual=value_text(f.get("final_answer")) if f.get("final_answer") else None,
            expected=value_text(f.get("ground_truth")) if f.get("ground_truth") else None,
            evidence=evidence,
            confidence=0.2,
            summary=(
                f"The final answer (step {symptom['step']}) contradicts the ground truth; {_CANNOT_TELL} which "
                "earlier step introduced the error: no rule traced it further back, so the step is the symptom."
            ),
        )
    if f.get("answer_matches") is False:
        last = f.get("last_assistant_step") or {}
        return Diagnosis(
            kind="reasoning_error",
            step=last.get("index") if isinstance(last.get("index"), int) else None,
            actual=value_text(f.get("final_answer")) if f.get("final_answer") else None,
            expected=value_text(f.get("ground_truth")) if f.get("ground_truth") else None,
            evidence=evidence,
            confidence=0.3,
            summary=(
                "The final answer differs from the ground truth; the step is the last answer, not a found "
                f"cause: {_CANNOT_TELL} which earlier step introduced the error."
            ),
        )
    return None
