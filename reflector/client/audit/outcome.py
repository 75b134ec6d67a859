"""A reflection's outcome in its audit: the text, stop reason and learnings of the workflow's output, each
learning with the cells it cites (`reflector.client.audit.walk` calls it at the end of a session)."""

from __future__ import annotations

from typing import Any

from reflector.analysis.citations import check_citations
from reflector.client.audit.timeline import CitationAudit, LearningAudit, Session, cell_anchor
from reflector.contract import ExtractedLearning

__all__ = ["fill_reflection"]


def fill_reflection(session: Session, out: dict[str, Any], outputs: dict[int, str]) -> None:
    """The session's reflection from the workflow's output `out`: its text, stop reason and learnings, each
    with its citations (as the workflow checked them, or checked here on the cell `outputs` the history shows
    for a reflection recorded before the workflow checked them)."""
    r = session.reflection
    raw = out.get("raw") or {}
    r.raw = raw
    r.stop_reason = (raw.get("rr_trace") or {}).get("stop_reason")
    for key in (
        "reasoning",
        "error_identification",
        "root_cause_analysis",
        "correct_approach",
        "key_insight",
    ):
        setattr(r, key, str(out.get(key, "")))
    learnings = [ExtractedLearning.model_validate(x) for x in out.get("extracted_learnings") or []]
    if "citations" in out:
        source = "workflow"
        cited = [
            (
                int(c["learning"]),
                CitationAudit(
                    cell=int(c["cell"]),
                    exists=bool(c["exists"]),
                    printed=bool(c.get("printed", True)),
                    quote=str(c.get("quote", "")),
                ),
            )
            for c in out.get("citations") or []
        ]
    else:  # recorded before the workflow checked citations: the same check, on the outputs the history shows
        source = "audit"
        cited = [
            (c.learning, CitationAudit(cell=c.cell, exists=c.exists, printed=c.printed, quote=c.quote))
            for c in check_citations(learnings, outputs)
        ]
    for i, learning in enumerate(learnings):
        mine = [c for n, c in cited if n == i]
        for c in mine:
            c.anchor = cell_anchor(session.workflow_id, c.cell) if c.exists else ""
        r.learnings.append(
            LearningAudit(
                index=i,
                learning=learning.learning,
                evidence=learning.evidence,
                citations=mine,
                source=source,
            )
        )
