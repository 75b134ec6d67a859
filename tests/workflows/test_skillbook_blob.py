"""The skillbook as a blob (issue 26, point 4): the skill tools answer from it in a local activity (bounded),
and what workflow code would have to hold or parse whole is refused with an error the session (or the model)
can act on, never a workflow task that times out for ever."""

from __future__ import annotations

import time
import uuid

from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector import client as rr
from reflector.analysis.limits import MAX_CONTEXT_CODE_CHARS, MAX_SKILL_QUERY_CHARS, MAX_SKILL_TOOL_CHARS
from reflector.contract import (
    EXECUTE_CODE_TOOL,
    RECURSE_TOOL,
    ReflectionConfig,
    ReflectionInput,
    ReflectorOutput,
)
from reflector.runtime.models import register_model
from reflector.testing.scripted import _final, synthesis_aware
from tests.support.fixtures import write_trace

MB = 1024**2
SKILLBOOK = (
    "## Booking\n[booking-00001] Confirm the reservation id before cancelling.\n"
    "[booking-00002] Check the cabin class rules before a change.\n## Long\n[long-00001] "
    + "very long skill text " * 2_000
    + "\n"
)
SEEN: dict[str, list[str]] = {}  # model name -> what its tools returned (the model runs in this process)


def _returns(messages: list[ModelMessage]) -> list[str]:
    return [
        f"{p.tool_name}: {p.content}"
        for m in messages
        for p in m.parts
        if isinstance(p, ToolReturnPart | RetryPromptPart) and p.tool_name != EXECUTE_CODE_TOOL
    ]


def _model(name: str, calls: list[tuple[str, dict[str, str]]]) -> str:
    """A model that makes `calls` one by one (after one cell), records what came back, then answers."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages for p in m.parts if isinstance(p, ToolCallPart))
        if n == 0:
            return ModelResponse(
                parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": "print(len(skillbook))"}, tool_call_id="c0")]
            )
        if n <= len(calls):
            tool, args = calls[n - 1]
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"t{n}")])
        SEEN[name] = _returns(messages)
        return _final(info, ["done"])

    register_model(name, lambda: FunctionModel(synthesis_aware(script), model_name=name))
    return name


async def _run(client, tq, settings, tmp_path, inp: ReflectionInput) -> ReflectorOutput:
    return await (await rr.start_reflection(client, inp, tq, f"sbblob-{uuid.uuid4().hex[:8]}")).result()


async def test_skill_tools_answer_from_the_blob_bounded(client, task_queue, settings, tmp_path) -> None:
    name = _model(
        f"sb-tools-{uuid.uuid4().hex[:6]}",
        [
            ("list_skill_sections", {}),
            ("get_skill", {"skill_id": "[booking-00002]"}),
            ("get_skill", {"skill_id": "long-00001"}),
            ("search_skills", {"query": "reservation"}),
            ("get_skill", {"skill_id": "x" * (MAX_SKILL_QUERY_CHARS + 1)}),
        ],
    )
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(
        ref, skillbook=SKILLBOOK, mode="online", config=ReflectionConfig(model=name), settings=settings
    )
    assert inp.skillbook == "" and inp.skillbook_ref is not None and inp.skillbook_ref.skills == 3
    out = await _run(client, task_queue, settings, tmp_path, inp)
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    seen = SEEN[name]
    assert seen[0] == "list_skill_sections: Booking: booking-00001, booking-00002\nLong: long-00001"
    assert seen[1] == "get_skill: [booking-00002] (Booking) Check the cabin class rules before a change."
    assert seen[2].startswith("get_skill: [long-00001] (Long) very long") and "more characters" in seen[2]
    assert len(seen[2]) < MAX_SKILL_TOOL_CHARS + 200
    assert seen[3] == "search_skills: [booking-00001] Confirm the reservation id before cancelling."
    assert (
        seen[4].startswith("get_skill:") and "over the limit" in seen[4]
    )  # a retry prompt the model can act on


async def test_an_inline_over_cap_skillbook_ends_the_session_at_once(
    client, task_queue, settings, tmp_path
) -> None:
    # 4 MB (over the 256 KiB cap and the 2 MB payload limit), not 100 MB: a workflow input of 100 MB is itself
    # decoded in workflow code on every replay (the suite's teardown replay of it tripped the deadlock detector
    # on a loaded CI machine); users reach the workflow through build_input, which stores a skillbook as a blob
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = ReflectionInput(trace=ref, skillbook="[a-001] x\n" * (MB // 2 * 4 // 5), mode="online")
    t0 = time.monotonic()
    out = await _run(client, task_queue, settings, tmp_path, inp)
    assert out.raw["rr_trace"]["stop_reason"] == "error"
    assert f"the inline skillbook is {len(inp.skillbook):,} characters" in out.raw["error"]
    assert time.monotonic() - t0 < 60


async def test_recurse_with_an_oversized_context_code_is_a_tool_error(
    client, task_queue, settings, tmp_path
) -> None:
    # 100 KiB, not 100 MB: a model's tool call is its provider's output (at most a few hundred KB); a 100 MB
    # tool call in a response would stall the workflow before any tool runs (reported in issue 26)
    name = _model(
        f"sb-recurse-{uuid.uuid4().hex[:6]}",
        [
            (RECURSE_TOOL, {"prompt": "look at step 1", "context_code": "x = 1\n#" + "a" * 100 * 1024}),
        ],
    )
    ref = rr.upload_trace(write_trace(tmp_path), settings)
    inp = rr.build_input(ref, config=ReflectionConfig(model=name, recursion="always"), settings=settings)
    t0 = time.monotonic()
    out = await _run(client, task_queue, settings, tmp_path, inp)
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    assert out.raw["rr_trace"]["subagent_calls"] == []  # no child was started
    assert any(
        s.startswith(f"{RECURSE_TOOL}: `context_code` is 102,407 characters")
        and f"{MAX_CONTEXT_CODE_CHARS:,}" in s
        for s in SEEN[name]
    ), SEEN[name]
    assert time.monotonic() - t0 < 120


async def test_a_batch_hands_its_skillbook_blob_to_every_run(client, task_queue, settings, tmp_path) -> None:
    from tests.workflows.test_skills import TRACE

    paths = [write_trace(tmp_path, TRACE, name=f"run{i}.json") for i in range(2)]
    manifest = rr.upload_batch(paths, settings)
    inp = rr.build_batch_input(manifest, skillbook=SKILLBOOK, mode="online", settings=settings)
    assert inp.skillbook == "" and inp.skillbook_ref is not None
    out = await rr.wait_for_batch(
        await rr.start_batch(client, inp, task_queue, f"sbb-{uuid.uuid4().hex[:8]}")
    )
    records = rr.load_batch_records(out, settings)
    assert [[(t.id, t.tag) for t in r.skill_tags] for r in records] == [[("booking-00001", "harmful")]] * 2
