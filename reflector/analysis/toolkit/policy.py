"""`requirements(run)`: the imperative rules of the system prompt / policy (`must`, `before`, `never`, `only if`,
...), each with the steps that honour or break it up to the first state-changing call (see `trace_back`)."""

from __future__ import annotations

import re
from typing import Any

from reflector.analysis.toolkit.calls import (
    NO_EFFECT_TOOLS,
    check_limit,
    check_run,
    is_write,
    iter_steps,
)
from reflector.analysis.toolkit.trace_back import step_source

__all__ = ["requirements", "MAX_RULES"]

MAX_RULES = 60  # rules `requirements` reads from a policy


_RULE_CHARS = 300


_RULE_WORDS = re.compile(
    r"\b(must|before|never|only if|only when|do not|don't|should not|must not|cannot|"
    r"can not|not allowed|always|at most|at least|required?|first)\b",
    re.IGNORECASE,
)


_CONFIRM = re.compile(r"\bconfirm(?:ation|ed|s)?\b|\bexplicit", re.IGNORECASE)


_BEFORE = re.compile(r"\bbefore\b|\bfirst\b|\bprior to\b", re.IGNORECASE)


_NEVER = re.compile(
    r"\bnever\b|\bdo not\b|\bdon't\b|\bshould not\b|\bmust not\b|\bcannot\b|\bcan not\b"
    r"|\bnot allowed\b",
    re.IGNORECASE,
)


_YES = re.compile(
    r"\b(yes|yeah|yep|confirm(?:ed)?|proceed|go ahead|sure|ok(?:ay)?|please do|correct|"
    r"that'?s right|do it|sounds good)\b",
    re.IGNORECASE,
)


_GENERIC_TOKENS = {
    "get",
    "search",
    "list",
    "find",
    "read",
    "lookup",
    "details",
    "info",
    "by",
    "id",
    "all",
    "the",
    "to",
    "of",
    "for",
    "and",
    "a",
    "an",
    "new",
    "current",
    "data",
    "tool",
}


# -- requirements -------------------------------------------------------------------------------------
def _policy_texts(run: dict[str, Any], steps: list[dict[str, Any]]) -> list[tuple[int | None, str]]:
    """(step, text) of the run's system prompts: its system steps, and a multi-agent trace's
    `system_prompt` (one text, or one per agent)."""
    out: list[tuple[int | None, str]] = []
    for s in steps:
        if s["role"] == "system" and s["content"].strip():
            out.append((s["index"], s["content"]))
    raw = dict.get(run, "raw")
    if isinstance(raw, dict):
        prompt = dict.get(raw, "system_prompt")
        if isinstance(prompt, str):
            out.append((None, str.__str__(prompt)))
        elif isinstance(prompt, dict):
            for v in dict.values(dict.copy(prompt)):
                if isinstance(v, str):
                    out.append((None, str.__str__(v)))
    return out


def _rules(text: str) -> list[str]:
    rules: list[str] = []
    for line in text.splitlines():
        line = line.strip(" \t-*#>")
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", line):
            sentence = sentence.strip()
            if len(sentence) >= 12 and _RULE_WORDS.search(sentence) and sentence not in rules:
                rules.append(sentence[:_RULE_CHARS])
    return rules


def _tool_words(name: str) -> list[str]:
    """The words of a tool's name that a rule would use for it (`book_reservation` -> book; a read tool's
    object: `get_user_details` -> user)."""
    parts = [p for p in re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name.lower()) if p]
    specific = [p for p in parts if p not in _GENERIC_TOKENS and len(p) >= 3]
    if not specific:
        return []
    return [specific[0]] if is_write(name) else specific[:1]


def _mentions(rule_low: str, word: str) -> bool:
    stem = word[: max(4, len(word) - 2)] if len(word) > 4 else word
    return re.search(r"\b" + re.escape(stem), rule_low) is not None


def requirements(run: Any, limit: Any = MAX_RULES) -> dict[str, Any]:
    """The imperative rules of the run's system prompt / policy and how the run kept them:

    `{"first_write": step | None, "rules": [{"rule", "kind": "confirm"|"before"|"never"|"must", "tools",
    "honoured": [steps], "broken": [steps], "checked": bool}]}`. Checked up to and including the first
    state-changing call (`first_write`), as a rule is kept or broken before acting:

    - `confirm` (confirmation / explicit): a write is honoured when the user's last turn before it
      agrees (yes, proceed, confirm, ...) after the agent's last message; broken otherwise;
    - `before` (before / first / prior to) naming a read tool: honoured by its calls before the first
      write; broken at the first write when it was never called;
    - `never` (never / do not / cannot ...) naming a tool: broken at each call of it (the whole run);
    - `must`, and any rule naming none of the run's tools: listed, `checked` False."""
    run = check_run(run, "requirements")
    n = check_limit(limit, "requirements")
    assert n is not None
    return _requirements(run, list(iter_steps(run, "requirements")), n)


def _requirements(run: dict[str, Any], steps: list[dict[str, Any]], n: int) -> dict[str, Any]:
    calls = [(s["index"], c["name"]) for s in steps for c in s["tool_calls"] if c["name"]]
    names = sorted({name for _i, name in calls})
    first_write = next((i for i, name in calls if is_write(name) and name not in NO_EFFECT_TOOLS), None)
    rules: list[dict[str, Any]] = []
    for _step, text in _policy_texts(run, steps):
        for rule in _rules(text):
            if len(rules) >= n:
                break
            rules.append(_check(rule, steps, calls, names, first_write))
    return {"first_write": first_write, "rules": rules}


def _check(
    rule: str,
    steps: list[dict[str, Any]],
    calls: list[tuple[int, str]],
    names: list[str],
    first_write: int | None,
) -> dict[str, Any]:
    low = rule.lower()
    tools = [t for t in names if any(_mentions(low, w) for w in _tool_words(t))]
    if _NEVER.search(rule) and not _CONFIRM.search(rule):
        tools = [t for t in tools if is_write(t)]  # what a rule forbids is an action, not a lookup
    kind = (
        "confirm"
        if _CONFIRM.search(rule)
        else "never"
        if _NEVER.search(rule)
        else "before"
        if _BEFORE.search(rule)
        else "must"
    )
    out: dict[str, Any] = {
        "rule": rule,
        "kind": kind,
        "tools": tools,
        "honoured": [],
        "broken": [],
        "checked": False,
    }
    writes = [(i, t) for i, t in calls if is_write(t) and t not in NO_EFFECT_TOOLS]
    if kind == "confirm":
        window = [(i, t) for i, t in writes if first_write is not None and i <= first_write]
        for i, _t in window:
            (out["honoured"] if _confirmed(steps, i) else out["broken"]).append(i)
        out["checked"] = bool(window)
    elif kind == "never" and tools:
        out["broken"] = sorted({i for i, t in calls if t in tools})
        out["checked"] = True
    elif kind == "before" and tools:
        reads = [t for t in tools if not is_write(t)]
        if reads and first_write is not None:
            out["honoured"] = sorted({i for i, t in calls if t in reads and i < first_write})
            if not out["honoured"]:
                out["broken"] = [first_write]
            out["checked"] = True
    return out


def _confirmed(steps: list[dict[str, Any]], at: int) -> bool:
    """Whether the user agreed in its last turn before step `at` (after the agent's last message)."""
    for s in reversed([s for s in steps if s["index"] < at]):
        src = step_source(s)
        if src == "user":
            return _YES.search(s["content"]) is not None
        if src == "agent" and s["content"].strip() and not s["tool_calls"]:
            return False
    return False
