"""The offline `heuristic` model, driven through a real pydantic-ai Agent.

The `execute_code` tool here is a test-only harness: it `exec`s the cell in a dict namespace with
`traces`/`task` and the toolkit (`reflector.analysis.toolkit.SANDBOX_HELPERS`, as the sandbox preloads them) and
captures print output. Production runs the same cell in the sandbox (tests/workflows run it there).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.tools import ToolDefinition

from reflector.analysis.heuristic import (
    FINDINGS_CELL,
    HEURISTIC_NAME,
    SIMPLE_CELL,
    heuristic_response,
    make_heuristic_model,
    parse_findings,
)
from reflector.analysis.toolkit import SANDBOX_HELPERS
from reflector.analysis.traces import load_normalized, normalize
from reflector.contract import ReflectionDraft

EXAMPLES = Path(__file__).resolve().parents[2] / "reflector" / "examples"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
TAU = SHARED / "tau-bench-airline-gpt-4o.json"
needs_tau = pytest.mark.skipif(
    not TAU.is_file(), reason=f"real trace {TAU} is absent (only present in the dev workspace)"
)
ALLOWED_IMPORTS = {"json", "re", "math", "collections", "itertools", "functools", "statistics"}


class Harness:
    """An in-process stand-in for the sandbox: records every cell and its output."""

    def __init__(self, traces: Any, task: dict[str, Any], refuse: int = 0) -> None:
        self.traces, self.task, self.refuse = traces, task, refuse
        self.cells: list[str] = []
        self.outputs: list[str] = []

    def execute_code(self, code: str) -> str:
        """Run Python code with `traces` and `task` defined; returns what it printed."""
        self.cells.append(code)
        if len(self.cells) <= self.refuse:
            out = "ERROR guard: refused"
        else:
            buf = io.StringIO()
            ns: dict[str, Any] = {"traces": self.traces, "task": self.task, **SANDBOX_HELPERS}
            try:
                with contextlib.redirect_stdout(buf):
                    exec(code, ns)
                out = buf.getvalue()
            except Exception as exc:  # the sandbox reports failures the same way
                out = f"ERROR {type(exc).__name__}: {exc}"
        self.outputs.append(out)
        return out


def reflect(
    view: Any, task: dict[str, Any] | None = None, prompt: str = "Reflect on the trace.", **kw: Any
) -> tuple[ReflectionDraft, Harness, list[ModelMessage]]:
    harness = Harness(view, task or {"question": "", "ground_truth": None, "feedback": None}, **kw)
    agent = Agent(make_heuristic_model(), output_type=ReflectionDraft, tools=[harness.execute_code])
    result = agent.run_sync(prompt)
    return result.output, harness, result.all_messages()


def findings_of(h: Harness) -> dict[str, Any]:
    f = parse_findings(h.outputs)
    assert f is not None
    return f


def strings_in(value: Any) -> str:
    """Every string and number of the parsed findings, joined (to check evidence against)."""
    if isinstance(value, dict):
        return "\n".join(strings_in(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(strings_in(v) for v in value)
    return "" if value is None else str(value)


def assert_evidence_from_findings(draft: ReflectionDraft, f: dict[str, Any]) -> None:
    """Each learning's evidence only cites step indices, tools and quoted text the cell printed."""
    printed = strings_in(f)
    assert 1 <= len(draft.extracted_learnings) <= 4
    for learning in draft.extracted_learnings:
        assert learning.evidence and 0 <= learning.atomicity_score <= 1
        for quoted in re.findall(r'"([^"]{4,}?)(?:\.\.\.)?"(?=[;.,: )]|$)', learning.evidence):
            assert quoted.removesuffix("...") in printed or quoted in printed.replace('"', ""), quoted
        for index, tool in re.findall(r"step (\d+) \(tool ([\w.-]+)\)", learning.evidence):
            assert f"\n{index}\n{tool}" in printed or f"{index}\n{tool}" in printed, (index, tool)


