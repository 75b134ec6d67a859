"""Reflection quality on labelled traces, through the real workflow: does the reflection find the failing step?

    python -m bench.quality [--model heuristic] [--traces DIR] [--tau FILE] [--whowhen DIR]
                            [--limit N] [--concurrency K] [--show N] [--json OUT]

Every labelled run is written to its own file with its labels removed, uploaded, and reflected by a
`ReflectionWorkflow` on an embedded dev server and an in-process worker (a provider model such as
`openai:gpt-4o` runs when its key is set in this process's environment). The answers are then scored
against the labels (the rules are in `bench/quality_labels.py`, apart from the code under test):

- tau-bench (runs with reward < 1): hit rate raw and with the answer key's verbatim copies blanked,
  `diagnosis.step` and `diagnosis.kind` accuracy, by label kind; and every checkable statement of the
  diagnosis verified against the trace (`false statements`);
- Who&When: agent- and step-level accuracy of `diagnosis.actor` / `diagnosis.step`, beside the random
  baseline and the best published GPT-4o figures on the same split;
- the median wall time per reflection.

`--traces DIR` is a folder laid out like the team's labelled set: `tau-bench-airline-gpt-4o.json` and
`who-and-when/algorithm-generated/*.json`; `--tau` / `--whowhen` point at other files of the same formats.
`--show N` prints N tau-bench reflections (diagnosis and error identification) beside their labels, for a
reader to check each statement.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import statistics
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.common import bench_home, table
from bench.quality_labels import (
    WHOWHEN_LABEL_KEYS,
    TauLabel,
    answer_key_texts,
    blank_echoes,
    leaf_differences,
    reflection_text,
    step_ok,
    tau_hit,
    tau_label,
)
from bench.tau_critical_labels import CRITICAL, LABEL_DATE, LABELLER
from reflector import client as rr
from reflector.contract import ReflectionConfig
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings

# Published on the same split (the Who&When paper, Table 1, GPT-4o with the ground truth): the best of
# its methods for each level, and random choice.
WHOWHEN_PUBLISHED = {"agent": (0.543, "all-at-once"), "step": (0.255, "step-by-step")}
WHOWHEN_RANDOM = {"agent": 0.291, "step": 0.191}


def _load_tau(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [r for r in data if isinstance(r, dict) and float(r.get("reward", 1)) < 1]


def _load_whowhen(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    files = sorted(folder.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
    return [(p.stem, json.loads(p.read_text(encoding="utf-8"))) for p in files]


def _unlabelled(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k not in WHOWHEN_LABEL_KEYS}


async def _reflect_all(
    jobs: list[tuple[str, dict[str, Any]]],
    model: str,
    concurrency: int,
    settings: Settings,
    client: Any,
    tq: str,
) -> dict[str, tuple[dict[str, Any], float]]:
    """Each job's reflection (as a dict) and its wall time, `concurrency` at a time."""
    work = settings.home / "quality"
    work.mkdir(parents=True, exist_ok=True)
    sem = asyncio.Semaphore(concurrency)
    done: dict[str, tuple[dict[str, Any], float]] = {}

    async def one(name: str, data: dict[str, Any]) -> None:
        async with sem:
            path = work / f"{name}.json"
            path.write_text(json.dumps(data), encoding="utf-8")
            t0 = time.perf_counter()
            trace = rr.upload_trace(path, settings)
            inp = rr.build_input(trace, config=ReflectionConfig(model=model))
            handle = await rr.start_reflection(
                client, inp, tq, f"quality-{name}-{uuid.uuid4().hex[:6]}", trace_name=path.name
            )
            out = await handle.result()
            done[name] = (out.model_dump(mode="json"), time.perf_counter() - t0)
            if len(done) % 20 == 0:
                print(f"  {len(done)}/{len(jobs)} reflections", file=sys.stderr, flush=True)

    await asyncio.gather(*(one(n, d) for n, d in jobs))
    return done


# ------------------------------------------------------------------------------ checking statements


def _tau_calls(raw: dict[str, Any]) -> list[tuple[int, str, Any]]:
    out = []
    for i, msg in enumerate(raw.get("traj") or []):
        for call in (msg.get("tool_calls") or []) if isinstance(msg, dict) else []:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = fn.get("arguments")
            out.append((i, str(fn.get("name")), args))
    return out


