"""`search_steps`: substring and regex search with snippets, the same on a lazy view as on the whole view."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit import search_steps
from reflector.analysis.traces import normalize
from reflector.analysis.traces.index import TraceIndex, build_index
from reflector.analysis.traces.lazy import Steps, open_view

MSGS: list[dict[str, Any]] = [
    {"role": "user", "content": "Please cancel reservation ABC123 for me."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "function": {"name": "get_reservation_details", "arguments": '{"reservation_id": "ABC123"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "x" * 200 + " status: FLOWN " + "y" * 200},
    {"role": "assistant", "content": "Réservation ABC123 was already flown."},
]


def test_substring_search_is_case_insensitive_and_looks_at_tool_calls() -> None:
    run = normalize(MSGS)
    hits = search_steps(run, "abc123")
    assert [(h["step"], h["role"], h["actor"]) for h in hits] == [
        (0, "user", None),
        (1, "assistant", None),
        (3, "assistant", None),
    ]
    assert hits[1]["snippet"] == 'get_reservation_details({"reservation_id": "ABC123"})'
    assert search_steps(run, "abc123", limit=1) == hits[:1]
    assert search_steps(run, "get_reservation_details(") == hits[1:2]
    assert search_steps(run, "nothing like this") == []


def test_snippets_are_cut_around_the_first_match() -> None:
    (hit,) = search_steps(normalize(MSGS), "flown ")
    assert hit["snippet"] == "..." + "x" * 71 + " status: FLOWN " + "y" * 80 + "..."


def test_regex_search_and_its_errors() -> None:
    run = normalize(MSGS)
    assert [h["step"] for h in search_steps(run, r"[A-Z]{3}\d{3}", regex=True)] == [0, 1, 3]
    assert [h["step"] for h in search_steps(run, r"^réservation", regex=True)] == [3]
    with pytest.raises(ValueError, match="invalid regular expression"):
        search_steps(run, "(unclosed", regex=True)
    assert search_steps(run, "(unclosed") == []  # a substring: no regex at all
    with pytest.raises(TypeError, match="pattern"):
        search_steps(run, "")
    with pytest.raises(TypeError, match="limit"):
        search_steps(run, "a", limit=-1)
    with pytest.raises(ValueError, match="batch"):
        search_steps({"format": "ace", "runs": []}, "a")


def test_a_lazy_view_finds_the_same_steps(tmp_path: Path) -> None:
    msgs: list[dict[str, Any]] = []
    for i in range(3000):
        content = f"note {i}" + (' needle é\n"quoted" here' if i % 97 == 0 else "")
        msgs.append({"role": "assistant" if i % 2 else "user", "content": content})
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in msgs) + "\n")  # ASCII JSON: é is escaped
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        view, _ = open_view(fd, TraceIndex.from_bytes(index.to_bytes()))
        assert type(view["steps"]) is Steps
        whole = normalize(msgs)
        for pattern, regex, limit in [
            ("NEEDLE", False, 1000),
            ("needle é", False, 5),
            ('"quoted" here', False, 1000),
            ("note 29", False, 1000),
            (r"note \d+5 needle", True, 1000),
            ("é", False, 3),
        ]:
            expected = search_steps(whole, pattern, limit=limit, regex=regex)
            assert expected, pattern
            assert search_steps(view, pattern, limit=limit, regex=regex) == expected, pattern
        assert len(search_steps(view, "needle", limit=1000)) == len(range(0, 3000, 97))
    finally:
        os.close(fd)


def test_a_lazy_ace_view_finds_text_the_adapter_composed(tmp_path: Path) -> None:
    """Free-form ACE steps become `key: value` lines and re-serialised arguments: text that is not in the
    raw record as such, so the search must not rely on it being there."""
    data = {
        "question": "q",
        "steps": [
            {
                "thought": f"t{i}",
                "action": "count",
                "args": {"ids": [i, i + 1]},
                "observation": "error: no widget" if i % 300 == 0 else f"ok {i}",
            }
            for i in range(2000)
        ],
    }
    path = tmp_path / "ace.json"
    path.write_text(json.dumps(data, indent=1))
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        view, _ = open_view(fd, TraceIndex.from_bytes(index.to_bytes()))
        assert type(view["steps"]) is Steps
        whole = normalize(data)
        for pattern in ("observation: error", "error: no widget", '"ids": [300, 301]', "ok 1999", "count("):
            expected = search_steps(whole, pattern, limit=1000)
            assert expected, pattern
            assert search_steps(view, pattern, limit=1000) == expected, pattern
    finally:
        os.close(fd)
