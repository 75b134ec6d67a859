"""Who did what in a multi-agent conversation (an AutoGen / CaptainAgent group chat, Who&When): the run's
actors, a one-line note naming them for the first request, and the conversation step by step, one actor's
or everyone's. The speaker is the step's `actor`, named by one rule for every trace dialect
(`reflector.analysis.traces.agents`); where it went wrong is `reflector.analysis.toolkit.actors`' guess.
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any

from reflector.analysis.toolkit.calls import check_limit, check_run, iter_steps

__all__ = ["actors", "actors_note", "timeline"]

_MAX_CHARS = 10_000  # longest preview `timeline` makes

_WS = re.compile(r"\s+")
_FAILED_EXIT = re.compile(r"\A\s*exitcode:\s*(?!0\b)-?\d+", re.IGNORECASE)


def actors(run: Any) -> list[dict[str, Any]]:
    """The run's actors in order of first appearance: `[{"actor", "n_steps", "first_step", "last_step",
    "roles", "addressees"}]` (`roles`: how many of its steps have each role; `addressees`: how many it
    addressed to each agent, `"Orchestrator (-> WebSurfer)"`). Steps that name no actor are grouped
    under `"actor": None` (a single-agent trace is that one group: its roles tell user from assistant).
    Who the actor of a step is: `reflector.analysis.traces.agents` (one rule for every trace dialect)."""
    run = check_run(run, "actors")
    found: dict[str | None, dict[str, Any]] = {}
    for s in iter_steps(run, "actors"):
        a = found.get(s["actor"])
        if a is None:
            a = found[s["actor"]] = {
                "actor": s["actor"],
                "n_steps": 0,
                "first_step": s["index"],
                "last_step": s["index"],
                "roles": {},
                "addressees": {},
            }
        a["n_steps"] += 1
        a["last_step"] = s["index"]
        a["roles"][s["role"]] = a["roles"].get(s["role"], 0) + 1
        if s["addressee"] is not None:
            a["addressees"][s["addressee"]] = a["addressees"].get(s["addressee"], 0) + 1
    return list(found.values())


NOTE_STEPS = 2_000  # steps `actors_note` reads (a lazy view stays cheap)


def actors_note(view: Any) -> str | None:
    """One line naming the agents of a single-run view and their step counts, for the first request
    (cell 1 prints it): `actors: Orchestrator (7 steps, addresses WebSurfer 2), WebSurfer (2 steps)`;
    None when no step names an agent (or `view` is not one run)."""
    try:
        run = check_run(view, "actors_note")
        counts: dict[str, list[Any]] = {}
        n = 0
        for s in islice(iter_steps(run, "actors_note"), NOTE_STEPS):
            n += 1
            if s["actor"] is None:
                continue
            a = counts.setdefault(s["actor"], [0, {}])
            a[0] += 1
            if s["addressee"] is not None:
                a[1][s["addressee"]] = a[1].get(s["addressee"], 0) + 1
    except (TypeError, ValueError):
        return None
    if not counts:
        return None
    parts = []
    for name, (k, to) in list(counts.items())[:20]:
        said = ", addresses " + ", ".join(f"{t} {c}" for t, c in list(to.items())[:6]) if to else ""
        parts.append(f"{name} ({k} step{'s' if k != 1 else ''}{said})")
    more = f" +{len(counts) - 20} more" if len(counts) > 20 else ""
    scope = f" (in the first {NOTE_STEPS:,} steps)" if n >= NOTE_STEPS else ""
    return "actors" + scope + ": " + "; ".join(parts) + more + " (actors(run) lists them)"


def timeline(run: Any, actor: Any = None, limit: Any = 200, chars: Any = 160) -> list[dict[str, Any]]:
    """The conversation step by step: `[{"step", "actor", "role", "preview"}]`, at most `limit`, only
    `actor`'s steps when given (a name from `actors(run)`). `preview`: the first `chars` characters with
    whitespace collapsed. A tool call or result also has `"tool"` (the tool's name; calls: their names
    joined by ", "); a failed step (an error result, a failed code execution) has `"error": True`."""
    run = check_run(run, "timeline")
    if actor is not None and not isinstance(actor, str):
        raise TypeError(f"timeline: actor must be an actor's name (str) or None, not {type(actor).__name__}")
    who = None if actor is None else str.__str__(actor)
    n = check_limit(limit, "timeline")
    assert n is not None
    if type(chars) is not int or not 1 <= chars <= _MAX_CHARS:
        raise TypeError(f"timeline: chars must be an int from 1 to {_MAX_CHARS:,}, not {chars!r}")
    out: list[dict[str, Any]] = []
    for s in iter_steps(run, "timeline"):
        if who is not None and s["actor"] != who:
            continue
        row: dict[str, Any] = {
            "step": s["index"],
            "actor": s["actor"],
            "role": s["role"],
            "preview": _preview(s["content"], chars),
        }
        tool = s["tool_name"] or ", ".join(c["name"] for c in s["tool_calls"] if c["name"])
        if tool:
            row["tool"] = tool
        if s["is_error"] or _FAILED_EXIT.match(s["content"]):
            row["error"] = True
        out.append(row)
        if len(out) >= n:
            break
    return out


def _preview(text: str, chars: int) -> str:
    flat = _WS.sub(" ", text).strip()
    return flat if len(flat) <= chars else flat[: max(chars - 3, 1)] + "..."
