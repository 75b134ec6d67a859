"""Labels and scoring for `bench/quality.py`: what the reflection should have found, and whether it did.

This module is the benchmark's answer key. It is written apart from the reflector's toolkit
(`reflector/analysis/toolkit/`) on purpose: a score computed with the code under test would measure nothing.

## tau-bench label rules (a run with reward < 1)

Only *write* actions count (tools not starting with a read-only prefix, `reflector.analysis.answers.READ_ONLY_PREFIXES`:
what tau-bench's grader compares through the database), and the agent's failed calls changed nothing.

1. Exact matches first: each expected write is matched with an unused successful agent write of the same
   name and the same canonical arguments (integral floats are ints; dict key order is irrelevant).
2. The **first divergence** is the first expected write, in the task's order, left unmatched:
   - `wrong_arguments` when the agent made an unmatched successful call of the same tool; the labelled
     step is that call's step (the closest such call: fewest differing leaves), and the differing
     arguments (paths such as `passengers[1].dob`) with both values are part of the label;
   - `missing_action` otherwise. The labelled step is a *window*: from the step after the agent's last call
     (read or write) that exactly matches an expected action preceding this one in the expected order (the
     agent had what it needed from then on; else the start) to the step of its next matched write (else the
     last step). A diagnosis step inside that window counts; the benchmark prints the windows' median share
     of the run, so a generous window is visible.
3. Else, the first agent write matched with nothing: `extra_action` at its step.
4. Else, the first expected output (`info.task.outputs`) no agent message states (tau-bench's rule:
   case-insensitive, commas ignored): `wrong_information`; the window runs from the first step whose text
   contains the value (the agent could know it from then on) to the last step.
5. Else the run has no label (its reward differs for a reason these rules do not see); it is counted and
   left out of the accuracies.

## Scores
- **hit**: the reflection names the label's tool (for `wrong_information`, the missing output value) and,
  for `wrong_arguments`, at least one differing value (the agent's or the expected one): a distinctive value
  (4+ characters, not a number) anywhere, a short one or a number only right after the argument's name.
- **echo-free hit**: the same after blanking every verbatim copy of the answer key in the reflection: any
  run of >= `ECHO_MIN_CHARS` characters that occurs in a serialisation of the expected actions/outputs
  (as `name(k=v, ...)`, as JSON with or without spaces, as a Python repr) and holds two words or more (a
  single identifier such as `update_reservation_flights` is a name, not a copy). Values are short, so a
  reflection that names them in its own words keeps them; one that pastes the expected call does not.
- **step**: `diagnosis.step` equals the labelled step (or lies in its window); **kind**: `diagnosis.kind`.

## Who&When (multi-agent, labelled `mistake_agent` and `mistake_step`)
The labels and `mistake_reason` / `is_correct` are removed from the file the reflector reads; `diagnosis.actor`
is compared with `mistake_agent` (exact, case-insensitive) and `diagnosis.step` with `mistake_step`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from reflector.analysis.answers import READ_ONLY_PREFIXES

__all__ = [
    "ECHO_MIN_CHARS",
    "WHOWHEN_LABEL_KEYS",
    "TauLabel",
    "tau_label",
    "reflection_text",
    "blank_echoes",
    "answer_key_texts",
    "tau_hit",
    "step_ok",
]

ECHO_MIN_CHARS = 24
_WORD = re.compile(r"\w+")
WHOWHEN_LABEL_KEYS = ("mistake_agent", "mistake_step", "mistake_reason", "is_correct")


@dataclass
class TauLabel:
    kind: str  # missing_action | wrong_arguments | extra_action | wrong_information | unlabelled
    tool: str | None = None
    step: int | None = None  # the exact step (wrong_arguments, extra_action)
    window: tuple[int, int] | None = None  # an accepted range of steps (missing_action, wrong_information)
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)  # (path, expected, actual)
    output: str | None = None  # the expected output never stated (wrong_information)


def _canon(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    return value


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return _canon(json.loads(raw)) if raw.strip() else {}
        except ValueError:
            return raw
    return _canon(raw if raw is not None else {})


def _key(name: str, args: Any) -> str:
    return name + json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


def _is_write(name: str) -> bool:
    return not name.startswith(READ_ONLY_PREFIXES)


def leaf_differences(expected: Any, actual: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where two argument values differ, as (path, expected, actual)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in sorted(set(expected) | set(actual)):
            sub = f"{path}.{k}" if path else k
            if k not in actual:
                out.append((sub, expected[k], None))
            elif k not in expected:
                out.append((sub, None, actual[k]))
            else:
                out += leaf_differences(expected[k], actual[k], sub)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        out = []
        for i in range(max(len(expected), len(actual))):
            sub = f"{path}[{i}]"
            if i >= len(actual):
                out.append((sub, expected[i], None))
            elif i >= len(expected):
                out.append((sub, None, actual[i]))
            else:
                out += leaf_differences(expected[i], actual[i], sub)
        return out
    return [] if expected == actual else [(path, expected, actual)]


def _agent_writes(raw_run: dict[str, Any]) -> list[tuple[int, str, Any]]:
    """(step, name, args) of the agent's successful write calls, read from the raw trajectory: the step is
    the index of the assistant message in `traj` (the canonical view's step index for tau-bench)."""
    traj = raw_run.get("traj") or []
    out: list[tuple[int, str, Any]] = []
    for i, msg in enumerate(traj):
        if not isinstance(msg, dict) or msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            name = str(fn.get("name"))
            if not _is_write(name):
                continue
            result = _result_of(traj, i, call.get("id"))
            if result is not None and result.lower().startswith("error"):
                continue
            out.append((i, name, _args(fn.get("arguments"))))
    return out


def _exact_steps(task: dict[str, Any], raw_run: dict[str, Any]) -> list[tuple[int, int]]:
    """(position in the expected list, agent step) of every expected action, read or write, that a successful
    agent call matched exactly (each call used once)."""
    traj = raw_run.get("traj") or []
    calls: list[tuple[int, str]] = []
    for i, msg in enumerate(traj):
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") or {}
                result = _result_of(traj, i, call.get("id"))
                if result is None or not result.lower().startswith("error"):
                    calls.append((i, _key(str(fn.get("name")), _args(fn.get("arguments")))))
    out, used = [], set()
    for j, a in enumerate(task.get("actions") or []):
        key = _key(str(a.get("name")), _args(a.get("arguments", a.get("kwargs"))))
        for ci, (step, ckey) in enumerate(calls):
            if ci not in used and ckey == key:
                used.add(ci)
                out.append((j, step))
                break
    return out


def _result_of(traj: list[Any], i: int, call_id: Any) -> str | None:
    for msg in traj[i + 1 :]:
        if isinstance(msg, dict) and msg.get("role") == "tool" and msg.get("tool_call_id") == call_id:
            return str(msg.get("content") or "")
    return None


def _said(raw_run: dict[str, Any]) -> list[str]:
    return [
        str(m.get("content") or "").lower().replace(",", "")
        for m in raw_run.get("traj") or []
        if isinstance(m, dict) and m.get("role") == "assistant"
    ]


def tau_label(raw_run: dict[str, Any]) -> TauLabel:
    """The first divergence of one raw tau-bench run (see the module docstring for the rules)."""
    task = (raw_run.get("info") or {}).get("task") or {}
    all_expected = task.get("actions") or []
    expected_pos = [i for i, a in enumerate(all_expected) if _is_write(str(a.get("name")))]
    expected = [
        (
            str(all_expected[i].get("name")),
            _args(all_expected[i].get("arguments", all_expected[i].get("kwargs"))),
        )
        for i in expected_pos
    ]
    writes = _agent_writes(raw_run)
    traj = raw_run.get("traj") or []
    last = max(len(traj) - 1, 0)
    used: set[int] = set()
    matched_step: dict[int, int] = {}  # expected index -> agent step
    for ei, (name, args) in enumerate(expected):
        for ai, (step, aname, aargs) in enumerate(writes):
            if ai not in used and _key(aname, aargs) == _key(name, args):
                used.add(ai)
                matched_step[ei] = step
                break
    for ei, (name, args) in enumerate(expected):
        if ei in matched_step:
            continue
        same = [
            (len(leaf_differences(args, aargs)), step, aargs)
            for ai, (step, aname, aargs) in enumerate(writes)
            if ai not in used and aname == name
        ]
        if same:
            _n, step, aargs = min(same, key=lambda t: (t[0], t[1]))
            return TauLabel("wrong_arguments", name, step=step, differences=leaf_differences(args, aargs))
        before = [s for j, s in _exact_steps(task, raw_run) if j < expected_pos[ei]]
        after = [matched_step[j] for j in range(ei + 1, len(expected)) if j in matched_step]
        lo = max(before) + 1 if before else 0
        hi = min([s for s in after if s >= lo], default=last)
        return TauLabel("missing_action", name, window=(lo, max(lo, hi)))
    for ai, (step, aname, _aargs) in enumerate(writes):
        if ai not in used:
            return TauLabel("extra_action", aname, step=step)
    said = _said(raw_run)
    for out in task.get("outputs") or []:
        value = str(out).lower()
        if not any(value in t for t in said):
            first = next(
                (
                    i
                    for i, m in enumerate(traj)
                    if isinstance(m, dict) and value in str(m.get("content") or "").lower().replace(",", "")
                ),
                0,
            )
            return TauLabel("wrong_information", None, window=(first, last), output=str(out))
    return TauLabel("unlabelled")


# ------------------------------------------------------------------------------------------ scoring


def reflection_text(out: dict[str, Any]) -> str:
    """Every text the reflection shows a reader (raw and citations excluded: the workflow writes them)."""
    parts = [
        str(out.get(k) or "")
        for k in (
            "reasoning",
            "error_identification",
            "root_cause_analysis",
            "correct_approach",
            "key_insight",
        )
    ]
    for item in out.get("extracted_learnings") or []:
        parts += [
            str(item.get("learning") or ""),
            str(item.get("evidence") or ""),
            str(item.get("justification") or ""),
        ]
    diag = out.get("diagnosis") or {}
    parts += [str(diag.get(k) or "") for k in ("tool", "argument", "actual", "expected", "summary")]
    return "\n".join(parts)


def answer_key_texts(raw_run: dict[str, Any]) -> list[str]:
    """The answer key (expected actions and outputs) serialised the ways a reflection could paste it."""
    task = (raw_run.get("info") or {}).get("task") or {}
    actions = task.get("actions") or []
    texts = [
        json.dumps(actions),
        json.dumps(actions, separators=(",", ":")),
        repr(actions),
        json.dumps(task.get("outputs") or []),
    ]
    for a in actions:
        args = _args(a.get("arguments", a.get("kwargs")))
        texts += [
            json.dumps(args),
            json.dumps(args, separators=(",", ":")),
            json.dumps(args, sort_keys=True),
            json.dumps(args, sort_keys=True, separators=(",", ":")),
            repr(args),
        ]
        if isinstance(args, dict):

            def v(x: Any) -> str:
                return x if isinstance(x, str) else json.dumps(x, sort_keys=True, separators=(",", ":"))

            inner = ", ".join(f"{k}={v(args[k])}" for k in sorted(args))
            texts += [f"{a.get('name')}({inner})", inner]
    return texts


def blank_echoes(text: str, keys: list[str], min_chars: int = ECHO_MIN_CHARS) -> str:
    """`text` with every run of >= `min_chars` characters found verbatim in one of `keys` blanked, when the
    run holds two words or more (one long identifier, such as a tool name, is naming, not pasting)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        best = 0
        if i + min_chars <= len(text) and any(text[i : i + min_chars] in k for k in keys):
            best = min_chars
            while i + best < len(text) and any(text[i : i + best + 1] in k for k in keys):
                best += 1
        if best and len(_WORD.findall(text[i : i + best])) >= 2:
            out.append(" " * best)
            i += best
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _value_texts(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, bool):
        return [str(value).lower(), str(value)]
    if isinstance(value, (int, float)):
        return [str(value)]
    return [json.dumps(value, sort_keys=True), json.dumps(value, sort_keys=True, separators=(",", ":"))]


def tau_hit(label: TauLabel, text: str) -> bool:
    """Whether `text` names what the label says went wrong (see the module docstring)."""
    low = text.lower()
    if label.kind == "wrong_information":
        return bool(label.output) and str(label.output).lower() in low.replace(",", "")
    if not label.tool or label.tool.lower() not in low:
        return False
    if label.kind != "wrong_arguments":
        return True
    for path, exp, act in label.differences:
        if any(_names_value(low, path, v.lower()) for v in _value_texts(exp) + _value_texts(act)):
            return True
    return False


def _names_value(low: str, path: str, value: str) -> bool:
    """A distinctive value (a text of 4+ characters, e.g. a flight number) anywhere; a short one (a number,
    `no`) only as a whole token within 80 characters after the argument's name (`nonfree_baggages ... 1`)."""
    if len(value) >= 4 and not re.fullmatch(r"-?[\d.]+", value):
        return value in low
    key = re.sub(r"\[\d+\]", "", path).rsplit(".", 1)[-1].lower()
    if not key:
        return False
    token = re.compile(r"(?<![\w.])" + re.escape(value) + r"(?![\w.])")
    for m in re.finditer(re.escape(key), low):
        if token.search(low, m.end(), m.end() + 80):
            return True
    return False


def step_ok(label: TauLabel, step: Any) -> bool:
    if not isinstance(step, int):
        return False
    if label.step is not None:
        return step == label.step
    if label.window is not None:
        return label.window[0] <= step <= label.window[1]
    return False
