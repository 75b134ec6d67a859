"""Issue-3 ergonomics on the real server: answers submitted from code, loop guard, host kill mid-session."""

from __future__ import annotations

import os

from tests.support.fixtures import comparable, write_trace
from tests.workflows.test_reflection import _reflect


async def test_final_answer_submitted_from_code_is_validated(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-submit")
    # the first, invalid submission was refused with a message; the second ended the run
    assert out.reasoning == "submitted from code"
    assert out.key_insight == "x is 42"  # computed in the sandbox from state of the previous cell
    assert out.raw["rr_trace"]["cells"] == 2
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    assert out.raw["usage"]["requests"] == 2


async def test_repeated_failing_cell_is_refused_then_session_stops(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-loop")
    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "error" and rt["timed_out"] is True
    assert rt["cells"] == 3  # max_failed_repeats cells ran; later repeats were refused without running
    assert rt["failed_cells"] == 3
    assert out.raw["usage"]["requests"] == 6  # 3 failures + 3 refusals = max_consecutive_cell_errors
    assert "repeating a failing cell" in out.raw["error"]
    assert out.reasoning.startswith("INCOMPLETE")


async def test_host_killed_mid_session_state_is_rebuilt(client, task_queue, settings, tmp_path) -> None:
    os.environ["RR_TEST_SLOW_LOOP"] = "1000"
    trace = write_trace(tmp_path)
    base = await _reflect(client, task_queue, settings, trace, model="scripted-stateful")
    killed = await _reflect(client, task_queue, settings, trace, model="scripted-hostkill")
    assert comparable(killed, drop_model=True) == comparable(base, drop_model=True)
    assert "final check 8 6" in killed.error_identification
