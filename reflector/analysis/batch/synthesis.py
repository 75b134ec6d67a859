"""The computed synthesis of a batch: which failure modes recur across runs, and in which runs.

Deterministic and model-independent: it groups the runs' records (`reflector.analysis.batch.records`) and
counts **runs**, never errors: a run with six errors of one tool counts once for that tool, as does a
run with one. Every mode cites the ids of the runs it was seen in. Learnings are grouped by identical
text (the heuristic writes the same learning for the same finding; an LLM rarely does, so with an LLM
this list is short and the LLM synthesis session is the place to look for paraphrases).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from reflector.analysis.batch.records import mode_label
from reflector.contract import BatchSynthesis, FailedRun, FailureMode, RecurringText, RunRecord

__all__ = ["synthesise", "llm_question", "llm_feedback", "METHOD", "MAX_CITED"]

MAX_CITED = 20  # run ids cited per mode (the records list every run)
MAX_MODES = 25
MAX_TEXTS = 10
MAX_FAILED_LISTED = 50
METHOD = (
    "computed (rule-based, deterministic; not an LLM): failure modes from each run's trace facts (tool "
    "errors, expected vs taken state-changing actions, answer vs ground truth, reward), each counted once "
    "per run; learnings grouped by identical text"
)


@dataclass
class _Tally:
    runs: int = 0
    failing: int = 0
    ids: list[str] = field(default_factory=list)

    def add(self, run_id: str, failing: bool = False) -> None:
        self.runs += 1
        self.failing += failing
        if len(self.ids) < MAX_CITED:
            self.ids.append(run_id)


def synthesise(records: Iterable[RunRecord], n_runs: int) -> BatchSynthesis:
    """The synthesis over `records` (in run order) of a batch of `n_runs` runs."""
    modes: dict[str, _Tally] = {}
    learnings: dict[str, _Tally] = {}
    harmful: dict[str, _Tally] = {}
    texts: dict[str, str] = {}
    outcomes = {"failure": 0, "success": 0, "unknown": 0}
    rewards: list[float] = []
    failed: list[FailedRun] = []
    n_failed = reflected = incomplete = 0
    for rec in records:
        if rec.status == "failed":
            n_failed += 1
            if len(failed) < MAX_FAILED_LISTED:
                failed.append(FailedRun(index=rec.index, run_id=rec.run_id, error=rec.error or "failed"))
            continue
        reflected += 1
        outcomes[rec.outcome] += 1
        if rec.reward is not None:
            rewards.append(rec.reward)
        if rec.stop_reason not in (None, "completed"):
            incomplete += 1
        for key in rec.failure_modes:
            modes.setdefault(key, _Tally()).add(rec.run_id, rec.outcome == "failure")
        for text in dict.fromkeys(" ".join(t.split()) for t in rec.learnings):
            norm = text.lower()
            texts.setdefault(norm, text)
            learnings.setdefault(norm, _Tally()).add(rec.run_id)
        for sid in dict.fromkeys(t.id for t in rec.skill_tags if t.tag == "harmful"):
            harmful.setdefault(sid, _Tally()).add(rec.run_id)
    ranked = sorted(modes.items(), key=lambda kv: (-kv[1].runs, kv[0]))
    failure_modes = [
        FailureMode(
            key=key,
            label=mode_label(key),
            runs=t.runs,
            failing_runs=t.failing,
            share=round(t.runs / reflected, 4) if reflected else 0.0,
            run_ids=t.ids,
            more_runs=t.runs - len(t.ids),
        )
        for key, t in ranked[:MAX_MODES]
    ]
    synthesis = BatchSynthesis(
        method=METHOD,
        n_runs=n_runs,
        reflected=reflected,
        failed=n_failed,
        outcomes=outcomes,
        mean_reward=round(sum(rewards) / len(rewards), 4) if rewards else None,
        incomplete_reflections=incomplete,
        failure_modes=failure_modes,
        single_run_modes=sum(1 for _, t in ranked if t.runs == 1),
        recurring_learnings=_recurring(learnings, texts, minimum=2),
        harmful_skills=_recurring(harmful, {k: k for k in harmful}, minimum=1),
        failed_runs=failed,
    )
    return synthesis.model_copy(update={"summary": _summary(synthesis)})


def _recurring(tallies: dict[str, _Tally], texts: dict[str, str], minimum: int) -> list[RecurringText]:
    ranked = sorted(
        ((k, t) for k, t in tallies.items() if t.runs >= minimum), key=lambda kv: (-kv[1].runs, kv[0])
    )
    return [
        RecurringText(text=texts[k], runs=t.runs, run_ids=t.ids, more_runs=t.runs - len(t.ids))
        for k, t in ranked[:MAX_TEXTS]
    ]


def _cite(ids: list[str], more: int) -> str:
    return ", ".join(ids) + (f" (+{more} more)" if more else "")


def _summary(s: BatchSynthesis) -> str:
    lines = [
        f"{s.n_runs} runs: {s.reflected} reflected, {s.failed} could not be reflected on."
        + (
            f" {s.incomplete_reflections} reflections are incomplete (stopped early)."
            if s.incomplete_reflections
            else ""
        ),
        f"Outcomes of the reflected runs: {s.outcomes['failure']} failed, {s.outcomes['success']} succeeded, "
        f"{s.outcomes['unknown']} unknown"
        + (f"; mean reward {s.mean_reward}." if s.mean_reward is not None else "."),
    ]
    recurring = [m for m in s.failure_modes if m.runs >= 2]
    if recurring:
        lines.append("Failure modes that recur across runs (runs counted once each):")
        for i, m in enumerate(recurring, 1):
            lines.append(
                f"{i}. {m.label}: {m.runs} of {s.reflected} runs ({m.share:.0%}), {m.failing_runs} of them "
                f"failed; runs {_cite(m.run_ids, m.more_runs)}"
            )
    else:
        lines.append("No failure mode occurs in more than one run.")
    if s.single_run_modes:
        lines.append(f"{s.single_run_modes} other failure modes occur in one run each (see the run records).")
    if s.recurring_learnings:
        top = s.recurring_learnings[0]
        lines.append(f"Most repeated learning ({top.runs} runs): {top.text}")
    return "\n".join(lines)


def llm_question(n_runs: int) -> str:
    """The question of the LLM synthesis session, whose `traces` are the batch's run records."""
    return (
        f"`traces` holds the compact records of the {n_runs} runs of a batch, each run reflected on by its own "
        "session: a JSON list, one record per run (index, run_id, status reflected/failed, error, reward, outcome "
        "success/failure/unknown, failing_tools {tool: error results}, missing_actions, unexpected_actions, "
        "what_went_wrong, root_cause, key_insight, learnings, skill_tags, failure_modes). Find the failure modes "
        "that recur across runs. Count RUNS, not errors (a run with six errors of one tool counts once), cite the "
        "run ids of each mode as evidence and give each mode's share of the reflected runs; group diagnoses and "
        "learnings that say the same thing in different words. Analyse the records with code, not one by one."
    )


def llm_feedback(s: BatchSynthesis) -> str:
    """The computed synthesis, handed to the LLM session as feedback to check and go beyond."""
    return "A rule-based count over the same records found:\n" + s.summary
