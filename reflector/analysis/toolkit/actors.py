"""Who did what in a multi-agent conversation, and a rule-based guess of the step where it went wrong.

Why: in a multi-agent run (an AutoGen / CaptainAgent group chat, Who&When) the question an engineer asks
is "which agent made the decisive mistake, and when", and the trace has no tool-call structure to
compare with expected actions: agents write code in their messages, an executor agent answers with
`exitcode: N` and the output. `actors` and `timeline` (`reflector.analysis.toolkit.actor_views`) give the
per-agent view of the conversation (the speaker is the step's `actor`, named by one rule for every trace
dialect: `reflector.analysis.traces.agents`); `suspect_mistake` traces the mistake back from the evidence
in the conversation, and says which rule placed it. It reads the conversation's values and wording, never
its meaning, and never prefers a step or an agent because of its position, its name or a dataset's label
statistics (issue 28).

The rules (each names itself in `rule`):

- `fabricated_data`: an agent step (after the opening task message) that says it invents its input:
  simulated, hypothetical, placeholder or sample data, "let's assume". Everything built on it is wrong
  whatever its method.
- `answer_origin`: the wrong final answer's values (numbers, dates, ids the ground truth does not hold and
  the question does not give; else its stated text) traced to the first step that states them
  (`trace_back.provenance`'s matching); an executor's output is its code author's.
- `wrong_answer`: the first step stating an answer of the ground truth's kind that contradicts it
  (compared by `reflector.analysis.answers.compare_answers`, numbers as numbers); an executor's output is the
  code author's.
- `unfixed_failure`: the first failed execution whose author never gets a successful run afterwards.
- `first_action` (the first agent step that writes code) and `first_claim` (the first agent step after
  the task message): leads by position only (`POSITIONAL`), callable by name, never the guess.

`suspect_mistake` returns the earliest step placed by the rules of `COMBINATION` (`fabricated_data`,
`answer_origin`, `wrong_answer`, `unfixed_failure`; ties in that order): the root cause is the earliest
step from which the run never recovered. The other rules' findings are in `others`. None when no rule
of the combination fires: "cannot tell" is an answer. Confidences say what kind of evidence a rule rests
on, not how often it matched a labelled set.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from reflector.analysis.answers import compare_answers
from reflector.analysis.toolkit.actor_views import _WS, actors, actors_note, timeline
from reflector.analysis.toolkit.calls import check_run, iter_steps
from reflector.analysis.toolkit.trace_back import _distinctive, _family, _has, canonical, text_keys

__all__ = [
    "actors",
    "actors_note",
    "final_statement",
    "timeline",
    "suspect_mistake",
    "RULES",
    "COMBINATION",
    "POSITIONAL",
    "SCAN_STEPS",
    "QUOTE_CHARS",
]

SCAN_STEPS = (
    2_000  # steps read by `suspect_mistake`: its rules look for early steps (a lazy view stays cheap)
)
QUOTE_CHARS = 120  # longest verbatim quote of a step in a reason

_FENCE = re.compile(r"```")
_CODE_LINE = re.compile(r"```[^\n]*\n\s*(\S)")  # the first line of code in a fenced block
# an executor's reply: AutoGen's code executor opens with the exit code, or says there was nothing to run
_EXECUTOR_REPLY = re.compile(
    r"\A\s*(?:exitcode:\s*-?\d+|there is no code from the last \d+ message)", re.IGNORECASE
)
_FAILED_RUN = re.compile(r"\A\s*exitcode:\s*(?!0\b)-?\d+|Traceback \(most recent call last\)", re.IGNORECASE)
_SUCCEEDED_RUN = re.compile(r"\A\s*exitcode:\s*0\b", re.IGNORECASE)
_END_TOKEN = re.compile(r"\W*terminate\W*", re.IGNORECASE)
_FABRICATED = re.compile(
    r"\b(?:hypothetical(?:ly)?|hypothesi[sz]e|placeholder|simulat(?:e|ed|ing)"
    r"|(?:sample|dummy|mock|fake|synthetic) (?:data|dataset|values?)|for (?:demonstration|illustration)"
    r"|let'?s assume|we (?:will|can|must|need to) assume|made[- ]up|replace (?:this |it )?with (?:the )?actual)\b",
    re.IGNORECASE,
)
# a stated answer, outside code: "the answer is X", "final answer: X", "the result is X", "\boxed{X}"
# (X not a verdict on something else: "the result is correct", "the answer is as follows")
_CLAIM = re.compile(
    r"\b(?:final answer|answer|result|conclusion)[ \t]*(?:is|was|:)[ \t]*(?!(?:correct|accurate|consistent|verified"
    r"|valid|confirmed|reliable|as follows|below|shown|not|that|the following|based|well|now|also|then)\b)(\S[^\n]{0,119})",
    re.IGNORECASE,
)
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^}\n]{1,120})\}")

# How sure each rule's placement is, by the kind of evidence it rests on (issue 28: no dataset's label
# statistics): an agent saying it invents data, or the wrong answer's value traced to where it first
# appears, is direct; a failure never fixed may not be what sank the answer; the positional leads are weak.
_CONFIDENCE = {
    "fabricated_data": 0.5,
    "answer_origin": 0.5,
    "wrong_answer": 0.4,
    "unfixed_failure": 0.35,
    "first_action": 0.2,
    "first_claim": 0.15,
}


# -- the rules ---------------------------------------------------------------------------------------
class _Conversation:
    """The first `SCAN_STEPS` steps, read once, with what the rules ask of each: who speaks, whether it is
    an executor's reply, whether it holds code."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.steps = list(islice(iter_steps(run, "suspect_mistake"), SCAN_STEPS))
        truth = dict.get(run, "ground_truth")
        self.truth = str.__str__(truth) if isinstance(truth, str) and truth.strip() else None
        final = dict.get(run, "final_answer")
        self.final = str.__str__(final) if isinstance(final, str) and final.strip() else None
        stated = final_statement(self.steps)
        if stated is not None:  # "FINAL ANSWER: x" said before a closing message (Magentic-One, GAIA)
            self.final = self.steps[stated]["content"]
        question = dict.get(run, "question")
        self.question = _WS.sub(" ", str.__str__(question)).strip()[:80] if isinstance(question, str) else ""
        # an actor that ever replies like a code executor is an executor in all its steps (AutoGen's
        # Computer_terminal also says "There is no code..." when there was nothing to run)
        self.executors = {s["actor"] for s in self.steps if s["actor"] is not None and _is_exec_reply(s)}
        self.has_calls = any(s["tool_calls"] for s in self.steps)

    def is_executor(self, s: dict[str, Any]) -> bool:
        return _is_exec_reply(s) or (s["actor"] is not None and s["actor"] in self.executors)

    def is_agent(self, s: dict[str, Any]) -> bool:
        """A step an agent took and said something in (not an executor, a system prompt or a bare TERMINATE)."""
        text = s["content"].strip()
        return (
            not self.is_executor(s)
            and s["role"] != "system"
            and bool(text)
            and _END_TOKEN.fullmatch(text) is None
        )

    def is_opening(self, pos: int) -> bool:
        """Whether the step at `pos` hands out the task: the first step, when it is a user/system message
        that names no agent or restates the run's question."""
        if pos != 0 or not self.steps:
            return False
        s = self.steps[0]
        if s["actor"] is None and s["role"] in ("user", "system", "human"):
            return True
        return bool(self.question) and self.question in _WS.sub(" ", s["content"])

    def author(self, pos: int) -> int | None:
        """Position of the agent step whose code the executor step at `pos` ran (the last agent step before it)."""
        return next((j for j in range(pos - 1, -1, -1) if self.is_agent(self.steps[j])), None)


