"""The tracing-back tools (reflector/analysis/toolkit/trace_back.py, root.py; issue 28): `provenance`,
`contradictions`, `requirements`, `root_cause`, on a hand-written tool-use run, eager and lazily read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit import (
    SANDBOX_HELPERS,
    TOOLKIT_DOC,
    contradictions,
    provenance,
    requirements,
    root_cause,
)
from reflector.analysis.toolkit.trace_back import canonical
from reflector.analysis.traces import load_normalized, normalize
from reflector.analysis.traces.lazy import Steps
from tests.support.lazy import lazy_view

POLICY = (
    "You are an airline agent.\n"
    "- Before taking any actions that update the booking database, you must obtain explicit user "
    "confirmation (yes) to proceed.\n"
    "- The agent must first obtain the user id and get the user details.\n"
    "- Never cancel a reservation on behalf of the user."
)


def call(cid: str, name: str, args: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ],
    }


def result(cid: str, name: str, data: Any) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": cid,
        "name": name,
        "content": data if isinstance(data, str) else json.dumps(data),
    }


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": POLICY},  # 0
    {"role": "user", "content": "Hi, I'm mia_li_3668. Please move my May 20 flight to HAT136."},  # 1
    call("c1", "get_user_details", {"user_id": "mia_li_3668"}),  # 2
    result(
        "c1",
        "get_user_details",
        {"payment_methods": {"credit_card_4421486": {"brand": "visa"}}, "reservations": ["ABC123"]},
    ),  # 3
    call("c2", "get_reservation_details", {"reservation_id": "ABC123"}),  # 4
    result(
        "c2",
        "get_reservation_details",
        {"reservation_id": "ABC123", "flights": [{"flight_number": "HAT100", "date": "2024-05-20"}]},
    ),  # 5
    {
        "role": "assistant",
        "content": "I will move HAT100 on 2024-05-21 to HAT136 and charge gift_card_999. Shall I proceed?",
    },  # 6
    {"role": "user", "content": "yes"},  # 7
    call(
        "c3",
        "update_reservation_flights",
        {
            "reservation_id": "ABC123",
            "payment_id": "gift_card_999",
            "flights": [{"flight_number": "HAT136", "date": "2024-05-21"}],
        },
    ),  # 8
    result("c3", "update_reservation_flights", {"reservation_id": "ABC123", "status": "ok"}),  # 9
    call("c4", "cancel_reservation", {"reservation_id": "ABC123"}),  # 10
    result("c4", "cancel_reservation", "cancelled"),  # 11
    {"role": "assistant", "content": "Done."},  # 12
]


def tau_run() -> dict[str, Any]:
    want = {
        "reservation_id": "ABC123",
        "payment_id": "credit_card_4421486",
        "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
    }
    return {
        "task_id": 1,
        "trial": 0,
        "reward": 0.0,
        "info": {
            "task": {
                "instruction": "move the flight",
                "actions": [{"name": "update_reservation_flights", "kwargs": want}],
            }
        },
        "traj": MESSAGES,
    }


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("2024-05-20", "date:05-20"),
        ("May 20", "date:05-20"),
        ("20 May 2024", "date:05-20"),
        (250.0, "num:250"),
        ("$1,250", "num:1250"),
        ("HAT136", "id:hat136"),
        ("credit_card_7", "id:credit_card_7"),
        ("Mia  Li", "text:mia li"),
        ("", None),
        (None, None),
        (True, None),
    ],
)
def test_values_are_canonical(value: Any, key: str | None) -> None:
    assert canonical(value) == key


def test_provenance_says_who_introduced_a_value_first() -> None:
    v = normalize(MESSAGES)
    date = provenance(v, "2024-05-20")
    assert date["introduced_by"] == "user" and [r["step"] for r in date["steps"]] == [
        1,
        5,
    ]  # "May 20" is the user's
    assert date["steps"][1]["source"] == "tool"
    made = provenance(v, "gift_card_999")
    assert made["introduced_by"] == "agent" and made["first"]["step"] == 6
    assert [(r["step"], r["where"]) for r in made["steps"]] == [(6, "content"), (8, "call")]
    assert (
        provenance(v, "HAT100", limit=1)["n_steps"] == 2
        and len(provenance(v, "HAT100", limit=1)["steps"]) == 1
    )
    with pytest.raises(TypeError, match="provenance: value"):
        provenance(v, {"a": 1})


def test_contradictions_find_made_up_and_conflicting_values() -> None:
    found = contradictions(normalize(MESSAGES))
    rows = [(c["step"], c["kind"], c["where"], c["argument"], c["value"]) for c in found]
    assert rows == [
        (6, "ungrounded", "message", None, "2024-05-21"),
        (6, "ungrounded", "message", None, "gift_card_999"),
        (8, "conflict", "call", "flights[0].date", "2024-05-21"),
    ]
    conflict = found[2]
    assert {"step": 5, "source": "tool", "values": ["05-20"]} in conflict["earlier"]
    assert {"step": 1, "source": "user", "values": ["05-20"]} in conflict["earlier"]


def test_requirements_say_which_steps_honour_or_break_each_rule() -> None:
    req = requirements(normalize(MESSAGES))
    assert req["first_write"] == 8
    by_kind = {r["kind"]: r for r in req["rules"]}
    assert by_kind["confirm"]["honoured"] == [8] and by_kind["confirm"]["broken"] == []
    assert by_kind["before"]["tools"] == ["get_user_details"] and by_kind["before"]["honoured"] == [2]
    assert by_kind["never"]["tools"] == ["cancel_reservation"] and by_kind["never"]["broken"] == [10]
    unconfirmed = [m for m in MESSAGES if m.get("content") != "yes"]
    assert requirements(normalize(unconfirmed))["rules"][0]["broken"] == [7]


def test_root_cause_traces_back_from_the_wrong_write() -> None:
    r = root_cause(normalize(tau_run()))
    assert r is not None
    assert (r["symptom"]["step"], r["symptom"]["kind"]) == (8, "wrong_arguments")
    # the agent itself first stated the wrong date and the made-up card, in its message before the write
    assert (r["root"]["step"], r["root"]["rule"]) == (6, "made_up") and not r["same"]
    assert "2024-05-21" in r["root"]["reason"] or "gift_card_999" in r["root"]["reason"]
    assert 0 < r["confidence"] <= 1


def test_root_cause_is_the_symptom_when_nothing_earlier_explains_it() -> None:
    msgs = [
        m for i, m in enumerate(MESSAGES) if i != 6
    ]  # the agent never said the values before writing them
    run = {**tau_run(), "traj": msgs}
    r = root_cause(normalize(run))
    assert r is not None and r["symptom"]["step"] == 7 and r["root"]["step"] == 7 and r["same"]
    # the output and the user held 2024-05-20; the write is the first step that uses another date
    assert r["root"]["rule"] == "misread_output" and "where the tool step" in r["root"]["reason"]


def test_the_tools_are_preloaded_and_documented() -> None:
    for name in ("provenance", "contradictions", "requirements", "root_cause"):
        assert SANDBOX_HELPERS[name].__name__ == name and f"{name}(run" in TOOLKIT_DOC


# -- lazily read -------------------------------------------------------------------------------------
_lazy = lazy_view  # tests/support/lazy.py


def test_the_tools_give_the_same_on_a_lazy_view(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in MESSAGES) + "\n", encoding="utf-8")
    whole = load_normalized(path)
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        for value in ("2024-05-20", "gift_card_999", "HAT136", 250):
            assert provenance(view, value) == provenance(whole, value)
        assert contradictions(view) == contradictions(whole) == contradictions(normalize(MESSAGES))
        assert requirements(view) == requirements(whole)
        assert root_cause(view) == root_cause(whole)


def test_without_expected_actions_the_wrong_answer_is_traced_to_where_its_value_came_from() -> None:
    msgs = [
        {"role": "user", "content": "How much is order ORD-17's refund?"},
        call("c1", "get_order", {"order_id": "ORD-17"}),
        result(
            "c1",
            "get_order",
            {"order_id": "ORD-17", "items": [{"sku": "SKU9", "price": 41.5}], "refund": 38.25},
        ),
        {"role": "assistant", "content": "The item cost $41.50, so the refund is $41.50."},
        {"role": "assistant", "content": "Final answer: 41.5"},
    ]
    r = root_cause(normalize({"messages": msgs, "ground_truth": "38.25"}))
    assert r is not None and r["symptom"]["kind"] == "wrong_information" and r["symptom"]["step"] == 4
    # 41.5 came from the tool output (the item's price, not the refund): the agent's first use of it
    assert (r["root"]["step"], r["root"]["rule"]) == (3, "wrong_source") and "step 2" in r["root"]["reason"]


def test_a_failed_run_without_any_key_points_at_its_last_write() -> None:
    msgs = [m for m in MESSAGES[:10]]
    r = root_cause(normalize({"messages": msgs, "reward": 0.0}))
    assert r is not None and r["symptom"]["kind"] == "other" and r["symptom"]["step"] == 8
    # the made-up card and date of the write were first stated by the agent, in its message at step 6
    assert (r["root"]["step"], r["root"]["rule"]) == (6, "made_up")
