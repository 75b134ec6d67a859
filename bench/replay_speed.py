"""`rr replay` speed (events/s) for the largest committed history and for a 60-request reflection with a
child and a compaction.

The 60-request reflection is generated here with a scripted model (`bench-replay-60`: 52 cells of about
2,000 characters, a `recurse` child of 5 cells at cell 3, a 3k context window so it microcompacts,
summarises and continues as new), on a fresh embedded dev server, then exported with `rr export`. Each
figure is the median of `--repeat` runs of the real command in a subprocess:

- `rr replay FILE --json` (offline, from the export file / the committed history): the `events_per_s`
  it reports (replay only: the replayer is built before the clock starts) and the command's wall time
  (interpreter start, model families loaded, replay);
- `rr replay ID --json` (from the server: the histories are read, payloads inlined, while replaying);
- warm: the same bundle replayed again and again by one replayer in this process (steady state).

    python -m bench.replay_speed [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from datetime import date
from pathlib import Path

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL
from reflector.runtime.models import register_model

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "tests" / "replay" / "histories"
MODEL = "bench-replay-60"
ROOT_CELLS, CHILD_CELLS, CHILD_AT = 52, 5, 3
CHILD_MARK = "BENCH-CHILD"
_SUMMARY_RE = re.compile(r"bench summary: (\d+) cells ran; child: (yes|no)")
_ANSWER = {
    "reasoning": "bench",
    "error_identification": "none",
    "root_cause_analysis": "none",
    "correct_approach": "none",
    "key_insight": "none",
    "extracted_learnings": [],
    "skill_tags": [],
}


def _first_prompt(messages: list[ModelMessage]) -> str:
    return next((str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)), "")


def _returns(messages: list[ModelMessage], tool: str) -> int:
    return sum(1 for m in messages for p in m.parts if isinstance(p, ToolReturnPart) and p.tool_name == tool)


def _cell(k: int) -> ModelResponse:
    code = f"w{k} = ' '.join(['word'] * 400)\nprint({k}, w{k})"
    return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"c{k}")])


async def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    first = _first_prompt(messages)
    if first.startswith("SUMMARISE_TRANSCRIPT"):  # the summary says how far the session got
        before = _SUMMARY_RE.findall(first)
        n = first.count(f"[ToolReturnPart {EXECUTE_CODE_TOOL}]") + (int(before[-1][0]) if before else 0)
        child = f"[ToolReturnPart {RECURSE_TOOL}]" in first or bool(before and before[-1][1] == "yes")
        return ModelResponse(
            parts=[TextPart(f"bench summary: {n} cells ran; child: {'yes' if child else 'no'}")]
        )
    summaries = [
        s
        for m in messages
        for p in m.parts
        if isinstance(p, TextPart)
        for s in _SUMMARY_RE.findall(p.content)
    ]
    k = _returns(messages, EXECUTE_CODE_TOOL) + (int(summaries[-1][0]) if summaries else 0)
    if CHILD_MARK in first:  # the child: a few cells, then its answer
        if k < CHILD_CELLS:
            return _cell(k)
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, _ANSWER, tool_call_id="child-final")]
        )
    child_done = _returns(messages, RECURSE_TOOL) > 0 or bool(summaries and summaries[-1][1] == "yes")
    if k == CHILD_AT and not child_done and RECURSE_TOOL in {t.name for t in info.function_tools}:
        args = {"prompt": f"{CHILD_MARK}: look at the trace's steps", "context_code": ""}
        return ModelResponse(parts=[ToolCallPart(RECURSE_TOOL, args, tool_call_id="r0")])
    if k < ROOT_CELLS and info.function_tools:
        return _cell(k)
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, _ANSWER, tool_call_id="final")])


register_model(MODEL, lambda: FunctionModel(_script, model_name=MODEL))


def _rr(*args: str, env: dict[str, str]) -> tuple[float, dict[str, object]]:
    exe = Path(sys.executable).parent / "rr"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]
    start = time.perf_counter()
    p = subprocess.run(
        [*cmd, *args, "--json"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"rr {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    report: dict[str, object] = json.loads(p.stdout)
    return wall, report


def _median_run(args: tuple[str, ...], env: dict[str, str], repeat: int) -> tuple[int, int, float, float]:
    walls, rates = [], []
    histories = events = 0
    for _ in range(repeat):
        wall, report = _rr(*args, env=env)
        walls.append(wall)
        rates.append(float(report["events_per_s"]))  # type: ignore[arg-type]
        histories, events = int(report["histories"]), int(report["events"])  # type: ignore[call-overload]
    return histories, events, statistics.median(rates), statistics.median(walls)


async def _warm(path: Path, blob_dir: Path, repeat: int) -> float:
    import worker
    from reflector.client.audit.histories import load_bundle
    from reflector.client.audit.replay import as_stream, recording_replayer, replay_runs

    bundle = load_bundle(path)
    replayer = recording_replayer(blob_dir, worker.replay_factory)
    rates = []
    for _ in range(repeat + 1):  # the first pass warms the replayer up
        start = time.perf_counter()
        results = [r async for r in replay_runs(as_stream(bundle.runs), replayer=replayer)]
        elapsed = time.perf_counter() - start
        assert all(r.ok for r in results), [r.failure for r in results if not r.ok]
        rates.append(bundle.events / elapsed)
    return statistics.median(rates[1:])


async def _generate(env: dict[str, str]) -> tuple[str, Path, dict[str, object], object]:
    """Run the 60-request reflection on a fresh embedded server; returns its id, its export file, its usage."""
    from bench.common import start_bench_env
    from reflector import client as rr
    from reflector.client.audit.histories import export
    from reflector.contract import ReflectionConfig
    from worker import build_worker

    bench = await start_bench_env()
    os.environ["RR_PLUGINS"] = env[
        "RR_PLUGINS"
    ]  # the worker and the warm replays here: the committed histories'
    # scripted models and this module's
    client = await rr.connect(bench.address, settings=bench.settings)
    tq = f"replay-speed-{uuid.uuid4().hex[:6]}"
    async with build_worker(client, tq):
        cfg = ReflectionConfig(
            model=MODEL, max_requests=90, max_tokens=5_000_000, context_window=3_000, max_compactions=10
        )
        handle = await rr.start_reflection(
            client, rr.build_input(bench.trace, config=cfg), tq, f"replay-speed-{uuid.uuid4().hex[:8]}"
        )
        out = await handle.result()
    path = bench.home / "replay-60.json"
    with path.open("w", encoding="utf-8") as fh:
        summary = await export(client, handle.id, bench.settings.blob_dir, out=fh)
    rt = out.raw["rr_trace"]
    facts = {
        "requests": out.raw["usage"]["requests"],
        "children": len(rt["subagent_calls"]),
        "summaries": rt["compactions"],
        "microcompactions": rt["microcompactions"],
        "continued_as_new": rt["continued_as_new"],
        "histories": summary.histories,
        "events": summary.events,
        "stop_reason": rt["stop_reason"],
    }
    env.update({"RR_HOME": str(bench.home), "TEMPORAL_ADDRESS": bench.address})
    return handle.id, path, facts, bench.server


def _largest_committed() -> Path:
    return max(
        COMMITTED.glob("*.json"), key=lambda p: (len(json.loads(p.read_text())["events"]), p.stat().st_size)
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    env = {
        **base,
        "PYTHONPATH": str(REPO_ROOT),
        "RR_PLUGINS": "reflector.testing.scripted,bench.replay_speed",
    }
    wf_id, export_file, facts, server = await _generate(env)
    rows = []
    try:
        committed = _largest_committed()
        h, e, rate, wall = _median_run(("replay", str(committed)), env, args.repeat)
        warm = await _warm(committed, Path(env["RR_HOME"]) / "blobs", args.repeat)
        rows.append(
            [f"committed {committed.name}", "file", h, e, f"{rate:,.0f}", f"{wall:.2f}", f"{warm:,.0f}"]
        )
        h, e, rate, wall = _median_run(("replay", str(export_file)), env, args.repeat)
        warm = await _warm(export_file, Path(env["RR_HOME"]) / "blobs", args.repeat)
        rows.append(
            [
                "60-request reflection (child, compaction)",
                "export file",
                h,
                e,
                f"{rate:,.0f}",
                f"{wall:.2f}",
                f"{warm:,.0f}",
            ]
        )
        h, e, rate, wall = _median_run(("replay", wf_id), env, args.repeat)
        rows.append(
            ["60-request reflection (child, compaction)", "server", h, e, f"{rate:,.0f}", f"{wall:.2f}", "–"]
        )
    finally:
        await server.astop()  # type: ignore[attr-defined]
    from bench.common import table

    print(f"rr replay speed, {date.today().isoformat()}, medians of {args.repeat} runs")
    print(f"60-request reflection: {json.dumps(facts)}")
    print(
        table(
            [
                "history",
                "source",
                "histories",
                "events",
                "`rr replay` events/s",
                "command wall s",
                "warm in-process events/s",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
