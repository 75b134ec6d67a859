"""Whether an agent did what was expected: its final answer against a text ground truth (normalised,
not exact), and its actions against expected actions (names and arguments, never as text).

Two kinds of ground truth, compared like with like:

- a text ground truth (an answer) is compared with the agent's final answer (`compare`);
- expected actions (tau-bench's `expected_actions`: `{name, arguments}`) are compared with the
  actions the agent took (`actions`: `{name, arguments, is_error}`) as multisets of
  (name, canonical arguments): `compare_actions`. Only state-changing actions count (what a
  tau-bench grader compares through the database), and the agent's failed calls changed nothing;
- expected outputs (tau-bench's `expected_outputs`) must each appear in one of the agent's
  messages, as tau-bench checks them (`missing_outputs`).

The rules are kept as source text because they run in two places: inside the sandbox, as part of
the heuristic model's inspection cell (cells can only use what they define), and in the worker /
workflow, for the deterministic fallback reflection. One text, executed in both, so they agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "ANSWER_RULES_SOURCE",
    "READ_ONLY_PREFIXES",
    "canon",
    "compare_answers",
    "answers_match",
    "compare_actions",
    "missing_outputs",
]

ANSWER_RULES_SOURCE = r'''
NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z ]{0,30}:\s+")

def norm(text):
    return re.sub(r"[\W_]+", "", str(text).lower())

def as_number(text):
    t = str(text).strip().replace("$", "").replace("%", "").strip()
    if re.fullmatch(r"-?\d[\d,]*(?:\.\d+)?", t):
        return float(t.replace(",", ""))
    return None

def compare(final, truth):
    """(matches, missing truth lines). None without a ground truth; a numeric truth is compared
    with the last number of the answer; otherwise every normalised truth line must be contained."""
    if truth is None or not str(truth).strip():
        return None, []
    if final is None or not str(final).strip():
        return False, [short(truth, 300)]
    number = as_number(truth)
    if number is not None:
        found = NUM_RE.findall(str(final))
        if found:
            last = float(found[-1].replace(",", ""))
            ok = abs(last - number) <= 1e-6 * max(1.0, abs(number))
            return ok, [] if ok else [str(truth).strip()]
    lines = [ln.strip() for ln in str(truth).splitlines() if ln.strip()]
    target = norm(final)
    missing = [ln for ln in lines if norm(LABEL_RE.sub("", ln)) and norm(LABEL_RE.sub("", ln)) not in target]
    if not any(norm(LABEL_RE.sub("", ln)) for ln in lines):
        return None, []
    if norm(truth) == target or not missing:
        return True, []
    return False, [short(ln, 300) for ln in missing[:5]]

# Tool-name prefixes that only read state (tau-bench and most tool suites): calls to anything else
# change the world, and those are what a tau-bench grader compares (through the database).
READ_ONLY_PREFIXES = (
    "transfer_to_human", "get_", "search_", "list_", "find_", "lookup", "read_", "calculate", "think",
)

def canon(value):
    """Integral floats become ints (250.0 and 250 are the same argument); keys become text."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [canon(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canon(v) for k, v in value.items()}
    return value

def action_args(arguments):
    """An action's arguments as data: a JSON string is parsed, nothing becomes {}."""
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return arguments.strip()
    return canon(arguments)

def action_key(action):
    args = json.dumps(action_args(action.get("arguments")), sort_keys=True, ensure_ascii=False, default=str)
    return str(action.get("name")), args

def action_text(action):
    """`name(k=v, ...)` with sorted keys and compact JSON values, to show an action (never to compare)."""
    args = action_args(action.get("arguments"))
    def value(v):
        return v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if isinstance(args, dict):
        inner = ", ".join(f"{k}={value(args[k])}" for k in sorted(args))
    else:
        inner = value(args)
    return f"{action.get('name')}({inner})"

def state_changing(actions, drop_failed):
    out = []
    for a in actions if isinstance(actions, list) else []:
        if not isinstance(a, dict) or str(a.get("name")).startswith(READ_ONLY_PREFIXES):
            continue
        if drop_failed and a.get("is_error"):
            continue
        out.append(a)
    return out

def compare_actions(actions, expected):
    """(matches, expected actions not taken, actions taken but not expected), as action texts.

    None without expected actions. Compared as multisets of (name, canonical arguments) over the
    state-changing actions; the agent's failed calls are left out (they changed nothing)."""
    if not isinstance(expected, list):
        return None, [], []
    want = state_changing(expected, False)
    did = state_changing(actions, True)
    left = [action_key(a) for a in did]
    missing = []
    for a in want:
        key = action_key(a)
        if key in left:
            left.remove(key)
        else:
            missing.append(a)
    unexpected = []
    for a in did:
        key = action_key(a)
        if key in left:
            left.remove(key)
            unexpected.append(a)
    ok = not missing and not unexpected
    return ok, [short(action_text(a), 300) for a in missing[:5]], [short(action_text(a), 300) for a in unexpected[:5]]

def missing_outputs(outputs, texts):
    """Expected outputs that no message of the agent states (tau-bench's rule: case-insensitive,
    commas in the message ignored)."""
    said = [str(t).lower().replace(",", "") for t in texts if t]
    return [str(o) for o in outputs if not any(str(o).lower() in t for t in said)] if isinstance(outputs, list) else []

'''

_rules: dict[str, Any] = {"re": re, "json": json}
exec(
    compile(
        '\ndef short(value, limit=300):\n    if value is None:\n        return None\n    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)\n    text = " ".join(text.split())\n    return text if len(text) <= limit else text[: limit - 3] + "..."\n'
        + ANSWER_RULES_SOURCE,
        "reflector/analysis/answers.py:rules",
        "exec",
    ),
    _rules,
)


def compare_answers(final: str | None, truth: str | None) -> tuple[bool | None, list[str]]:
    """(matches, missing truth lines); `None` when there is no ground truth to compare with.

    A numeric truth is compared with the last number of the answer; otherwise every normalised
    truth line must be contained in the normalised answer.
    """
    ok, missing = _rules["compare"](final, truth)
    return ok, list(missing)


def answers_match(final: str | None, truth: str | None) -> bool | None:
    return compare_answers(final, truth)[0]


READ_ONLY_PREFIXES: tuple[str, ...] = _rules["READ_ONLY_PREFIXES"]
canon: Callable[[Any], Any] = _rules["canon"]  # integral floats become ints, keys become text


def compare_actions(actions: Any, expected: Any) -> tuple[bool | None, list[str], list[str]]:
    """(matches, expected actions not taken, actions taken but not expected); `None` without expected actions.

    Actions are `{name, arguments[, is_error]}` (arguments a dict or a JSON string); they are compared
    by name and canonical arguments, never as text. Only state-changing actions count, and the
    agent's failed calls are left out.
    """
    ok, missing, unexpected = _rules["compare_actions"](actions, expected)
    return ok, list(missing), list(unexpected)


def missing_outputs(outputs: Any, texts: list[str]) -> list[str]:
    """The expected outputs that none of `texts` (the agent's messages) states."""
    return list(_rules["missing_outputs"](outputs, texts))
