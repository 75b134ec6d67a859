"""Multi-agent conversations (Who&When's `history`) in the canonical view: one step per message, its
`index` the message's position, its `actor` the speaking agent; and `actor` on every adapter's steps."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit.actors import actors, suspect_mistake, timeline
from reflector.analysis.traces import detect_format, load_normalized, normalize
from reflector.analysis.traces.index import build_index
from reflector.analysis.traces.lazy import Steps
from tests.support.lazy import lazy_view

WHOWHEN: dict[str, Any] = {
    "question": "How many clients get the sunset design?",
    "ground_truth": "8",
    "question_ID": "q-1",
    "level": "2",
    "system_prompt": {"Excel_Expert": "You read spreadsheets.", "Verification_Expert": "You verify."},
    "history": [
        {
            "content": "You are given a task.\n# General Task\nHow many clients get the sunset design?",
            "role": "assistant",
            "name": "Excel_Expert",
        },
        {
            "content": "exitcode: 0 (execution succeeded)\nCode output: 4",
            "role": "user",
            "name": "Computer_terminal",
        },
        {"content": "The answer is 4.", "role": "user", "name": "Verification_Expert"},
        {"content": "TERMINATE", "role": "user", "name": "Verification_Expert"},
    ],
}
LABELS = {
    "mistake_agent": "Excel_Expert",
    "mistake_step": "0",
    "mistake_reason": "wrong count",
    "is_correct": False,
}


def test_history_messages_are_the_steps_numbered_by_position() -> None:
    v = normalize(WHOWHEN)
    assert v["format"] == "ace" and detect_format(WHOWHEN) == "ace"
    assert [s["index"] for s in v["steps"]] == [0, 1, 2, 3]
    assert [s["actor"] for s in v["steps"]] == [
        "Excel_Expert",
        "Computer_terminal",
        "Verification_Expert",
        "Verification_Expert",
    ]
    assert [s["role"] for s in v["steps"]] == ["assistant", "user", "user", "user"]
    assert v["steps"][1]["content"] == "exitcode: 0 (execution succeeded)\nCode output: 4"
    assert (v["question"], v["ground_truth"]) == ("How many clients get the sunset design?", "8")


def test_system_prompts_are_named_in_metadata_and_kept_out_of_the_steps() -> None:
    v = normalize(WHOWHEN)
    assert v["metadata"]["system_prompts"] == ["Excel_Expert", "Verification_Expert"]
    assert v["metadata"]["n_steps"] == 4
    assert not any("You read spreadsheets" in s["content"] for s in v["steps"])
    assert v["raw"]["system_prompt"]["Excel_Expert"] == "You read spreadsheets."


def test_the_final_answer_is_the_last_message_that_says_something_whatever_its_role() -> None:
    # in a group chat the role is the framework's point of view: the answer here is a "user" message
    assert normalize(WHOWHEN)["final_answer"] == "The answer is 4."


def test_labels_get_no_special_meaning() -> None:
    """With or without the failure labels, the steps are the same (the benchmark removes the labels)."""
    with_labels = normalize({**WHOWHEN, **LABELS})
    assert with_labels["steps"] == normalize(WHOWHEN)["steps"]
    assert with_labels["question"] == WHOWHEN["question"]


def test_a_history_without_task_keys_is_still_detected() -> None:
    bare = {"history": WHOWHEN["history"]}
    assert detect_format(bare) == "ace"
    assert len(normalize(bare)["steps"]) == 4
    assert detect_format({"history": []}) == "unknown"
    assert detect_format({"history": [{"text": "no role, no name"}]}) == "unknown"


def test_a_message_with_several_parts_stays_one_step() -> None:
    history = [
        {
            "role": "assistant",
            "name": "A",
            "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}],
        },
        {
            "role": "user",
            "name": "B",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                {"type": "text", "text": "and here is my view"},
            ],
        },
        {"role": "user", "name": "C", "content": "fine"},
    ]
    steps = normalize({"question": "q", "history": history})["steps"]
    assert [s["index"] for s in steps] == [0, 1, 2]
    assert [s["actor"] for s in steps] == ["A", "B", "C"]
    assert "and here is my view" in steps[1]["content"] and "x" in steps[1]["content"]
    assert steps[1]["tool_name"] == "ls"


def test_message_names_are_actors_but_tool_names_are_not() -> None:
    msgs = [
        {"role": "user", "name": "alice", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}],
        },
        {"role": "tool", "name": "ls", "tool_call_id": "c1", "content": "bin"},
        {"role": "assistant", "name": " ", "content": "done"},
    ]
    steps = normalize(msgs)["steps"]
    assert [s["actor"] for s in steps] == ["alice", None, None, None]
    assert steps[2]["tool_name"] == "ls"


def test_every_adapter_gives_steps_an_actor_key() -> None:
    shapes: list[Any] = [
        {"question": "q", "steps": [{"thought": "t"}, {"tool": "ls", "observation": "bin"}]},
        {"question": "q", "messages": [{"role": "user", "content": "q"}]},
        [{"type": "session", "id": "s"}, {"type": "message", "message": {"role": "user", "content": "hi"}}],
        {"traj": [{"role": "user", "content": "hi"}], "reward": 0},
        {"spans": [{"name": "tool", "span_id": "1", "attributes": {"tool.name": "t"}}]},
    ]
    for data in shapes:
        v = normalize(data)
        run = v["runs"][0] if "runs" in v else v
        assert run["steps"], data
        assert all("actor" in s for s in run["steps"]), v["format"]


# -- the lazy path ---------------------------------------------------------------------------------
_lazy = lazy_view  # tests/support/lazy.py


def test_a_history_object_is_indexed_and_read_lazily_as_a_whole_read_gives_it(tmp_path: Path) -> None:
    """A multi-agent `history` object is indexed (one record per message, so a step's index stays its
    position in the conversation): the lazy view gives the steps, actors and answer of a whole read."""
    path = tmp_path / "ww.json"
    path.write_text(json.dumps(WHOWHEN), encoding="utf-8")
    fmt, index = build_index(io.BytesIO(path.read_bytes()), "ww.json")
    assert fmt == "ace" and index is not None and index.record_kind == "history-message"
    whole = load_normalized(path)
    assert whole["steps"] == normalize(WHOWHEN)["steps"]
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        assert [dict(s) for s in view["steps"]] == whole["steps"]
        assert view["final_answer"] == whole["final_answer"] and view["question"] == whole["question"]
        assert actors(view) == actors(whole)


def test_named_messages_read_lazily_keep_their_actors(tmp_path: Path) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Task: count the rows"}]
    for i in range(300):
        msgs.append({"role": "user", "name": "Coder", "content": f"try {i}\n```python\nprint({i})\n```"})
        msgs.append(
            {
                "role": "user",
                "name": "Computer_terminal",
                "content": f"exitcode: 0 (execution succeeded)\nCode output: {i}",
            }
        )
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in msgs) + "\n", encoding="utf-8")
    whole = load_normalized(path)
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        assert view["steps"][1]["actor"] == "Coder" and view["steps"][0]["actor"] is None
        assert actors(view) == actors(whole)
        assert timeline(view, actor="Computer_terminal", limit=3) == timeline(
            whole, actor="Computer_terminal", limit=3
        )
        guess = suspect_mistake(view, "first_action")  # a positional lead: by name only, never the guess
        assert guess == suspect_mistake(whole, "first_action")
        assert guess is not None and (guess["step"], guess["actor"]) == (1, "Coder")
        assert suspect_mistake(view) == suspect_mistake(whole)


# -- the real files ---------------------------------------------------------------------------------
def test_real_whowhen_files_step_index_is_the_history_position(shared_traces: Path) -> None:
    folder = shared_traces / "who-and-when" / "algorithm-generated"
    if not folder.is_dir():
        pytest.skip(f"no Who&When folder in {shared_traces}")
    files = sorted(folder.glob("*.json"))
    assert len(files) == 126
    for path in files:
        raw = json.loads(path.read_text(encoding="utf-8"))
        v = load_normalized(path)
        assert v["format"] == "ace" and v["question"] == raw["question"], path.name
        assert v["ground_truth"] == raw["ground_truth"]
        assert [(s["index"], s["actor"], s["content"]) for s in v["steps"]] == [
            (i, m["name"], m["content"]) for i, m in enumerate(raw["history"])
        ], path.name


def test_a_bare_list_of_named_messages_is_the_conversation_a_history_key_gives(tmp_path: Path) -> None:
    """Messages that name their speaker and carry no role (`{"name", "content"}`) are a conversation whether
    they come as a bare list, as JSON lines or under `history`: each a named agent's turn, the same steps and
    actors, and the lazy view of the JSON lines reads them as the whole read does."""
    named = [{"name": m["name"], "content": m["content"]} for m in WHOWHEN["history"]]
    bare = normalize(named)
    keyed = normalize({"history": named})
    assert (detect_format(named), detect_format({"history": named})) == ("messages", "ace")
    assert [(s["role"], s["actor"], s["content"]) for s in bare["steps"]] == [
        (s["role"], s["actor"], s["content"]) for s in keyed["steps"]
    ]
    assert {s["role"] for s in bare["steps"]} == {"assistant"}
    assert [s["actor"] for s in bare["steps"]] == [m["name"] for m in named]
    assert actors(bare) == actors(keyed)
    assert (
        bare["final_answer"] == keyed["final_answer"] == "The answer is 4."
    )  # a bare TERMINATE answers nothing
    path = tmp_path / "named.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in named * 200) + "\n", encoding="utf-8")
    whole = load_normalized(path)
    assert whole["format"] == "messages" and len(whole["steps"]) == 800
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        assert [dict(s) for s in view["steps"]] == whole["steps"]
        assert actors(view) == actors(whole)
        assert view["final_answer"] == whole["final_answer"] == "The answer is 4."
    # an ACE run list whose records happen to have `name` and `content` stays ACE
    assert detect_format([{"question": "q", "name": "n", "content": "c"}]) == "ace"