def _leaf_texts(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _leaf_texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _leaf_texts(v)]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return [str(value).lower()]


def _squash(text: str) -> str:
    return "".join(text.split()).lower()


def _contains(haystack: list[str], claim: str) -> bool:
    """Whether a claimed value is one of the trace's values (or of its JSON, whitespace ignored); a claim
    shortened with "..." counts when the trace has a value starting with what is left."""
    claim = _squash(claim).strip("'\"")
    if not claim:
        return True
    hay = [_squash(h) for h in haystack]
    if claim.endswith("..."):
        stem = claim[:-3]
        return len(stem) > 3 and any(stem in h for h in hay)
    return any(claim == h or (len(claim) > 3 and claim in h) for h in hay)


def check_tau_diagnosis(raw: dict[str, Any], diag: dict[str, Any] | None) -> list[str]:
    """The diagnosis's checkable statements that the trace contradicts (empty: every one holds).

    Checked: the step exists; the tool was called at that step (or, for a missing action, is an expected
    tool); `actual` is a value of the agent's call at that step; `expected` is a value of the expected
    actions (or outputs). A claim stated in words (summary) is left to the reader (`--show`)."""
    if not diag:
        return []
    false: list[str] = []
    traj = raw.get("traj") or []
    root = diag.get("step")
    if root is not None and not (isinstance(root, int) and 0 <= root < len(traj)):
        return [f"step {root} is not a step of the run"]
    # the tool, the actual and the expected value are the symptom's (the divergence); `step` is the root cause
    step = diag.get("symptom_step") if diag.get("symptom_step") is not None else root
    tool, kind = diag.get("tool"), diag.get("kind")
    if step is not None and not (isinstance(step, int) and 0 <= step < len(traj)):
        false.append(f"step {step} is not a step of the run")
        return false
    calls = _tau_calls(raw)
    task = (raw.get("info") or {}).get("task") or {}
    expected = task.get("actions") or []
    at_step = [c for c in calls if c[0] == step]
    if tool and kind in ("wrong_arguments", "extra_action", "tool_error_mishandled"):
        if not any(c[1] == tool for c in at_step):
            false.append(f"{tool} was not called at step {step}")
    if tool and kind == "missing_action" and not any(a.get("name") == tool for a in expected):
        false.append(f"{tool} is not an expected action")
    actual = diag.get("actual")
    if actual and kind in ("wrong_arguments", "extra_action") and at_step:
        leaves = [t for c in at_step if c[1] == tool for t in _leaf_texts(c[2])] + [
            json.dumps(c[2], sort_keys=True).lower() for c in at_step
        ]
        if not _contains(leaves, str(actual)):
            false.append(f"actual {actual!r} is not a value of the agent's call at step {step}")
    exp = diag.get("expected")
    if exp and kind in ("wrong_arguments", "missing_action"):
        leaves = [t for a in expected for t in _leaf_texts(a.get("arguments", a.get("kwargs")))] + [
            json.dumps(a.get("arguments", a.get("kwargs")), sort_keys=True).lower() for a in expected
        ]
        if not _contains(leaves, str(exp)):
            false.append(f"expected {exp!r} is not a value of the expected actions")
    return false


# ------------------------------------------------------------------------------------------ scoring


