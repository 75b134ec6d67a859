"""A run's compact record, and the failure modes it counts toward.

Two sources, kept apart:
- **facts**, read from the run's trace by the same rules the reflection's facts cell uses
  (`reflector.analysis.answers`): the reward, whether the outcome matches what was expected (actions against
  expected actions, else the answer against the ground truth), which tools returned errors and how
  often, which expected actions were not taken. They do not depend on the model, so the failure modes
  built from them mean the same with the heuristic and with an LLM;
- **diagnosis**, the reflection's own text, shortened: what went wrong, root cause, key insight,
  learnings, skill tags.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reflector.analysis.answers import answers_match, compare_actions, missing_outputs
from reflector.analysis.traces import TraceError, iter_runs, load_normalized_bytes
from reflector.contract import RecordRunInput, ReflectorOutput, RunOutcome, RunRecord

__all__ = ["TraceRunFacts", "trace_facts", "build_record", "mode_label", "MAX_FACTS_BYTES"]

TEXT_CHARS = 300
LEARNING_CHARS = 200
MAX_LEARNINGS = 4
# Facts are read in the worker process from the whole trace; a run bigger than this gets none (its
# reflection still counts). Runs of a batch are one agent episode each, far below this.
MAX_FACTS_BYTES = 64 * 1024**2

_LABELS = {
    "tool_error": "tool {} returned an error",
    "missing_action": "expected action {} not taken (or not with the expected arguments)",
    "unexpected_action": "state-changing call {} not expected (or not with the expected arguments)",
    "answer_mismatch": "the final answer does not match the ground truth",
    "missing_output": "an expected output was never stated to the user",
    "failed_unexplained": "the run failed (reward < 1) with no tool error or outcome mismatch found",
    "diagnosis": "the reflection's decisive failure: {}",
}


@dataclass
class TraceRunFacts:
    reward: float | None = None
    answer_correct: bool | None = None  # actions match (tau-bench) or answer matches the ground truth
    failing_tools: Counter[str] = field(default_factory=Counter)
    missing_actions: list[str] = field(default_factory=list)
    unexpected_actions: list[str] = field(default_factory=list)
    answer_mismatch: bool = False
    missing_outputs: int = 0


def _name(action_text: str) -> str:
    return action_text.split("(", 1)[0].strip() or "?"


def trace_facts(raw: bytes) -> TraceRunFacts:
    """The facts of a run's trace (a trace holding several runs: summed over them, reward averaged)."""
    view = load_normalized_bytes(raw, "run.json")
    facts = TraceRunFacts()
    rewards: list[float] = []
    verdicts: list[bool] = []
    for run in iter_runs(view):
        steps = [s for s in run.get("steps") or [] if isinstance(s, dict)]
        for s in steps:
            if s.get("is_error"):
                facts.failing_tools[str(s.get("tool_name") or "?")] += 1
        if isinstance(run.get("reward"), int | float):
            rewards.append(float(run["reward"]))
        ok: bool | None
        if isinstance(run.get("expected_actions"), list):
            ok, missing, unexpected = compare_actions(run.get("actions"), run["expected_actions"])
            facts.missing_actions += [_name(a) for a in missing]
            facts.unexpected_actions += [_name(a) for a in unexpected]
        else:
            ok = answers_match(_opt(run.get("final_answer")), _opt(run.get("ground_truth")))
            facts.answer_mismatch = facts.answer_mismatch or ok is False
        said = [str(s.get("content") or "") for s in steps if s.get("role") == "assistant"]
        facts.missing_outputs += len(missing_outputs(run.get("expected_outputs"), said))
        if ok is not None:
            verdicts.append(ok)
    if rewards:
        facts.reward = round(sum(rewards) / len(rewards), 4)
    if verdicts:
        facts.answer_correct = all(verdicts)
    return facts


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)


