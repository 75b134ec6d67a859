"""Building the heuristic's `ReflectionDraft` from the findings its cell printed.

Every statement restates a printed finding (a step index, tool name or value), so the draft can be
checked against the cell output; the rules that produced the findings live in the cell.
"""

from __future__ import annotations

from typing import Any

from reflector.analysis.heuristic.run_draft import NAME, run_draft
from reflector.contract import ExtractedLearning, ReflectionDraft

__all__ = ["HEURISTIC_NAME", "build_draft"]

HEURISTIC_NAME = NAME


def _draft_no_tool() -> ReflectionDraft:
    msg = "the execute_code tool was not available, so the trace could not be inspected"
    return ReflectionDraft(
        reasoning=f"Produced by the {HEURISTIC_NAME}: {msg}; nothing below comes from the trace.",
        error_identification=f"Unknown: {msg}.",
        root_cause_analysis=f"Unknown: {msg}.",
        correct_approach="Run the reflection with the execute_code tool enabled so the trace can be read.",
        key_insight="No trace evidence was available to this reflection.",
        extracted_learnings=[],
    )


def build_draft(
    findings: dict[str, Any],
    *,
    skillbook_ids: list[str] | None = None,
    cell_errors: list[str] | None = None,
    cell: int | None = None,
) -> ReflectionDraft:
    """A `ReflectionDraft` that restates the findings; every claim cites what a cell printed
    (`cell`: the id of the cell that printed the findings, cited in every learning's evidence)."""
    if findings.get("batch"):
        draft = _batch_draft(findings)
    elif not findings or findings.get("simple") or findings.get("format") == "unknown":
        draft = _shallow_draft(findings, cell_errors or [])
    else:
        draft = run_draft(findings, skillbook_ids or [], cell)
    if cell is not None:
        for item in draft.extracted_learnings:
            item.evidence = f"cell {cell}: {item.evidence}"
    return draft


def _batch_draft(f: dict[str, Any]) -> ReflectionDraft:
    """A batch: failing runs counted as runs, grouped by their first divergence (kind and tool)."""
    n_runs, n_fail = f.get("n_runs", 0), f.get("n_failing_runs", 0)
    runs = f.get("failing_runs") or []
    kinds = f.get("divergence_kinds") or {}
    groups = f.get("divergences") or []
    reasoning = (
        f"Produced by the {HEURISTIC_NAME}: one sandbox cell ran first_divergence on each of the {n_runs} "
        f"{f.get('format')} runs; every statement below restates what it printed. {n_fail} runs failed; "
        f"mean reward {f.get('mean_reward')}."
    )
    if not n_fail:
        return ReflectionDraft(
            reasoning=reasoning,
            error_identification=f"No error found: none of the {n_runs} runs failed by the printed checks.",
            root_cause_analysis="Nothing to diagnose (rule-based check).",
            correct_approach="Keep the same approach.",
            key_insight="The batch shows no failing run.",
            extracted_learnings=[],
        )

    def run_ref(r: dict[str, Any]) -> str:
        where = f" at step {r.get('step')}" if r.get("step") is not None else ""
        what = f"{r.get('kind')} {r.get('tool')}{where}" if r.get("kind") else "no divergence found"
        return f"{r.get('id')} ({what})"

    learnings = []
    for group, count in groups[:3]:
        kind, _, tool = str(group).partition(" ")
        examples = ", ".join(str(r.get("id")) for r in runs if f"{r.get('kind')} {r.get('tool')}" == group)[
            :200
        ]
        learnings.append(
            ExtractedLearning(
                learning=_batch_learning(kind, tool),
                atomicity_score=0.75,
                evidence=f"{count} of {n_fail} failing runs first diverge by {kind} on {tool}; e.g. {examples}.",
                justification="Counted over runs (one first divergence per run), not over tool errors.",
            )
        )
    with_errors = f.get("n_failing_runs_with_tool_errors", 0)
    top = ", ".join(f"{k} {v}" for k, v in kinds.items()) or "none found"
    return ReflectionDraft(
        reasoning=reasoning,
        error_identification=f"{n_fail} of {n_runs} runs failed. First divergence by kind (runs): {top}. Runs: "
        + "; ".join(run_ref(r) for r in runs[:8])
        + ".",
        root_cause_analysis=(
            f"{with_errors} of the {n_fail} failing runs contain a tool error and "
            f"{f.get('n_failing_runs_answer_mismatch', 0)} end with an answer that does not match the ground truth. "
            "The per-run causes are in each run's first divergence; a batch reflection does not judge them further."
        ),
        correct_approach="Reflect on the runs of the largest group one by one (rr reflect on a single run) and fix "
        "that call first.",
        key_insight=(
            f"Most failing runs share one first divergence: {groups[0][0]} ({groups[0][1]} runs)."
            if groups
            else "The failing runs share no divergence the cell could compute."
        ),
        extracted_learnings=learnings,
    )


def _batch_learning(kind: str, tool: str) -> str:
    return {
        "wrong_arguments": f"Check every argument of {tool} against the user's request and the records read before "
        "calling it: runs failed on its values.",
        "missing_action": f"Make the {tool} call the request needs before ending: runs ended without it.",
        "extra_action": f"Call {tool} only when the user asked for that change: runs made it unrequested.",
        "wrong_information": "Tell the user the values the request asks for before ending.",
    }.get(kind, f"Look at {tool} in the failing runs: they diverge there ({kind}).")


def _shallow_draft(f: dict[str, Any], cell_errors: list[str]) -> ReflectionDraft:
    """No usable findings: say exactly what is known (format, raw shape, cell errors)."""
    fmt = f.get("format", "unknown")
    shape = (
        f"raw type {f.get('raw_type')}, keys {f.get('raw_keys')}" if f.get("raw_type") else "no shape details"
    )
    errs = "; ".join(e for e in cell_errors if e.startswith("ERROR")) or "none"
    reason = (
        f"Produced by the {HEURISTIC_NAME}: the inspection found format {fmt!r} ({shape}); "
        f"cell errors: {errs}. The rules cannot judge this trace further."
    )
    return ReflectionDraft(
        reasoning=reason,
        error_identification=f"Undetermined: the trace could only be inspected shallowly (format {fmt!r}).",
        root_cause_analysis="Undetermined (rule-based reflector; the trace shape is not one it can analyse).",
        correct_approach="Convert the trace to a supported format (ACE, messages, OpenClaw, tau-bench, OTel) or use an LLM model.",
        key_insight="The trace format limits what a rule-based reflection can say.",
        extracted_learnings=[
            ExtractedLearning(
                learning="Record agent traces in a supported, structured format so they can be reflected on.",
                atomicity_score=0.6,
                evidence=f"format={fmt}; {shape}; cell errors: {errs}.",
                justification="Without recognised steps no error or answer could be checked.",
            )
        ],
    )
