"""The heuristic's reflection of one run: the diagnosis and every statement, restated from its cell's findings.

Rules of the text (issue 15): every statement is something the findings cell computed over the trace;
quotes are verbatim and say where they come from (the agent's call, the agent's message, a tool's
error, the task's expected actions); "repeated the same call" only when the arguments were identical;
learnings name the tool, argument or value they are about; when the cell could not tell, the text says so.
The diagnosis is `run_diagnosis`'s; how a statement quotes and names things is `run_text`'s.
"""

from __future__ import annotations

from typing import Any

from reflector.analysis.diagnosis import value_text
from reflector.analysis.heuristic.run_diagnosis import _root, _unrecovered, diagnosis_of
from reflector.analysis.heuristic.run_text import _CANNOT_TELL, _args_summary, _failing_of, _failure_text, _q
from reflector.contract import Diagnosis, ExtractedLearning, ReflectionDraft, SkillTag

__all__ = ["run_draft", "diagnosis_of", "value_text"]

NAME = "heuristic (rule-based, not an LLM)"


# -------------------------------------------------------------------------------------- statements


def _differences(d: dict[str, Any]) -> list[dict[str, Any]]:
    diffs = [x for x in d.get("differences") or [] if isinstance(x, dict)]
    if diffs:
        return diffs
    return [{"path": d.get("argument"), "expected": d.get("expected"), "actual": d.get("actual")}]


def _diff_phrase(x: dict[str, Any]) -> str:
    exp, act = x.get("expected"), x.get("actual")
    if act is None:
        return f"{x.get('path')} was missing (expected {value_text(exp)})"
    if exp is None:
        return f"{x.get('path')} was {value_text(act)}, which the expected call does not have"
    return f"{x.get('path')} was {value_text(act)} (expected {value_text(exp)})"


def _at_step(d: dict[str, Any]) -> str:
    at = d.get("at_step") or {}
    if not at.get("content"):
        return ""
    who = at.get("actor") or at.get("role")
    return f" What the trace shows at step {d.get('step')} ({who}, verbatim): {_q(at.get('content'), 240)}."


def _wrong_arguments(
    f: dict[str, Any], d: dict[str, Any]
) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    tool, step = d.get("tool"), d.get("step")
    diffs = _differences(d)
    call = (d.get("agent_call") or {}).get("args")
    err = (
        f"At step {step} the agent called {tool} and {len(diffs)} argument value(s) differ from the task's "
        f"expected {tool} call: "
        + "; ".join(_diff_phrase(x) for x in diffs[:4])
        + ". The call returned no error, "
        "so the wrong values were written."
    )
    if call is not None:
        err += f" The agent's call at step {step}, from the trace: {_q(call, 400)}."
    g = _failing_of(f, tool)
    if g:
        cause = f"Before the accepted call, {_failure_text(g)}."
    else:
        cause = (
            f"No {tool} call failed before this one: the values were the agent's own choice; {_CANNOT_TELL} "
            f"what led it to {value_text(diffs[0].get('actual'))}."
        )
    approach = (
        f"Call {tool} with "
        + "; ".join(f"{x.get('path')} {value_text(x.get('expected'))}" for x in diffs[:4])
        + ", checking each value against the user's request and the records read earlier before the call."
    )
    paths = ", ".join(str(x.get("path")) for x in diffs[:4])
    if d.get("others"):
        insight = (
            f"The first divergence is in argument values of {tool} at step {step} ({paths}); "
            f"{len(d['others'])} other divergence(s) from the expected actions follow it."
        )
    else:
        insight = (
            f"The run failed on argument values of one state-changing call ({tool} at step {step}: {paths}), "
            "not on the choice of action."
        )
    learnings = [
        ExtractedLearning(
            learning=(
                f"Before calling {tool}, check `{x.get('path')}` against the user's request and the records "
                f"read earlier: {_sent(x)}."
            ),
            atomicity_score=0.85,
            evidence=f"divergence at step {step}: {tool} {x.get('path')}: agent {_q(x.get('actual'), 80)}, "
            f"expected {_q(x.get('expected'), 80)}",
            justification="The expected call differs from the agent's exactly there; the other arguments matched.",
        )
        for x in diffs[:3]
    ]
    if g:
        learnings.append(_failure_learning(g))
    return err, cause, approach, insight, learnings


