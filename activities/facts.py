"""The facts cell: what the deterministic fallback reads from the already-loaded trace (run once per session,
journaled like any cell), and the `TraceFacts` parsed from its output."""

from __future__ import annotations

import json

from reflector.analysis.answers import answers_match, compare_actions
from reflector.analysis.diagnosis import from_divergence
from reflector.contract import (
    CellOutcome,
    TraceFacts,
)

__all__ = ["FACTS_CODE", "FACTS_MARKER"]

FACTS_MARKER = "RR_FACTS "


FACTS_TEXT_CHARS = (
    4_000  # the trace's question / feedback kept in `TraceFacts` (the prompt shows at most 1,500)
)


# Read what the deterministic fallback needs from the already-loaded trace (no second parse here).
# What the deterministic fallback compares (run once per session, journaled like any cell): the final
# answer and the ground truth, and, where the trace has expected actions (tau-bench), the agent's
# actions and the expected ones, so actions are compared with actions, never with text. Each part is
# bounded so the printed line stays valid JSON; its helper is removed again from the namespace.
FACTS_CODE = """def rr_facts_line():
    view = traces if isinstance(traces, dict) else {}
    truth = task.get("ground_truth") or view.get("ground_truth")
    facts = {"final_answer": view.get("final_answer"), "ground_truth": truth,
             "question": view.get("question"), "feedback": view.get("feedback")}
    acts = {"actions": view.get("actions"), "expected_actions": view.get("expected_actions")}
    if isinstance(acts["expected_actions"], list) and len(json.dumps(acts, default=str)) < 40000:
        facts.update(acts)
    if isinstance(acts["expected_actions"], list) or view.get("expected_outputs"):
        try:
            div = first_divergence(view)
        except Exception as e:
            div = {"error": repr(e)[:200]}
        if isinstance(div, dict):
            facts["divergence"] = {k: div.get(k) for k in ("kind", "step", "tool", "argument", "actual",
                                                           "expected", "where", "error")}
    text = json.dumps(facts, default=str)
    if len(text) > 45000:
        text = json.dumps({k: None if facts[k] is None else str(facts[k])[:20000]
                           for k in ("final_answer", "ground_truth", "question", "feedback")})
    return "RR_FACTS " + text
print(rr_facts_line())
del rr_facts_line"""


def _facts(outcome: CellOutcome) -> TraceFacts:
    for line in outcome.output.splitlines():
        if line.startswith(FACTS_MARKER):
            try:
                data = json.loads(line[len(FACTS_MARKER) :])
            except ValueError:  # a cut-off line (a cell's output is bounded): no facts, no wrong claim
                return TraceFacts()
            if not isinstance(data, dict):
                return TraceFacts()
            final, truth = data.get("final_answer"), data.get("ground_truth")
            final = None if final is None else str(final)
            truth = None if truth is None else str(truth)
            # the trace's own question and feedback, for the task prompt (a few KB at most: its fields are cut)
            told = {
                k: str(data[k])[:FACTS_TEXT_CHARS]
                for k in ("question", "feedback")
                if data.get(k) is not None
            }
            diagnosis = from_divergence(data.get("divergence"), [outcome.seq])
            if isinstance(data.get("expected_actions"), list):
                ok, missing, unexpected = compare_actions(data.get("actions"), data["expected_actions"])
                return TraceFacts(
                    final_answer=final,
                    ground_truth=truth,
                    answer_correct=ok,
                    actions_checked=ok is not None,
                    missing_actions=missing[:20],
                    unexpected_actions=unexpected[:20],
                    diagnosis=diagnosis,
                    **told,
                )
            return TraceFacts(
                final_answer=final,
                ground_truth=truth,
                answer_correct=answers_match(final, truth),
                diagnosis=diagnosis,
                **told,
            )
    return TraceFacts()
