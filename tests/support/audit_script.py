"""`scripted-audit`: a reflection with every kind of decision the audit shows (import to register it;
list it in `RR_PLUGINS` for a subprocess that replays its histories).

Root session: a cell that prints `alpha 42`, a child (`recurse`, the child runs one cell and answers), a
request during which the session's sandbox host is SIGKILLed (the next cell is rebuilt on a new host),
big cells until the context is summarised (a compaction, then continue-as-new), one cell after it, and
a final answer whose learnings cite cells: one supported, one citing a cell that never ran, one quoting
text its cell never printed, one citing none. Driven by the messages only (replay-safe, restart-safe).
"""

from __future__ import annotations

import os
import signal

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.analysis.citations import header_cell
from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL
from reflector.runtime.models import register_model
from reflector.testing.scripted import synthesis_aware

NAME = "scripted-audit"
CHILD_PROMPT = "CHILD: count the steps of the trace"
ALPHA_CELL = 3  # the first model-written cell (cell 1 is the prefill, 2 the workflow's own)
BIG_CELLS = 6
_killed: set[str] = set()


def _first_prompt(messages: list[ModelMessage]) -> str:
    return next(
        (str(p.content) for m in messages for p in m.parts if type(p).__name__ == "UserPromptPart"), ""
    )


def _returns(messages: list[ModelMessage], tool: str) -> list[str]:
    return [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == tool
    ]


def _summarised(messages: list[ModelMessage]) -> bool:
    return any(
        isinstance(p, TextPart) and "scripted summary:" in p.content for m in messages for p in m.parts
    )


def _code(code: str, call_id: str) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=call_id)])


def _kill_sandbox_host() -> None:
    """SIGKILL this session's sandbox host once (the worker survives; the next cell rebuilds the host)."""
    from temporalio import activity

    from activities import sandbox

    workflow_id = activity.info().workflow_id
    if workflow_id is None or workflow_id in _killed:
        return
    executor = sandbox._rt().sessions.executor_for(workflow_id)
    pid = getattr(executor, "pid", None)
    if pid is not None:
        _killed.add(workflow_id)
        os.killpg(pid, signal.SIGKILL)


def _answer(info: AgentInfo, learnings: list[tuple[str, str]]) -> ModelResponse:
    args = {
        "reasoning": "audit script",
        "error_identification": "the calculator timed out",
        "root_cause_analysis": "no retry",
        "correct_approach": "retry the tool",
        "key_insight": "check tool errors",
        "extracted_learnings": [
            {"learning": text, "atomicity_score": 0.9, "evidence": evidence, "justification": "j"}
            for text, evidence in learnings
        ],
        "skill_tags": [],
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")])


def _child(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = _returns(messages, EXECUTE_CODE_TOOL)
    if not done:
        return _code("print('child saw', len(traces['steps']), 'steps')", "k0")
    return _answer(info, [("the trace has four steps", f'cell {header_cell(done[0])}: "child saw 4 steps"')])


def audit_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if _first_prompt(messages).find("CHILD:") >= 0:
        return _child(messages, info)
    if _summarised(messages):
        if not _returns(messages, EXECUTE_CODE_TOOL):
            return _code("print('after the summary', alpha)\nprint(traces.get('feedback'))", "post")
        return _answer(
            info,
            [
                ("the agent's answer was 42 in the probe", f'cell {ALPHA_CELL}: "alpha 42"'),
                ("a cell that never ran", 'cell 99: "nothing"'),
                ("a quote its cell never printed", f'cell {ALPHA_CELL}: "beta 7"'),
                ("a learning without evidence", "from experience"),
            ],
        )
    cells = _returns(messages, EXECUTE_CODE_TOOL)
    if not cells:
        return _code("alpha = 42\nprint('alpha', alpha)", "a0")
    if not _returns(messages, RECURSE_TOOL):
        return ModelResponse(
            parts=[
                ToolCallPart(RECURSE_TOOL, {"prompt": CHILD_PROMPT, "context_code": ""}, tool_call_id="r0")
            ]
        )
    big = len(cells) - 1
    if big == 0:
        _kill_sandbox_host()
    if big < BIG_CELLS:
        return _code(f"v{big} = ' '.join(['yy'] * 1000)\nprint('big {big}', alpha, v{big})", f"b{big}")
    return _answer(info, [("never summarised", f"cell {ALPHA_CELL}")])


register_model(NAME, lambda: FunctionModel(synthesis_aware(audit_script), model_name=NAME))