def _sent(x: dict[str, Any]) -> str:
    exp, act = x.get("expected"), x.get("actual")
    if act is None:
        return f"this run left it out where {value_text(exp, 60)} was required"
    if exp is None:
        return f"this run sent {value_text(act, 60)}, which the expected call does not have"
    return f"this run sent {value_text(act, 60)} where {value_text(exp, 60)} was required"


def _failure_learning(g: dict[str, Any]) -> ExtractedLearning:
    tool = g.get("tool")
    if g.get("identical_retries"):
        text = f"After {tool} fails, change what its error names before calling it again; identical retries fail again."
    else:
        text = f"When {tool} fails with {_q(g.get('first_error'), 80)}, fix what that error names before the next call."
    return ExtractedLearning(
        learning=text,
        atomicity_score=0.8,
        evidence=_failure_text(g),
        justification="Restates the failing attempts the cell grouped for this tool.",
    )


def _missing(f: dict[str, Any], d: dict[str, Any]) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    tool, step = d.get("tool"), d.get("step")
    want = (d.get("expected_action") or {}).get("args")
    n_exp, n_ok = d.get("n_expected"), d.get("n_matched")
    g = _failing_of(f, tool)
    head = (
        f"The expected {tool} call never went through: the agent's {tool} calls failed"
        if g
        else f"The agent never made the expected {tool} call"
    )
    err = (
        f"{head} (the task expected it with {_args_summary(want)}). "
        f"{n_ok} of the task's {n_exp} expected state-changing actions were taken as expected."
    )
    err += f" The decisive point is step {step} ({d.get('where')})." + _at_step(d)
    if g:
        cause = f"The agent did try: {_failure_text(g)}."
    else:
        cause = (
            f"The agent made no {tool} call at all, and no tool error stopped it; {_CANNOT_TELL} whether it "
            "misread the policy or the user's request."
        )
    approach = (
        f"Make the {tool} call the task requires ({_args_summary(want)}) before ending the conversation."
    )
    insight = f"The outcome was lost by an action not taken ({tool})" + (
        f": the agent's {tool} call(s) for it failed ({g.get('n_attempts')} failed attempt(s))."
        if g
        else ", not by a failing tool: what the agent said afterwards cannot replace the call."
    )
    learnings = [
        ExtractedLearning(
            learning=(
                f"When the user's request requires {tool}, get that call through before ending the turn; in this "
                f"run every {tool} call failed."
                if g
                else f"When the user's request requires {tool}, make that call instead of ending the turn; this run "
                f"never called it."
            ),
            atomicity_score=0.8,
            evidence=f"expected action {tool} not taken; decisive step {step} ({d.get('where')})",
            justification="The expected actions include it and no call of the agent matches it.",
        )
    ]
    if g:
        learnings.append(_failure_learning(g))
    return err, cause, approach, insight, learnings


def _extra(f: dict[str, Any], d: dict[str, Any]) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    tool, step = d.get("tool"), d.get("step")
    call = (d.get("agent_call") or {}).get("args")
    made = (
        f"all {d.get('n_matched')} expected state-changing action(s) were made"
        if d.get("n_expected")
        else "the task expected no state-changing call"
    )
    err = (
        f"At step {step} the agent called {tool} ({_args_summary(call)}), a state-changing call the task did not "
        f"expect: {made}, and this extra one changed the state."
    )
    if call is not None:
        err += f" The agent's call, from the trace: {_q(call, 300)}."
    cause = f"The call succeeded, so nothing stopped it; {_CANNOT_TELL} which request or policy the agent misread."
    approach = f"Do not call {tool} here: only the expected changes were wanted."
    n_other = len(d.get("others") or [])
    insight = (
        f"An extra write ({tool} at step {step}) spoiled an otherwise correct run."
        if not n_other
        else f"Extra writes spoiled the run: {tool} at step {step} first, then {n_other} more."
    )
    learnings = [
        ExtractedLearning(
            learning=f"Call {tool} only when the user asked for that change and the policy allows it; this run made an "
            f"unrequested {tool} call.",
            atomicity_score=0.8,
            evidence=f"extra action at step {step}: {tool} {_q(_args_summary(call), 120)}",
            justification="Every expected action was matched; this call matches none.",
        )
    ]
    return err, cause, approach, insight, learnings


