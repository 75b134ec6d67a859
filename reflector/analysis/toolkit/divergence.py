"""Where the agent's actions part from the task's expected ones: the alignment, and the decisive step.

Why an alignment and not a set difference: "book_reservation missing, book_reservation extra" says
nothing; "the booking at step 24 has `payment_methods[0].amount` 300, the task expected 250" says
what to fix. The rules (`diff_actions`): exact matches first (name and canonical arguments, as a
multiset, in order: what `reflector.analysis.answers.compare_actions` counts), then each unmatched expected
action is paired with the unmatched call of the same tool that differs least (`wrong_arguments`); the
rest is `missing` / `extra`. The agent's failed calls changed nothing, so they are left out of the
matching (`failing_calls` shows them).

`first_divergence` picks the decisive divergence by the agent's step order and says which rule placed
it (`where`). Everything it returns is the trace's own data; when nothing diverges, it returns None.
"""

from __future__ import annotations

from typing import Any

from reflector.analysis.answers import missing_outputs
from reflector.analysis.toolkit.calls import (
    assistant_texts,
    check_run,
    expected_actions,
    is_write,
    parse_args,
    short,
    tool_calls,
)
from reflector.analysis.toolkit.diff import as_data, canon, diff_values, same_value

__all__ = ["diff_actions", "first_divergence"]

_KIND_ORDER = {"wrong_arguments": 0, "extra_action": 1, "missing_action": 2}
_LAST_MESSAGE_CHARS = 300


def _actions(value: Any, what: str) -> list[dict[str, Any]]:
    """Action lists of any of the toolkit's shapes as `{"name", "args", "step", "is_error"}`."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"diff_actions: {what} must be a list of actions ({{'name', 'args'}}: tool_calls(run), "
            f"expected_actions(run), run['actions']), not {type(value).__name__}"
        )
    out: list[dict[str, Any]] = []
    for i, a in enumerate(as_data(value, f"diff_actions: {what}")):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise TypeError(f"diff_actions: {what}[{i}] is not an action dict with a 'name'")
        args = a["args"] if "args" in a else a.get("arguments", a.get("kwargs"))
        step = a.get("step")
        out.append(
            {
                "name": a["name"],
                "args": canon(parse_args(args)),
                "step": step if type(step) is int else None,
                "is_error": bool(a.get("is_error")),
            }
        )
    return out


def diff_actions(expected: Any, actual: Any, writes_only: Any = True) -> dict[str, Any]:
    """Align expected actions with the agent's calls (indices are positions in the lists given):

    `{"matched": [{"expected", "actual"}], "wrong_arguments": [{"expected", "actual", "name",
    "differences"}], "missing": [{"expected", "name", "args"}], "extra": [{"actual", "name", "args",
    "step"}], "equal": bool}`. Failed calls (`is_error`) are not matched. `writes_only`: only
    state-changing tools on both sides (`is_write`).
    """
    if type(writes_only) is not bool:
        raise TypeError("diff_actions: writes_only must be True or False")
    want = _actions(expected, "expected")
    did = _actions(actual, "actual")
    todo = [i for i, a in enumerate(want) if not writes_only or is_write(a["name"])]
    free = [j for j, a in enumerate(did) if not a["is_error"] and (not writes_only or is_write(a["name"]))]
    matched: list[dict[str, int]] = []
    unmatched: list[int] = []
    for i in todo:
        j = next(
            (
                j
                for j in free
                if did[j]["name"] == want[i]["name"] and same_value(want[i]["args"], did[j]["args"])
            ),
            None,
        )
        if j is None:
            unmatched.append(i)
        else:
            free.remove(j)
            matched.append({"expected": i, "actual": j})
    wrong: list[dict[str, Any]] = []
    missing: list[dict[str, Any]] = []
    for i in unmatched:
        best: tuple[int, int, list[dict[str, Any]]] | None = None
        for j in free:
            if did[j]["name"] == want[i]["name"]:
                diffs = diff_values(want[i]["args"], did[j]["args"])
                if best is None or len(diffs) < best[0]:
                    best = (len(diffs), j, diffs)
        if best is None:
            missing.append({"expected": i, "name": want[i]["name"], "args": want[i]["args"]})
        else:
            free.remove(best[1])
            wrong.append({"expected": i, "actual": best[1], "name": want[i]["name"], "differences": best[2]})
    extra = [
        {"actual": j, "name": did[j]["name"], "args": did[j]["args"], "step": did[j]["step"]} for j in free
    ]
    return {
        "matched": matched,
        "wrong_arguments": wrong,
        "missing": missing,
        "extra": extra,
        "equal": not (wrong or missing or extra),
    }


def first_divergence(run: Any) -> dict[str, Any] | None:
    """The decisive divergence from the task's expected actions (then outputs).

    `{"kind", "step", "tool", "argument", "actual", "expected", "expected_action", "agent_call", "where",
    "n_expected", "n_matched", "others"}` (+ `"differences"` for wrong arguments; `others`: every other
    divergence, `{kind, step, tool}`). The first expected write, in the task's order, that the agent did
    not take as expected: with wrong arguments (at the agent's call) or missing (at the first agent step
    after the last expected action, read or write, taken before it; else the end of the conversation).
    When every expected write was taken: the first extra state-changing call, by step. When every write
    matches: the first expected output the agent never stated (at its last message). None when nothing
    diverges, or the trace carries no expected actions or outputs.
    """
    run = check_run(run, "first_divergence")
    want = expected_actions(run)
    outputs = dict.get(run, "expected_outputs")
    outputs = (
        as_data(outputs, "first_divergence: expected_outputs") if isinstance(outputs, (list, tuple)) else []
    )
    if want is None and not outputs:
        return None
    texts = assistant_texts(run, "first_divergence")
    agent_steps = [i for i, _t in texts]
    n_expected = n_matched = 0
    if want is not None:
        calls = tool_calls(run)
        d = diff_actions(want, calls)
        n_expected = len(d["matched"]) + len(d["wrong_arguments"]) + len(d["missing"])
        n_matched = len(d["matched"])
        reads = diff_actions(want, calls, False)[
            "matched"
        ]  # expected reads taken too: they place a missing write
        found = _candidates(d, want, calls, agent_steps, reads)
        if found:
            # the task's order first: the first expected write not taken as expected (wrong arguments or
            # missing); only when every expected write was taken, the first extra write by step
            best = min(found, key=_decisive)
            others = [
                {"kind": c["kind"], "step": c["step"], "tool": c["tool"]}
                for c in sorted(found, key=_decisive)
                if c is not best
            ]
            del best["_order"]
            return {**best, "n_expected": n_expected, "n_matched": n_matched, "others": others[:10]}
    unsaid = missing_outputs([str(o) for o in outputs], [t for _i, t in texts])
    if not unsaid:
        return None
    last = next(((i, t) for i, t in reversed(texts) if t), None)
    return {
        "kind": "wrong_information",
        "step": last[0] if last else None,
        "tool": None,
        "argument": None,
        "actual": short(last[1], _LAST_MESSAGE_CHARS) if last else None,
        "expected": unsaid[0],
        "expected_action": None,
        "agent_call": None,
        "where": "the agent's last message: no message of the agent states this expected output",
        "n_expected": n_expected,
        "n_matched": n_matched,
        "missing_outputs": unsaid,
    }


def _decisive(c: dict[str, Any]) -> tuple[int, int, int]:
    """Sort key: expected actions (wrong arguments, missing) in the task's order, then extra writes by step."""
    if c["kind"] == "extra_action":
        return (1, c["step"] if c["step"] is not None else 1 << 62, c["_order"])
    return (0, c["_order"], _KIND_ORDER[c["kind"]])


