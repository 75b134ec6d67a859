"""Human-readable rendering of a reflection and of progress lines (no logic beyond formatting)."""

from __future__ import annotations

import textwrap

from reflector.contract import Progress, ReflectorOutput
from reflector.models import is_llm

__all__ = ["render_reflection", "render_progress"]


def _wrap(text: str, indent: str = "  ") -> str:
    return "\n".join(
        textwrap.fill(line, width=100, initial_indent=indent, subsequent_indent=indent) if line.strip() else ""
        for line in text.splitlines() or [""]
    )


def render_reflection(out: ReflectorOutput) -> str:
    raw = out.raw
    rt = raw.get("rr_trace", {})
    usage = raw.get("usage", {})
    model = str(raw.get("model", "?"))
    label = model if is_llm(model) else f"{model} (rule-based, not an LLM)"
    lines = [
        f"Reflection {raw.get('workflow_id', '?')}  model: {label}",
        f"  stop: {rt.get('stop_reason', '?')}{' (INCOMPLETE)' if rt.get('timed_out') else ''}  "
        f"requests: {usage.get('requests', 0)}  tokens: {usage.get('total_tokens', 0):,}  "
        f"cells: {rt.get('cells', 0)} ({rt.get('failed_cells', 0)} failed)  depth: {rt.get('depth', 0)}",
        "",
    ]
    for title, text in (
        ("What went wrong", out.error_identification),
        ("Root cause", out.root_cause_analysis),
        ("Correct approach", out.correct_approach),
        ("Key insight", out.key_insight),
        ("Reasoning", out.reasoning),
    ):
        lines += [f"{title}:", _wrap(text), ""]
    if out.extracted_learnings:
        lines.append("Learnings:")
        for i, learning in enumerate(out.extracted_learnings, 1):
            lines.append(f"  {i}. {learning.learning}  (atomicity {learning.atomicity_score:.2f})")
            if learning.evidence:
                lines.append(_wrap(f"evidence: {learning.evidence}", "     "))
            if learning.justification:
                lines.append(_wrap(f"why: {learning.justification}", "     "))
        lines.append("")
    if out.skill_tags:
        lines.append("Skill tags: " + ", ".join(f"{t.id}={t.tag}" for t in out.skill_tags))
    return "\n".join(lines).rstrip() + "\n"


def render_progress(p: Progress) -> str:
    return (
        f"  … {p.phase}: {p.iterations} model turns, {p.cells} cells ({p.failed_cells} failed), "
        f"{p.total_tokens:,} tokens{(' — ' + p.last_event) if p.last_event else ''}"
    )
