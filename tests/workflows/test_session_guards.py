"""Issue-3 ergonomics on the real server: answers submitted from code, loop guard, host kill mid-session."""

from __future__ import annotations

import os
import signal

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from activities import sandbox as sandbox_activities
from reflector.runtime.models import register_model
from reflector.testing.scripted import SLOW_LOOP_ENV, _returns, stateful_script, synthesis_aware
from tests.support.fixtures import comparable, write_trace
from tests.workflows.test_reflection import _reflect


def host_killer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The stateful script, but the sandbox host is SIGKILLed before the third cell (in-process worker only)."""
    if len(_returns(messages)) == 2:
        rt = sandbox_activities._rt()  # the running worker's (the model request is its local activity)
        for sid in list(rt.sessions._live):
            ex = rt.sessions.executor_for(sid)
            pid = getattr(ex, "pid", None)
            if pid:
                os.kill(pid, signal.SIGKILL)
    return stateful_script(messages, info)


register_model(
    "scripted-hostkill", lambda: FunctionModel(synthesis_aware(host_killer), model_name="scripted-hostkill")
)


async def test_final_answer_submitted_from_code_is_validated(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-submit")
    # the first, invalid submission was refused with a message; the second ended the run
    assert out.reasoning == "submitted from code"
    assert out.key_insight == "x is 42"  # computed in the sandbox from state of the previous cell
    assert out.raw["rr_trace"]["cells"] == 2
    assert out.raw["rr_trace"]["stop_reason"] == "completed"
    assert out.raw["usage"]["requests"] == 2


async def test_repeated_failing_cell_is_refused_then_session_stops(
    client, task_queue, settings, tmp_path
) -> None:
    out = await _reflect(client, task_queue, settings, write_trace(tmp_path), model="scripted-loop")
    rt = out.raw["rr_trace"]
    assert rt["stop_reason"] == "error" and rt["timed_out"] is True
    assert rt["cells"] == 3  # max_failed_repeats cells ran; later repeats were refused without running
    assert rt["failed_cells"] == 3
    assert out.raw["usage"]["requests"] == 6  # 3 failures + 3 refusals = max_consecutive_cell_errors
    assert "repeating a failing cell" in out.raw["error"]
    assert out.reasoning.startswith("INCOMPLETE")


async def test_host_killed_mid_session_state_is_rebuilt(
    client, task_queue, settings, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv(SLOW_LOOP_ENV, "1000")
    trace = write_trace(tmp_path)
    base = await _reflect(client, task_queue, settings, trace, model="scripted-stateful")
    killed = await _reflect(client, task_queue, settings, trace, model="scripted-hostkill")
    assert comparable(killed, drop_model=True) == comparable(base, drop_model=True)
    assert "final check 8 6" in killed.error_identification
