"""Building the heuristic's `ReflectionDraft` from the findings its cell printed.

Every statement restates a printed finding (a step index, tool name or value), so the draft can be
checked against the cell output; the rules that produced the findings live in the cell.
"""

from __future__ import annotations

from typing import Any

from reflector.contract import ExtractedLearning, ReflectionDraft, SkillTag

__all__ = ["HEURISTIC_NAME", "build_draft"]

HEURISTIC_NAME = "heuristic (rule-based, not an LLM)"


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
        draft = _run_draft(findings, skillbook_ids or [])
    if cell is not None:
        for item in draft.extracted_learnings:
            item.evidence = f"cell {cell}: {item.evidence}"
    return draft


def _q(text: Any, limit: int = 160) -> str:
    """Quote a printed value, shortened, so evidence stays readable."""
    s = "" if text is None else str(text)
    return '"' + (s if len(s) <= limit else s[: limit - 3] + "...") + '"'


def _step_ref(step: dict[str, Any]) -> str:
    return f"step {step.get('index')} (tool {step.get('tool_name')})"


def _verdict(f: dict[str, Any]) -> tuple[bool, str]:
    """(failed?, one-line verdict) from reward, answer comparison and tool errors."""
    reward, match, n_fail = f.get("reward"), f.get("answer_matches"), f.get("n_failing_steps", 0)
    acts, outs = f.get("actions_match"), f.get("missing_outputs") or []
    problems = []
    if reward is not None and reward < 1:
        problems.append(f"the run's reward is {reward}")
    if match is False:
        problems.append("the final answer does not match the ground truth")
    if acts is False:
        problems.append("the agent's state-changing actions differ from the expected actions")
    if outs:
        problems.append(f"{len(outs)} expected output(s) never stated by the agent")
    if n_fail:
        problems.append(f"{n_fail} tool result(s) look like errors")
    if problems:
        return True, "; ".join(problems)
    if match is None and acts is None:
        return (
            False,
            "no tool result looks like an error and no ground truth was available to check the answer",
        )
    checked = (["the final answer matches the ground truth"] if match else []) + (
        ["the agent's actions match the expected actions"] if acts else []
    )
    return False, "no tool result looks like an error and " + " and ".join(checked)


def _run_draft(f: dict[str, Any], skillbook_ids: list[str]) -> ReflectionDraft:
    failed, verdict = _verdict(f)
    failing = f.get("failing_steps") or []
    tools = f.get("tool_calls") or {}
    reasoning = (
        f"Produced by the {HEURISTIC_NAME}: one sandbox cell inspected the {f.get('format')} trace "
        f"and every statement below restates what it printed. The trace has {f.get('n_steps')} steps and "
        f"{f.get('n_tool_calls', 0)} tool calls ({', '.join(f'{k} x{v}' for k, v in tools.items()) or 'none'}). "
        f"Verdict: {verdict}."
    )
    errors = []
    if f.get("answer_matches") is False:
        missing = f.get("missing_from_answer") or []
        errors.append(
            f"The final answer {_q(f.get('final_answer'))} does not match the ground truth "
            f"{_q(f.get('ground_truth'))} (from {f.get('ground_truth_source')})"
            + (f"; it lacks {_q(missing[0], 200)}." if missing else ".")
        )
    if f.get("actions_match") is False:
        errors.append(_actions_mismatch(f))
    if f.get("missing_outputs"):
        errors.append(
            "The agent never stated the expected output(s) "
            + ", ".join(_q(o, 100) for o in f["missing_outputs"][:3])
            + "."
        )
    errors += [f"{_step_ref(s)} returned an error: {_q(s.get('content'))}." for s in failing[:3]]
    if f.get("reward") is not None and f["reward"] < 1:
        errors.append(f"Reward {f['reward']}; feedback: {_q(f.get('feedback'))}.")
    if not failed:
        errors = [f"No error found: {verdict}."]
    return ReflectionDraft(
        reasoning=reasoning,
        error_identification=" ".join(errors),
        root_cause_analysis=_root_cause(f, failed),
        correct_approach=_correct_approach(f, failed),
        key_insight=_key_insight(f, failed),
        extracted_learnings=_run_learnings(f, failed)[:4],
        skill_tags=_skill_tags(f, skillbook_ids, failed),
    )