def test_cell_respects_sandbox_rules() -> None:
    for cell in (FINDINGS_CELL, SIMPLE_CELL):
        assert "__" not in cell and "open(" not in cell
        imported = set(re.findall(r"^\s*import ([\w, ]+)$", cell, re.M))
        modules = {m.strip() for line in imported for m in line.split(",")}
        assert modules <= ALLOWED_IMPORTS
        assert "from " not in re.sub(r"[\"'].*?[\"']", "", cell).replace("from traces", "")


def test_failed_math_mismatch() -> None:
    view = load_normalized(EXAMPLES / "failed_math.json")
    draft, h, _ = reflect(view)
    f = findings_of(h)
    assert h.cells == [FINDINGS_CELL]
    assert f["answer_matches"] is False and f["ground_truth"] == "408" and f["ground_truth_source"] == "trace"
    assert (
        "does not match the ground truth" in draft.error_identification
        and "408" in draft.error_identification
    )
    d = draft.diagnosis
    # the root cause is where the wrong value was introduced, the symptom the final answer (issue 28)
    assert d is not None and (d.kind, d.step, d.expected) == ("wrong_information", 1, "408")
    assert d.symptom_step is not None and d.step is not None and d.symptom_step > d.step
    assert d.confidence <= 0.5 and "rule answer_origin" in d.summary and "'398'" in d.summary
    assert "A rule-based guess, not a verified cause" in draft.root_cause_analysis
    assert HEURISTIC_NAME in draft.reasoning and "not an LLM" in draft.reasoning
    assert_evidence_from_findings(draft, f)
    assert draft.skill_tags == []


def test_ground_truth_from_task_takes_precedence() -> None:
    view = load_normalized(EXAMPLES / "failed_math.json")
    _, h, _ = reflect(view, {"question": "q", "ground_truth": "398 pencils", "feedback": None})
    f = findings_of(h)
    assert f["ground_truth_source"] == "task" and f["answer_matches"] is True


def test_tool_error_groups_the_retries_and_says_they_were_identical() -> None:
    draft, h, _ = reflect(load_normalized(EXAMPLES / "tool_error.json"))
    f = findings_of(h)
    (group,) = f["failing_calls"]
    assert group["tool"] == "get_weather" and group["steps"] == [2, 4] and group["identical_retries"] == 1
    assert group["recovered"] is False and f["answer_matches"] is None
    d = draft.diagnosis
    assert d is not None and (d.kind, d.step, d.tool) == ("tool_error_mishandled", 2, "get_weather")
    assert "1 retry(ies) repeated the same arguments" in draft.error_identification
    assert "again with the same arguments" in draft.root_cause_analysis
    assert any("get_weather" in x.learning for x in draft.extracted_learnings)
    assert_evidence_from_findings(draft, f)


def test_deterministic_and_history_only() -> None:
    view = load_normalized(EXAMPLES / "tool_error.json")
    first, _, messages = reflect(view)
    second, _, _ = reflect(view)
    assert first == second
    # replaying the model on the recorded history (as after a worker restart) decides the same
    info = _info(output=True)
    again = heuristic_response(messages[:-2], info)
    recorded = messages[-2]
    assert isinstance(recorded, ModelResponse)
    assert again.parts == recorded.parts


def test_labels_itself_not_an_llm() -> None:
    model = make_heuristic_model()
    assert model.model_name == HEURISTIC_NAME == "heuristic (rule-based, not an LLM)"
    assert model.system == HEURISTIC_NAME
    _, _, messages = reflect(load_normalized(EXAMPLES / "tool_error.json"))
    names = {m.model_name for m in messages if isinstance(m, ModelResponse)}
    assert names == {HEURISTIC_NAME}


def test_success_is_reported_honestly() -> None:
    view = normalize({"question": "6*7?", "ground_truth": "42", "final_answer": "The answer is 42."})
    draft, h, _ = reflect(view)
    assert findings_of(h)["answer_matches"] is True
    assert draft.error_identification.startswith("No error found")
    assert len(draft.extracted_learnings) == 1


