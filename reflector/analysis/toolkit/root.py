"""The symptom and the root cause of a failed run: where the failure became visible, and the earliest step
from which the run never recovered, found by tracing back from the symptom with `trace_back`'s tools.

`root_cause(run)` first finds the symptom: the first divergence from the task's expected actions (the
wrong or extra write, the missing action), else an unrecovered failing call, else the final answer when it
contradicts the ground truth; a conversation without tool calls goes to `suspect_mistake`, whose rules
trace a wrong answer back the same way. It then traces back from the symptom, and names the rule that
placed the root (`rule`), each of which rests on something the trace shows, never on a step's position,
an agent's name or a dataset's statistics:

- `made_up`: the wrong value (an argument that differs from the expected one) first appears in the
  agent's own step, before the symptom: the agent introduced it there (invented or computed it);
- `misread_output` / `misunderstood_request`: the right value was in an earlier tool output / user
  message, and the first agent step after it that uses the wrong value without the right one is the root
  (a later message or call using another value than the output held);
- `wrong_source`: the wrong value came from a tool output and the right one was never seen: the root is
  the agent's first use of it (a value taken from the wrong record);
- `repeated_attempt`: the same wrong argument was already sent in an earlier call of the same tool;
- `unsupported_value`: a call argument no earlier step supports (`contradictions`), used at the symptom;
- `refusal`: an expected action was never taken and the agent had declined or denied something before
  ("I'm unable to", "cannot be", "unfortunately"): the first such message;
- `unconfirmed_write`: the symptom write breaks the policy's confirmation rule (`requirements`);
- `symptom`: nothing earlier explains it; the root is the symptom itself ("cannot tell" further back).

Without expected actions the symptom is the first unrecovered failing call, else a final answer the
ground truth contradicts (its wrong values are traced as above: `made_up`, `wrong_source`), else, in a
run known to have failed (reward < 1), its last state-changing call.

The earliest of the steps these rules place is the root (the issue's definition: the earliest step from
which the run never recovered). Every placement says what it rests on (`reason`, with verbatim snippets).
"""

from __future__ import annotations

import re
from typing import Any

from reflector.analysis.answers import compare_answers
from reflector.analysis.toolkit.actors import POSITIONAL, final_statement, suspect_mistake
from reflector.analysis.toolkit.calls import NO_EFFECT_TOOLS, check_run, is_write, iter_steps, parse_args
from reflector.analysis.toolkit.divergence import first_divergence
from reflector.analysis.toolkit.failing import failing_calls
from reflector.analysis.toolkit.policy import MAX_RULES, _requirements
from reflector.analysis.toolkit.trace_back import (
    _contradictions,
    _distinctive,
    _has,
    _leaves,
    _snippet,
    _spans,
    canonical,
    step_source,
    text_keys,
)

__all__ = ["root_cause", "ROOT_RULES"]

ROOT_RULES = (
    "made_up",
    "misread_output",
    "misunderstood_request",
    "wrong_source",
    "repeated_attempt",
    "unsupported_value",
    "refusal",
    "unconfirmed_write",
    "symptom",
)
# How sure each placement is, by what it rests on (not measured on any labelled set): a value traced to
# where it was introduced is direct evidence; a refusal before a missing action is circumstantial.
_CONFIDENCE = {
    "made_up": 0.7,
    "misread_output": 0.65,
    "misunderstood_request": 0.65,
    "wrong_source": 0.6,
    "repeated_attempt": 0.75,
    "unsupported_value": 0.55,
    "refusal": 0.4,
    "unconfirmed_write": 0.6,
}
_REFUSAL = re.compile(
    r"\b(?:I'?m unable to|I am unable to|I (?:can ?not|can't|could not|couldn't|am not able to)\b|unable to "
    r"(?:process|proceed|provide|access|assist|find|modify|cancel|change)|(?:is|are|was) not (?:possible|"
    r"allowed|eligible|permitted)|not eligible|cannot be (?:modified|changed|cancell?ed|refunded|done)"
    r"|unfortunately|I'?m sorry, but)",
    re.IGNORECASE,
)


def _text_of(s: dict[str, Any]) -> str:
    calls = "\n".join(
        f"{c['name']}({c['arguments'] if isinstance(c['arguments'], str) else ''})" for c in s["tool_calls"]
    )
    return "\n".join(x for x in (s["content"], calls) if x)


