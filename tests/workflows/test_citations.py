"""Each learning is linked to the cells its evidence cites, checked by the workflow against what they printed."""

from __future__ import annotations

import json
import uuid
from importlib import resources
from pathlib import Path

from temporalio.client import Client

from reflector import client as rr
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.settings import Settings
from tests.support.fixtures import write_trace


async def _reflect(client: Client, tq: str, settings: Settings, trace: Path, model: str) -> ReflectorOutput:
    inp = rr.build_input(rr.upload_trace(trace, settings), config=ReflectionConfig(model=model))
    handle = await rr.start_reflection(client, inp, tq, f"cite-{uuid.uuid4().hex[:10]}")
    return await handle.result()


async def test_citations_are_checked_against_the_cells_outputs(
    client, task_queue, settings, tmp_path
) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), "scripted-cite")
    by_learning: dict[int, list[tuple[int, bool, str, bool]]] = {}
    for c in out.citations:
        by_learning.setdefault(c.learning, []).append((c.cell, c.exists, c.quote, c.printed))
    # cells 1 (prefill) and 2 (facts) come first: the model's two cells are 3 and 4
    assert by_learning[0] == [(3, True, "book_reservation (3 errors)", True), (4, True, "12A", True)]
    assert by_learning[1] == [(4, True, "seat 14C is free", False)]  # the cell never printed it
    assert by_learning[2] == [(99, False, "policy says no", False)]  # no such cell
    assert 3 not in by_learning  # cites nothing
    assert [c.supported for c in out.citations] == [True, True, False, False]


async def test_every_heuristic_learning_cites_a_cell_that_printed_its_quotes(
    client, task_queue, settings, tmp_path
) -> None:
    for name in ("failed_math.json", "tool_error.json"):
        data = json.loads(resources.files("reflector.examples").joinpath(name).read_text())
        out = await _reflect(client, task_queue, settings, write_trace(tmp_path, data, name), "heuristic")
        assert out.extracted_learnings, name
        cited = {c.learning for c in out.citations}
        assert cited == set(range(len(out.extracted_learnings))), (name, out.citations)
        unsupported = [
            (out.extracted_learnings[c.learning].evidence, c) for c in out.citations if not c.supported
        ]
        assert not unsupported, (name, unsupported)


async def test_heuristic_citations_hold_on_real_tau_bench_failures(
    client, task_queue, settings, tmp_path, shared_traces
) -> None:
    runs = json.loads((shared_traces / "tau-bench-airline-gpt-4o.json").read_text())
    failed = [r for r in runs if r["reward"] < 1][:6]
    for run in failed:
        out = await _reflect(
            client, task_queue, settings, write_trace(tmp_path, run, "tau.json"), "heuristic"
        )
        assert {c.learning for c in out.citations} == set(range(len(out.extracted_learnings)))
        bad = [
            (out.extracted_learnings[c.learning].evidence[:300], c.quote)
            for c in out.citations
            if not c.supported
        ]
        assert not bad, (run["task_id"], bad)