@pytest.mark.parametrize(
    ("final", "truth", "expected"),
    [
        ("The answer is 42.", "42", True),
        ("It is 42.0", "42", True),
        ("17*24 = 408, not 398", "408", False),
        ("Total: $1,200", "1200", True),
        ("Paris, France", "paris", True),
        ("London", "Paris", False),
        (None, "Paris", False),
        ("x", None, None),
    ],
)
def test_answer_comparison(final: str | None, truth: str | None, expected: bool | None) -> None:
    view = normalize({"question": "q", "ground_truth": truth, "final_answer": final})
    _, h, _ = reflect(view)
    assert findings_of(h)["answer_matches"] is expected


def test_retry_with_simple_cell_when_refused() -> None:
    view = load_normalized(EXAMPLES / "failed_math.json")
    draft, h, _ = reflect(view, refuse=1)
    assert h.cells == [FINDINGS_CELL, SIMPLE_CELL]
    assert findings_of(h) == {"format": "ace", "simple": True}
    assert "ERROR guard: refused" in draft.reasoning and "Undetermined" in draft.error_identification


def test_simple_cell_on_a_non_view() -> None:
    draft, h, _ = reflect("not a view", refuse=1)
    assert len(h.cells) == 2 and findings_of(h) == {"format": "unknown", "simple": True}
    assert "unknown" in draft.error_identification


def test_gives_up_after_two_failed_cells() -> None:
    draft, h, _ = reflect(load_normalized(EXAMPLES / "tool_error.json"), refuse=5)
    assert len(h.cells) == 2 and parse_findings(h.outputs) is None
    assert "Undetermined" in draft.error_identification and draft.reasoning.count("ERROR guard") == 2


def test_evidence_checker_catches_invented_evidence() -> None:
    draft, h, _ = reflect(load_normalized(EXAMPLES / "tool_error.json"))
    bad = draft.model_copy(deep=True)
    bad.extracted_learnings[0].evidence = 'step 9 (tool get_weather): "made up"'
    with pytest.raises(AssertionError):
        assert_evidence_from_findings(bad, findings_of(h))
    bad.extracted_learnings[0].evidence = 'step 3 (tool get_weather): "an invented quote"'
    with pytest.raises(AssertionError):
        assert_evidence_from_findings(bad, findings_of(h))


def test_unknown_format() -> None:
    draft, h, _ = reflect(normalize({"foo": 1, "bar": [2]}))
    f = findings_of(h)
    assert f["format"] == "unknown" and f["raw_keys"] == ["bar", "foo"]
    assert "['bar', 'foo']" in draft.extracted_learnings[0].evidence


def test_skill_tags_only_for_cited_skillbook_ids() -> None:
    view = normalize(
        {
            "question": "6*7?",
            "ground_truth": "42",
            "final_answer": "Using [math-00001] the answer is 36",
            "skill_ids": ["math-00002"],
        }
    )
    prompt = "Task...\nSkill ids in the skillbook: [math-00001], [math-00003], [math-00002]\n"
    draft, _, _ = reflect(view, prompt=prompt)
    assert [(t.id, t.tag) for t in draft.skill_tags] == [("math-00001", "harmful"), ("math-00002", "harmful")]
    no_book, _, _ = reflect(view)
    assert no_book.skill_tags == []


def test_batch_of_runs_counts_runs() -> None:
    runs = [
        {"question": "a", "ground_truth": "1", "final_answer": "1"},
        {
            "question": "b",
            "ground_truth": "2",
            "final_answer": "3",
            "steps": [
                {"tool": "calc", "observation": "Error: x"},
                {"tool": "calc", "observation": "Error: y"},
            ],
        },
    ]
    draft, h, _ = reflect(normalize(runs))
    f = findings_of(h)
    assert f["batch"] and f["n_runs"] == 2 and f["n_failing_runs"] == 1
    assert f["n_failing_runs_with_tool_errors"] == 1  # one run, however many errors it has
    assert "1 of 2 runs failed" in draft.error_identification
    assert "1 of the 1 failing runs contain a tool error" in draft.root_cause_analysis


def _info(output: bool, tools: tuple[str, ...] = ("execute_code",)) -> AgentInfo:
    out = [ToolDefinition(name="final_result")] if output else []
    return AgentInfo(
        function_tools=[ToolDefinition(name=t) for t in tools],
        allow_text_output=not output,
        output_tools=out,
        model_settings=None,
        model_request_parameters=ModelRequestParameters(),
        instructions=None,
    )


