"""Human-readable rendering of a reflection and of progress lines (no logic beyond formatting)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from reflector.analysis.model_names import is_llm
from reflector.contract import CellCitation, Diagnosis, Progress, ReflectorOutput

__all__ = ["render_reflection", "render_progress", "clock", "used", "cells_text"]


def _wrap(text: str, indent: str = "  ") -> str:
    return "\n".join(
        textwrap.fill(line, width=100, initial_indent=indent, subsequent_indent=indent)
        if line.strip()
        else ""
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
        f"requests: {usage.get('requests', 0)}  tokens: {usage.get('total_tokens', 0):,}{_cached(usage)}  "
        f"cells: {rt.get('cells', 0)} ({rt.get('failed_cells', 0)} failed)  depth: {rt.get('depth', 0)}",
        "",
    ]
    lines += _diagnosis_lines(out.diagnosis)
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
            lines.append(_wrap(f"cells: {_citations_line(out, i - 1)}", "     "))
            if learning.justification:
                lines.append(_wrap(f"why: {learning.justification}", "     "))
        lines.append("")
    if out.skill_tags:
        lines.append("Skill tags: " + ", ".join(f"{t.id}={t.tag}" for t in out.skill_tags))
    return "\n".join(lines).rstrip() + "\n"


def _cached(usage: dict[str, int]) -> str:
    """The tokens of the input the provider's prompt cache served or stored, when it did (`reflector.analysis.prompt_cache`)."""
    read, written = usage.get("cache_read_tokens", 0), usage.get("cache_write_tokens", 0)
    if not read and not written:
        return ""
    return f" (input {usage.get('input_tokens', 0):,}: {read:,} cache reads, {written:,} cache writes)"


def _diagnosis_lines(d: Diagnosis | None) -> list[str]:
    """The decisive failure first: where (the root step, actor, and the symptom's step when it differs),
    what (kind, tool, argument), actual vs expected."""
    if d is None:
        return ["Diagnosis: none (no decisive failure was identified)", ""]
    where = f"step {d.step}" if d.step is not None else "step unknown"
    if d.actor:
        where += f" by {d.actor}"
    if d.symptom_step is not None and d.symptom_step != d.step:
        where += f" (root cause; symptom at step {d.symptom_step})"
    what = (
        d.kind.replace("_", " ")
        + (f" in {d.tool}" if d.tool else "")
        + (f" ({d.argument})" if d.argument else "")
    )
    head = f"Diagnosis: {where}: {what}  (confidence {d.confidence:.2f}"
    head += f"; evidence: {', '.join(f'cell {c}' for c in d.evidence)})" if d.evidence else ")"
    lines = [head]
    if d.actual is not None or d.expected is not None:
        lines.append(
            _wrap(
                f"actual: {d.actual if d.actual is not None else '-'}   "
                f"expected: {d.expected if d.expected is not None else '-'}"
            )
        )
    if d.summary:
        lines.append(_wrap(d.summary))
    return [*lines, ""]


def clock(seconds: float) -> str:
    """An elapsed time for progress lines: `4.2s` under a minute, else `m:ss` (`h:mm:ss` past an hour)."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def used(n: int, limit: int) -> str:
    """`n/limit` with thousands separators (`n` alone when the limit is unknown: an older worker)."""
    return f"{n:,}/{limit:,}" if limit else f"{n:,}"


def cells_text(cells: int, failed: int, last_cell: int = 0) -> str:
    """The cells the model wrote, and the id of the latest cell: ids count the prefill and internal
    cells too (the model sees each output headed "[cell N]"), so the latest id is not the count."""
    latest = f", latest [cell {last_cell}]" if last_cell else ""
    return f"cells {cells} by the model ({failed} failed){latest}"


def render_progress(p: Progress, elapsed_s: float | None = None, running: Sequence[Progress] = ()) -> str:
    """One plain progress line. `running`: the progress of the running child, its running child, ...
    (`reflector.client.status.running_chain`): their usage is added to the tree's total and the deepest is named."""
    requests = p.requests + sum(c.requests for c in running)
    tokens = p.total_tokens + sum(c.total_tokens for c in running)
    scope = " (tree)" if running else ""
    parts = [
        p.phase,
        f"requests {used(requests, p.max_requests)}{scope}",
        f"tokens {used(tokens, p.max_tokens)}{scope}",
        cells_text(p.cells, p.failed_cells, p.last_cell),
    ]
    if p.children_started:
        child = ""
        if p.child_running:
            child = f", 1 running: {p.child_running}"
            if running:
                deepest = running[-1]
                child = (
                    f", 1 running: {' > '.join(c.child_running for c in [p, *running[:-1]])} (depth "
                    f"{deepest.depth}, {deepest.phase}, {cells_text(deepest.cells, deepest.failed_cells, deepest.last_cell)}"
                    + (f", last tool {deepest.last_tool}" if deepest.last_tool else "")
                    + ")"
                )
        parts.append(f"children {p.children_done} done{child}")
    if p.depth:
        parts.append(f"depth {p.depth}")
    if p.compactions:
        parts.append(f"compactions {p.compactions}")
    if p.continued_as_new:
        parts.append(f"continued as new {p.continued_as_new}x")
    if p.last_tool:
        parts.append(f"last tool {p.last_tool}")
    when = f"[{clock(elapsed_s)}] " if elapsed_s is not None else ""
    return "  … " + when + " · ".join(parts)


def _citations_line(out: ReflectorOutput, learning: int) -> str:
    """The cells a learning cites, one entry per cell: `cell 3 ok (4 quotes)`, `cell 9 UNSUPPORTED (no such
    cell)`, `cell 4 UNSUPPORTED (not printed: "...")`."""
    by_cell: dict[int, list[CellCitation]] = {}
    for c in out.citations:
        if c.learning == learning:
            by_cell.setdefault(c.cell, []).append(c)
    parts = []
    for cell, cites in by_cell.items():
        quotes = sum(1 for c in cites if c.quote)
        bad = [c for c in cites if not c.supported]
        if not bad:
            parts.append(f"cell {cell} ok" + (f" ({quotes} quote{'s' * (quotes != 1)})" if quotes else ""))
        elif not bad[0].exists:
            parts.append(f"cell {cell} UNSUPPORTED (no such cell)")
        else:
            shown = "; ".join(f'"{c.quote[:60]}"' for c in bad[:3])
            parts.append(f"cell {cell} UNSUPPORTED (not printed: {shown}{' ...' if len(bad) > 3 else ''})")
    return ", ".join(parts) or "none cited"