_FINAL_STATED = re.compile(r"\bfinal answer\s*(?:is|:)", re.IGNORECASE)


def final_statement(steps: list[dict[str, Any]]) -> int | None:
    """Position of the last agent step that states a final answer ("FINAL ANSWER: x", "the final answer is
    x"), outside code; None when no step does."""
    for pos in range(len(steps) - 1, -1, -1):
        s = steps[pos]
        if (
            s["role"] != "system"
            and not _is_exec_reply(s)
            and _FINAL_STATED.search(_FENCED.sub("\n", s["content"]))
        ):
            return pos
    return None


def _is_exec_reply(s: dict[str, Any]) -> bool:
    return (
        s["role"] == "tool" or s["tool_name"] is not None or _EXECUTOR_REPLY.match(s["content"]) is not None
    )


def _quote(text: str, rx: re.Pattern[str] | None = None) -> str:
    """A verbatim line of `text`, at most `QUOTE_CHARS`: the line where `rx` matches first (its first
    group when it has one), else the first non-empty line."""
    m = rx.search(text) if rx is not None else None
    if m is not None:
        at = m.start(1) if rx is not None and rx.groups else m.start()
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        line = text[start : end if end >= 0 else len(text)].strip()
        if line:
            return line[:QUOTE_CHARS]
    return next((ln.strip()[:QUOTE_CHARS] for ln in text.splitlines() if ln.strip()), "")