def _history_with_findings(findings: dict[str, Any]) -> list[ModelMessage]:
    call = ToolCallPart("execute_code", {"code": FINDINGS_CELL}, tool_call_id="c1")
    ret = ToolReturnPart("execute_code", "RR_FINDINGS " + json.dumps(findings), tool_call_id="c1")
    return [
        ModelRequest(parts=[UserPromptPart("reflect")]),
        ModelResponse(parts=[call]),
        ModelRequest(parts=[ret]),
    ]


def test_first_turn_is_the_findings_cell() -> None:
    resp = heuristic_response([ModelRequest(parts=[UserPromptPart("reflect")])], _info(output=True))
    assert len(resp.parts) == 1 and isinstance(resp.parts[0], ToolCallPart)
    assert resp.parts[0].tool_name == "execute_code" and resp.parts[0].args == {"code": FINDINGS_CELL}


def test_text_output_when_no_output_tool() -> None:
    f = {"format": "ace", "n_steps": 1, "answer_matches": False, "final_answer": "1", "ground_truth": "2"}
    resp = heuristic_response(_history_with_findings(f), _info(output=False))
    assert isinstance(resp.parts[0], TextPart)
    draft = ReflectionDraft.model_validate_json(resp.parts[0].content)
    assert "does not match" in draft.error_identification


def test_without_execute_code_tool() -> None:
    resp = heuristic_response([ModelRequest(parts=[UserPromptPart("reflect")])], _info(True, tools=()))
    part = resp.parts[0]
    assert isinstance(part, ToolCallPart) and part.tool_name == "final_result"
    draft = ReflectionDraft.model_validate(part.args)
    assert "could not be inspected" in draft.reasoning and draft.extracted_learnings == []


@needs_tau
def test_real_tau_bench_failed_runs_name_the_divergence() -> None:
    data = json.loads(TAU.read_text())
    for run in [r for r in data if r["reward"] == 0][:6]:
        view = normalize(run)
        draft, h, _ = reflect(view, {"question": view["question"], "ground_truth": None, "feedback": None})
        f = findings_of(h)
        assert f["format"] == "tau-bench" and f["reward"] == 0.0 and f["answer_matches"] is None
        d = draft.diagnosis
        assert d is not None and d.tool and isinstance(d.step, int) and d.evidence == []
        assert d.tool in draft.error_identification and f"step {d.symptom_step}" in draft.error_identification
        if d.step != d.symptom_step:  # the root cause, traced back from the symptom, is said where it is
            assert f"the root cause is step {d.step}" in draft.root_cause_analysis
        assert len(h.outputs[0]) < 20_000
        again, _, _ = reflect(view, {"question": view["question"], "ground_truth": None, "feedback": None})
        assert again == draft


@needs_tau
def test_real_tau_bench_batch_line_is_bounded() -> None:
    view = normalize(json.loads(TAU.read_text()))
    draft, h, _ = reflect(view)
    f = findings_of(h)
    assert len(h.outputs[0]) < 20_000
    assert f["n_runs"] == 120 and f["n_failing_runs"] == 84
    assert sum(f["divergence_kinds"].values()) >= 80  # first divergences counted once per failing run
    assert "84 of 120 runs failed" in draft.error_identification
    assert 1 <= len(draft.extracted_learnings) <= 4


# ---- tau-bench: actions against actions, the agent's words verbatim ------------------------


