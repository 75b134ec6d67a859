"""Human-readable rendering of a batch result and of its progress line (formatting only)."""

from __future__ import annotations

from reflector.analysis.model_names import is_llm
from reflector.client.render import clock, render_reflection
from reflector.contract import BatchOutput, BatchProgress, BatchResult

__all__ = ["render_batch", "render_batch_progress"]

MAX_RUN_LINES = 50


def render_batch_progress(p: BatchProgress, elapsed_s: float | None = None) -> str:
    pending = max(0, p.total - p.done - p.failed - p.running)
    cont = f", continued as new {p.continued_as_new}x" if p.continued_as_new else ""
    when = f"[{clock(elapsed_s)}] " if elapsed_s is not None else ""
    return (
        f"  … {when}{p.phase}: {p.done}/{p.total} done, {p.running} running, {p.failed} failed, {pending} pending{cont}"
        f"{(' — ' + p.last_event) if p.last_event else ''}"
    )


def render_batch(out: BatchOutput) -> str:
    s = out.synthesis
    label = out.model if is_llm(out.model) else f"{out.model} (rule-based, not an LLM)"
    lines = [
        f"Batch {out.batch_id}  model: {label}  runs: {out.n_runs}  reflected: {out.reflected}  "
        f"failed: {out.failed}"
        + (f"  continued as new: {out.continued_as_new}x" if out.continued_as_new else ""),
        "",
        f"Synthesis ({s.method}):",
        *(f"  {line}" for line in s.summary.splitlines()),
        "",
    ]
    if s.failed_runs:
        lines.append("Runs that could not be reflected on:")
        lines += [f"  #{f.index} {f.run_id}: {f.error}" for f in s.failed_runs]
        if out.failed > len(s.failed_runs):
            lines.append(f"  (+{out.failed - len(s.failed_runs)} more in the run records)")
        lines.append("")
    if out.llm_synthesis is not None:
        lines += [
            "LLM synthesis (one reflection session over the run records):",
            render_reflection(out.llm_synthesis),
        ]
    elif out.llm_synthesis_error:
        lines += [f"LLM synthesis failed: {out.llm_synthesis_error}", ""]
    if isinstance(out, BatchResult) and out.run_records:
        lines.append("Runs (full reflection: rr result <workflow id>):")
        for r in out.run_records[:MAX_RUN_LINES]:
            reward = "-" if r.reward is None else f"{r.reward:g}"
            what = r.error if r.status == "failed" else ", ".join(r.failure_modes) or "no failure mode"
            lines.append(
                f"  #{r.index} {r.run_id}  {r.status}  outcome {r.outcome}  reward {reward}  "
                f"{r.workflow_id or '-'}: {what}"
            )
        if len(out.run_records) > MAX_RUN_LINES:
            lines.append(f"  (+{len(out.run_records) - MAX_RUN_LINES} more: --json prints every record)")
    return "\n".join(lines).rstrip() + "\n"