def _actions_mismatch(f: dict[str, Any]) -> str:
    """What differs between the agent's state-changing actions and the expected ones (by name and arguments)."""
    parts = []
    if f.get("missing_actions"):
        parts.append("expected but not taken: " + "; ".join(_q(a, 200) for a in f["missing_actions"][:2]))
    if f.get("unexpected_actions"):
        parts.append("taken but not expected: " + "; ".join(_q(a, 200) for a in f["unexpected_actions"][:2]))
    return (
        "The agent's state-changing actions differ from the expected actions (compared by name and arguments)"
        + (": " + "; ".join(parts) if parts else "")
        + "."
    )


def _outcome_missed(f: dict[str, Any]) -> bool:
    return (
        f.get("answer_matches") is False
        or f.get("actions_match") is False
        or bool(f.get("missing_outputs"))
        or (f.get("reward") is not None and f["reward"] < 1)
    )


def _root_cause(f: dict[str, Any], failed: bool) -> str:
    failing = f.get("failing_steps") or []
    repeated = f.get("repeated_failures") or {}
    if not failed:
        return "Nothing to diagnose: the printed findings show no failure (rule-based check)."
    parts = []
    if repeated:
        name, count = sorted(repeated.items())[0]
        parts.append(
            f"Tool {name} failed {count} times, so the agent repeated a failing call instead of changing "
            "its arguments or approach after the first error."
        )
    elif failing:
        parts.append(f"The first failure is {_step_ref(failing[0])}: {_q(failing[0].get('content'))}.")
    if f.get("actions_match") is False and not failing:
        parts.append(
            "No tool reported an error: the agent chose state-changing calls (or arguments) other than the "
            "ones the task required, so the outcome differs although every call succeeded."
        )
    elif _outcome_missed(f):
        if failing:
            parts.append(
                "The run then ended without the expected result, so the agent did not recover from it."
            )
        else:
            parts.append(
                "No tool reported an error, so the wrong outcome comes from the agent's own reasoning or "
                "choice of actions, not from a tool failure."
            )
    return " ".join(parts) + " (Rule-based inference from the findings, not an LLM judgement.)"


def _correct_approach(f: dict[str, Any], failed: bool) -> str:
    if not failed:
        return "Keep the same approach; the findings show it reached the expected result without tool errors."
    steps = []
    if f.get("failing_steps"):
        steps.append("read each tool error and fix the call (arguments, preconditions) before retrying")
    if f.get("answer_matches") is False:
        steps.append(
            f"verify the result against the task before answering; the expected answer was {_q(f.get('ground_truth'))}"
        )
    if f.get("actions_match") is False:
        missing = f.get("missing_actions") or []
        steps.append(
            "make exactly the state-changing calls the task requires, with the arguments it requires"
            + (f" (expected: {_q(missing[0], 200)})" if missing else "")
        )
    if f.get("missing_outputs"):
        steps.append(
            "tell the user the information the task requires (" + ", ".join(f["missing_outputs"][:3]) + ")"
        )
    outcome_named = (
        f.get("answer_matches") is False or f.get("actions_match") is False or f.get("missing_outputs")
    )
    if not outcome_named and f.get("reward") is not None and f["reward"] < 1:
        steps.append("check the required outcome (expected actions/outputs) before ending the run")
    return "The agent should " + "; then ".join(steps) + "."


def _key_insight(f: dict[str, Any], failed: bool) -> str:
    if not failed:
        return "This run needs no correction: no tool errors and the outcome matches what was expected."
    if f.get("repeated_failures"):
        return "Retrying an identical failing tool call does not help; the error message says what to change."
    if f.get("failing_steps"):
        return "A tool error is information: its message says what to fix before the next call."
    if f.get("actions_match") is False:
        return (
            "For a task that changes state, the calls are the outcome: each one must match what the task "
            "requires, name and arguments, whatever the agent says afterwards."
        )
    return "The final result was not checked against what the task required before the run ended."