def _tau(
    actions: list[dict[str, Any]],
    final: str,
    reward: float,
    expected: list[dict[str, Any]] | None = None,
    outputs: list[str] | None = None,
) -> dict[str, Any]:
    """A tau-bench-shaped run: the agent's calls (name, arguments as the JSON string the API sent, result)."""
    traj: list[dict[str, Any]] = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "Please cancel Z7GOZK, it costs $250."},
    ]
    for i, (name, args, result) in enumerate((a["name"], a["arguments"], a["result"]) for a in actions):
        traj.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{i}", "function": {"name": name, "arguments": args}}],
            }
        )
        traj.append({"role": "tool", "tool_call_id": f"c{i}", "name": name, "content": result})
    traj += [{"role": "assistant", "content": final}, {"role": "user", "content": "ok ###STOP###"}]
    expected = (
        expected
        if expected is not None
        else [
            {"name": "get_reservation_details", "kwargs": {"reservation_id": "Z7GOZK"}},
            {"name": "cancel_reservation", "kwargs": {"reservation_id": "Z7GOZK", "refund": 250}},
        ]
    )
    return {
        "task_id": 7,
        "trial": 0,
        "reward": reward,
        "traj": traj,
        "info": {
            "task": {
                "user_id": "u7",
                "instruction": "Cancel Z7GOZK",
                "actions": expected,
                "outputs": outputs or [],
            },
            "reward_info": {"reward": reward, "info": {"r_actions": reward}},
        },
    }


def test_tau_bench_saying_the_action_is_not_taking_it() -> None:
    # the agent writes the expected call as text but never makes it: its words must not count as the action
    final = "Done: cancel_reservation(refund=250, reservation_id=Z7GOZK)"
    run = _tau(
        [
            {
                "name": "get_reservation_details",
                "arguments": '{"reservation_id": "Z7GOZK"}',
                "result": '{"status": "active"}',
            }
        ],
        final,
        0.0,
    )
    view = normalize(run)
    draft, h, _ = reflect(view)
    f = findings_of(h)
    div = f["divergence"]
    assert (
        div["kind"] == "missing_action"
        and div["tool"] == "cancel_reservation"
        and f["answer_matches"] is None
    )
    assert draft.diagnosis is not None and draft.diagnosis.kind == "missing_action"
    assert "never made the expected cancel_reservation call" in draft.error_identification
    assert "The final answer" not in draft.error_identification  # nothing to quote: no text ground truth
    assert_evidence_from_findings(draft, f)


def test_tau_bench_right_action_in_other_words_matches() -> None:
    # same action: other key order, 250.0 for 250, a failed attempt first; the final text mentions none of it
    actions = [
        {
            "name": "cancel_reservation",
            "arguments": '{"reservation_id": "Z7G0ZK", "refund": 250}',
            "result": "Error: reservation not found",
        },
        {
            "name": "cancel_reservation",
            "arguments": '{"refund": 250.0, "reservation_id": "Z7GOZK"}',
            "result": '{"status": "cancelled"}',
        },
    ]
    draft, h, _ = reflect(normalize(_tau(actions, "All set, have a nice day!", 1.0)))
    f = findings_of(h)
    assert f["divergence"] is None and f["failing_calls"][0]["recovered"] is True
    assert draft.diagnosis is None and draft.error_identification.startswith("No error found")
    assert "the agent's actions match the expected actions" in draft.error_identification


def test_tau_bench_wrong_arguments_are_named_with_both_values() -> None:
    actions = [
        {
            "name": "cancel_reservation",
            "arguments": '{"reservation_id": "Z7GOZK", "refund": 25}',
            "result": '{"status": "cancelled"}',
        }
    ]
    draft, h, _ = reflect(normalize(_tau(actions, "Cancelled with a $25 refund.", 0.0)))
    f = findings_of(h)
    assert f["divergence"]["kind"] == "wrong_arguments"
    assert f["divergence"]["differences"] == [{"path": "refund", "expected": 250, "actual": 25}]
    d = draft.diagnosis
    assert d is not None and (d.kind, d.step, d.tool, d.argument, d.actual, d.expected) == (
        "wrong_arguments",
        2,
        "cancel_reservation",
        "refund",
        "25",
        "250",
    )
    assert "refund was 25 (expected 250)" in draft.error_identification
    assert "No cancel_reservation call failed before this one" in draft.root_cause_analysis
    assert any("`refund`" in x.learning and "25" in x.learning for x in draft.extracted_learnings)
    assert_evidence_from_findings(draft, f)