def _finding(
    c: _Conversation, pos: int, rule: str, kind: str, why: str, rx: re.Pattern[str] | None = None
) -> dict[str, Any]:
    s = c.steps[pos]
    who = s["actor"] or s["role"]
    return {
        "step": s["index"],
        "actor": s["actor"],
        "kind": kind,
        "reason": f'{rule}: step {s["index"]} ({who}) {why}: "{_quote(s["content"], rx)}"',
        "rule": rule,
        "confidence": _CONFIDENCE[rule],
    }


def _first_action(c: _Conversation) -> dict[str, Any] | None:
    for pos, s in enumerate(c.steps):
        if c.is_agent(s) and _FENCE.search(s["content"]):
            kind, why = (
                "reasoning_error",
                "is the first agent step that writes code, committing the team to a method",
            )
            failed = _run_failed(c, pos)
            if failed is not None and not _fixed_later(c, pos, s["actor"]):
                kind, why = (
                    "tool_error_mishandled",
                    (
                        f"is the first agent step that writes code; its run failed "
                        f"(step {c.steps[failed]['index']}) and none of its author's later code ran"
                    ),
                )
            elif _FABRICATED.search(s["content"]):
                kind, why = "wrong_information", "is the first agent step that writes code, on invented data"
            return _finding(c, pos, "first_action", kind, why, _CODE_LINE)
    return None


def _first_claim(c: _Conversation) -> dict[str, Any] | None:
    agent = [pos for pos, s in enumerate(c.steps) if c.is_agent(s)]
    after = [pos for pos in agent if not c.is_opening(pos)]
    pick = after[0] if after else agent[0] if agent else None
    if pick is None:
        return None
    return _finding(
        c, pick, "first_claim", "wrong_information", "is the first agent step after the task message"
    )


def _wrong_answer(c: _Conversation) -> dict[str, Any] | None:
    if c.truth is None:
        return None
    truth_kinds = {_family(k) for k in text_keys(c.truth)}
    for pos, s in enumerate(c.steps):
        executed = c.is_executor(s) and _SUCCEEDED_RUN.match(s["content"]) is not None
        if c.is_opening(pos) or not (c.is_agent(s) or executed):
            continue
        for claim in _claims(s["content"]):
            if truth_kinds and not {_family(k) for k in text_keys(claim)} & truth_kinds:
                continue  # "the first result is exampletown.gov" states no answer of the truth's kind
            if compare_answers(claim, c.truth)[0] is False:
                if c.is_executor(s):
                    author = c.author(pos)
                    if author is not None:
                        return _finding(
                            c,
                            author,
                            "wrong_answer",
                            "reasoning_error",
                            f"wrote the code whose output (step {s['index']}) states an answer "
                            f"that contradicts the ground truth ({claim[:40]!r})",
                            _CODE_LINE,
                        )
                return _finding(
                    c,
                    pos,
                    "wrong_answer",
                    "wrong_information",
                    "is the first to state an answer that contradicts the ground truth",
                    re.compile(re.escape(claim)),
                )
    return None


def _claims(text: str) -> Iterator[str]:
    """The answers `text` states, in its prose (code blocks are left out: `result = f(x)` states nothing)."""
    prose = _FENCED.sub("\n", text)
    for rx in (_CLAIM, _BOXED):
        for m in rx.finditer(prose):
            claim = m.group(1).strip()
            if any(ch.isalnum() for ch in claim):
                yield claim


def _fabricated(c: _Conversation) -> dict[str, Any] | None:
    for pos, s in enumerate(c.steps):
        if c.is_agent(s) and not c.is_opening(pos) and _FABRICATED.search(s["content"]):
            return _finding(
                c,
                pos,
                "fabricated_data",
                "wrong_information",
                "is the first agent step that invents its input",
                _FABRICATED,
            )
    return None


def _wrong_values(c: _Conversation) -> list[str]:
    """The canonical values (numbers, dates, ids; else the stated text) of the final answer that the ground
    truth does not hold and the question does not give: what is wrong in it."""
    if c.final is None or c.truth is None or compare_answers(c.final, c.truth)[0] is not False:
        return []
    claims = list(_claims(c.final)) or [ln.strip() for ln in c.final.splitlines() if ln.strip()][-1:]
    given = text_keys(c.truth) | text_keys(c.question)
    truth_low = c.truth.lower()
    out: list[str] = []
    for claim in claims:
        keys = [k for k in sorted(text_keys(claim)) if k not in given and _distinctive(k)]
        if not keys and len(claim) <= 60:
            key = canonical(claim.rstrip(". "))
            if key is not None and key[5:] not in truth_low:
                keys = [key]
        out += [k for k in keys if k not in out]
    return out[:6]


