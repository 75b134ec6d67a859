"""The quality benchmark's answer key (bench/quality_labels.py): labels, echo blanking, hits, statement checks."""

from __future__ import annotations

import json
from typing import Any

from bench.quality import check_tau_diagnosis
from bench.quality_labels import answer_key_texts, blank_echoes, reflection_text, step_ok, tau_hit, tau_label


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _run(
    calls: list[tuple[str, dict[str, Any], str]],
    expected: list[tuple[str, dict[str, Any]]],
    outputs: list[str] | None = None,
    said: str = "Done.",
) -> dict[str, Any]:
    traj: list[dict[str, Any]] = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    for i, (name, args, result) in enumerate(calls):
        traj.append({"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}", name, args)]})
        traj.append({"role": "tool", "tool_call_id": f"c{i}", "name": name, "content": result})
    traj.append({"role": "assistant", "content": said})
    return {
        "task_id": 1,
        "trial": 0,
        "reward": 0.0,
        "traj": traj,
        "info": {
            "task": {"actions": [{"name": n, "arguments": a} for n, a in expected], "outputs": outputs or []}
        },
    }


BOOK: dict[str, Any] = {
    "reservation_id": "ABC123",
    "passengers": [{"first_name": "Ann", "dob": "1990-01-01"}, {"first_name": "Bo", "dob": "1991-02-02"}],
    "bags": 0,
}


def test_wrong_arguments_label_names_the_nested_path_and_the_call_step() -> None:
    wrong = {**BOOK, "passengers": [BOOK["passengers"][0], {"first_name": "Bo", "dob": "1991-02-03"}]}
    run = _run([("get_user_details", {"user_id": "u"}, "{}"), ("book", wrong, "{}")], [("book", BOOK)])
    label = tau_label(run)
    assert label.kind == "wrong_arguments" and label.tool == "book" and label.step == 4
    assert label.differences == [("passengers[1].dob", "1991-02-02", "1991-02-03")]


def test_integral_float_is_the_same_argument_and_failed_calls_changed_nothing() -> None:
    run = _run([("book", {**BOOK, "bags": 0.0}, "{}")], [("book", BOOK)])
    assert tau_label(run).kind in ("unlabelled", "wrong_information")
    failed = _run([("book", BOOK, "Error: card declined")], [("book", BOOK)])
    assert tau_label(failed).kind == "missing_action"


def test_missing_action_window_starts_after_the_last_matched_expected_call() -> None:
    run = _run(
        [("get_reservation_details", {"reservation_id": "ABC123"}, "{}")],
        [
            ("get_reservation_details", {"reservation_id": "ABC123"}),
            ("cancel_reservation", {"reservation_id": "ABC123"}),
        ],
    )
    label = tau_label(run)
    assert label.kind == "missing_action" and label.window == (3, 4)
    assert step_ok(label, 4) and not step_ok(label, 2) and not step_ok(label, None)


def test_extra_write_then_unstated_output() -> None:
    extra = _run(
        [("book", BOOK, "{}"), ("cancel_reservation", {"reservation_id": "ZZZ"}, "{}")], [("book", BOOK)]
    )
    label = tau_label(extra)
    assert label.kind == "extra_action" and label.tool == "cancel_reservation" and label.step == 4
    info = _run(
        [("book", BOOK, "{}")], [("book", BOOK)], outputs=["1234"], said="The total is 1,234 dollars."
    )
    assert tau_label(info).kind == "unlabelled"  # commas are ignored, as tau-bench does
    info = _run([("book", BOOK, "{}")], [("book", BOOK)], outputs=["327"], said="The total is 300.")
    assert tau_label(info).kind == "wrong_information" and tau_label(info).output == "327"


def test_echo_blanking_removes_pasted_answer_keys_only() -> None:
    run = _run([], [("book", BOOK)])
    keys = answer_key_texts(run)
    pasted = "missing: " + json.dumps(BOOK) + " end"
    blanked = blank_echoes(pasted, keys)
    assert "ABC123" not in blanked and blanked.startswith("missing") and blanked.endswith(" end")
    own_words = "At step 4 the agent called book; passengers[1].dob was 1991-02-03 (expected 1991-02-02)."
    assert blank_echoes(own_words, keys) == own_words


def test_hit_needs_the_tool_and_a_differing_value_near_its_argument() -> None:
    label = tau_label(_run([("book", {**BOOK, "bags": 1}, "{}")], [("book", BOOK)]))
    assert label.differences == [("bags", 0, 1)]
    assert tau_hit(label, "book was called with bags 1 instead of 0")
    assert not tau_hit(label, "book failed at step 1; see cell 3")  # a stray digit is not the value
    assert not tau_hit(label, "the agent chose bags 1")  # no tool


def test_reflection_text_reads_every_field_a_reader_sees() -> None:
    out = {
        "error_identification": "a",
        "key_insight": "b",
        "extracted_learnings": [{"learning": "c", "evidence": "d"}],
        "diagnosis": {"tool": "book", "summary": "e"},
        "raw": {"x": "not read"},
    }
    text = reflection_text(out)
    assert all(t in text for t in "abcde") and "not read" not in text


def test_diagnosis_statements_are_checked_against_the_trace() -> None:
    run = _run([("book", {**BOOK, "bags": 1}, "{}")], [("book", BOOK)])
    good = {
        "kind": "wrong_arguments",
        "step": 2,
        "tool": "book",
        "argument": "bags",
        "actual": "1",
        "expected": "0",
    }
    assert check_tau_diagnosis(run, good) == []
    assert check_tau_diagnosis(run, {**good, "step": 99}) == ["step 99 is not a step of the run"]
    assert check_tau_diagnosis(run, {**good, "tool": "cancel"})[0] == "cancel was not called at step 2"
    assert check_tau_diagnosis(run, {**good, "actual": "7"})
    assert check_tau_diagnosis(run, {**good, "expected": "ZZZ999"})