def score_tau(
    runs: list[dict[str, Any]], outs: dict[str, tuple[dict[str, Any], float]], show: int
) -> list[str]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    windows: list[float] = []
    shown = 0
    lines: list[str] = []
    false_total: list[str] = []
    for raw in runs:
        name = _tau_name(raw)
        if name not in outs:
            continue
        out, _t = outs[name]
        label = tau_label(raw)
        c = by_kind[label.kind]
        c["n"] += 1
        if label.kind == "unlabelled":
            continue
        text = reflection_text(out)
        blanked = blank_echoes(text, answer_key_texts(raw))
        diag = out.get("diagnosis") or {}
        c["hit"] += tau_hit(label, text)
        c["echo_free"] += tau_hit(label, blanked)
        symptom = diag.get("symptom_step") if diag.get("symptom_step") is not None else diag.get("step")
        c["step"] += step_ok(label, symptom)
        c["root_differs"] += diag.get("step") is not None and diag.get("step") != symptom
        c["kind"] += diag.get("kind") == label.kind
        c["has_diagnosis"] += bool(out.get("diagnosis"))
        false = check_tau_diagnosis(raw, out.get("diagnosis"))
        c["false"] += len(false)
        false_total += [f"{name}: {f}" for f in false]
        if label.window:
            windows.append((label.window[1] - label.window[0] + 1) / max(len(raw.get("traj") or []), 1))
        if shown < show:
            shown += 1
            lines += _shown(name, label, out)
    rows: list[list[object]] = []
    total: Counter[str] = Counter()
    for kind in ("wrong_arguments", "extra_action", "missing_action", "wrong_information", "unlabelled"):
        found = by_kind.get(kind)
        if not found:
            continue
        if kind != "unlabelled":
            total.update(found)
        rows.append(_row(kind, found))
    rows.append(_row("ALL (labelled)", total))
    exact = by_kind["wrong_arguments"] + by_kind["extra_action"]
    rows.append(_row("exact-step kinds", exact))
    out_lines = [
        table(
            [
                "label kind",
                "runs",
                "hit",
                "hit, echo-free",
                "symptom step",
                "kind",
                "with diagnosis",
                "false statements",
                "root != symptom",
            ],
            rows,
        )
    ]
    out_lines += _critical_lines(runs, outs)
    if windows:
        out_lines.append(
            f"missing/wrong-information steps are windows: median {statistics.median(windows):.0%} of "
            f"the run (a step inside counts), so their step column is generous"
        )
    if false_total:
        out_lines.append("false statements found:\n  " + "\n  ".join(false_total[:40]))
    return out_lines + lines


def _row(kind: str, c: Counter[str]) -> list[object]:
    n = c["n"]

    def pct(k: str) -> str:
        return f"{c[k] / n:.0%}" if n and kind != "unlabelled" else "-"

    return [
        kind,
        n,
        pct("hit"),
        pct("echo_free"),
        pct("step"),
        pct("kind"),
        pct("has_diagnosis"),
        c["false"] if kind != "unlabelled" else "-",
        pct("root_differs"),
    ]


def _critical_lines(runs: list[dict[str, Any]], outs: dict[str, tuple[dict[str, Any], float]]) -> list[str]:
    """Step accuracy against the hand labels of the critical step (`bench/tau_critical_labels.py`):
    `diagnosis.step` (the root cause) beside `symptom_step`, exact and within two steps."""
    got: Counter[str] = Counter()
    for raw in runs:
        key = (int(raw.get("task_id") or 0), int(raw.get("trial") or 0))
        name = _tau_name(raw)
        if key not in CRITICAL or name not in outs:
            continue
        want = CRITICAL[key][0]
        diag = outs[name][0].get("diagnosis") or {}
        got["n"] += 1
        for col, value in (
            ("root", diag.get("step")),
            ("symptom", diag.get("symptom_step", diag.get("step"))),
        ):
            got[f"{col}_exact"] += value == want
            got[f"{col}_near"] += isinstance(value, int) and abs(value - want) <= 2
    n = got["n"]
    if not n:
        return []
    rows: list[list[object]] = [
        [name, n, f"{got[f'{col}_exact'] / n:.0%}", f"{got[f'{col}_near'] / n:.0%}"]
        for name, col in (("diagnosis.step (the root cause)", "root"), ("diagnosis.symptom_step", "symptom"))
    ]
    return [
        "",
        f"hand labels of the critical step ({n} runs; {LABELLER}, {LABEL_DATE}):",
        table(["against the critical step", "runs", "exact", "within 2 steps"], rows),
    ]


def _shown(name: str, label: TauLabel, out: dict[str, Any]) -> list[str]:
    diag = out.get("diagnosis") or {}
    diffs = "; ".join(f"{p}: expected {e!r}, agent {a!r}" for p, e, a in label.differences[:3])
    return [
        "",
        f"--- {name}: label {label.kind} {label.tool or label.output} step {label.step or label.window} {diffs}",
        f"diagnosis: {json.dumps({k: v for k, v in diag.items() if k != 'evidence'}, ensure_ascii=False)[:600]}",
        f"error_identification: {str(out.get('error_identification'))[:700]}",
        f"key_insight: {str(out.get('key_insight'))[:300]}",
        "learnings: "
        + " | ".join(str(x.get("learning"))[:200] for x in out.get("extracted_learnings") or []),
    ]