def _run_learnings(f: dict[str, Any], failed: bool) -> list[ExtractedLearning]:
    failing = f.get("failing_steps") or []
    learnings: list[ExtractedLearning] = []
    if not failed:
        return [
            ExtractedLearning(
                learning="When the tool calls succeed and the answer is checked, end the run with that answer.",
                atomicity_score=0.6,
                evidence=f"{f.get('n_steps')} steps, 0 failing tool results; answer_matches={f.get('answer_matches')}.",
                justification="Rule-based: the findings show no failure, so the learning only confirms the approach.",
            )
        ]
    for name, count in sorted((f.get("repeated_failures") or {}).items())[:1]:
        refs = ", ".join(_step_ref(s) for s in failing if s.get("tool_name") == name)
        learnings.append(
            ExtractedLearning(
                learning=f"After a {name} call fails, change its arguments before calling {name} again.",
                atomicity_score=0.85,
                evidence=f"{name} failed {count} times: {refs}.",
                justification="Identical retries after an error repeated the same failure.",
            )
        )
    if failing:
        s = failing[0]
        learnings.append(
            ExtractedLearning(
                learning=f"Read the error text returned by {s.get('tool_name')} and fix the cause it names.",
                atomicity_score=0.8,
                evidence=f"{_step_ref(s)}: {_q(s.get('content'))}.",
                justification="The error message states the cause; acting on it avoids the failure.",
            )
        )
    if f.get("answer_matches") is False:
        learnings.append(
            ExtractedLearning(
                learning="Before answering, re-check the result against the question's requirement.",
                atomicity_score=0.75,
                evidence=_mismatch_evidence(f),
                justification="The answer differed from the ground truth; a final check would have caught it.",
            )
        )
    if f.get("actions_match") is False:
        learnings.append(
            ExtractedLearning(
                learning="Before each state-changing call, check every argument against what the user asked for "
                "and what the policy allows.",
                atomicity_score=0.75,
                evidence=_actions_evidence(f),
                justification="The agent's state-changing calls differed from the expected ones in name or arguments.",
            )
        )
    if (
        f.get("answer_matches") is not False
        and f.get("actions_match") is not False
        and (f.get("reward") is not None and f["reward"] < 1)
    ):
        learnings.append(
            ExtractedLearning(
                learning="Before ending, confirm every action the task requires has been completed.",
                atomicity_score=0.7,
                evidence=f"reward {f['reward']}; feedback {_q(f.get('feedback'))}.",
                justification="The grader's feedback shows the required outcome was not reached.",
            )
        )
    return learnings


def _mismatch_evidence(f: dict[str, Any]) -> str:
    """Final answer vs ground truth, the truth lines it lacks, and the last step that led there."""
    text = f"final answer {_q(f.get('final_answer'))} vs ground truth {_q(f.get('ground_truth'))}"
    missing = f.get("missing_from_answer") or []
    if missing:
        text += "; missing from the answer: " + "; ".join(_q(m, 200) for m in missing[:2])
    last = f.get("last_assistant_step")
    if isinstance(last, dict):
        text += f"; last assistant step {last.get('index')}: {_q(last.get('content'))}"
    return text + "."


def _actions_evidence(f: dict[str, Any]) -> str:
    """The expected actions the agent did not take and those it took unexpectedly (printed action texts)."""
    parts = []
    if f.get("missing_actions"):
        parts.append("expected actions not taken: " + "; ".join(_q(a, 200) for a in f["missing_actions"][:2]))
    if f.get("unexpected_actions"):
        parts.append(
            "actions taken but not expected: " + "; ".join(_q(a, 200) for a in f["unexpected_actions"][:2])
        )
    if f.get("reward") is not None:
        parts.append(f"reward {f['reward']}")
    return "; ".join(parts) + "."


def _skill_tags(f: dict[str, Any], skillbook_ids: list[str], failed: bool) -> list[SkillTag]:
    """Tag only skills that are both in the prompt's skillbook and cited in the trace."""
    cited = set(f.get("cited_skill_ids") or [])
    checked_ok = f.get("answer_matches") is True or f.get("actions_match") is True
    tag = "harmful" if failed else "helpful" if checked_ok else "neutral"
    return [SkillTag(id=sid, tag=tag) for sid in dict.fromkeys(skillbook_ids) if sid in cited]