def test_tau_bench_nested_argument_differences_are_found_past_the_first_characters() -> None:
    # the differing value sorts last in the call (the old heuristic cut the call at 200 characters)
    pax = [{"first_name": f"P{i}", "last_name": "L" * 40, "dob": f"1990-01-{i + 10}"} for i in range(4)]
    wrong = [dict(p) for p in pax]
    wrong[3]["dob"] = "1999-09-09"
    expected = [
        {"name": "update_reservation_passengers", "kwargs": {"reservation_id": "R1", "passengers": pax}}
    ]
    actions = [
        {
            "name": "update_reservation_passengers",
            "arguments": json.dumps({"reservation_id": "R1", "passengers": wrong}),
            "result": "{}",
        }
    ]
    draft, h, _ = reflect(normalize(_tau(actions, "Updated.", 0.0, expected=expected)))
    d = draft.diagnosis
    assert d is not None and d.argument == "passengers[3].dob" and d.actual == "1999-09-09"
    assert "passengers[3].dob was 1999-09-09 (expected 1990-01-13)" in draft.error_identification


def test_tau_bench_extra_write_is_the_divergence_when_all_expected_were_made() -> None:
    actions = [
        {
            "name": "cancel_reservation",
            "arguments": '{"reservation_id": "Z7GOZK", "refund": 250}',
            "result": "{}",
        },
        {
            "name": "cancel_reservation",
            "arguments": '{"reservation_id": "OTHER1", "refund": 0}',
            "result": "{}",
        },
    ]
    draft, h, _ = reflect(normalize(_tau(actions, "Both cancelled.", 0.0)))
    d = draft.diagnosis
    assert d is not None and (d.kind, d.step, d.tool) == ("extra_action", 4, "cancel_reservation")
    assert "OTHER1" in draft.error_identification and "did not expect" in draft.error_identification


def test_tau_bench_expected_outputs_are_looked_for_in_what_the_agent_said() -> None:
    run = _tau([], "The total is 1,000 dollars.", 0.0, expected=[], outputs=["1000", "327"])
    draft, h, _ = reflect(normalize(run))
    f = findings_of(h)
    assert f["divergence"]["kind"] == "wrong_information" and f["divergence"]["expected"] == "327"
    assert "never told the user 327" in draft.error_identification


def test_answer_rules_compare_actions_by_name_and_arguments() -> None:
    from reflector.analysis.answers import compare_actions, missing_outputs

    expected = [
        {"name": "get_user_details", "arguments": {"user_id": "u"}},
        {"name": "book", "arguments": {"x": 1, "y": [1.0, {"b": 2, "a": 1}]}},
        {"name": "book", "arguments": {"x": 1, "y": [1, {"a": 1, "b": 2}]}},
    ]
    same = {"name": "book", "arguments": '{"y": [1, {"a": 1, "b": 2}], "x": 1.0}', "is_error": False}
    assert compare_actions([same, same], expected) == (True, [], [])
    # a multiset: one booking is not two; a failed call changed nothing; read-only calls do not count
    failed = {**same, "is_error": True}
    ok, missing, unexpected = compare_actions([same, failed], expected)
    assert ok is False and missing == ['book(x=1, y=[1,{"a":1,"b":2}])'] and unexpected == []
    assert compare_actions([same, same, {"name": "book", "arguments": {"x": 2}}], expected)[2] == [
        "book(x=2)"
    ]
    assert compare_actions([same], None) == (None, [], [])
    assert missing_outputs(["1000", "Mia"], ["It is 1,000.", "hello mia!"]) == []


def test_a_divergence_is_its_own_symptom_until_a_root_is_traced() -> None:
    """`from_divergence` (the facts cell's finding, which the budget fallback reports as it is) places the
    symptom where the divergence is; a root cause traced back from it moves only `step`."""
    from reflector.analysis.diagnosis import from_divergence

    d = from_divergence({"kind": "wrong_arguments", "step": 7, "tool": "book", "argument": "x"}, [2])
    assert d is not None and (d.step, d.symptom_step) == (7, 7)
    unplaced = from_divergence({"kind": "wrong_information", "step": None}, [2])
    assert unplaced is not None and (unplaced.step, unplaced.symptom_step) == (None, None)
