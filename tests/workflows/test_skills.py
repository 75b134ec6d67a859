"""Online-mode skill evaluation: cited skill ids are checked against the skillbook by exact id."""

from __future__ import annotations

import uuid

from reflector import client as rr
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.testing.scripted import INPUTS_ENV, recorded_inputs
from tests.support.fixtures import write_trace

SKILLBOOK = """## Booking
[booking-00001] Confirm the reservation id before cancelling.
[booking-00002] Check the cabin class rules before a change.
"""

TRACE = {
    "question": "Cancel my trip",
    "ground_truth": "cancel_reservation(reservation_id=Z7GOZK)",
    "steps": [
        {
            "role": "assistant",
            "content": "Following [booking-00001] I ask for the id. Also [booking-000011] and [booking-99999].",
        },
        {"role": "tool", "tool_name": "cancel_reservation", "content": "Error: reservation not found"},
        {"role": "assistant", "content": "I could not cancel it."},
    ],
    "final_answer": "I could not cancel it.",
}


async def _reflect(client, tq, settings, tmp_path, *, mode: str, skillbook: str) -> ReflectorOutput:
    ref = rr.upload_trace(write_trace(tmp_path, TRACE), settings)
    inp = rr.build_input(ref, skillbook=skillbook, mode=mode, config=ReflectionConfig(model="heuristic"))
    return await (await rr.start_reflection(client, inp, tq, f"skills-{uuid.uuid4().hex[:8]}")).result()


async def test_online_mode_tags_cited_skills_by_exact_id(client, task_queue, settings, tmp_path) -> None:
    out = await _reflect(client, task_queue, settings, tmp_path, mode="online", skillbook=SKILLBOOK)
    # booking-000011 (a superstring) and booking-99999 (absent) are not skillbook skills; 00002 was not cited
    assert [(t.id, t.tag) for t in out.skill_tags] == [("booking-00001", "harmful")]


async def test_offline_mode_and_empty_skillbook_never_tag(client, task_queue, settings, tmp_path) -> None:
    offline = await _reflect(client, task_queue, settings, tmp_path, mode="offline", skillbook=SKILLBOOK)
    assert offline.skill_tags == []
    empty = await _reflect(client, task_queue, settings, tmp_path, mode="online", skillbook="")
    assert empty.skill_tags == []


async def test_skillbook_tools_offered_only_with_a_skillbook(
    client, task_queue, settings, tmp_path, monkeypatch
) -> None:
    from reflector.analysis.skillbook import parse_skillbook

    assert [s.id for s in parse_skillbook(SKILLBOOK)] == ["booking-00001", "booking-00002"]
    offered: list[list[str]] = []
    for i, skillbook in enumerate((SKILLBOOK, "")):
        log = tmp_path / f"inputs-{i}.jsonl"
        monkeypatch.setenv(INPUTS_ENV, str(log))
        ref = rr.upload_trace(write_trace(tmp_path, TRACE), settings)
        inp = rr.build_input(
            ref, skillbook=skillbook, mode="online", config=ReflectionConfig(model="scripted-steps-3")
        )
        handle = await rr.start_reflection(client, inp, task_queue, f"skills-{uuid.uuid4().hex[:8]}")
        await handle.result()
        offered.append(recorded_inputs(str(log))[0]["tools"])
    assert {"get_skill", "list_skill_sections", "search_skills"} <= set(offered[0])
    assert "get_skill" not in offered[1] and "execute_code" in offered[1]