def _wrong_info(f: dict[str, Any], d: dict[str, Any]) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    exp = value_text(d.get("expected"))
    err = (
        f"Every expected action matched, but the agent never told the user {exp}, an output the task expected "
        f"(no agent message contains it)."
    )
    cause = f"{_CANNOT_TELL} whether the agent computed a different value or left it out."
    approach = f"State {exp} to the user before ending."
    insight = "The required information, not an action, was what the run missed."
    learnings = [
        ExtractedLearning(
            learning=f"Before ending, give the user the value the request asks for ({exp} in this task).",
            atomicity_score=0.75,
            evidence=f"expected output {_q(exp)} in no agent message",
            justification="tau-bench's rule: each expected output must appear in an agent message.",
        )
    ]
    return err, cause, approach, insight, learnings


_BY_KIND = {
    "wrong_arguments": _wrong_arguments,
    "missing_action": _missing,
    "extra_action": _extra,
    "wrong_information": _wrong_info,
}


def run_draft(f: dict[str, Any], skillbook_ids: list[str], cell: int | None) -> ReflectionDraft:
    diagnosis = diagnosis_of(f, cell)
    failed = _failed(f, diagnosis)
    tools = f.get("tool_calls") or {}
    reasoning = (
        f"Produced by the {NAME}: one sandbox cell inspected the {f.get('format')} trace with the toolkit "
        f"(tool_calls, first_divergence, failing_calls) and every statement below restates what it printed. The "
        f"trace has {f.get('n_steps')} steps and {f.get('n_tool_calls', 0)} tool calls "
        f"({', '.join(f'{k} x{v}' for k, v in tools.items()) or 'none'})."
    )
    if f.get("reward") is not None:
        reasoning += f" Reward {f.get('reward')}."
    if f.get("toolkit_errors"):
        reasoning += " Toolkit errors: " + "; ".join(f["toolkit_errors"][:2]) + "."
    d = f.get("divergence")
    if isinstance(d, dict) and d.get("kind") in _BY_KIND:
        err, cause, approach, insight, learnings = _BY_KIND[str(d["kind"])](f, d)
        err += _others(d) + "".join(
            f" Tool errors on the way: {_failure_text(g)}."
            for g in (f.get("failing_calls") or [])[:3]
            if g.get("tool") != d.get("tool")
        )
        if (
            diagnosis is not None
            and diagnosis.symptom_step is not None
            and diagnosis.step != diagnosis.symptom_step
        ):
            r = _root(f) or {}
            cause = (
                f"Traced back from the symptom at step {diagnosis.symptom_step}: the root cause is step "
                f"{diagnosis.step} ({(r.get('root') or {}).get('reason')}). " + cause
            )
    elif diagnosis is not None and _unrecovered(f):
        g = _unrecovered(f)[0]
        err = _failure_text(g) + "."
        last = f.get("last_assistant_step") or {}
        steps = g.get("steps") or []
        answered_after = isinstance(last.get("index"), int) and steps and last["index"] > max(steps)
        if answered_after:
            err += (
                f" The agent's last message came after that (step {last['index']}, verbatim): "
                f"{_q(last.get('content'), 240)}."
            )
        if g.get("identical_retries"):
            cause = (
                f"The agent called {g.get('tool')} again with the same arguments after the error, so the same "
                "error came back"
                + ("; it then answered without the tool's result." if answered_after else ".")
            )
        else:
            cause = f"The agent did not get {g.get('tool')} to succeed; {_CANNOT_TELL} what the right arguments were."
        approach = f"Read {g.get('tool')}'s error and change what it names before calling it again."
        insight = f"The run stalled on {g.get('tool')}'s errors."
        learnings = [_failure_learning(g)]
    elif diagnosis is not None:
        err, cause, approach, insight, learnings = _other(f, diagnosis)
        err += "".join(
            f" Tool errors on the way: {_failure_text(g)}." for g in (f.get("failing_calls") or [])[:2]
        )
    elif failed:
        err = (
            f"The run failed (reward {f.get('reward')}) but the cell found no divergence it can name: no expected "
            "action differs, no tool call failed, and no rule fired."
        )
        cause, approach = (
            f"Unknown: {_CANNOT_TELL}.",
            "Read the conversation with an LLM reflection (--model).",
        )
        insight, learnings = "The failure is not visible in the trace's structure.", []
    else:
        err, cause, approach, insight, learnings = _no_failure(f)
    return ReflectionDraft(
        reasoning=reasoning,
        error_identification=err,
        root_cause_analysis=cause,
        correct_approach=approach,
        key_insight=insight,
        extracted_learnings=learnings[:4],
        skill_tags=_skill_tags(f, skillbook_ids, failed),
        diagnosis=diagnosis,
    )


