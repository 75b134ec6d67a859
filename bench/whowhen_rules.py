"""The rules of `reflector.analysis.toolkit.actors.suspect_mistake`, scored on the labelled Who&When failures.

    python -m bench.whowhen_rules [SHARED_TRACES_DIR]     (default ../shared/traces)

Reads `who-and-when/algorithm-generated/*.json` under the given folder, removes the labels
(`mistake_agent`, `mistake_step`, `mistake_reason`, `is_correct`) before the trace is normalised, runs
each rule alone and the combination `suspect_mistake` uses, and compares the guessed `actor` with
`mistake_agent` and `step` with `int(mistake_step)`. Accuracy counts a rule that does not fire as a
miss. The rules were designed on the runs with an odd question number (the file's number) and the
even ones were held out: both halves are reported. `step where fired vs the others`: the rule's step
accuracy on the runs where it fires, beside that of the combination without it on the same runs. Since
issue 28 the combination holds only the rules that rest on evidence (no position prior, no label
statistics) and takes the earliest step they place; `first_action` and `first_claim` are reported as leads.
Deterministic: no model, no network.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import table
from bench.quality_labels import WHOWHEN_LABEL_KEYS
from reflector.analysis.toolkit.actors import COMBINATION, RULES, suspect_mistake
from reflector.analysis.traces import normalize

RANDOM = {"agent": 0.291, "step": 0.191}  # the dataset's paper, Table 1, same split
PUBLISHED = {"agent": 0.543, "step": 0.255}  # GPT-4o with the ground truth: all-at-once / step-by-step

Guess = Callable[[dict[str, Any]], dict[str, Any] | None]


def load(folder: Path) -> list[tuple[int, dict[str, Any], str, int]]:
    """(question number, the normalised run without its labels, mistake_agent, mistake_step) per file."""
    out = []
    for path in sorted(folder.glob("*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)):
        data = json.loads(path.read_text(encoding="utf-8"))
        agent, step = str(data["mistake_agent"]), int(data["mistake_step"])
        view = normalize({k: v for k, v in data.items() if k not in WHOWHEN_LABEL_KEYS})
        out.append((int(re.sub(r"\D", "", path.stem) or 0), view, agent, step))
    return out


def _score(
    runs: list[tuple[int, dict[str, Any], str, int]], guess: Guess, other: Guess
) -> dict[str, list[int]]:
    """Per half ("all", "odd", "even"): [runs, fired, agent hits, step hits, step hits where fired,
    `other`'s step hits on the runs where `guess` fired]."""
    halves: dict[str, list[int]] = {"all": [0] * 6, "odd": [0] * 6, "even": [0] * 6}
    for number, view, agent, step in runs:
        g = guess(view)
        base = other(view) if g is not None else None
        for half in ("all", "odd" if number % 2 else "even"):
            h = halves[half]
            h[0] += 1
            if g is not None:
                h[1] += 1
                h[2] += g["actor"] == agent
                h[3] += g["step"] == step
                h[4] += g["step"] == step
                h[5] += base is not None and base["step"] == step
    return halves


def _first_step(view: dict[str, Any]) -> dict[str, Any] | None:
    steps = view["steps"]
    return {"step": steps[0]["index"], "actor": steps[0]["actor"]} if steps else None


def _combination_without(name: str) -> Guess:
    """The combination without the rule `name`: what that rule competes with where it fires."""
    order = [n for n in COMBINATION if n != name]

    def guess(view: dict[str, Any]) -> dict[str, Any] | None:  # the earliest step the others place
        fired = [g for g in (suspect_mistake(view, n) for n in order) if g is not None]
        return min(fired, key=lambda g: g["step"]) if fired else None

    return guess


def _pct(num: int, den: int) -> str:
    return f"{num / den:.1%}" if den else "-"


def rows(runs: list[tuple[int, dict[str, Any], str, int]]) -> list[list[object]]:
    guesses: list[tuple[str, Guess]] = [
        *((name, lambda v, n=name: suspect_mistake(v, n)) for name in RULES),
        (f"combination (earliest of {', '.join(COMBINATION)})", suspect_mistake),
        ("baseline: the first step", _first_step),
    ]
    out: list[list[object]] = []
    for name, guess in guesses:
        h = _score(runs, guess, _combination_without(name))
        out.append(
            [
                name,
                f"{h['all'][1]}/{h['all'][0]}",
                *(_pct(h[x][k], h[x][0]) for x in ("all", "odd", "even") for k in (2, 3)),
                *(f"{_pct(h[x][4], h[x][1])} vs {_pct(h[x][5], h[x][1])}" for x in ("odd", "even")),
            ]
        )
    blank = [""] * (len(HEADERS) - 4)
    out.append(["random choice (published)", "", f"{RANDOM['agent']:.1%}", f"{RANDOM['step']:.1%}", *blank])
    out.append(
        ["GPT-4o best (published)", "", f"{PUBLISHED['agent']:.1%}", f"{PUBLISHED['step']:.1%}", *blank]
    )
    return out


HEADERS = [
    "rule",
    "fires",
    "agent",
    "step",
    "agent odd",
    "step odd",
    "agent even",
    "step even",
    "odd: step where fired vs the others",
    "even: step where fired vs the others",
]


def main(argv: list[str]) -> int:
    shared = Path(argv[0]) if argv else Path("../shared/traces")
    folder = shared / "who-and-when" / "algorithm-generated"
    if not folder.is_dir():
        print(f"no Who&When folder at {folder}", file=sys.stderr)
        return 2
    runs = load(folder)
    n_odd = sum(1 for r in runs if r[0] % 2)
    print(f"{len(runs)} labelled runs ({n_odd} odd: design half, {len(runs) - n_odd} even: held out)")
    print(table(HEADERS, rows(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
