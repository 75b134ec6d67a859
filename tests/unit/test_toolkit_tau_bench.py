"""The toolkit on the 120 real tau-bench runs (skipped without ../shared/traces), and its sandbox contract."""

from __future__ import annotations

from pathlib import Path

from reflector.analysis.answers import compare_actions
from reflector.analysis.toolkit import (
    SANDBOX_HELPERS,
    TOOLKIT_DOC,
    diff_actions,
    expected_actions,
    failing_calls,
    first_divergence,
    search_steps,
    tool_calls,
)
from reflector.analysis.traces import load_normalized
from reflector.contract import DIAGNOSIS_KINDS

CONTRACT_NAMES = (
    "tool_calls",
    "expected_actions",
    "diff_actions",
    "diff_values",
    "first_divergence",
    "failing_calls",
    "search_steps",
    "is_write",
)


def test_every_failed_run_with_expectations_gets_a_divergence(shared_traces: Path) -> None:
    runs = load_normalized(shared_traces / "tau-bench-airline-gpt-4o.json")["runs"]
    assert len(runs) == 120
    missed, flagged_ok = [], []
    for run in runs:
        calls = tool_calls(run)
        assert [(c["name"], c["step"]) for c in calls] == [(a["name"], a["step"]) for a in run["actions"]]
        assert all(c["result_step"] is not None for c in calls)
        d = diff_actions(expected_actions(run), calls)
        assert d["equal"] == compare_actions(run["actions"], run["expected_actions"])[0], run["metadata"][
            "id"
        ]
        div = first_divergence(run)
        if div is not None:
            assert div["kind"] in DIAGNOSIS_KINDS and isinstance(div["step"], int)
            assert run["steps"][div["step"]]["index"] == div["step"]
        has_expectations = bool(run["expected_actions"] or run["expected_outputs"])
        if run["reward"] < 1 and has_expectations and div is None:
            missed.append(run["metadata"]["id"])
        if run["reward"] == 1 and div is not None:
            flagged_ok.append(run["metadata"]["id"])
        failing_calls(run)
        search_steps(run, "reservation")
    # task2-trial1: every write matches and the output is stated; the run has no reward_info (reward 0 unexplained)
    assert missed == ["task2-trial1"]
    # reported, not tuned: tau-bench compares the database, so a call with extra keys the tool ignores still
    # scores 1 (task5-trial1 passes flights with origin/destination the task's action does not have)
    assert flagged_ok == ["task5-trial1"]


def test_the_sandbox_names_and_the_doc() -> None:
    assert set(CONTRACT_NAMES) <= set(SANDBOX_HELPERS)
    assert all(callable(fn) for fn in SANDBOX_HELPERS.values())
    assert TOOLKIT_DOC.startswith("toolkit: ")
    assert len(TOOLKIT_DOC) <= 1000  # printed in cell 1, which the task prompt shows
    for name in SANDBOX_HELPERS:
        if name != "timeline":  # documented on the `actors` line
            assert f"{name}(" in TOOLKIT_DOC, name
