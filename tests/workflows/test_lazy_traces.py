"""Large traces through real workflows: uploaded with their record index, read lazily by every session.

The lazy threshold is lowered for these uploads (the client builds the index for a trace at least
`lazy_trace_bytes` big, and a host reads a trace lazily exactly when its index exists), so small traces
exercise the same path a gigabyte trace takes.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from reflector import client as rr
from reflector.analysis.traces.index import INDEX_SUFFIX
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore
from tests.support.fixtures import comparable
from tests.workflows.test_recursion import plan

N_STEPS = 400


def big_trace(path: Path, indent: int | None) -> Path:
    steps: list[dict[str, Any]] = []
    for i in range(N_STEPS):
        cite = (
            f" (skill arith-{i:03d})" if i % 100 == 3 else ""
        )  # cited skill ids: found through the index too
        steps.append(
            {
                "role": "assistant",
                "content": f"step {i}: calling the calculator{cite}",
                "tool_calls": [{"name": "calculator", "arguments": json.dumps({"expr": f"{i}*2"})}],
            }
        )
        failed = i % 50 == 7
        steps.append(
            {
                "role": "tool",
                "tool_name": "calculator",
                "content": "Error: calculator timed out" if failed else str(i * 2),
            }
        )
    data = {"question": "What is the sum?", "ground_truth": "408", "steps": steps, "final_answer": "398"}
    path.write_text(json.dumps(data, indent=indent))
    return path


def lazy(settings: Settings) -> Settings:
    return dataclasses.replace(settings, lazy_trace_bytes=1)


SKILLBOOK = "## Arithmetic\n[arith-103] Check a product by estimating it.\n[arith-999] Never cited.\n"


async def _reflect(
    client, tq: str, ref, model: str = "heuristic", question: str = ""
) -> tuple[ReflectorOutput, str]:
    inp = rr.build_input(
        ref,
        question=question,
        ground_truth="408",
        skillbook=SKILLBOOK,
        mode="online",
        config=ReflectionConfig(model=model, recursion="always"),
    )
    handle = await rr.start_reflection(client, inp, tq, f"lazy-{uuid.uuid4().hex[:8]}")
    return await handle.result(), handle.id


async def test_the_heuristic_reflects_the_same_on_the_lazy_view(
    client, task_queue, settings, tmp_path
) -> None:
    whole = rr.upload_trace(big_trace(tmp_path / "a.json", None), settings)
    streamed = rr.upload_trace(big_trace(tmp_path / "b.json", 1), lazy(settings))
    store = BlobStore(settings.blob_dir)
    assert not store.derived_path(whole.sha256, INDEX_SUFFIX[1:]).exists()
    assert store.derived_path(streamed.sha256, INDEX_SUFFIX[1:]).exists()
    assert whole.format == streamed.format == "ace"
    out_whole, _ = await _reflect(client, task_queue, whole)
    out_lazy, _ = await _reflect(client, task_queue, streamed)
    a, b = comparable(out_whole), comparable(out_lazy)
    for d in (a, b):
        d["raw"].pop("trace", None)  # the two references differ (two files), nothing else may
        d["raw"].get("rr_trace", {}).pop("trace", None)
    diffs = [
        d for d in _diff(a, b) if "tokens" not in d.split(":")[0]
    ]  # the prefill (describe_traces) differs
    assert diffs == []
    assert "calculator" in out_lazy.error_identification
    assert [t.id for t in out_lazy.skill_tags] == [
        "arith-103"
    ]  # cited in the trace (online mode tags), found lazily


async def test_a_child_shares_the_lazy_trace_by_reference(client, task_queue, settings, tmp_path) -> None:
    ref = rr.upload_trace(big_trace(tmp_path / "c.json", None), lazy(settings))
    root = plan(
        code=[
            "rows = traces['steps']\nwindow = rows[10:20]\nbig = 'x' * (20 * 1024**2)\n"
            "print('root', type(rows).__name__, len(rows))"
        ],
        children=[
            plan(
                code=[
                    "print('child sees', type(window).__name__, len(window), window[0]['index'], "
                    "len(rows), len(sub), sub[1]['index'], 'big' in dir())"
                ],
                ctx="sub = rows[100:102]",
            )
        ],
    )
    out, _root_id = await _reflect(client, task_queue, ref, "scripted-plan", "PLAN:" + json.dumps(root))
    assert f"root Steps {2 * N_STEPS}" in out.error_identification
    calls = out.raw["rr_trace"]["subagent_calls"]
    assert len(calls) == 1
    skipped = calls[0]["skipped_variables"]
    assert len(skipped) == 1 and skipped[0].startswith("big (20.0 MB: too big to hand down"), skipped
    child = ReflectorOutput.model_validate(
        await client.get_workflow_handle(calls[0]["child_workflow_id"]).result()
    )
    assert f"child sees Steps 10 10 {2 * N_STEPS} 2 101 False" in child.error_identification


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in set(a) | set(b) for d in _diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:300]!r} != {str(b)[:300]!r}"]
