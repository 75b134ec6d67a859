"""Find the steps that mention something: a value, an id, an error message.

Why: the evidence for a diagnosis is usually one step ("where did the agent first see this reservation
id?"). A step is searched in its content and in its tool calls (`name(arguments)`); each hit comes with a
snippet around the first match, so a cell can cite it without printing whole steps. On a lazy view the
trace's raw records are searched first (`steps.grep`, nothing parsed) and only the candidates are parsed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from reflector.analysis.toolkit.calls import check_limit, check_run, iter_steps, plain_step
from reflector.analysis.traces.lazy import Steps

__all__ = ["search_steps", "SNIPPET_CHARS"]

SNIPPET_CHARS = 80  # characters kept on each side of the match
# On a lazy view a substring is first looked for in the raw records (`steps.grep`: C speed, nothing parsed),
# and only the records found are parsed and checked. What is looked for must be in the record of every
# matching step: a pattern of characters no JSON writer escapes or reformats, and that none of the
# adapters' joins (": ", "\n", "(", "[thinking]") or a re-serialised value (", ") contains, is there as is;
# otherwise its longest ASCII word is (JSON escapes touch no ASCII letter, digit or "_").
_RAW_SAFE = re.compile(r"[A-Za-z0-9 _\-.;!?#@$%*+=|~^'`]+")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_MIN_WORD = 3  # a shorter word selects too little: read every step instead
_CHUNK_STEPS = 16_384  # steps grepped at once: a search that is satisfied early stops early


def _step_text(s: dict[str, Any]) -> str:
    calls = [f"{c['name']}({_args_text(c['arguments'])})" for c in s["tool_calls"]]
    return "\n".join(part for part in [s["content"], *calls] if part)


def _args_text(args: Any) -> str:
    return args if isinstance(args, str) else "" if args is None else json.dumps(args, ensure_ascii=False)


def _snippet(text: str, start: int, end: int) -> str:
    lo, hi = max(0, start - SNIPPET_CHARS), min(len(text), end + SNIPPET_CHARS)
    return ("..." if lo else "") + text[lo:hi] + ("..." if hi < len(text) else "")


def search_steps(run: Any, pattern: Any, limit: Any = 20, regex: Any = False) -> list[dict[str, Any]]:
    """The steps whose content or tool calls contain `pattern`: `[{"step", "role", "actor", "snippet"}]`,
    at most `limit`, in order. Case-insensitive; a plain substring unless `regex=True` (a Python regular
    expression; an invalid one raises ValueError). `snippet`: +-80 characters around the first match."""
    run = check_run(run, "search_steps")
    if not isinstance(pattern, str) or not pattern:
        raise TypeError("search_steps: pattern must be a non-empty str")
    text = str.__str__(pattern)
    n = check_limit(limit, "search_steps")
    assert n is not None
    if type(regex) is not bool:
        raise TypeError("search_steps: regex must be True or False")
    try:
        rx = re.compile(text if regex else re.escape(text), re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"search_steps: invalid regular expression {text!r}: {exc}") from None
    out: list[dict[str, Any]] = []
    for s in _candidates(run, text, regex):
        body = _step_text(s)
        m = rx.search(body)
        if m is None:
            continue
        out.append(
            {
                "step": s["index"],
                "role": s["role"],
                "actor": s["actor"],
                "snippet": _snippet(body, m.start(), m.end()),
            }
        )
        if len(out) >= n:
            break
    return out


def _candidates(run: dict[str, Any], text: str, regex: bool) -> Iterator[dict[str, Any]]:
    """The steps that may match, in order: on a lazy view, for a substring, those whose raw record has it
    (or its longest ASCII word), grepped a chunk of steps at a time; otherwise every step."""
    steps = dict.get(run, "steps")
    needle = text if _RAW_SAFE.fullmatch(text) else max(_WORD.findall(text), key=len, default="")
    if type(steps) is not Steps or regex or len(needle) < _MIN_WORD:
        yield from iter_steps(run, "search_steps")
        return
    rx = re.escape(needle)
    for start in range(0, len(steps), _CHUNK_STEPS):
        for k in steps[start : start + _CHUNK_STEPS].grep(rx, limit=_CHUNK_STEPS, flags=re.IGNORECASE):
            yield plain_step(steps[start + k], start + k, "search_steps", fresh=True)
