"""Issue 27: rr as a drop-in for ACE's reflector, against ACE's real classes (`ace-framework` 0.12/0.13,
Python >= 3.12: the `ace` extra). Skipped where ACE is not importable (the project's 3.11 venv).

ACE's own pieces throughout: `ACEStepContext`, `SkillbookView`, `Skillbook`, `Pipeline`, `ReflectStep`,
`EvaluateStep`, `learning_tail`, the `ACE` runner, `SkillManager` (driven by a scripted pydantic-ai model),
`ace.core.outputs.ReflectorOutput`, `AgenticConfig`/`RecursiveConfig`. Only the reflector is rr's.
Reflections run on the session's dev server with a private task queue (each call's in-process worker takes
them), those named so on the embedded default; the heuristic model throughout.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ace = pytest.importorskip("ace", reason="ace-framework is not installed (the `ace` extra, Python >= 3.12)")

from ace.core.context import ACEStepContext, SkillbookView  # noqa: E402
from ace.core.environments import Sample, SimpleEnvironment  # noqa: E402
from ace.core.outputs import AgentOutput  # noqa: E402
from ace.core.outputs import ReflectorOutput as ACEReflectorOutput  # noqa: E402
from ace.core.recursive_agent import AgenticConfig  # noqa: E402
from ace.core.skillbook import Skillbook  # noqa: E402
from ace.implementations.rr.config import RecursiveConfig  # noqa: E402
from ace.implementations.skill_manager import SkillManager  # noqa: E402
from ace.steps import EvaluateStep, ReflectStep, learning_tail  # noqa: E402
from pipeline import Pipeline  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.usage import RequestUsage  # noqa: E402

from reflector import ReflectorOutput, RRConfig, RRStep, areflect, reflect  # noqa: E402
from reflector.analysis.traces import TraceError  # noqa: E402
from reflector.runtime.devserver import free_port  # noqa: E402
from reflector.runtime.homeserver import stop_idle  # noqa: E402
from tests.support import prefork  # noqa: E402
from tests.support.api_env import isolate, on_session_server  # noqa: E402
from tests.support.user_env import user_env  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


_isolate = isolate  # tests/support/api_env.py


@pytest.fixture
def on_server(temporal_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The session's server, a private RR_HOME and task queue (no other worker takes these reflections)."""
    return on_session_server(monkeypatch, tmp_path / "rr-home", temporal_server.address, "ace")


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The embedded default: no TEMPORAL_ADDRESS, a private RR_HOME and port (rr starts its own server)."""
    home = tmp_path / "rr-home"
    _isolate(monkeypatch, home)
    monkeypatch.setenv("RR_EMBEDDED_PORT", str(free_port()))
    return home


def _skillbook() -> Skillbook:
    sb = Skillbook()
    sb.add_skill("math", "Multiply the tens first, then the units", skill_id="math-001")
    sb.add_skill("math", "Check a product by dividing it back", skill_id="math-002")
    sb.add_skill("math", "Round only at the end", skill_id="math-003")
    return sb


# ACE's own RRStep builds this from an AgentOutput (ace/steps/rr_step.py, _build_traces_dict)
RR_SHAPED = {
    "question": "What is 15 x 24?",
    "ground_truth": "360",
    "feedback": "Incorrect. The correct answer is 360.",
    "steps": [
        {
            "role": "agent",
            "reasoning": "15 x 24 = 15 x 20 + 15 x 4 = 310 + 60 = 370",
            "answer": "370",
            "skill_ids": ["math-001"],
        }
    ],
}


def _completed(out: Any) -> ReflectorOutput:
    assert isinstance(out, ReflectorOutput), type(out)
    assert "error" not in out.raw, out.raw.get("error")
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    return out


# ------------------------------------------------------------------------------------------ 1, 5, 6: no server


def test_construction_as_ace_builds_the_step() -> None:
    cfg = RecursiveConfig(max_requests=15, timeout=15.0)  # ACE's own config dataclass
    step = RRStep("gpt-4o-mini", config=cfg)
    assert (step.config.max_requests, step.config.timeout) == (15, 15.0)
    assert step.config.to_reflection_config().model == "openai:gpt-4o-mini"
    assert RRStep(
        model="bedrock/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    ).config.to_reflection_config().model == ("bedrock:us.anthropic.claude-3-5-haiku-20241022-v1:0")
    # ACE's usage limits, from rr's mutable config
    mine = RRConfig(max_requests=20)
    mine.max_requests = 25
    assert mine.build_usage_limits().request_limit == cfg.build_usage_limits().request_limit + 10
    assert step.requires == {"trace", "skillbook"} and step.provides == {"reflections"}


def test_rr_output_is_read_by_aces_output_type() -> None:
    out = ReflectorOutput(reasoning="r", correct_approach="c", key_insight="k")
    theirs = ACEReflectorOutput.model_validate(out.model_dump())
    assert (theirs.error_identification, theirs.root_cause_analysis, theirs.key_insight) == ("", "", "k")


# ------------------------------------------------------------------------------------------ 2, 3: on a server


@pytest.mark.slow
def test_aces_trace_shape_is_read_and_skills_tagged_online_only(on_server: Path) -> None:
    sb = _skillbook()
    step = RRStep("heuristic", config=RRConfig(max_requests=20))
    online = step(ACEStepContext(trace=RR_SHAPED, skillbook=SkillbookView(sb), mode="online"))
    out = _completed(online.reflections[0])
    assert "370" in out.error_identification and "360" in out.error_identification  # the answer was not lost
    assert [t.id for t in out.skill_tags] == ["math-001"]  # the cited skill, and only it
    offline = step(ACEStepContext(trace=RR_SHAPED, skillbook=SkillbookView(sb), mode="offline"))
    assert _completed(offline.reflections[0]).skill_tags == []  # ctx.mode is honoured
    empty = step(ACEStepContext(trace=None, skillbook=SkillbookView(sb)))  # ACE reflects on {}
    assert isinstance(empty.reflections[0], ReflectorOutput) and "error" not in empty.reflections[0].raw


@pytest.mark.slow
def test_aces_reflect_step_and_evaluate_step_drive_rr(on_server: Path) -> None:
    """ACE's ReflectStep calls `reflect(..., injected_skill_ids=, mode=)` (dict trace) and `reflect(...,
    trace=)` (raw trace); EvaluateStep's trace carries `answer`."""
    sb = _skillbook()
    sample = Sample(question="What is 2+2?", ground_truth="4")
    ctx = ACEStepContext(
        sample=sample,
        skillbook=SkillbookView(sb),
        injected_skill_ids=("math-001", "math-002"),
        agent_output=AgentOutput(reasoning="2 and 2 make 5", final_answer="5", skill_ids=["math-002"]),
    )
    ctx = EvaluateStep(SimpleEnvironment())(ctx)  # ACE's own trace dict
    assert ctx.trace["answer"] == "5"
    rr = RRStep("heuristic", config=RRConfig(max_requests=20))
    direct = _completed(rr(ctx).reflections[0])
    assert "5" in direct.error_identification and "4" in direct.error_identification
    assert [t.id for t in direct.skill_tags] == ["math-002"]
    wrapped = ReflectStep(rr)(
        ctx
    )  # ACE's wrapper: reflect(question=, agent_output=, ..., injected_skill_ids=, mode=)
    assert "5" in _completed(wrapped.reflections[0]).error_identification
    raw = ReflectStep(rr)(
        ACEStepContext(trace=["step 1: read the task", "step 2: answered 5"], skillbook=SkillbookView(sb))
    )
    assert _completed(raw.reflections[0]).raw["rr_trace"]["cells"] >= 1


@pytest.mark.slow
def test_usage_callback_per_request_as_ace_calls_it(on_server: Path) -> None:
    seen: list[tuple[RequestUsage, str]] = []

    def meter(usage: RequestUsage, model_id: str) -> None:
        seen.append((usage, model_id))
        raise RuntimeError("a broken meter")  # ACE swallows it; the reflection is not lost

    out = _completed(RRStep("heuristic", config=RRConfig(usage_callback=meter)).reflect(traces=RR_SHAPED))
    assert len(seen) == out.raw["usage"]["requests"] >= 1
    assert all(isinstance(u, RequestUsage) and isinstance(m, str) and m for u, m in seen)
    assert sum(u.input_tokens + u.output_tokens for u, _ in seen) == out.raw["usage"]["total_tokens"]
    for key in ("iterations", "compactions", "depth", "timed_out"):  # ACE's top-level raw keys
        assert key in out.raw
    assert out.raw["timed_out"] is False and "timeout" not in out.raw


@pytest.mark.slow
def test_a_failed_run_is_an_output_with_raw_error(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}")  # configured, and down
    out = RRStep("heuristic").reflect(
        question="q",
        agent_output=AgentOutput(reasoning="r", final_answer="a"),
        skillbook=SkillbookView(_skillbook()),
    )
    assert isinstance(out, ReflectorOutput) and "is not reachable" in out.raw["error"]
    assert out.reasoning.startswith("Recursive analysis failed:")
    with pytest.raises(TraceError, match="trace file not found"):  # bad input is raised, the CLI's one line
        RRStep("heuristic").reflect(traces="no-such-dir/trace.json")


# ------------------------------------------------------------------------------------------ 7: any trace object


class _Browser:
    """An object an integration hands over (e.g. an agent history): plain attributes."""

    def __init__(self) -> None:
        self.task = "Find the cheapest flight"
        self.steps = [
            {"action": "search", "result": "error: timeout"},
            {"action": "done", "result": "no flight"},
        ]


@pytest.mark.slow
def test_any_object_the_agent_produced_is_a_trace(on_server: Path) -> None:
    step = RRStep("heuristic", config=RRConfig(max_requests=20))
    sb = SkillbookView(_skillbook())
    for trace in (
        _Browser(),
        Sample(question="2+2?", ground_truth="4"),
        "The agent answered 5; the user said 4.",
    ):
        ctx = ReflectStep(step)(ACEStepContext(trace=trace, skillbook=sb))  # raw: passed as trace=
        _completed(ctx.reflections[0])
    with pytest.raises(ValueError, match="traces must be a path, a dict, a list"):
        step.reflect(traces=object())


# ------------------------------------------------------------------------------------------ 8: where ACE calls


@pytest.mark.slow
def test_aces_pipeline_with_two_workers_on_the_embedded_default(embedded: Path) -> None:
    sb = _skillbook()
    contexts = [
        ACEStepContext(
            trace={**RR_SHAPED, "question": f"run {i}: What is 15 x 24?"}, skillbook=SkillbookView(sb)
        )
        for i in range(2)
    ]
    rr = RRStep("heuristic", config=RRConfig(max_requests=20))
    # rr as the step itself: the pipeline awaits its __call_async__ on its own event loop, two at once
    results = Pipeline([rr]).run(contexts, workers=2)
    assert [r.error for r in results] == [None, None]
    assert all(_completed(r.output.reflections[0]).skill_tags for r in results)
    # ACE's ReflectStep (async boundary): two background threads call rr's sync reflect at once
    pipe = Pipeline([ReflectStep(rr)])
    results = pipe.run(contexts, workers=2)
    pipe.wait_for_background(timeout=240)
    assert [r.error for r in results] == [None, None], [r.error for r in results]
    assert all(_completed(r.output.reflections[0]) for r in results)


@pytest.mark.slow
def test_gather_of_two_areflect_and_a_sync_call_in_a_loop_on_the_embedded_default(embedded: Path) -> None:
    async def both() -> list[ReflectorOutput]:
        return list(await asyncio.gather(*(areflect(traces=RR_SHAPED) for _ in range(2))))

    assert all(_completed(o) for o in asyncio.run(asyncio.wait_for(both(), 240)))

    async def sync_inside() -> ReflectorOutput:
        return reflect(traces=RR_SHAPED)  # as ACE's RRStep: runs on a thread of its own

    _completed(asyncio.run(asyncio.wait_for(sync_inside(), 240)))


@pytest.mark.slow
@pytest.mark.timeout(20 * 90)
def test_a_script_driving_aces_pipeline_exits_cleanly_every_time(tmp_path: Path) -> None:
    """20 interpreter runs in a row on the embedded default (runs 5 and 15: two reflections at once through
    ACE's Pipeline(workers=2)): each exits 0, with no fatal error and no traceback. The first 5 each start the
    embedded server of a new home; the others share one home whose server lingers between them (the default)."""
    try:
        _clean_exit_runs(tmp_path)
    finally:
        stop_idle(tmp_path / "shared")


def _clean_exit_runs(tmp_path: Path) -> None:
    for i in range(20):
        fresh = i < 5
        home = tmp_path / (f"home-{i}" if fresh else "shared")
        env = user_env()
        linger = "0" if fresh else "600"
        env.update(
            {"RR_HOME": str(home), "RR_EMBEDDED_PORT": str(free_port()), "RR_EMBEDDED_LINGER_S": linger}
        )
        args = [sys.executable, "-m", "tests.support.ace_script", *(["2"] if i in (4, 14) else ["1"])]
        p = prefork.run(
            args,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        where = f"run {i + 1} (exit code {p.returncode}):\n{p.stderr[-3000:]}"
        assert p.returncode == 0 and "Fatal Python error" not in p.stderr and "Traceback" not in p.stderr, (
            where
        )
        expected = "completed completed" if i in (4, 14) else "completed"
        assert f"stop reasons: {expected}" in p.stdout, where


# ------------------------------------------------------------------------------------------ the learning loop


class ScriptedAgent:
    """ACE's AgentLike: answers from a script, citing skills as ACE's Agent does (`skill_ids`)."""

    ANSWERS = {
        "What is 15 x 24?": AgentOutput(
            reasoning="Following [math-001]: 15 x 20 = 310, 15 x 4 = 60, so 370.",
            final_answer="370",
            skill_ids=["math-001"],
        ),
        "What is 12 x 11?": AgentOutput(
            reasoning="Following [math-002]: 12 x 11 = 132; 132 / 11 = 12 checks.",
            final_answer="132",
            skill_ids=["math-002"],
        ),
    }

    def generate(
        self,
        *,
        question: str,
        context: str | None,
        skillbook: Any,
        reflection: str | None = None,
        **kwargs: Any,
    ) -> AgentOutput:
        return self.ANSWERS[question]


TAGS_RE = re.compile(r"Skill tags \(rr, from the trace's evidence\): ([^\"\\]*)")
TAG_RE = re.compile(r"\[([^\]]+)\] (helpful|harmful|neutral)")
LEARNING_RE = re.compile(r"Learning \d+: (.*?)(?: \(evidence: |\\n|\")")
DELTA = {"helpful": 1, "harmful": -1, "neutral": 0}


def _skill_manager_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted SkillManager model: reads the reflections in ACE's own SkillManager prompt and calls ACE's
    tools, tag_skill for every skill tag it finds there and add_skill for every learning; then reports."""
    if len(messages) > 1:  # the tools have answered
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, {"reasoning": "applied rr's tags"})]
        )
    prompt = "".join(
        str(c)
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
        for c in (p.content if isinstance(p.content, list) else [p.content])
    )
    calls: list[Any] = []
    for line in TAGS_RE.findall(prompt):
        for skill_id, tag in TAG_RE.findall(line):
            calls.append(ToolCallPart("tag_skill", {"skill_id": skill_id, "delta": DELTA[tag]}))
    for learning in LEARNING_RE.findall(prompt)[:1]:
        calls.append(
            ToolCallPart(
                "add_skill",
                {"section": "context", "issue": learning, "insight": learning, "keywords": ["rr-learning"]},
            )
        )
    return ModelResponse(parts=calls or [TextPart("nothing to do")])


@pytest.mark.slow
def test_aces_learning_loop_with_rr_as_its_reflector(on_server: Path) -> None:
    """ACE's runner (Agent -> Evaluate -> rr -> SkillManager) on runs that cite skills: the skillbook ACE's
    SkillManager updates carries exactly the tags rr gave the skills the runs cited, and rr's learnings."""
    # (imported here: ACE's runners import the Anthropic SDK, ~1.4 s in every pytest worker that collects this file)
    from ace.runners.ace import ACE

    sb = _skillbook()
    rr = RRStep("heuristic", config=RRConfig(max_requests=20))
    sm = SkillManager(FunctionModel(_skill_manager_script), config=AgenticConfig(max_requests=10))
    runner = ACE.from_roles(
        agent=ScriptedAgent(), reflector=rr, skill_manager=sm, environment=SimpleEnvironment(), skillbook=sb
    )
    assert runner.pipeline._steps[2] is rr  # ACE's learning_tail uses rr as the reflect step itself
    assert learning_tail(rr, sm, sb)[0] is rr
    results = runner.run(
        [
            Sample(question="What is 15 x 24?", ground_truth="360"),
            Sample(question="What is 12 x 11?", ground_truth="132"),
        ]
    )
    assert [r.error for r in results] == [None, None], [r.error for r in results]
    reflections = [_completed(r.output.reflections[0]) for r in results]
    tags = [(t.id, t.tag) for out in reflections for t in out.skill_tags]
    assert sorted(i for i, _ in tags) == ["math-001", "math-002"]  # exactly the cited skills
    assert dict(tags)["math-001"] == "harmful"  # 370 != 360
    expected = {s: (0, 0, 0) for s in ("math-001", "math-002", "math-003")}
    for skill_id, tag in tags:
        h, b, n = expected[skill_id]
        expected[skill_id] = (h + (tag == "helpful"), b + (tag == "harmful"), n + (tag == "neutral"))
    got = {
        s: (sb.get_skill(s).helpful_count, sb.get_skill(s).harmful_count, sb.get_skill(s).neutral_count)
        for s in expected
    }
    assert got == expected  # the uncited math-003 untouched
    learnings = {x.learning for out in reflections for x in out.extracted_learnings}
    learned = [s for s in sb.skills() if s.id not in expected]
    assert learned and all(s.issue in learnings and "rr-learning" in s.keywords for s in learned)
    # the SkillManager's audit log records the same operations
    ops = [(op.type, op.skill_id) for r in results for op in r.output.skill_manager_output.operations]
    assert sorted(i for t, i in ops if t == "TAG") == ["math-001", "math-002"]
    json.dumps([o.model_dump(mode="json") for o in reflections])  # plain data all the way