def _candidates(
    d: dict[str, Any],
    want: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    agent_steps: list[int],
    reads: list[dict[str, int]],
) -> list[dict[str, Any]]:
    """Every divergence of the alignment `d`, each placed at a step (`_order`: a tie-breaker)."""
    found: list[dict[str, Any]] = []
    for w in d["wrong_arguments"]:
        i, j = w["expected"], w["actual"]
        first = w["differences"][0] if w["differences"] else {}
        found.append(
            {
                "kind": "wrong_arguments",
                "step": calls[j]["step"],
                "tool": w["name"],
                "argument": first.get("path") or None,
                "actual": first.get("actual"),
                "expected": first.get("expected"),
                "expected_action": {"index": i, **want[i]},
                "agent_call": {"index": j, **calls[j]},
                "where": "the agent's call",
                "differences": w["differences"],
                "_order": i,
            }
        )
    for x in d["extra"]:
        j = x["actual"]
        found.append(
            {
                "kind": "extra_action",
                "step": calls[j]["step"],
                "tool": x["name"],
                "argument": None,
                "actual": calls[j]["args"],
                "expected": None,
                "expected_action": None,
                "agent_call": {"index": j, **calls[j]},
                "where": "the agent's call: a state-changing call the task does not expect",
                "_order": j,
            }
        )
    pairs = {p["expected"]: p["actual"] for p in [*reads, *d["matched"], *d["wrong_arguments"]]}
    diverging = sorted(
        [(calls[x["actual"]]["step"], x["name"]) for x in d["extra"]]
        + [(calls[w["actual"]]["step"], w["name"]) for w in d["wrong_arguments"]],
        key=lambda t: t[0] if t[0] is not None else 1 << 62,
    )
    for m in d["missing"]:
        i = m["expected"]
        step, where = _missing_step(i, pairs, want, calls, agent_steps)
        start = _after_step(i, pairs, calls)
        instead = next(
            ((s, n) for s, n in diverging if s is not None and s > start and (step is None or s <= step)),
            None,
        )
        if instead is not None:  # the agent changed the state otherwise there: that is where it went wrong
            step, where = instead[0], f"step {instead[0]}, where the agent called {instead[1]} instead"
        found.append(
            {
                "kind": "missing_action",
                "step": step,
                "tool": m["name"],
                "argument": None,
                "actual": None,
                "expected": want[i]["args"],
                "expected_action": {"index": i, **want[i]},
                "agent_call": None,
                "where": where,
                "_order": i,
            }
        )
    return found


def _after_step(i: int, pairs: dict[int, int], calls: list[dict[str, Any]]) -> int:
    """The step of the latest expected action before `i` the agent took (-1: none)."""
    steps = [calls[pairs[k]]["step"] for k in pairs if k < i and calls[pairs[k]]["step"] is not None]
    return max(steps, default=-1)


def _missing_step(
    i: int,
    pairs: dict[int, int],
    want: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    agent_steps: list[int],
) -> tuple[int | None, str]:
    """Where the agent should have taken expected action `i`, and the rule that says so."""
    before = [k for k in pairs if k < i and calls[pairs[k]]["step"] is not None]
    last = agent_steps[-1] if agent_steps else None
    if before:
        k = max(before, key=lambda b: (calls[pairs[b]]["step"], b))  # the latest taken in the conversation
        at = calls[pairs[k]]["step"]
        after = next((s for s in agent_steps if s > at), None)
        if after is not None:
            return after, (
                f"the first agent step after step {at}, where the expected action before it "
                f"({want[k]['name']}) was taken"
            )
        return last, (
            f"the agent's last step: the expected action before it ({want[k]['name']}, step {at}) "
            "was its last move"
        )
    return last, "the end of the conversation: the agent took none of the expected actions before this one"