def _digits26(i: int) -> list[int]:
    out = [i % 26]
    while i >= 26:
        i = i // 26 - 1
        out.insert(0, i % 26)
    return out


def renamed_whowhen(data: dict[str, Any]) -> dict[str, Any]:
    """A Who&When run with its agents renamed `Agent_A`, `Agent_B`, ... in an order that has nothing to do
    with the original names or their order (sorted by a hash of the name), everywhere the name occurs: the
    messages' `name`, the text, `system_prompt`'s keys, and the label `mistake_agent`."""
    names = {str(m.get("name")) for m in data.get("history") or [] if isinstance(m, dict) and m.get("name")}
    names |= (
        {str(k) for k in (data.get("system_prompt") or {})}
        if isinstance(data.get("system_prompt"), dict)
        else set()
    )
    order = sorted(names, key=lambda x: hashlib.sha256(x.encode()).hexdigest())
    # letters, not numbers: a name with digits would read as an id (a value) to the toolkit's tracing
    mapping = {x: "Agent_" + "".join(chr(65 + d) for d in _digits26(i)) for i, x in enumerate(order)}
    if not mapping:
        return data
    alts = "|".join(re.escape(x) for x in sorted(mapping, key=len, reverse=True))
    rx = re.compile(r"(?<![\w])(" + alts + r")(?![\w])")

    def sub(value: Any) -> Any:
        if isinstance(value, str):
            return rx.sub(lambda m: mapping[m.group(1)], value)
        if isinstance(value, list):
            return [sub(v) for v in value]
        if isinstance(value, dict):
            return {sub(k) if isinstance(k, str) else k: sub(v) for k, v in value.items()}
        return value

    out = {
        k: sub(v) if k in ("history", "system_prompt", "mistake_agent", "mistake_reason") else v
        for k, v in data.items()
    }
    return out


