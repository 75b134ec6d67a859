"""Scripted models for tests, driven only by the message history (so they survive worker restarts).

Import this module (or list it in `RR_PLUGINS` for a worker subprocess) to register the models.
Every call appends one line to the file named by `RR_TEST_MODEL_LOG` (if set): the request's key,
the process id and the worker's wall clock, so tests can count how often each request ran. With
`RR_TEST_MODEL_INPUTS` set, every call also appends what the model was sent (the tools offered and the
text of every message part): model inputs are not in the history (they follow from it by replay).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import Callable

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.contract import EXECUTE_CODE_TOOL, RECURSE_TOOL
from reflector.runtime.models import register_model

SLOW_LOOP_ENV = "RR_TEST_SLOW_LOOP"  # iterations of the slow cell (read when the cell is written)


def _slow_loop() -> int:
    return int(os.environ.get(SLOW_LOOP_ENV, "40000000"))


def _returns(messages: list[ModelMessage], tool: str = EXECUTE_CODE_TOOL) -> list[str]:
    return [
        str(p.content)
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == tool
    ]


def request_key(messages: list[ModelMessage]) -> str:
    body = json.dumps(
        [
            [type(p).__name__, str(getattr(p, "content", getattr(p, "args", "")))]
            for m in messages
            for p in m.parts
        ],
        sort_keys=True,
    )
    return f"{len(messages)}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def _log(messages: list[ModelMessage], name: str) -> None:
    path = os.environ.get("RR_TEST_MODEL_LOG")
    if path:
        with open(path, "a") as f:
            f.write(
                json.dumps(
                    {
                        "model": name,
                        "key": request_key(messages),
                        "n": len(messages),
                        "pid": os.getpid(),
                        "t": time.time(),
                    }
                )
                + "\n"
            )


INPUTS_ENV = "RR_TEST_MODEL_INPUTS"


def _record_input(messages: list[ModelMessage], info: AgentInfo) -> None:
    path = os.environ.get(INPUTS_ENV)
    if path:
        text = "\n".join(
            str(getattr(p, "content", getattr(p, "args", ""))) for m in messages for p in m.parts
        )
        with open(path, "a") as f:
            f.write(json.dumps({"tools": sorted(t.name for t in info.function_tools), "text": text}) + "\n")


def recorded_inputs(path: str) -> list[dict]:  # type: ignore[type-arg]
    """What `RR_TEST_MODEL_INPUTS` recorded, one dict per model call, in call order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def synthesis_aware(fn):
    """Scripts answer the workflow's synthesis request (no tools offered) and summarise requests too."""

    def wrapped(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _record_input(messages, info)
        first = next(
            (str(p.content) for m in messages for p in m.parts if type(p).__name__ == "UserPromptPart"), ""
        )
        if first.startswith("SUMMARISE_TRANSCRIPT"):
            _log(messages, "summary")
            earlier = re.findall(r"scripted summary: (\d+) cell outputs", first)
            n = first.count("[ToolReturnPart execute_code]") + (int(earlier[-1]) if earlier else 0)
            return ModelResponse(parts=[TextPart(f"scripted summary: {n} cell outputs so far")])
        if info.output_tools and EXECUTE_CODE_TOOL not in {t.name for t in info.function_tools}:
            _log(messages, "synthesis")
            return _final(info, [first[-300:]])
        return fn(messages, info)

    return wrapped


def _final(info: AgentInfo, outputs: list[str]) -> ModelResponse:
    evidence = " | ".join(o.strip()[:200] for o in outputs)
    args = {
        "reasoning": f"scripted reasoning over {len(outputs)} cells",
        "error_identification": f"observed: {evidence}",
        "root_cause_analysis": "scripted root cause",
        "correct_approach": "scripted approach",
        "key_insight": "scripted insight",
        "extracted_learnings": [
            {
                "learning": "check the data first",
                "atomicity_score": 0.9,
                "evidence": evidence,
                "justification": "j",
            }
        ],
        "skill_tags": [],
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")])


CELLS = [
    "n_steps = len(traces.get('steps', [])) if isinstance(traces, dict) else len(traces)\nprint('steps', n_steps)",
    "seen = {'n': n_steps, 'double': n_steps * 2}\ndef tri(k):\n    return k * (k + 1) // 2\nprint('seen', seen)",
    "total = 0\nfor i in range(SLOW):\n    total += 1\nprint('slow done', total, tri(n_steps))",
    "print('final check', seen['double'], tri(3), total)",
]


def stateful_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Four cells that build state (variables, a function, derived data), one slow; then answer."""
    _log(messages, "scripted-stateful")
    outputs = _returns(messages)
    if len(outputs) < len(CELLS):
        code = CELLS[len(outputs)].replace("SLOW", str(_slow_loop()))
        return ModelResponse(
            parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"c{len(outputs)}")]
        )
    return _final(info, outputs)


def steps_script(n: int):
    """A reflection of `n` trivial cells then an answer (benchmarks)."""

    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        _log(messages, f"scripted-steps-{n}")
        outputs = _returns(messages)
        if len(outputs) < n:
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        EXECUTE_CODE_TOOL,
                        {"code": f"x{len(outputs)} = {len(outputs)}\nprint(x{len(outputs)})"},
                        tool_call_id=f"c{len(outputs)}",
                    )
                ]
            )
        return _final(info, outputs[-2:])

    return fn


def answer_without_code(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Tries to answer at once; the output validator must refuse until a cell succeeded."""
    _log(messages, "scripted-eager")
    outputs = _returns(messages)
    # the validator's refusal comes back as the output tool's return (or a retry prompt)
    retried = any(
        getattr(p, "tool_name", None) == info.output_tools[0].name and not isinstance(p, ToolCallPart)
        for m in messages
        for p in m.parts
    )
    if retried and not outputs:
        return ModelResponse(
            parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": "print('ok', type(traces).__name__)"})]
        )
    return _final(info, outputs)


def text_only(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _log(messages, "scripted-text")
    return ModelResponse(parts=[TextPart("I refuse to use tools.")])


register_model(
    "scripted-stateful",
    lambda: FunctionModel(synthesis_aware(stateful_script), model_name="scripted-stateful"),
)
register_model(
    "scripted-eager", lambda: FunctionModel(synthesis_aware(answer_without_code), model_name="scripted-eager")
)
register_model("scripted-text", lambda: FunctionModel(synthesis_aware(text_only), model_name="scripted-text"))


def _steps_model(n: int) -> Callable[[], FunctionModel]:
    return lambda: FunctionModel(synthesis_aware(steps_script(n)), model_name=f"scripted-steps-{n}")


for _n in (3, 20):
    register_model(f"scripted-steps-{_n}", _steps_model(_n))


def paced(fn, seconds: float):
    """`fn` answering after `seconds` (a model with latency: the run spans several workflow tasks)."""

    async def wrapped(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        await asyncio.sleep(seconds)
        return fn(messages, info)

    return wrapped


register_model(
    "scripted-paced-20",
    lambda: FunctionModel(paced(synthesis_aware(steps_script(20)), 0.25), model_name="scripted-paced-20"),
)


FULL_ANSWER = {
    "reasoning": "submitted from code",
    "error_identification": "e",
    "root_cause_analysis": "r",
    "correct_approach": "c",
    "key_insight": "k",
    "extracted_learnings": [
        {"learning": "l", "atomicity_score": 0.8, "evidence": "cell 2", "justification": "j"}
    ],
    "skill_tags": [],
}


def submit_from_code(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """First submits an invalid answer from code, then a valid one (the run must end there)."""
    _log(messages, "scripted-submit")
    outputs = _returns(messages)
    if not outputs:
        code = "x = 41\nFINAL_ANSWER({'reasoning': 'missing fields'})"
    elif len(outputs) == 1:
        code = (
            "x += 1\nanswer = "
            + repr(FULL_ANSWER)
            + "\nanswer['key_insight'] = 'x is ' + str(x)\nFINAL_ANSWER(answer)"
        )
    else:
        code = "print('should never run')"
    return ModelResponse(
        parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"s{len(outputs)}")]
    )


def same_failing_cell(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _log(messages, "scripted-loop")
    return ModelResponse(
        parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": "print(1/0)"}, tool_call_id=f"l{len(messages)}")]
    )


register_model(
    "scripted-submit", lambda: FunctionModel(synthesis_aware(submit_from_code), model_name="scripted-submit")
)
register_model(
    "scripted-loop", lambda: FunctionModel(synthesis_aware(same_failing_cell), model_name="scripted-loop")
)


# ------------------------------------------------------------------------------------------------
# Plan-driven recursion: the session's task prompt carries `PLAN:{json}`; a plan node is
# {"code": [cells before children], "children": [child plans], "after": [cells after], "ctx": str}
# and each child is started with `recurse(prompt="PLAN:{child}", context_code=child["ctx"])`.
# ------------------------------------------------------------------------------------------------

_PLAN_RE = re.compile(r"PLAN:(\{.*\})")


def _plan(messages: list[ModelMessage]) -> dict:  # type: ignore[type-arg]
    for m in messages:
        for p in m.parts:
            if type(p).__name__ == "UserPromptPart":
                found = _PLAN_RE.search(str(p.content))
                if found:
                    return json.loads(found.group(1))
    return {"code": ["print('no plan')"]}


def plan_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    _log(messages, "scripted-plan")
    plan = _plan(messages)
    cells = _returns(messages)
    recursed = [
        p for m in messages for p in m.parts if isinstance(p, ToolReturnPart) and p.tool_name == RECURSE_TOOL
    ]
    # a failing context_code comes back as the tool's (failed) return, which the model can correct
    retries = [p for p in recursed if "context_code failed" in str(p.content)]
    children = [p for p in recursed if p not in retries]
    before, kids, after = plan.get("code", []), plan.get("children", []), plan.get("after", [])
    offered = RECURSE_TOOL in {t.name for t in info.function_tools}
    if len(cells) < len(before):
        code = before[len(cells)]
    elif len(children) < len(kids) and offered:
        k = len(children)
        kid = kids[k]
        ctx = kid.get("ctx", "")
        if retries and kid.get("fixed_ctx") is not None and len(retries) > k:
            ctx = kid["fixed_ctx"]
        args = {"prompt": "PLAN:" + json.dumps(kid), "context_code": ctx}
        return ModelResponse(parts=[ToolCallPart(RECURSE_TOOL, args, tool_call_id=f"r{k}-{len(retries)}")])
    elif len(cells) < len(before) + len(after):
        code = after[len(cells) - len(before)]
    else:
        outs = cells + [str(c.content) for c in children] + [f"recurse offered: {offered}"]
        return _final(info, outs)
    return ModelResponse(
        parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"c{len(cells)}")]
    )


def _summarised_cells(messages: list[ModelMessage]) -> int:
    """Cells done before the last compaction, as the summary says (scripts resume from there)."""
    found = [
        int(x)
        for m in messages
        for p in m.parts
        if isinstance(p, TextPart)
        for x in re.findall(r"scripted summary: (\d+) cell outputs", p.content)
    ]
    return found[-1] if found else 0


def big_outputs(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Cells that print a lot (forces compaction with a small context window), then an answer."""
    _log(messages, "scripted-big")
    cells = [f"(summarised {i})" for i in range(_summarised_cells(messages))] + _returns(messages)
    n = int(os.environ.get("RR_TEST_BIG_CELLS", "8"))
    if len(cells) < n:
        # ~3,000 characters (1,000 words) of word-like text (the FunctionModel counts tokens by words)
        code = f"v{len(cells)} = ' '.join(['yy'] * 1000)\nprint('cell {len(cells)}', v{len(cells)})"
        return ModelResponse(
            parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=f"b{len(cells)}")]
        )
    if len(cells) == n:  # the archived transcripts are readable in the sandbox
        code = "print('history items', len(history), 'v0 still', len(v0))"
        return ModelResponse(parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id="hist")])
    return _final(info, [c[:40] for c in cells])


register_model(
    "scripted-plan", lambda: FunctionModel(synthesis_aware(plan_script), model_name="scripted-plan")
)
register_model("scripted-big", lambda: FunctionModel(synthesis_aware(big_outputs), model_name="scripted-big"))


# A plan whose root session waits for a file (the test's gate) after `gate_after` cells: the reflection
# stays running, with its sandbox and blobs in use, until the test creates the file. The task carries
# `GATE:<path>`; children (whose task is their own plan) never wait.
_GATE_RE = re.compile(r"GATE:(\S+)")


def _gate(messages: list[ModelMessage]) -> str | None:
    for m in messages:
        for p in m.parts:
            if type(p).__name__ == "UserPromptPart":
                found = _GATE_RE.search(str(p.content))
                if found:
                    return found.group(1)
    return None


async def gated_plan(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    gate = _gate(messages)
    if gate is not None and len(_returns(messages)) >= int(_plan(messages).get("gate_after", 1)):
        while not os.path.exists(gate):
            await asyncio.sleep(0.05)
    return synthesis_aware(plan_script)(messages, info)


register_model("scripted-plan-gated", lambda: FunctionModel(gated_plan, model_name="scripted-plan-gated"))


def citing_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Two cells, then learnings whose evidence cites them: one citation that holds, one quote the cell
    never printed, one cell that never ran, and one learning citing nothing."""
    from reflector.analysis.citations import header_cell

    outputs = _returns(messages)
    cells = [
        "print('failing tool: book_reservation (3 errors)')",
        "print({'seat': '12A', 'status': 'taken'})",
    ]
    if len(outputs) < len(cells):
        return ModelResponse(
            parts=[
                ToolCallPart(
                    EXECUTE_CODE_TOOL, {"code": cells[len(outputs)]}, tool_call_id=f"cite{len(outputs)}"
                )
            ]
        )
    first, second = (header_cell(o) for o in outputs[:2])
    learnings = [
        (
            "retry with other arguments",
            f'cell {first}: "book_reservation (3 errors)"; cell {second} printed "12A"',
        ),
        ("check the seat map", f'cell {second}: "seat 14C is free"'),
        ("read the policy", 'cell 99: "policy says no"'),
        ("be careful", "general experience"),
    ]
    args = {
        "reasoning": "scripted citations",
        "error_identification": "e",
        "root_cause_analysis": "r",
        "correct_approach": "c",
        "key_insight": "k",
        "skill_tags": [],
        "extracted_learnings": [{"learning": t, "atomicity_score": 0.8, "evidence": e} for t, e in learnings],
    }
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, tool_call_id="final")])


register_model(
    "scripted-cite", lambda: FunctionModel(synthesis_aware(citing_script), model_name="scripted-cite")
)
