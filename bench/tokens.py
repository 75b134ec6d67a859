"""Prompt tokens: what each model request of a reflection costs in input tokens, for rr, the anchor and the seed.

    python -m bench.tokens [--traces DIR] [--cells 3] [--json OUT]

The same traces are reflected by three systems through one local Chat Completions server (loopback, no
network; `reflector.testing.openai_server` with a script that works for all three):

- **rr**: a `ReflectionWorkflow` on an embedded dev server and an in-process worker (`openai-chat:` model);
- **anchor**: `bench/anchor.py`'s agent as benchmarked (user prompt "go", one `execute_code` tool, the
  output tool), and the same agent with the trace's JSON in its prompt (what a plain, non-recursive
  reflector sends). Run in process: a `TemporalDurability` agent sends the same request bodies;
- **seed**: the original recursive reflector rr was designed from, ACE's `RRStep`
  (`ace.steps.rr_step`, ace-framework), with its own prompt, tools and prompted JSON output.

Every system gets the same script: `--cells` `execute_code` calls (each prints the trace's type and size)
then the final answer (the output tool where the request offers one, else the JSON text the seed asks for).
So the figures compare what each system *sends* for the same work: instructions, tool definitions and their
JSON schemas, the task prompt, and the conversation each request re-sends.

Tokens are counted from each request body as OpenAI bills a Chat Completions request, with tiktoken's
`o200k_base` (GPT-4o's encoding, from the copy litellm bundles, so no download): per message 3 tokens, its
role, its text and its tool calls' names and arguments; plus 3 for the reply's priming; plus the tool
definitions as their compact JSON (OpenAI renders them into a typed namespace of about that size). Without
tiktoken's encoding files the count falls back to ``ceil(bytes / 4)`` and the table says so. The server
reports that count as ``prompt_tokens``, so rr's own ledger (``usage.input_tokens``) must equal the sum
over its requests (checked).

"cached (modelled)" is what an automatic prefix cache such as OpenAI's would serve from its cache within one
reflection: for each request, the longest token prefix it shares with an earlier request of the same
reflection, in steps of 128 tokens, counted from 1,024 tokens on (OpenAI's published rule). It is a model of
the provider, not a measurement of one; caching across reflections (the static prefix every reflection
shares) would add to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import table
from bench.token_count import TOKENIZER, cached_tokens, request_tokens, tokens_of

EXAMPLES = Path(__file__).resolve().parents[1] / "reflector" / "examples"


# ------------------------------------------------------------------------------------------ the server


def cell(k: int) -> str:
    """The k-th scripted cell: works on every system's `traces` (a dict, a list or text)."""
    return f"print('cell', {k}, type(traces).__name__, len(str(traces)))"


def _make_server(cells: int) -> Any:
    from reflector.testing.openai_server import OpenAIServer, _chat_cell_outputs, _reflection

    @dataclass
    class TokenServer(OpenAIServer):
        """The scripted Chat Completions server, reporting each request's counted tokens as `prompt_tokens`,
        and answering a request without an output tool (the seed's prompted output) with the JSON text."""

        counts: list[int] = field(default_factory=list)

        def _chat(self, body: dict[str, Any], n: int) -> dict[str, Any]:
            self.prompt_tokens = len(request_tokens(body))
            reply = super()._chat(body, n)
            tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
            outputs = _chat_cell_outputs(body.get("messages") or [])
            if len(outputs) >= self.cells and "final_result" not in tools:
                reply["choices"][0]["message"] = {
                    "role": "assistant",
                    "content": json.dumps(_reflection(outputs)),
                    "refusal": None,
                }
                reply["choices"][0]["finish_reason"] = "stop"
            return reply

    return TokenServer(cells=cells, code=cell)


def _chat_model(base_url: str) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=base_url, api_key="bench-key"))


# ------------------------------------------------------------------------------------------ the traces


@dataclass
class Trace:
    name: str
    path: Path  # what rr uploads
    data: Any  # what the seed and the anchor get (the file as loaded)