def _others(d: dict[str, Any]) -> str:
    """The run's other divergences from the expected actions, after the decisive one."""
    others = [o for o in d.get("others") or [] if isinstance(o, dict)]
    if not others:
        return ""
    listed = "; ".join(
        f"{str(o.get('kind')).replace('_', ' ')} {o.get('tool')} (step {o.get('step')})" for o in others[:4]
    )
    return f" Other divergences from the expected actions: {listed}."


def _other(f: dict[str, Any], diag: Diagnosis) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    """A suspect step (no tool structure) or a wrong final answer: said as the guess it is."""
    s = f.get("suspect") or {}
    parts = []
    if f.get("answer_matches") is False:
        parts.append(
            f"The final answer {_q(f.get('final_answer'))} does not match the ground truth "
            f"{_q(f.get('ground_truth'))} (from the {f.get('ground_truth_source')})."
        )
    if s:
        parts.append(
            f"Suspected decisive step: {s.get('step')} by {s.get('actor')} (rule {s.get('rule')}): "
            f"{s.get('reason')}"
        )
    elif f.get("wrong_value"):
        parts.append(diag.summary)
    err = " ".join(parts) or diag.summary
    cause = (
        f"A rule-based guess, not a verified cause (confidence {diag.confidence}): {_CANNOT_TELL} for certain "
        "which step introduced the error."
    )
    who = f" by {diag.actor}" if diag.actor else ""
    approach = f"Re-check the work at step {diag.step}{who} against the task before building on it."
    insight = (
        f"The first checkable claim that goes wrong is the one to fix (suspected: step {diag.step}{who})."
    )
    learnings = [
        ExtractedLearning(
            learning=f"{diag.actor or 'The agent'} should verify its result at step {diag.step} before handing it on.",
            atomicity_score=0.6,
            evidence=diag.summary[:300],
            justification="A rule-based suspicion; an LLM reflection can confirm it from the conversation.",
        )
    ]
    return err, cause, approach, insight, learnings


def _no_failure(f: dict[str, Any]) -> tuple[str, str, str, str, list[ExtractedLearning]]:
    checked = []
    if f.get("answer_matches") is True:
        checked.append("the final answer matches the ground truth")
    if f.get("has_expected"):
        checked.append("the agent's actions match the expected actions")
    basis = " and ".join(checked) or "no ground truth or expected actions were available to check against"
    err = f"No error found: no tool call failed and {basis}."
    learnings = [
        ExtractedLearning(
            learning="When every tool call succeeds and the result is checked, end the run with that result.",
            atomicity_score=0.6,
            evidence=f"{f.get('n_steps')} steps, 0 failing tool results; {basis}",
            justification="Rule-based: the findings show no failure, so the learning only confirms the approach.",
        )
    ]
    return (
        err,
        "Nothing to diagnose (rule-based check).",
        "Keep the same approach.",
        "This run needs no correction by the checks available.",
        learnings,
    )


def _failed(f: dict[str, Any], diagnosis: Diagnosis | None) -> bool:
    reward = f.get("reward")
    return diagnosis is not None or (reward is not None and reward < 1) or f.get("answer_matches") is False


def _skill_tags(f: dict[str, Any], skillbook_ids: list[str], failed: bool) -> list[SkillTag]:
    """Tag only skills that are both in the prompt's skillbook and cited in the trace."""
    cited = set(f.get("cited_skill_ids") or [])
    checked_ok = f.get("answer_matches") is True or (f.get("has_expected") and not f.get("divergence"))
    tag = "harmful" if failed else "helpful" if checked_ok else "neutral"
    return [SkillTag(id=sid, tag=tag) for sid in dict.fromkeys(skillbook_ids) if sid in cited]
