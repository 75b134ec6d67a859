"""The deterministic reflection a session returns when the model could not finish (budget spent, compaction
limit, an error, or `rr cancel`): built from what the session saw, in workflow code."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.messages import ModelMessage, ToolReturnPart

    from reflector.contract import EXECUTE_CODE_TOOL, ReflectionDraft, StopReason
    from workflows.state import SessionState

__all__ = ["CANCELLED_FINDINGS_CHARS", "fallback_draft"]

CANCELLED_FINDINGS_CHARS = 6_000


def fallback_draft(
    state: SessionState, messages: list[ModelMessage], stop_reason: StopReason, error: str
) -> ReflectionDraft:
    """A deterministic reflection from what the session saw, when the model could not finish."""
    outputs = [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == EXECUTE_CODE_TOOL
    ]
    seen = outputs[-1][:2_000] if outputs else "(no cell output)"
    why = {
        "token_budget": "the token budget was spent",
        "request_budget": "the request budget was spent",
        "max_compactions": "the context was compacted the maximum number of times",
        "error": "the model did not produce a valid reflection",
        "completed": "the session ended",
        "cancelled": "it was cancelled",
    }[stop_reason]
    if stop_reason == "cancelled":  # the findings so far: every cell output (the latest ones when long)
        seen = "\n---\n".join(outputs)[-CANCELLED_FINDINGS_CHARS:] if outputs else "(no cell output)"
    facts = state.facts
    verdict = ""
    if facts.actions_checked:
        verdict = (
            f" The agent's state-changing actions {'match' if facts.answer_correct else 'do NOT match'} the "
            "expected actions (compared by name and arguments)"
            + (
                f"; expected but not taken: {'; '.join(facts.missing_actions)[:400]}"
                if facts.missing_actions
                else ""
            )
            + (
                f"; taken but not expected: {'; '.join(facts.unexpected_actions)[:400]}"
                if facts.unexpected_actions
                else ""
            )
            + "."
        )
    elif facts.answer_correct is not None:
        verdict = (
            f" The agent's final answer ({(facts.final_answer or '')[:200]!r}) "
            f"{'matches' if facts.answer_correct else 'does NOT match'} the ground truth "
            f"({(facts.ground_truth or '')[:200]!r}) under a normalised comparison."
        )
    cancelled = stop_reason == "cancelled"
    return ReflectionDraft(
        reasoning=(
            f"{'CANCELLED' if cancelled else 'INCOMPLETE'}: the reflection stopped early because {why} ({error}). "
            f"{state.counters.cells} cells ran ({state.counters.failed_cells} failed). This is not a finding that nothing went wrong."
            + verdict
        ),
        error_identification=(
            f"Not determined: the session stopped early ({stop_reason}).{verdict} "
            + (f"Cell outputs so far: {seen}" if cancelled else f"Last cell output: {seen}")
        ),
        root_cause_analysis="Not determined: the session stopped before an analysis was complete.",
        correct_approach=(
            "Re-run the reflection (it was cancelled)."
            if cancelled
            else "Re-run the reflection with a larger budget (--max-requests / --max-tokens)."
        ),
        key_insight=("Cancelled reflection" if cancelled else "Incomplete reflection")
        + "; see raw.rr_trace.stop_reason.",
        extracted_learnings=[],
        skill_tags=[],
        diagnosis=facts.diagnosis,  # the facts cell's first divergence, when the trace has expected actions
    )