def _traces(shared: Path | None, work: Path) -> tuple[list[Trace], list[str]]:
    found = [Trace(p.stem, p, json.loads(p.read_text())) for p in sorted(EXAMPLES.glob("*.json"))]
    skipped: list[str] = []
    if shared is None or not shared.is_dir():
        skipped.append("tau-bench, OpenClaw, Who&When: no --traces folder given (or it does not exist)")
        return found, skipped
    tau = shared / "tau-bench-airline-gpt-4o.json"
    if tau.is_file():
        run = next(r for r in json.loads(tau.read_text()) if float(r.get("reward", 1)) < 1)
        path = work / "tau-bench-run.json"
        path.write_text(json.dumps(run))
        found.append(Trace(f"tau-bench task {run.get('task_id')}", path, run))
    else:
        skipped.append(f"tau-bench: no {tau.name}")
    claws = sorted(shared.glob("openclaw-*.jsonl"))
    if claws:
        lines = claws[0].read_text(errors="replace").splitlines()
        events = []
        for line in lines:
            start = line.find("{")
            if start >= 0:
                try:
                    events.append(json.loads(line[start:]))
                except ValueError:
                    pass
        found.append(Trace("OpenClaw session", claws[0], events))
    else:
        skipped.append("OpenClaw: no openclaw-*.jsonl")
    ww = sorted((shared / "who-and-when").glob("*/*.json"), key=lambda p: (len(p.stem), p.stem))
    if ww:
        from bench.quality_labels import WHOWHEN_LABEL_KEYS

        data = {k: v for k, v in json.loads(ww[0].read_text()).items() if k not in WHOWHEN_LABEL_KEYS}
        path = work / "whowhen-run.json"
        path.write_text(json.dumps(data))
        found.append(Trace(f"Who&When {ww[0].stem}", path, data))
    else:
        skipped.append("Who&When: no who-and-when/*/*.json")
    return found, skipped


# ------------------------------------------------------------------------------------------ the systems


async def _rr(traces: list[Trace], server: Any) -> dict[str, list[dict[str, Any]]]:
    """Each trace's request bodies from one rr reflection; checks the ledger against the counts."""
    from bench.common import start_bench_env
    from reflector import client as rr
    from reflector.client import connect
    from reflector.contract import ReflectionConfig
    from worker import build_worker

    env = await start_bench_env()
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        client = await connect(env.address, settings=env.settings)
        tq = f"tokens-{uuid.uuid4().hex[:6]}"
        async with build_worker(client, tq):
            for t in traces:
                before = len(server.requests)
                ref = rr.upload_trace(t.path, env.settings)
                cfg = ReflectionConfig(model=f"openai-chat:bench-tokens-{uuid.uuid4().hex[:6]}")
                result = await (
                    await rr.start_reflection(client, rr.build_input(ref, config=cfg), tq)
                ).result()
                assert result.raw["rr_trace"]["stop_reason"] == "completed", result.raw["rr_trace"]
                bodies = [r.body for r in server.requests[before:]]
                counted = sum(len(request_tokens(b)) for b in bodies)
                billed = result.raw["usage"]["input_tokens"]
                assert billed == counted, (
                    f"rr's ledger says {billed} input tokens, the server counted {counted}"
                )
                out[t.name] = bodies
    finally:
        from activities import sandbox as sandbox_activities

        await sandbox_activities.shutdown()
        await env.server.astop()
    return out


def _anchor(traces: list[Trace], server: Any, with_trace: bool) -> dict[str, list[dict[str, Any]]]:
    from bench import anchor

    out: dict[str, list[dict[str, Any]]] = {}
    for t in traces:
        anchor._namespaces["ns"] = {"traces": t.data}  # the anchor's cells see the trace as rr's do
        before = len(server.requests)
        prompt = json.dumps(t.data) if with_trace else "go"
        anchor.plain_agent.run_sync(prompt, model=_chat_model(server.base_url))
        out[t.name] = [r.body for r in server.requests[before:]]
    return out


