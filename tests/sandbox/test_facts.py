"""The facts cell the deterministic fallback relies on: actions are compared with actions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from activities.facts import FACTS_CODE, _facts
from reflector.contract import CellOutcome
from sandbox.sessions import SessionManager
from tests.sandbox.conftest import TEST_LIMITS
from tests.unit.test_heuristic import _tau


async def _facts_of(tmp_path: Path, trace: dict[str, Any], task: dict[str, Any]):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    sessions = SessionManager(tmp_path / "j", pool_size=0, fsync=False)
    kw: dict[str, Any] = {
        "trace_path": str(path),
        "trace_format": "auto",
        "extra_vars": {"task": task},
        "limits": TEST_LIMITS,
    }
    try:
        r = await sessions.run_cell("s", 1, FACTS_CODE, **kw)
        assert r.ok, r
        leftover = await sessions.run_cell("s", 2, "rr_facts_line", **kw)  # the helper is gone again
        assert leftover.error_kind == "runtime" and "NameError" in (leftover.error or "")
        return _facts(CellOutcome(ok=True, output=r.stdout))
    finally:
        await sessions.close_all()


async def test_tau_bench_facts_compare_actions_not_text(tmp_path: Path) -> None:
    said_not_done = _tau(
        [{"name": "get_reservation_details", "arguments": '{"reservation_id": "Z7GOZK"}', "result": "{}"}],
        "Done: cancel_reservation(refund=250, reservation_id=Z7GOZK)",
        0.0,
    )
    facts = await _facts_of(tmp_path / "a", said_not_done, {})
    assert facts.actions_checked and facts.answer_correct is False
    assert facts.missing_actions == ["cancel_reservation(refund=250, reservation_id=Z7GOZK)"]
    # the budget fallback's diagnosis: the toolkit's first divergence, citing the facts cell (its seq: 2 in a
    # session; this helper's CellOutcome has none)
    d = facts.diagnosis
    assert d is not None and (d.kind, d.tool, d.evidence) == ("missing_action", "cancel_reservation", [0])
    done = _tau(
        [
            {
                "name": "cancel_reservation",
                "arguments": '{"refund": 250, "reservation_id": "Z7GOZK"}',
                "result": "{}",
            }
        ],
        "All set!",
        1.0,
    )
    facts = await _facts_of(tmp_path / "b", done, {})
    assert facts.actions_checked and facts.answer_correct is True and facts.final_answer == "All set!"
    assert facts.diagnosis is None  # nothing diverges


async def test_text_answers_are_still_compared_as_text(tmp_path: Path) -> None:
    trace = {"question": "2+2?", "steps": [{"role": "assistant", "content": "5"}], "final_answer": "5"}
    facts = await _facts_of(tmp_path, trace, {"ground_truth": "4"})
    assert not facts.actions_checked and facts.answer_correct is False and facts.ground_truth == "4"


def test_a_cut_off_facts_line_gives_no_facts() -> None:
    assert _facts(CellOutcome(ok=True, output='RR_FACTS {"final_answer": "ab')).answer_correct is None
