"""The one actor rule every adapter applies (reflector/analysis/traces/agents.py, issue 28), on every dialect; a
Magentic-One style trace that names its agents only in `role`; and attribution that follows the evidence
when the agents are renamed and reordered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.toolkit import actors, root_cause, suspect_mistake, timeline
from reflector.analysis.traces import load_normalized, normalize
from reflector.analysis.traces.agents import agent_of, normalise_agent
from reflector.analysis.traces.lazy import Steps
from reflector.contract import Diagnosis, ReflectionDraft
from tests.support.lazy import lazy_view
from tests.support.magentic import AGENTS, MAGENTIC_ONE, MISTAKE, renamed, swapped_reports


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("Orchestrator (thought)", ("Orchestrator", None)),
        ("Orchestrator (-> WebSurfer)", ("Orchestrator", "WebSurfer")),
        ("Orchestrator (→ FileSurfer)", ("Orchestrator", "FileSurfer")),
        ("Orchestrator -> Assistant", ("Orchestrator", "Assistant")),
        ("Lead (to Coder)", ("Lead", "Coder")),
        ("Orchestrator (final answer)", ("Orchestrator", None)),
        ("  WebSurfer  ", ("WebSurfer", None)),
        ("", (None, None)),
        (None, (None, None)),
    ],
)
def test_agent_names_are_normalised(value: Any, want: tuple[str | None, str | None]) -> None:
    assert normalise_agent(value) == want


@pytest.mark.parametrize(
    ("record", "want"),
    [
        ({"role": "user", "name": "Coder", "content": "x"}, "Coder"),  # AutoGen / AG2 group chat, Who&When
        ({"role": "WebSurfer", "content": "x"}, "WebSurfer"),  # Magentic-One
        ({"role": "assistant", "content": "x"}, None),  # a chat role names no one
        ({"role": "developer", "content": "x"}, None),
        ({"sender": "planner", "content": "x"}, "planner"),  # AutoGen messages
        ({"sender": "user", "content": "x"}, None),
        (
            {"source": "writer_agent", "content": "x", "type": "TextMessage"},
            "writer_agent",
        ),  # AutoGen AgentChat
        ({"agent": {"name": "Triage"}, "type": "message_output_item"}, "Triage"),  # OpenAI Agents SDK
        ({"agent": "Senior Researcher", "raw": "x"}, "Senior Researcher"),  # CrewAI task output
        ({"agent_role": "Writer", "raw": "x"}, "Writer"),  # CrewAI step
        ({"role": "assistant", "metadata": {"langgraph_node": "supervisor"}}, "supervisor"),  # LangGraph
        ({"name": "Orchestrator (thought)", "role": "assistant"}, "Orchestrator"),
    ],
)
def test_the_rule_finds_the_most_specific_identity(record: dict[str, Any], want: str | None) -> None:
    assert agent_of(record)[0] == want


def test_every_adapter_applies_the_rule() -> None:
    msgs = normalize(
        [
            {"role": "user", "content": "q"},
            {"role": "Planner (-> Coder)", "content": "do it"},
            {
                "role": "assistant",
                "name": "Coder",
                "content": "done",
                "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "ls", "content": "a b"},
        ]
    )
    assert [(s["role"], s["actor"], s["addressee"]) for s in msgs["steps"]] == [
        ("user", None, None),
        ("assistant", "Planner", "Coder"),
        ("assistant", "Coder", None),
        ("tool", None, None),
    ]
    spans = normalize(
        [
            {
                "name": "plan",
                "trace_id": "t",
                "span_id": "1",
                "start_time": "1",
                "attributes": {
                    "openinference.span.kind": "AGENT",
                    "gen_ai.agent.name": "Planner",
                    "input.value": "q",
                },
            }
        ]
    )
    assert spans["format"] == "otel" and spans["steps"][0]["actor"] == "Planner"
    ace = normalize({"question": "q", "steps": [{"thought": "x", "agent_name": "Critic"}]})
    assert ace["steps"][0]["actor"] == "Critic"


# -- a Magentic-One style trace ----------------------------------------------------------------------
def test_magentic_one_roles_name_the_agents() -> None:
    v = normalize(MAGENTIC_ONE)
    assert v["steps"][0]["role"] == "user" and v["steps"][0]["actor"] is None  # the human's task
    found = actors(v)
    assert [(a["actor"], a["n_steps"]) for a in found] == [
        (None, 1),
        ("Orchestrator", 7),
        ("WebSurfer", 2),
        ("FileSurfer", 1),
        ("Assistant", 1),
    ]
    assert found[1]["addressees"] == {"WebSurfer": 2, "FileSurfer": 1, "Assistant": 1}
    assert {s["actor"] for s in v["steps"][1:]} == set(AGENTS)
    assert all(s["role"] == "assistant" for s in v["steps"][1:])  # an agent's turn, whatever the role said
    assert [t["step"] for t in timeline(v, actor="WebSurfer")] == [3, 6]


def test_magentic_one_root_cause_is_the_misread_report_and_the_symptom_the_answer() -> None:
    r = root_cause(normalize(MAGENTIC_ONE))
    assert r is not None and (r["root"]["actor"], r["root"]["step"]) == MISTAKE
    assert r["root"]["rule"] == "answer_origin" and "45,902" in r["root"]["reason"]
    assert r["symptom"]["step"] == len(MAGENTIC_ONE["history"]) - 1 and not r["same"]


RENAMES = [
    {"Orchestrator": "Lead", "WebSurfer": "Navigator", "FileSurfer": "Reader", "Assistant": "Writer"},
    # names swapped among the agents: the name that was innocent is now the one that misreads
    {
        "Orchestrator": "WebSurfer",
        "WebSurfer": "Assistant",
        "FileSurfer": "Orchestrator",
        "Assistant": "FileSurfer",
    },
]


@pytest.mark.parametrize("mapping", RENAMES)
def test_attribution_follows_the_evidence_when_agents_are_renamed(mapping: dict[str, str]) -> None:
    r = root_cause(normalize(renamed(MAGENTIC_ONE, mapping)))
    assert r is not None and (r["root"]["actor"], r["root"]["step"]) == (mapping[MISTAKE[0]], MISTAKE[1])


@pytest.mark.parametrize("mapping", [{a: a for a in AGENTS}, *RENAMES])
def test_attribution_follows_the_evidence_when_agents_are_reordered(mapping: dict[str, str]) -> None:
    # the misreading report is now FileSurfer's, at another step: the attribution moves with it
    trace = renamed(swapped_reports(MAGENTIC_ONE), mapping)
    v = normalize(trace)
    r = root_cause(v)
    assert r is not None and r["root"]["actor"] == mapping["FileSurfer"]
    assert v["steps"][r["root"]["step"]]["actor"] == mapping["FileSurfer"] and r["root"]["step"] == 6
    g = suspect_mistake(v)
    assert g is not None and (g["actor"], g["step"]) == (r["root"]["actor"], r["root"]["step"])


def test_without_evidence_there_is_no_agent_guess() -> None:
    # the answer's value appears nowhere before the final answer: no rule places an earlier agent
    trace = json.loads(json.dumps(MAGENTIC_ONE))
    trace["history"][6]["content"] = "I clicked the census link. The page did not load."
    r = root_cause(normalize(trace))
    assert r is not None and r["root"]["step"] == len(trace["history"]) - 1  # the answer itself states it
    assert r["root"]["actor"] == "Assistant"


# -- lazily read -------------------------------------------------------------------------------------
_lazy = lazy_view  # tests/support/lazy.py


def test_role_named_agents_read_lazily_are_the_same(tmp_path: Path) -> None:
    path = tmp_path / "m1.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in MAGENTIC_ONE["history"]) + "\n", encoding="utf-8")
    whole = load_normalized(path)
    for view in _lazy(path):
        assert type(view["steps"]) is Steps
        assert actors(view) == actors(whole)
        assert [view["steps"][i]["addressee"] for i in range(len(view["steps"]))] == [
            s["addressee"] for s in whole["steps"]
        ]


# -- the contract -------------------------------------------------------------------------------------
def test_old_persisted_diagnoses_still_load() -> None:
    old = {
        "kind": "wrong_arguments",
        "step": 28,
        "actor": None,
        "tool": "book_reservation",
        "argument": "payment_methods[1].amount",
        "actual": "55",
        "expected": "5",
        "evidence": [3],
        "confidence": 0.9,
        "summary": "s",
    }
    d = Diagnosis.model_validate(old)
    assert d.step == 28 and d.symptom_step is None
    draft = ReflectionDraft.model_validate(
        {
            "reasoning": "r",
            "error_identification": "e",
            "root_cause_analysis": "c",
            "correct_approach": "a",
            "key_insight": "k",
            "diagnosis": old,
        }
    )
    assert draft.diagnosis == d and "symptom_step" in draft.model_dump(mode="json")["diagnosis"]


def test_a_closing_message_after_the_final_answer_is_not_the_answer() -> None:
    trace = json.loads(json.dumps(MAGENTIC_ONE))
    trace["history"].append(
        {"role": "Orchestrator (termination condition)", "content": "The request is satisfied."}
    )
    v = normalize(trace)
    assert v["steps"][-1]["actor"] == "Orchestrator"
    r = root_cause(v)
    assert r is not None and (r["root"]["actor"], r["root"]["step"]) == MISTAKE
    assert r["symptom"]["step"] == len(trace["history"]) - 2  # the step that states "FINAL ANSWER: 45,902"
