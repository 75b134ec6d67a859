"""`diff_actions` (the alignment) and `first_divergence` (the decisive step) on hand-written tau-bench runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reflector.analysis.answers import compare_actions
from reflector.analysis.toolkit import diff_actions, expected_actions, first_divergence, tool_calls
from reflector.analysis.traces import normalize

Script = list[tuple[Any, ...]]
BOOK: dict[str, Any] = {
    "user_id": "mia",
    "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
    "passengers": [
        {"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"},
        {"first_name": "Bo", "last_name": "Li", "dob": "1991-02-03"},
    ],
    "payment_methods": [
        {"payment_id": "certificate_1", "amount": 250},
        {"payment_id": "card_2", "amount": 5},
    ],
}


def _with(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out: Any = json.loads(json.dumps(base))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return dict(out)


def tau(
    script: Script, expected: list[tuple[str, dict[str, Any]]], outputs: list[str] | None = None
) -> dict[str, Any]:
    """A tau-bench run's view. Script items: ("user", text) | ("agent", text) | ("call", name, args[, result]);
    a result starting with "Error" is a failed call. Steps: 0 system, then one per message."""
    traj: list[dict[str, Any]] = [{"role": "system", "content": "policy"}]
    for n, item in enumerate(script):
        if item[0] in ("user", "agent"):
            traj.append({"role": "user" if item[0] == "user" else "assistant", "content": item[1]})
            continue
        name, args = item[1], item[2]
        result = item[3] if len(item) > 3 else "{}"
        traj.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{n}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        traj.append({"role": "tool", "tool_call_id": f"c{n}", "name": name, "content": result})
    return normalize(
        {
            "task_id": 1,
            "trial": 0,
            "reward": 0.0,
            "traj": traj,
            "info": {
                "task": {
                    "user_id": "mia",
                    "instruction": "book",
                    "outputs": outputs or [],
                    "actions": [{"name": name, "kwargs": args} for name, args in expected],
                }
            },
        }
    )


def test_exact_matches_first_then_wrong_arguments_by_fewest_differences() -> None:
    close = _with(BOOK, ("passengers", 1, "dob"), "1991-02-04")
    far = _with(_with(close, ("payment_methods", 0, "amount"), 300), ("user_id",), "x")
    run = tau(
        [
            ("user", "book"),
            ("call", "get_user_details", {"user_id": "mia"}),
            ("call", "book_reservation", far),
            ("call", "book_reservation", close),
            ("call", "cancel_reservation", {"reservation_id": "R1"}),
            ("call", "update_reservation_baggages", {"n": 1}),
        ],
        [
            ("cancel_reservation", {"reservation_id": "R1"}),
            ("book_reservation", BOOK),
            ("update_reservation_baggages", {"n": 1.0}),
        ],
    )
    calls = tool_calls(run)
    d = diff_actions(expected_actions(run), calls)
    assert d["matched"] == [{"expected": 0, "actual": 3}, {"expected": 2, "actual": 4}]  # 1.0 == 1
    assert d["wrong_arguments"] == [
        {
            "expected": 1,
            "actual": 2,
            "name": "book_reservation",
            "differences": [{"path": "passengers[1].dob", "expected": "1991-02-03", "actual": "1991-02-04"}],
        }
    ]
    assert d["missing"] == []
    assert d["extra"] == [{"actual": 1, "name": "book_reservation", "args": far, "step": 4}]
    assert d["equal"] is False
    all_tools = diff_actions(expected_actions(run), calls, writes_only=False)
    assert {"actual": 0, "name": "get_user_details", "args": {"user_id": "mia"}, "step": 2} in all_tools[
        "extra"
    ]
    # the run's own `actions` and `arguments` keys are accepted as well
    assert diff_actions(run["expected_actions"], run["actions"]) == d


def test_failed_calls_are_not_matched_and_equal_agrees_with_compare_actions() -> None:
    run = tau(
        [
            ("call", "cancel_reservation", {"reservation_id": "R1"}, "Error: not found"),
            ("call", "cancel_reservation", {"reservation_id": "R1"}),
        ],
        [("cancel_reservation", {"reservation_id": "R1"})],
    )
    d = diff_actions(expected_actions(run), tool_calls(run))
    assert d == {
        "matched": [{"expected": 0, "actual": 1}],
        "wrong_arguments": [],
        "missing": [],
        "extra": [],
        "equal": True,
    }
    assert compare_actions(run["actions"], run["expected_actions"])[0] is True
    assert first_divergence(run) is None
    only_failed = tau(
        [("call", "cancel_reservation", {"reservation_id": "R1"}, "Error: not found")],
        [("cancel_reservation", {"reservation_id": "R1"})],
    )
    d = diff_actions(expected_actions(only_failed), tool_calls(only_failed))
    assert d["missing"] == [{"expected": 0, "name": "cancel_reservation", "args": {"reservation_id": "R1"}}]


def test_first_divergence_wrong_arguments_at_the_agents_call() -> None:
    wrong = _with(BOOK, ("payment_methods", 0, "amount"), 300.0)
    run = tau(
        [("user", "book"), ("agent", "ok"), ("call", "book_reservation", wrong), ("agent", "booked")],
        [("book_reservation", BOOK)],
    )
    d = first_divergence(run)
    assert d is not None
    assert {
        k: d[k]
        for k in (
            "kind",
            "step",
            "tool",
            "argument",
            "actual",
            "expected",
            "where",
            "n_expected",
            "n_matched",
        )
    } == {
        "kind": "wrong_arguments",
        "step": 3,
        "tool": "book_reservation",
        "argument": "payment_methods[0].amount",
        "actual": 300,
        "expected": 250,
        "where": "the agent's call",
        "n_expected": 1,
        "n_matched": 0,
    }
    assert d["agent_call"]["step"] == 3 and d["agent_call"]["args"] == wrong
    assert d["expected_action"] == {"index": 0, "name": "book_reservation", "args": BOOK}
    assert d["differences"] == [{"path": "payment_methods[0].amount", "expected": 250, "actual": 300}]
    json.dumps(d)  # plain data


def test_the_first_expected_write_not_taken_comes_before_an_earlier_extra_write() -> None:
    # the task's order decides (the label: first expected write not taken as expected, else the
    # first extra write); the earlier extra write is still reported among the others
    run = tau(
        [
            ("call", "cancel_reservation", {"reservation_id": "R9"}),
            ("call", "book_reservation", _with(BOOK, ("user_id",), "bob")),
        ],
        [("book_reservation", BOOK)],
    )
    d = first_divergence(run)
    assert d is not None
    assert (d["kind"], d["step"], d["tool"], d["argument"]) == (
        "wrong_arguments",
        3,
        "book_reservation",
        "user_id",
    )
    assert d["others"] == [{"kind": "extra_action", "step": 1, "tool": "cancel_reservation"}]
    only_extra = tau(
        [("call", "cancel_reservation", {"reservation_id": "R9"}), ("call", "book_reservation", BOOK)],
        [("book_reservation", BOOK)],
    )
    d = first_divergence(only_extra)
    assert d is not None
    assert (d["kind"], d["step"], d["tool"], d["actual"], d["expected"]) == (
        "extra_action",
        1,
        "cancel_reservation",
        {"reservation_id": "R9"},
        None,
    )
    # when nothing is expected at all, any write is extra
    d = first_divergence(tau([("agent", "hi"), ("call", "cancel_reservation", {"reservation_id": "R9"})], []))
    assert d is not None and d["kind"] == "extra_action" and d["n_expected"] == 0


def test_a_missing_action_is_placed_after_the_last_matched_one_before_it() -> None:
    run = tau(
        [
            ("user", "a"),
            ("call", "cancel_reservation", {"reservation_id": "R1"}),
            ("agent", "cancelled R1"),
            ("user", "and R2?"),
            ("agent", "bye"),
        ],
        [("cancel_reservation", {"reservation_id": "R1"}), ("update_reservation_baggages", {"r": "R2"})],
    )
    d = first_divergence(run)
    assert d is not None
    assert (d["kind"], d["step"], d["tool"], d["expected"], d["actual"]) == (
        "missing_action",
        4,
        "update_reservation_baggages",
        {"r": "R2"},
        None,
    )
    assert d["where"].startswith("the first agent step after step 2")
    assert (d["n_expected"], d["n_matched"]) == (2, 1)
    # nothing before it was taken: the end of the conversation
    run = tau(
        [("user", "a"), ("agent", "hello"), ("user", "b"), ("agent", "bye")],
        [("cancel_reservation", {"reservation_id": "R1"})],
    )
    d = first_divergence(run)
    assert d is not None and (d["kind"], d["step"]) == ("missing_action", 4)
    assert d["where"].startswith("the end of the conversation")
    # an expected read taken places the missing write after it
    run = tau(
        [
            ("user", "a"),
            ("call", "get_reservation_details", {"reservation_id": "R1"}),
            ("agent", "found it"),
            ("user", "cancel"),
            ("agent", "cannot"),
        ],
        [
            ("get_reservation_details", {"reservation_id": "R1"}),
            ("cancel_reservation", {"reservation_id": "R1"}),
        ],
    )
    d = first_divergence(run)
    assert d is not None and (d["kind"], d["step"]) == ("missing_action", 4)
    assert "get_reservation_details" in d["where"]


def test_expected_outputs_when_every_write_matches() -> None:
    script: Script = [
        ("call", "get_user_details", {"user_id": "mia"}),
        ("agent", "Your balance is 1,250 dollars."),
        ("agent", "Anything else?"),
    ]
    d = first_divergence(tau(script, [], outputs=["1250", "327"]))
    assert d is not None
    assert (d["kind"], d["step"], d["expected"], d["actual"], d["tool"]) == (
        "wrong_information",
        4,
        "327",
        "Anything else?",
        None,
    )
    assert d["missing_outputs"] == ["327"]
    assert first_divergence(tau(script, [], outputs=["1250"])) is None  # stated ("1,250": commas ignored)
    # an unmatched write comes first: outputs are only looked at when every write matches
    d = first_divergence(tau([("call", "cancel_reservation", {"r": 1}), *script], [], outputs=["327"]))
    assert d is not None and d["kind"] == "extra_action"


def test_nothing_to_compare_with_is_none_and_a_batch_is_refused() -> None:
    plain = normalize([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert first_divergence(plain) is None
    batch = normalize([{"task_id": 1, "trial": 0, "reward": 1.0, "traj": [], "info": {}}] * 2)
    with pytest.raises(ValueError, match=r"first_divergence\(traces\['runs'\]\[i\]\)"):
        first_divergence(batch)
    with pytest.raises(TypeError, match="list of actions"):
        diff_actions({"name": "x"}, [])
    with pytest.raises(TypeError, match="writes_only"):
        diff_actions([], [], writes_only="yes")


def test_a_missing_action_is_placed_where_the_agent_changed_the_state_otherwise() -> None:
    # the agent booked anew instead of changing the reservation: that call is the decisive step
    run = tau(
        [
            ("user", "change my flight"),
            ("agent", "ok"),
            ("call", "book_reservation", BOOK),
            ("agent", "booked"),
            ("user", "thanks"),
            ("agent", "bye"),
        ],
        [("update_reservation_flights", {"reservation_id": "R1", "cabin": "economy"})],
    )
    d = first_divergence(run)
    assert d is not None and (d["kind"], d["tool"], d["step"]) == (
        "missing_action",
        "update_reservation_flights",
        3,
    )
    assert d["where"] == "step 3, where the agent called book_reservation instead"
    assert d["others"] == [{"kind": "extra_action", "step": 3, "tool": "book_reservation"}]