def _answer_origin(c: _Conversation) -> dict[str, Any] | None:
    """Where the wrong final answer's value was introduced: the first step that states it (after the task
    message); a code executor's output is its code author's."""
    best: tuple[int, str] | None = None
    for key in _wrong_values(c):
        for pos, s in enumerate(c.steps):
            if c.is_opening(pos) or s["role"] == "system":
                continue
            text = s["content"]
            if _has(key, text, text.lower()):
                if c.is_executor(s) and c.author(pos) is None:
                    continue  # an output nobody's code produced (a bare executor reply) introduces nothing
                if best is None or pos < best[0]:
                    best = (pos, key)
                break
    if best is None:
        return None
    pos, key = best
    value = key.partition(":")[2]
    if c.is_executor(c.steps[pos]):
        author = c.author(pos)
        if author is not None:
            return _finding(
                c,
                author,
                "answer_origin",
                "reasoning_error",
                f"wrote the code whose output (step {c.steps[pos]['index']}) is the first to give "
                f"{value!r}, the wrong final answer's value",
                _CODE_LINE,
            )
    return _finding(
        c,
        pos,
        "answer_origin",
        "wrong_information",
        f"is the first to state {value!r}, the wrong final answer's value",
        re.compile(re.escape(value), re.IGNORECASE),
    )


def _unfixed_failure(c: _Conversation) -> dict[str, Any] | None:
    for pos, s in enumerate(c.steps):
        if c.is_executor(s) and _FAILED_RUN.search(s["content"]):
            author = c.author(pos)
            if author is not None and not _fixed_later(c, pos, c.steps[author]["actor"]):
                return _finding(
                    c,
                    author,
                    "unfixed_failure",
                    "tool_error_mishandled",
                    f"wrote code that failed (step {s['index']}), and none of its author's later code ran",
                    _CODE_LINE,
                )
    return None


def _run_failed(c: _Conversation, pos: int) -> int | None:
    """Position of the failed execution of the code written at `pos` (the executor replies before the next agent step)."""
    for j in range(pos + 1, len(c.steps)):
        s = c.steps[j]
        if not c.is_executor(s):
            return None
        if _FAILED_RUN.search(s["content"]):
            return j
    return None


def _fixed_later(c: _Conversation, pos: int, actor: str | None) -> bool:
    """Whether code by `actor` ran successfully after `pos`."""
    for j in range(pos + 1, len(c.steps)):
        s = c.steps[j]
        if c.is_executor(s) and _SUCCEEDED_RUN.match(s["content"]):
            author = c.author(j)
            if author is not None and author > pos and c.steps[author]["actor"] == actor:
                return True
    return False


RULES: dict[str, Callable[[_Conversation], dict[str, Any] | None]] = {
    "answer_origin": _answer_origin,
    "first_action": _first_action,
    "first_claim": _first_claim,
    "wrong_answer": _wrong_answer,
    "fabricated_data": _fabricated,
    "unfixed_failure": _unfixed_failure,
}
# the rules that rest on evidence in the conversation; the earliest step any of them places is the guess
COMBINATION: tuple[str, ...] = ("fabricated_data", "answer_origin", "wrong_answer", "unfixed_failure")
POSITIONAL: tuple[str, ...] = ("first_action", "first_claim")  # leads by position only: never the guess


def suspect_mistake(run: Any, rule: Any = None) -> dict[str, Any] | None:
    """A rule-based guess of the decisive mistake of a conversation without tool-call structure:
    `{"step", "actor", "kind", "reason", "rule", "confidence", "others": [<what the other rules found>]}`.

    `rule=None` applies `COMBINATION` (see the module docstring); a name of `RULES` applies that rule
    alone. None when no rule fires, and when the run has structured tool calls (use `first_divergence`
    and `failing_calls` there). The guess is a starting point: check the step it names."""
    run = check_run(run, "suspect_mistake")
    if rule is not None and (not isinstance(rule, str) or str.__str__(rule) not in RULES):
        raise ValueError(f"suspect_mistake: rule must be None or one of {', '.join(RULES)}, not {rule!r}")
    c = _Conversation(run)
    if c.has_calls:
        return None
    if rule is not None:
        return RULES[str.__str__(rule)](c)
    findings = {name: RULES[name](c) for name in RULES}
    fired = [f for f in (findings[name] for name in COMBINATION) if f is not None]
    if not fired:
        return None
    best = min(fired, key=lambda f: (f["step"], COMBINATION.index(f["rule"])))
    others = [
        {k: f[k] for k in ("rule", "step", "actor", "kind", "reason")}
        for name, f in findings.items()
        if f is not None and name != best["rule"]
    ]
    return {**best, "others": others}