def _seed(traces: list[Trace], server: Any) -> dict[str, list[dict[str, Any]]]:
    from ace.steps.rr_step import RRConfig, RRStep

    out: dict[str, list[dict[str, Any]]] = {}
    for t in traces:
        step = RRStep(_chat_model(server.base_url), config=RRConfig())
        before = len(server.requests)
        data = t.data
        question = str(data.get("question", "")) if isinstance(data, dict) else ""
        result = step.reflect(question=question, agent_output=None, traces=data)
        assert "error" not in result.raw, result.raw
        out[t.name] = [r.body for r in server.requests[before:]]
    return out


# ------------------------------------------------------------------------------------------ report


def _row(system: str, trace: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    seqs = [request_tokens(b) for b in bodies]
    counts = [len(s) for s in seqs]
    cached = cached_tokens(seqs)
    first = bodies[0] if bodies else {}
    tools = first.get("tools") or []
    return {
        "system": system,
        "trace": trace,
        "requests": len(counts),
        "first": counts[0] if counts else 0,
        "average": statistics.mean(counts) if counts else 0.0,
        "reflection": sum(counts),
        "cached": sum(cached),
        "tools_first": len(
            tokens_of(json.dumps([t.get("function", t) for t in tools], separators=(",", ":")))
        )
        if tools
        else 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="folder with tau-bench-airline-gpt-4o.json, openclaw-*.jsonl, who-and-when/",
    )
    ap.add_argument("--cells", type=int, default=3, help="execute_code calls before the answer (each system)")
    ap.add_argument("--only", default="rr,anchor,seed", help="systems to run (comma-separated)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows and the first rr request here")
    args = ap.parse_args()
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="rr-tokens-"))
    traces, skipped = _traces(args.traces, work)
    only = set(args.only.split(","))
    rows: list[dict[str, Any]] = []
    server = _make_server(args.cells)
    with server:
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = server.base_url, "bench-key"
        runs: list[tuple[str, dict[str, list[dict[str, Any]]]]] = []
        if "rr" in only:
            runs.append(("rr", asyncio.run(_rr(traces, server))))
        if "anchor" in only:
            runs.append(("anchor (prompt 'go')", _anchor(traces, server, with_trace=False)))
            runs.append(("anchor, trace in prompt", _anchor(traces, server, with_trace=True)))
        if "seed" in only:
            runs.append(("seed (ACE RRStep)", _seed(traces, server)))
    for system, by_trace in runs:
        for name, bodies in by_trace.items():
            rows.append(_row(system, name, bodies))
    print(f"Input tokens per request ({TOKENIZER}; {args.cells} execute_code calls, then the answer)")
    print(
        table(
            [
                "system",
                "trace",
                "requests",
                "first",
                "average",
                "per reflection",
                "cached (modelled)",
                "tool defs",
            ],
            [
                [
                    r["system"],
                    r["trace"],
                    r["requests"],
                    r["first"],
                    round(r["average"]),
                    r["reflection"],
                    r["cached"],
                    r["tools_first"],
                ]
                for r in rows
            ],
        )
    )
    by_system: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_system.setdefault(r["system"], []).append(r)
    print("\nMedian over the traces")
    print(
        table(
            ["system", "first", "average", "per reflection", "cached (modelled)", "tool defs"],
            [
                [
                    s,
                    round(statistics.median(r["first"] for r in rs)),
                    round(statistics.median(r["average"] for r in rs)),
                    round(statistics.median(r["reflection"] for r in rs)),
                    round(statistics.median(r["cached"] for r in rs)),
                    round(statistics.median(r["tools_first"] for r in rs)),
                ]
                for s, rs in by_system.items()
            ],
        )
    )
    for s in skipped:
        print(f"skipped: {s}")
    if args.json is not None:
        first_rr = next((b[0] for s, d in runs if s == "rr" for b in d.values() if b), None)
        args.json.write_text(
            json.dumps({"tokenizer": TOKENIZER, "rows": rows, "first_rr_request": first_rr}, indent=1)
        )


if __name__ == "__main__":
    main()
