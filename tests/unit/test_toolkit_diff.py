"""`diff_values` (argument-level differences with paths) and `as_data` (the toolkit's plain copies)."""

from __future__ import annotations

from typing import Any

import pytest

from reflector.analysis.toolkit import diff_values
from reflector.analysis.toolkit.diff import as_data, same_value

BOOKING: dict[str, Any] = {
    "user_id": "mia_li_3668",
    "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
    "passengers": [
        {"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"},
        {"first_name": "Ann", "last_name": "Li", "dob": "1992-01-01"},
    ],
    "payment_methods": [
        {"payment_id": "certificate_7504069", "amount": 250},
        {"payment_id": "credit_card_4421486", "amount": 5},
    ],
    "insurance": "no",
}


def _changed(**changes: Any) -> dict[str, Any]:
    out = as_data(BOOKING)
    for key, value in changes.items():
        out[key] = value
    return dict(out)


def test_equal_values_have_no_differences_whatever_the_key_order() -> None:
    shuffled = {k: BOOKING[k] for k in reversed(list(BOOKING))}
    assert diff_values(BOOKING, shuffled) == []
    assert same_value(BOOKING, shuffled)


def test_nested_lists_of_dicts_say_which_passenger_and_which_payment_method() -> None:
    actual = as_data(BOOKING)
    actual["passengers"][1]["dob"] = "1992-01-02"
    actual["payment_methods"][0]["amount"] = 300
    assert diff_values(BOOKING, actual) == [
        {"path": "passengers[1].dob", "expected": "1992-01-01", "actual": "1992-01-02"},
        {"path": "payment_methods[0].amount", "expected": 250, "actual": 300},
    ]


def test_integral_floats_equal_ints_but_bools_are_not_numbers() -> None:
    assert diff_values({"amount": 250}, {"amount": 250.0}) == []
    assert diff_values([1, 2.5], [1.0, 2.5]) == []
    assert diff_values({"amount": 250}, {"amount": 250.5}) == [
        {"path": "amount", "expected": 250, "actual": 250.5}
    ]
    assert diff_values({"flag": True}, {"flag": 1}) == [{"path": "flag", "expected": True, "actual": 1}]


def test_a_missing_or_extra_element_is_one_difference() -> None:
    two = _changed(passengers=BOOKING["passengers"][:1])
    assert diff_values(BOOKING, two) == [
        {"path": "passengers[1]", "expected": BOOKING["passengers"][1], "actual": None, "note": "missing"}
    ]
    three = _changed(passengers=[*BOOKING["passengers"], {"first_name": "Bo"}])
    assert diff_values(BOOKING, three) == [
        {"path": "passengers[2]", "expected": None, "actual": {"first_name": "Bo"}, "note": "not expected"}
    ]


def test_missing_and_unexpected_keys_are_labelled() -> None:
    assert diff_values({"a": 1, "b": None}, {"a": 1, "c": 2}) == [
        {"path": "b", "expected": None, "actual": None, "note": "missing"},
        {"path": "c", "expected": None, "actual": 2, "note": "not expected"},
    ]


def test_strings_are_compared_exactly_and_case_or_space_differences_are_labelled() -> None:
    assert diff_values({"cabin": "economy"}, {"cabin": "Economy "}) == [
        {
            "path": "cabin",
            "expected": "economy",
            "actual": "Economy ",
            "note": "differs only in case or whitespace",
        }
    ]
    assert diff_values("economy", "business") == [{"path": "", "expected": "economy", "actual": "business"}]


def test_type_changes_paths_and_odd_keys() -> None:
    assert diff_values({"flights": [1]}, {"flights": {"0": 1}}) == [
        {"path": "flights", "expected": [1], "actual": {"0": 1}}
    ]
    assert diff_values({"a b": {"x": 1}}, {"a b": {"x": 2}}, path="args") == [
        {"path": 'args["a b"].x', "expected": 1, "actual": 2}
    ]
    assert diff_values([[1, 2]], [[1, 3]]) == [{"path": "[0][1]", "expected": 2, "actual": 3}]
    assert diff_values((1, 2), [1, 2]) == []  # a tuple is a list


def test_subclasses_are_read_through_the_base_types_never_their_overrides() -> None:
    class Lying(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise AssertionError("an override was called")

        def get(self, *args: Any) -> Any:
            raise AssertionError("an override was called")

        def __iter__(self) -> Any:
            raise AssertionError("an override was called")

    class Text(str):
        def __str__(self) -> str:
            return "lie"

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    value = as_data(Lying(a=Text("x"), b=[Text("y")]))
    assert value == {"a": "x", "b": ["y"]}
    assert type(value) is dict and type(value["a"]) is str and type(value["b"][0]) is str
    assert diff_values(Lying(a=Text("x")), {"a": "z"}) == [{"path": "a", "expected": "x", "actual": "z"}]


def test_non_json_values_and_cycles_are_refused_with_a_clear_error() -> None:
    with pytest.raises(TypeError, match="not JSON-like data"):
        diff_values({"a": {1, 2}}, {})
    with pytest.raises(TypeError, match="str keys"):
        diff_values({(1, 2): 1}, {})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nests more than"):
        diff_values(loop, [])
    with pytest.raises(TypeError, match="path must be a str"):
        diff_values(1, 2, path=3)  # type: ignore[arg-type]


def test_results_are_fresh_copies() -> None:
    expected = {"p": [{"x": 1}]}
    diffs = diff_values(expected, {"p": []})
    diffs[0]["expected"]["x"] = 99
    assert expected == {"p": [{"x": 1}]}