def _mentions(key: str, s: dict[str, Any]) -> tuple[int, int, str] | None:
    """Where step `s` (content or calls) mentions `key`'s value. The step's text and values are worked out
    once and kept on the step (these are `root_cause`'s own copies of the steps)."""
    memo = s.get("_rr_text")
    if memo is None:
        text = _text_of(s)
        memo = s["_rr_text"] = (text, text.lower(), _spans(text))
    text, low, spans = memo
    hit = _has(key, text, low, spans)
    return (hit[0], hit[1], text) if hit else None


def _place(rule: str, s: dict[str, Any], why: str, hit: tuple[int, int, str] | None = None) -> dict[str, Any]:
    quote = _snippet(hit[2], hit[0], hit[1]) if hit else " ".join(s["content"].split())[:160]
    return {
        "step": s["index"],
        "actor": s["actor"],
        "rule": rule,
        "reason": f"{rule}: step {s['index']} {why}",
        "quote": quote,
    }


def _differences(d: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    diffs = [
        (str(x.get("path")), x.get("actual"), x.get("expected"))
        for x in d.get("differences") or []
        if isinstance(x, dict)
    ]
    if not diffs and d.get("kind") == "wrong_arguments":
        diffs = [(str(d.get("argument")), d.get("actual"), d.get("expected"))]
    return diffs


def _trace_value(
    steps: list[dict[str, Any]], upto: int, path: str, actual: Any, expected: Any, tool: str | None
) -> list[dict[str, Any]]:
    """Where the wrong value `actual` (at `path` of a `tool` call, the task expecting `expected`) came from."""
    found: list[dict[str, Any]] = []
    before = [s for s in steps if s["index"] < upto]
    # the same argument already sent in an earlier call of the same tool (a failed attempt, a retry)
    for s in before:
        for c in s["tool_calls"]:
            if c["name"] != tool:
                continue
            leaves = {p: v for p, _l, v in _leaves(parse_args(c["arguments"]))}
            if (
                path in leaves
                and canonical(leaves[path]) == canonical(actual)
                and canonical(actual) is not None
            ):
                found.append(_place("repeated_attempt", s, f"already called {tool} with {path} = {actual!r}"))
                break
        if found:
            break
    a_key, e_key = canonical(actual), canonical(expected)
    if a_key is None or not _distinctive(a_key):
        return found
    first_a = next(((s, h) for s in steps if s["index"] <= upto and (h := _mentions(a_key, s))), None)
    first_e = None
    if e_key is not None and _distinctive(e_key):
        first_e = next(
            ((s, h) for s in before if step_source(s) in ("tool", "user") and (h := _mentions(e_key, s))),
            None,
        )
    if first_a is not None and step_source(first_a[0]) == "agent" and first_a[0]["index"] < upto:
        where = (
            f"; the expected {expected!r} was in the {step_source(first_e[0])} step {first_e[0]['index']}"
            if first_e
            else ""
        )
        found.append(
            _place(
                "made_up",
                first_a[0],
                f"is the first to mention {actual!r} (the agent introduced "
                f"it; {path} expected {expected!r}{where})",
                first_a[1],
            )
        )
        return found
    if first_e is not None:
        e_step = first_e[0]["index"]
        rule = "misread_output" if step_source(first_e[0]) == "tool" else "misunderstood_request"
        for s in steps:
            if not (e_step < s["index"] <= upto) or step_source(s) != "agent":
                continue
            hit = _mentions(a_key, s)
            if hit and not _mentions(e_key or "", s):
                found.append(
                    _place(
                        rule,
                        s,
                        f"uses {actual!r} where the {step_source(first_e[0])} step {e_step} "
                        f'said {expected!r} (verbatim there: "{_snippet(first_e[1][2], first_e[1][0], first_e[1][1])}")',
                        hit,
                    )
                )
                break
        return found
    if first_a is not None and step_source(first_a[0]) == "tool":
        src = first_a[0]["index"]
        for s in steps:
            if src < s["index"] <= upto and step_source(s) == "agent" and (hit := _mentions(a_key, s)):
                found.append(
                    _place(
                        "wrong_source",
                        s,
                        f"uses {actual!r}, read from the tool output at step {src}; "
                        f"the expected {expected!r} appears in no earlier output",
                        hit,
                    )
                )
                break
    return found


def _refusal(steps: list[dict[str, Any]], upto: int) -> dict[str, Any] | None:
    for s in steps:
        if s["index"] > upto:
            break
        if step_source(s) == "agent" and not s["tool_calls"]:
            m = _REFUSAL.search(s["content"])
            if m:
                return _place(
                    "refusal",
                    s,
                    "declines or denies something, and the expected action is never taken",
                    (m.start(), m.end(), s["content"]),
                )
    return None


def _symptom_of_divergence(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": d.get("step"),
        "kind": d.get("kind"),
        "tool": d.get("tool"),
        "argument": d.get("argument"),
        "actual": d.get("actual"),
        "expected": d.get("expected"),
        "what": d.get("where"),
    }


def root_cause(run: Any) -> dict[str, Any] | None:
    """`{"symptom": {"step", "kind", "tool", "argument", "actual", "expected", "what"}, "root": {"step",
    "actor", "rule", "reason", "quote"}, "same": bool, "confidence", "candidates": [other placements]}`,
    or None when the run shows no failure the toolkit can locate. See the module doc for the rules."""
    run = check_run(run, "root_cause")
    steps = list(iter_steps(run, "root_cause"))
    if not steps:
        return None
    by_index = {s["index"]: s for s in steps}
    d = (
        first_divergence(run)
        if isinstance(dict.get(run, "expected_actions"), (list, tuple)) or dict.get(run, "expected_outputs")
        else None
    )
    candidates: list[dict[str, Any]] = []
    if isinstance(d, dict) and isinstance(d.get("step"), int):
        symptom = _symptom_of_divergence(d)
        upto = int(d["step"])
        if d.get("kind") in ("wrong_arguments", "extra_action"):
            for path, actual, expected in _differences(d):
                candidates += _trace_value(steps, upto, path, actual, expected, d.get("tool"))
        if d.get("kind") == "missing_action":
            r = _refusal(steps, upto)
            if r:
                candidates.append(r)
    elif not any(s["tool_calls"] for s in steps):
        return _conversation_root(run, steps)
    else:
        generic = _generic_symptom(run, steps)
        if generic is None:
            return None
        symptom = generic
        upto = int(symptom["step"])
        if symptom["kind"] == "wrong_information":
            traced = _trace_answer(run, steps, upto)
            if traced:
                candidates.append(traced)
    at = by_index.get(upto)
    for c in _contradictions(steps, 200):
        if c["step"] > upto:
            continue
        key = canonical(c["value"])
        linked = at is not None and key is not None and _mentions(key, at) is not None
        s = by_index[c["step"]]
        if c["where"] == "message" and linked and c["step"] < upto:
            candidates.append(
                _place(
                    "made_up",
                    s,
                    f"is the first to state {c['value']!r}, which no earlier step "
                    f"supports and the symptom step {upto} uses",
                )
            )
            break
        if c["where"] == "call" and (c["step"] == upto or linked):
            candidates.append(
                _place(
                    "unsupported_value",
                    s,
                    f"calls {c['tool']} with {c['argument']} = "
                    f"{c['value']!r}, which no earlier step supports ({c['kind']})",
                )
            )
            break
    if at is not None and at["tool_calls"]:
        for r in _requirements(run, steps, MAX_RULES)["rules"]:
            if r["kind"] == "confirm" and upto in r["broken"]:
                candidates.append(
                    _place(
                        "unconfirmed_write",
                        at,
                        f'acts without the user\'s confirmation the policy requires ("{r["rule"][:120]}")',
                    )
                )
                break
    candidates.sort(key=lambda c: (c["step"], ROOT_RULES.index(c["rule"])))
    if candidates:
        root = candidates[0]
    else:
        s = at or steps[-1]
        root = _place("symptom", s, "is where the failure shows; no earlier step in the trace explains it")
    return {
        "symptom": symptom,
        "root": root,
        "same": root["step"] == symptom["step"],
        "confidence": _CONFIDENCE.get(root["rule"], 0.3),
        "candidates": candidates[1:6],
    }


def _conversation_root(run: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A conversation without tool calls (a multi-agent chat): the symptom is the final answer's step when
    it contradicts the ground truth; the root, what `suspect_mistake`'s evidence rules place."""
    final, truth = dict.get(run, "final_answer"), dict.get(run, "ground_truth")
    wrong = isinstance(final, str) and isinstance(truth, str) and compare_answers(final, truth)[0] is False
    stated = final_statement(steps)
    if stated is not None:  # "FINAL ANSWER: x" said before a closing message: that is the answer
        final = steps[stated]["content"]
    last = (
        (steps[stated] if stated is not None else None)
        or next((s for s in reversed(steps) if s["content"].strip() == (final or "").strip()), None)
        or next((s for s in reversed(steps) if step_source(s) == "agent" and s["content"].strip()), None)
    )
    guess = suspect_mistake(run)
    if last is None or not (wrong or guess):
        return None
    symptom = {
        "step": last["index"],
        "kind": "wrong_information" if wrong else "reasoning_error",
        "tool": None,
        "argument": None,
        "actual": (final or "")[:200] or None,
        "expected": (truth or "")[:200] or None,
        "what": "the final answer" + ("" if wrong else " (not compared: no ground truth)"),
    }
    if guess is not None:
        root = {
            "step": guess["step"],
            "actor": guess["actor"],
            "rule": guess["rule"],
            "reason": guess["reason"],
            "quote": guess["reason"].rpartition(": ")[2].strip('"'),
            "kind": guess["kind"],
        }
        conf = float(guess["confidence"])
    else:
        root = _place(
            "symptom",
            last,
            "states the final answer, which the ground truth contradicts; no earlier "
            "step could be traced as its cause",
        )
        conf = 0.2
    return {
        "symptom": symptom,
        "root": root,
        "same": root["step"] == symptom["step"],
        "confidence": conf,
        "candidates": [
            {k: o[k] for k in ("step", "actor", "rule", "reason")}
            for o in (guess or {}).get("others", [])
            if o.get("rule") not in POSITIONAL
        ][:5],
    }


def _generic_symptom(run: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Without expected actions: the first failing call never recovered from, else the final answer when
    it contradicts the ground truth."""
    for g in failing_calls(run):
        if g.get("recovered") is False and g.get("attempts"):
            first = g["attempts"][0]
            return {
                "step": first.get("step"),
                "kind": "tool_error_mishandled",
                "tool": g.get("tool"),
                "argument": None,
                "actual": first.get("error"),
                "expected": None,
                "what": "a failing call no later call of the tool recovered from",
            }
    final, truth = dict.get(run, "final_answer"), dict.get(run, "ground_truth")
    if isinstance(final, str) and isinstance(truth, str) and compare_answers(final, truth)[0] is False:
        last = next((s for s in reversed(steps) if step_source(s) == "agent" and s["content"].strip()), None)
        if last is not None:
            return {
                "step": last["index"],
                "kind": "wrong_information",
                "tool": None,
                "argument": None,
                "actual": final[:200],
                "expected": truth[:200],
                "what": "the final answer",
            }
    reward = dict.get(run, "reward")
    if isinstance(reward, (int, float)) and not isinstance(reward, bool) and reward < 1:
        writes = [
            (s, c)
            for s in steps
            for c in s["tool_calls"]
            if c["name"] and is_write(c["name"]) and c["name"] not in NO_EFFECT_TOOLS
        ]
        if writes:
            s, c = writes[-1]
            return {
                "step": s["index"],
                "kind": "other",
                "tool": c["name"],
                "argument": None,
                "actual": None,
                "expected": None,
                "what": f"the last state-changing call of a failed run (reward {reward})",
            }
    return None


def _trace_answer(run: dict[str, Any], steps: list[dict[str, Any]], upto: int) -> dict[str, Any] | None:
    """Where the wrong final answer's values (those the ground truth and the question do not hold) were
    introduced: an agent step that first states one (`made_up`), or the agent's first use of one a tool
    output gave (`wrong_source`)."""
    final, truth, question = (dict.get(run, k) for k in ("final_answer", "ground_truth", "question"))
    if not (isinstance(final, str) and isinstance(truth, str)):
        return None
    given = text_keys(truth) | (text_keys(question) if isinstance(question, str) else set())
    keys = [k for k in sorted(text_keys(final)) if k not in given and _distinctive(k)]
    best: dict[str, Any] | None = None
    for key in keys[:6]:
        first = next(
            (
                (s, h)
                for s in steps
                if s["index"] <= upto and step_source(s) in ("agent", "tool") and (h := _mentions(key, s))
            ),
            None,
        )
        if first is None:
            continue
        s, hit = first
        value = key.partition(":")[2]
        if step_source(s) == "agent":
            found = _place(
                "made_up", s, f"is the first to state {value!r}, a value of the wrong final answer", hit
            )
        else:
            use = next(
                (
                    (t, h)
                    for t in steps
                    if s["index"] < t["index"] <= upto
                    and step_source(t) == "agent"
                    and (h := _mentions(key, t))
                ),
                None,
            )
            if use is None:
                continue
            found = _place(
                "wrong_source",
                use[0],
                f"uses {value!r}, read from the tool output at step {s['index']}: "
                "a value of the wrong final answer",
                use[1],
            )
        if best is None or found["step"] < best["step"]:
            best = found
    return best