def _batch_draft(f: dict[str, Any]) -> ReflectionDraft:
    n_runs, n_fail = f.get("n_runs", 0), f.get("n_failing_runs", 0)
    tools = f.get("failing_tools") or []
    runs = f.get("failing_runs") or []
    run_ids = ", ".join(f"{r.get('id')} (reward {r.get('reward')})" for r in runs[:5])
    reasoning = (
        f"Produced by the {HEURISTIC_NAME}: one sandbox cell summarised a batch of {n_runs} "
        f"{f.get('format')} runs; every statement below restates what it printed. "
        f"{n_fail} runs failed; mean reward {f.get('mean_reward')}."
    )
    if not n_fail:
        return ReflectionDraft(
            reasoning=reasoning,
            error_identification=f"No error found: none of the {n_runs} runs failed by the printed checks.",
            root_cause_analysis="Nothing to diagnose (rule-based check).",
            correct_approach="Keep the same approach.",
            key_insight="The batch shows no failing run.",
            extracted_learnings=[
                ExtractedLearning(
                    learning="Keep the current approach for this kind of task.",
                    atomicity_score=0.5,
                    evidence=f"{n_runs} runs, 0 failing runs.",
                    justification="Rule-based: no failure was found.",
                )
            ],
        )
    learnings = []
    if tools:
        name, count = tools[0]
        learnings.append(
            ExtractedLearning(
                learning=f"Validate {name} arguments against the tool's preconditions before calling it.",
                atomicity_score=0.75,
                evidence=f"{name} is the most frequent failing tool in failing runs ({count} errors); failing tools: {tools}.",
                justification="The same tool failing across runs points to a recurring misuse.",
            )
        )
    act_mism = f.get("n_failing_runs_action_mismatch", 0)
    if act_mism:
        learnings.append(
            ExtractedLearning(
                learning="Before ending a run, compare the state-changing calls made with exactly what the task requires.",
                atomicity_score=0.7,
                evidence=f"{act_mism} of {n_fail} failing runs made state-changing calls that differ from the expected "
                f"actions (by name and arguments); e.g. {run_ids}.",
                justification="Most failures are wrong or missing actions, not crashes.",
            )
        )
    mism = f.get("n_failing_runs_answer_mismatch", 0)
    if mism:
        learnings.append(
            ExtractedLearning(
                learning="Before ending a run, compare the actions taken with exactly what the task requires.",
                atomicity_score=0.7,
                evidence=f"{mism} of {n_fail} failing runs end with a result that does not match the ground truth; e.g. {run_ids}.",
                justification="Most failures are outcome mismatches, not crashes.",
            )
        )
    example = f.get("example_run")
    if isinstance(example, dict):
        for item in _run_learnings(example, True)[: max(0, 4 - len(learnings))]:
            item.evidence = f"run {example.get('id')}: {item.evidence}"
            learnings.append(item)
    if not learnings:
        learnings.append(
            ExtractedLearning(
                learning="Check the outcome against the task before ending each run.",
                atomicity_score=0.6,
                evidence=f"{n_fail} failing runs: {run_ids}.",
                justification="Failures were found but no recurring tool error explains them.",
            )
        )
    return ReflectionDraft(
        reasoning=reasoning,
        error_identification=f"{n_fail} of {n_runs} runs failed: {run_ids}"
        + (f"; most common failing tools: {tools}." if tools else "."),
        root_cause_analysis=(
            f"{f.get('n_runs_with_tool_errors', 0)} failing runs contain tool errors, {mism} end with a result "
            f"that does not match the ground truth and {act_mism} made state-changing calls other than the expected "
            "ones. (Rule-based inference from the findings, not an LLM judgement.)"
        ),
        correct_approach="Act on tool errors instead of repeating calls, and verify the required outcome before ending each run.",
        key_insight=(
            f"Failures recur across runs around {tools[0][0]}."
            if tools
            else "Failures are outcome mismatches, not tool crashes."
        ),
        extracted_learnings=learnings[:4],
    )


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
