"""`rr audit` time: the largest committed history, and a 60-request reflection with a child and compactions.

Two subjects: (1) the largest file in tests/replay/histories (offline: `rr audit FILE`); (2) a reflection
run here by `bench-audit-60` (a scripted in-process model: a cell, a child, then cells that print ~900
characters each until the context is summarised, continue-as-new, and so on: 60 model requests of the root
in all, plus the child's and the summaries). For (2) both paths are timed: from the server
(`reflector.client.audit.build.audit_workflow`: read every run and child, replay, build) and the CLI on its export
(`rr audit FILE --json`, a subprocess: Python start and imports included). Medians of `--reps`.

    python -m bench.audit_speed [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bench.common import median, start_bench_env, table
from reflector import client as rr
from reflector.client import connect
from reflector.client.audit.build import audit_file, audit_workflow
from reflector.client.audit.histories import collect, dump_bundle
from reflector.client.audit.render_html import render_html
from reflector.client.audit.render_text import render_text
from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL, ReflectionConfig
from reflector.runtime.models import register_model
from reflector.testing.scripted import synthesis_aware
from worker import audit_replay_hooks, build_worker

REPO_ROOT = Path(__file__).resolve().parents[1]
HISTORIES = REPO_ROOT / "tests" / "replay" / "histories"
HOOKS = audit_replay_hooks()  # the replayer and the workflow-side capture of model requests
MODEL = "bench-audit-60"
ROOT_CELLS = 58  # + the recurse call + the answer = 60 requests of the root session


def _returns(messages: list[ModelMessage], tool: str) -> list[str]:
    return [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == tool
    ]


def _summarised(messages: list[ModelMessage]) -> int:
    found = [
        int(x)
        for m in messages
        for p in m.parts
        if isinstance(p, TextPart)
        for x in re.findall(r"scripted summary: (\d+) cell outputs", p.content)
    ]
    return found[-1] if found else 0


def _answer(info: AgentInfo, evidence: str) -> ModelResponse:
    args = {
        "reasoning": "r",
        "error_identification": "e",
        "root_cause_analysis": "r",
        "correct_approach": "c",
        "key_insight": "k",
        "skill_tags": [],
        "extracted_learnings": [
            {"learning": "l", "atomicity_score": 0.9, "evidence": evidence, "justification": "j"}
        ],
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")])


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    first = next(
        (str(p.content) for m in messages for p in m.parts if type(p).__name__ == "UserPromptPart"), ""
    )
    cells = _returns(messages, EXECUTE_CODE_TOOL)
    if "CHILD:" in first:
        if not cells:
            return ModelResponse(
                parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": "print('child', len(traces))"})]
            )
        return _answer(info, "cell 4")
    done = _summarised(messages) + len(cells)
    if done == 1 and not _returns(messages, RECURSE_TOOL) and not _summarised(messages):
        return ModelResponse(
            parts=[ToolCallPart(RECURSE_TOOL, {"prompt": "CHILD: look", "context_code": ""})]
        )
    if done < ROOT_CELLS:
        code = f"v{done} = ' '.join(['yy'] * 300)\nprint('cell {done}', v{done})"
        return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"c{done}")])
    return _answer(info, 'cell 3: "cell 0"')


register_model(MODEL, lambda: FunctionModel(synthesis_aware(script), model_name=MODEL))


def _cli(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "reflector.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    env = await start_bench_env()
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    cli_env.update(
        {"RR_HOME": str(env.home / "cli"), "RR_PLUGINS": "bench.audit_speed,reflector.testing.scripted"}
    )
    rows: list[list[object]] = []
    try:
        imports = []  # what every `rr audit` process pays before it reads anything: Python and rr's imports
        for _ in range(args.reps):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", "import reflector.cli, reflector.client.audit.build, worker"],
                env=cli_env,
                cwd=REPO_ROOT,
                check=True,
                stdin=subprocess.DEVNULL,
            )
            imports.append(time.perf_counter() - t0)
        print(
            f"python + imports of a CLI process: {median(imports):.3f} s median; load average {os.getloadavg()}"
        )
        largest = max(HISTORIES.glob("*.json"), key=lambda p: p.stat().st_size)
        events = len(json.loads(largest.read_text())["events"])
        inproc = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            render_text(await audit_file(largest, env.settings.blob_dir, HOOKS))
            inproc.append(time.perf_counter() - t0)
        cli = [_cli(["audit", str(largest), "--json"], cli_env) for _ in range(args.reps)]
        rows.append(
            [
                f"{largest.name} ({largest.stat().st_size // 1024} KB)",
                1,
                events,
                "",
                median(inproc),
                median(cli),
            ]
        )

        client = await connect(env.address, settings=env.settings)
        tq = f"audit-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            cfg = ReflectionConfig(
                model=MODEL, max_requests=90, context_window=8_000, microcompact_keep_recent=100
            )
            handle = await rr.start_reflection(
                client, rr.build_input(env.trace, config=cfg), tq, f"bench-audit-{uuid.uuid4().hex[:8]}"
            )
            out = await handle.result()
        rt = out.raw["rr_trace"]
        assert rt["compactions"] >= 1 and len(rt["subagent_calls"]) == 1, rt
        server_s, html_s = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            audit = await audit_workflow(client, handle.id, env.settings.blob_dir, HOOKS)
            server_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            render_html(audit)
            html_s.append(time.perf_counter() - t0)
        bundle = await collect(client, handle.id, env.settings.blob_dir)
        export = env.home / "export.json"
        export.write_text(dump_bundle(bundle))
        cli = [_cli(["audit", str(export), "--json"], cli_env) for _ in range(args.reps)]
        assert len(audit.session.requests()) == rt["total_iterations"] == 60, rt
        rows.append(
            [
                f"60-request reflection, 1 child, {rt['compactions']} compactions",
                len(bundle.runs),
                bundle.events,
                audit.requests,
                median(server_s),
                median(cli),
            ]
        )
        print(f"HTML render of the 60-request audit: {median(html_s):.3f} s median")
    finally:
        await env.server.astop()
    print(
        table(
            ["history", "runs", "events", "requests (tree)", "audit in-process s", "rr audit FILE --json s"],
            rows,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