def role_only_whowhen(data: dict[str, Any]) -> dict[str, Any]:
    """A Who&When run in the Magentic-One dialect: each message's agent only in its `role`, no `name`."""
    history = [
        {"role": m.get("name") or m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m
        for m in data.get("history") or []
    ]
    return {**data, "history": history}


def score_whowhen(
    runs: list[tuple[str, dict[str, Any]]],
    outs: dict[str, tuple[dict[str, Any], float]],
    prefix: str = "ww-",
    title: str = "Who&When",
) -> list[str]:
    """Agent- and step-level accuracy, for each half (odd / even file numbers: the rules of issue 15 were
    designed on the odd half) and in all."""
    halves: dict[str, Counter[str]] = {"odd": Counter(), "even": Counter(), "all": Counter()}
    for name, data in runs:
        key = f"{prefix}{name}"
        if key not in outs:
            continue
        out, _t = outs[key]
        diag = out.get("diagnosis") or {}
        actor = str(diag.get("actor") or "").strip().lower()
        try:
            want = int(str(data.get("mistake_step")))
        except ValueError:
            want = -1
        number = int("".join(ch for ch in name if ch.isdigit()) or 0)
        for half in ("all", "odd" if number % 2 else "even"):
            h = halves[half]
            h["n"] += 1
            h["with_diag"] += bool(diag)
            h["agent"] += bool(actor) and actor == str(data.get("mistake_agent") or "").strip().lower()
            h["step"] += diag.get("step") == want
    if not halves["all"]["n"]:
        return []
    rows: list[list[object]] = [
        [
            f"this model: {half} ({'design half of issue 15' if half == 'odd' else 'held out' if half == 'even' else 'all'})",
            h["n"],
            f"{h['agent'] / h['n']:.1%}",
            f"{h['step'] / h['n']:.1%}",
            f"{h['with_diag'] / h['n']:.0%}",
        ]
        for half, h in halves.items()
        if h["n"]
    ]
    rows += [
        [
            "random choice (published)",
            "",
            f"{WHOWHEN_RANDOM['agent']:.1%}",
            f"{WHOWHEN_RANDOM['step']:.1%}",
            "",
        ],
        [
            f"GPT-4o best (published: {WHOWHEN_PUBLISHED['agent'][1]} / {WHOWHEN_PUBLISHED['step'][1]})",
            "",
            f"{WHOWHEN_PUBLISHED['agent'][0]:.1%}",
            f"{WHOWHEN_PUBLISHED['step'][0]:.1%}",
            "",
        ],
    ]
    return [table([title, "runs", "agent-level", "step-level", "with diagnosis"], rows)]


def _tau_name(raw: dict[str, Any]) -> str:
    return f"tau-{raw.get('task_id')}-{raw.get('trial')}"


# ------------------------------------------------------------------------------------------ main


async def run(args: argparse.Namespace) -> None:
    if not (args.traces or args.tau or args.whowhen):
        raise SystemExit("give the labelled set: --traces DIR, or --tau FILE / --whowhen DIR")
    traces = Path(args.traces or ".")
    tau_path = Path(args.tau) if args.tau else traces / "tau-bench-airline-gpt-4o.json"
    ww_dir = Path(args.whowhen) if args.whowhen else traces / "who-and-when" / "algorithm-generated"
    tau = _load_tau(tau_path)[: args.limit] if tau_path.exists() and not args.skip_tau else []
    ww = _load_whowhen(ww_dir)[: args.limit] if ww_dir.is_dir() and not args.skip_whowhen else []
    if not tau and not ww:
        raise SystemExit(f"no labelled traces found (looked for {tau_path} and {ww_dir})")
    jobs = [(_tau_name(r), r) for r in tau] + [(f"ww-{n}", _unlabelled(d)) for n, d in ww]
    renamed = [(n, renamed_whowhen(d)) for n, d in ww] if not args.no_rename else []
    jobs += [(f"wwr-{n}", _unlabelled(d)) for n, d in renamed]
    role_only = [(n, role_only_whowhen(d)) for n, d in ww] if args.role_only else []
    jobs += [(f"wwo-{n}", _unlabelled(d)) for n, d in role_only]
    home = bench_home()
    settings = Settings.from_env()
    server = DevServer(home / "temporal.sqlite", ui=False, log_file=home / "server.log")
    address = await server.astart()
    from worker import build_worker

    try:
        client = await rr.connect(address, settings=settings)
        tq = f"quality-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        async with build_worker(client, tq):
            outs = await _reflect_all(jobs, args.model, args.concurrency, settings, client, tq)
        wall = time.perf_counter() - t0
    finally:
        await server.astop()
    print(
        f"model {args.model}: {len(outs)} reflections in {wall:.0f} s, median "
        f"{statistics.median(t for _o, t in outs.values()):.2f} s each (concurrency {args.concurrency})\n"
    )
    if tau:
        print(f"tau-bench: {len(tau)} failed runs of {tau_path.name}")
        print("\n".join(score_tau(tau, outs, args.show)))
        print()
    if ww:
        print(f"Who&When: {len(ww)} labelled runs of {ww_dir.name}")
        print("\n".join(score_whowhen(ww, outs)))
        if renamed:
            print(
                "\nthe same runs with every agent renamed Agent_A, Agent_B, ... (in an order unrelated to the names):"
            )
            print("\n".join(score_whowhen(renamed, outs, "wwr-", "Who&When, agents renamed")))
        if role_only:
            print(
                "\nthe same runs with each agent named only in `role` (the Magentic-One dialect, no `name`):"
            )
            print("\n".join(score_whowhen(role_only, outs, "wwo-", "Who&When, role-only names")))
    if args.json:
        Path(args.json).write_text(json.dumps({k: v[0] for k, v in outs.items()}, indent=1), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="heuristic")
    p.add_argument(
        "--traces",
        default="",
        help="folder with the labelled set (tau-bench-airline-gpt-4o.json, "
        "who-and-when/algorithm-generated/)",
    )
    p.add_argument("--tau", help="a tau-bench results file (list of runs with info.task.actions)")
    p.add_argument("--whowhen", help="a folder of Who&When json files")
    p.add_argument("--skip-tau", action="store_true")
    p.add_argument("--skip-whowhen", action="store_true")
    p.add_argument("--no-rename", action="store_true", help="skip the Who&When runs with the agents renamed")
    p.add_argument(
        "--role-only", action="store_true", help="also run Who&When with the agents named only in role"
    )
    p.add_argument("--limit", type=int, default=None, help="at most N runs of each set")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--show", type=int, default=0, help="print N tau-bench reflections beside their labels")
    p.add_argument("--json", help="write every reflection to this file")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()

__all__ = [
    "main",
    "check_tau_diagnosis",
    "score_tau",
    "score_whowhen",
    "renamed_whowhen",
    "role_only_whowhen",
    "leaf_differences",
]