def _short(text: str, limit: int = TEXT_CHARS) -> str:
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def outcome_of(facts: TraceRunFacts) -> RunOutcome:
    """The run's label: its reward when the trace has one (the benchmark's verdict: a tau-bench run whose
    calls differ from the expected ones in arguments that leave the same database state still earns 1),
    else whether the answer or actions checked right; unknown: nothing to check against."""
    if facts.reward is not None:
        return "failure" if facts.reward < 1 else "success"
    if facts.answer_correct is not None:
        return "success" if facts.answer_correct else "failure"
    return "unknown"


def failure_modes(facts: TraceRunFacts, outcome: RunOutcome) -> list[str]:
    """The mode keys a run counts toward, each once (`kind:subject` or `kind`), sorted."""
    modes = {f"tool_error:{t}" for t in facts.failing_tools}
    modes |= {f"missing_action:{a}" for a in facts.missing_actions}
    modes |= {f"unexpected_action:{a}" for a in facts.unexpected_actions}
    if facts.answer_mismatch:
        modes.add("answer_mismatch")
    if facts.missing_outputs:
        modes.add("missing_output")
    if outcome == "failure" and not modes:
        modes.add("failed_unexplained")
    return sorted(modes)


def mode_label(key: str) -> str:
    kind, _, subject = key.partition(":")
    template = _LABELS.get(kind)
    if template is None:
        return key
    return template.format(subject) if "{}" in template else template


def build_record(inp: RecordRunInput, trace_bytes: bytes | None, facts_error: str | None = None) -> RunRecord:
    """The run's record from its manifest entry, its trace's bytes (None: not readable) and its
    reflection (`inp.output`, None when the child failed or the run is broken)."""
    run = inp.run
    error = inp.error or run.error
    if error is None and inp.output is None:
        error = "no reflection was produced"
    facts = TraceRunFacts()
    if trace_bytes is not None:
        try:
            facts = trace_facts(trace_bytes)
        except (TraceError, RecursionError, ValueError) as e:
            facts_error = _short(f"{type(e).__name__}: {e}")
    outcome = outcome_of(facts)
    out: ReflectorOutput | None = inp.output
    rec = RunRecord(
        index=run.index,
        run_id=run.run_id,
        source=run.source,
        status="failed" if error is not None else "reflected",
        error=_short(error, 1_000) if error is not None else None,
        workflow_id=inp.workflow_id,
        trace_sha256=run.trace.sha256 if run.trace is not None else None,
        format=run.trace.format if run.trace is not None else "unknown",
        reward=facts.reward,
        outcome=outcome,
        answer_correct=facts.answer_correct,
        failing_tools=dict(sorted(facts.failing_tools.items())),
        missing_actions=sorted(set(facts.missing_actions)),
        unexpected_actions=sorted(set(facts.unexpected_actions)),
        failure_modes=failure_modes(facts, outcome) if error is None else [],
        facts_error=facts_error,
    )
    if out is None:
        return rec
    return rec.model_copy(
        update={
            "stop_reason": str(out.raw.get("rr_trace", {}).get("stop_reason", "completed")),
            "what_went_wrong": _short(out.error_identification),
            "root_cause": _short(out.root_cause_analysis),
            "key_insight": _short(out.key_insight),
            "learnings": [
                _short(lr.learning, LEARNING_CHARS) for lr in out.extracted_learnings[:MAX_LEARNINGS]
            ],
            "skill_tags": list(out.skill_tags),
            "diagnosis": out.diagnosis,
            # the reflection's first divergence, once per run: runs grouped by kind and tool in the synthesis
            "failure_modes": _with_diagnosis(rec.failure_modes, out) if error is None else [],
        }
    )


def _with_diagnosis(modes: list[str], out: ReflectorOutput) -> list[str]:
    """The run's modes; a failed run the trace facts cannot explain (no tool error, no expected action or
    answer to compare) counts toward its reflection's decisive failure instead (e.g. a multi-agent run)."""
    d = out.diagnosis
    if d is None or modes != ["failed_unexplained"]:
        return modes
    return [f"diagnosis:{d.kind.replace('_', ' ')}" + (f" in {d.tool}" if d.tool else "")]
