"""The Python API (`reflector.client.api`): `reflect` / `areflect` on every kind of trace, `RRStep` as a pipeline step
and as a reflector, `RRConfig`'s seed defaults and their mapping, and the errors a caller gets.

Reflections run on the session's dev server (TEMPORAL_ADDRESS set, a private task queue: each call runs
its in-process worker), one on the embedded default; the heuristic model throughout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from reflector import ReflectorOutput, RRConfig, RRStep, areflect, reflect
from reflector.analysis.ledger import UsageSummary
from reflector.analysis.traces import TraceError
from reflector.client import ReflectError
from reflector.client.ace import _with_reflections
from reflector.client.api_traces import IN_MEMORY, _Answer, _place_answer, _skillbook_text, _trace_file
from reflector.contract import ReflectionConfig
from reflector.runtime.devserver import free_port, is_reachable
from reflector.runtime.settings import Settings
from tests.support import prefork
from tests.support.api_env import isolate, on_session_server
from tests.support.fixtures import ACE_TRACE, write_trace

REPO_ROOT = Path(__file__).resolve().parents[2]
ANSWER = "The school receives 398 pencils."
QUESTION = "A school orders 17 boxes of 24 pencils. How many pencils does it receive?"
MESSAGES = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "17 * 24 = 340 + 58 = 398."},
]


@dataclasses.dataclass(frozen=True)
class StepContext:
    """An ACE-like frozen step context (`ACEStepContext` has `replace`)."""

    trace: object = None
    skillbook: object = None
    agent_output: object = None
    reflections: tuple[ReflectorOutput, ...] = ()

    def replace(self, **changes: Any) -> StepContext:
        return dataclasses.replace(self, **changes)


_isolate = isolate  # tests/support/api_env.py


@pytest.fixture
def on_server(temporal_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The session's server, a private RR_HOME and task queue (no other worker takes these reflections)."""
    return on_session_server(monkeypatch, tmp_path / "rr-home", temporal_server.address, "api")


def _completed(out: ReflectorOutput) -> ReflectorOutput:
    assert isinstance(out, ReflectorOutput)
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    assert out.raw["rr_trace"]["cells"] >= 1
    return out


def _judged(out: ReflectorOutput, answer: str = ANSWER) -> None:
    """The reflection compared `answer` (the agent's final answer) with the ground truth 408."""
    _completed(out)
    assert out.raw["answer_correct"] is False
    assert answer in out.error_identification and "408" in out.error_identification


# ------------------------------------------------------------------------------------------ no server


def test_import_of_reflector_stays_light() -> None:
    code = (
        "import sys, reflector; heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & "
        "{'temporalio', 'pydantic_ai', 'pydantic'}); print(heavy()); "
        "from reflector import RRConfig, RRStep, reflect, areflect, ReflectorOutput; print(heavy())"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    plain, api = p.stdout.splitlines()
    assert (
        plain == "[]"
    )  # `import reflector` (the sandbox host's `reflector.analysis.traces` too) imports none of them
    assert api == "['pydantic']"  # the API's names: its types, not the Temporal client or pydantic-ai


def test_rrconfig_has_the_seed_defaults_and_maps_onto_the_durable_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _isolate(monkeypatch, tmp_path)
    cfg = RRConfig()
    seed = {
        "max_tokens": 500_000,
        "max_requests": 50,
        "context_window": 128_000,
        "max_depth": 2,
        "child_budget_fraction": 0.5,
        "max_compactions": 3,
        "microcompact_keep_recent": 3,
        "timeout": 60,
        "max_output_chars": 50_000,
        "usage_callback": None,
    }
    assert {k: getattr(cfg, k) for k in seed} == seed
    durable = cfg.to_reflection_config()
    assert durable == ReflectionConfig(
        model="heuristic",
        max_tokens=500_000,
        max_requests=50,
        context_window=128_000,
        max_depth=2,
        child_budget_fraction=0.5,
        max_compactions=3,
        microcompact_keep_recent=3,
        cell_timeout_s=60,
        max_output_chars=50_000,
    )
    mine = RRConfig(
        model="openai:gpt-4o", model_settings={"temperature": 0}, max_requests=7, timeout=5, max_depth=0
    ).to_reflection_config()
    assert (mine.model, mine.model_settings, mine.max_requests, mine.cell_timeout_s, mine.max_depth) == (
        "openai:gpt-4o",
        {"temperature": 0, "cache": "5m"},
        7,
        5.0,
        0,
    )  # cache_prompts: pydantic-ai's `cache`
    assert RRConfig(model="openai:gpt-4o", cache_prompts=False).to_reflection_config().model_settings == {
        "temperature": 0.0,
        "cache": False,
    }
    monkeypatch.setenv("RR_MODEL", "test")  # model None: the settings' RR_MODEL
    assert RRConfig().to_reflection_config().model == "test"
    assert RRConfig().to_reflection_config(Settings.from_env()).model == "test"
    cfg.max_tokens = 1  # mutable like ACE's RRConfig dataclass, each assignment validated
    assert cfg.to_reflection_config().max_tokens == 1
    with pytest.raises(ValidationError, match="max_requests"):
        cfg.max_requests = 0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1 (got 0)"),
        ({"timeout": 0}, "timeout: Input should be greater than 0 (got 0.0)"),
        ({"child_budget_fraction": 1.5}, "child_budget_fraction: Input should be less than or equal to 1"),
        ({"max_output_chars": 10}, "max_output_chars"),
        ({"max_requests": "many"}, "max_requests"),
        ({"max_tokenz": 5}, "max_tokenz"),
    ],
)
def test_rrconfig_refuses_bad_values_with_the_field_named(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as e:
        RRConfig(**kwargs)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_agent_output_is_put_where_the_readers_find_the_final_answer() -> None:
    a = _Answer(ANSWER, reasoning="17 * 24 = 398", skill_ids=("s-1",))
    ace = {k: v for k, v in ACE_TRACE.items() if k != "final_answer"}
    assert _place_answer(ace, a) == {
        **ace,
        "final_answer": ANSWER,
        "reasoning": "17 * 24 = 398",
        "skill_ids": ["s-1"],
    }
    assert _place_answer({**ace, "final_answer": f" {ANSWER} "}, a) == {**ace, "final_answer": f" {ANSWER} "}
    with pytest.raises(ValueError, match="differs from the trace's final_answer"):
        _place_answer(ACE_TRACE, a)  # its final answer is "398"
    assert _place_answer(MESSAGES, a) == {"messages": MESSAGES, "final_answer": ANSWER}
    assert _place_answer({"messages": MESSAGES}, a) == {"messages": MESSAGES, "final_answer": ANSWER}
    steps = [{"thought": "17 boxes of 24"}, {"thought": "so 398"}]
    assert _place_answer(steps, a) == {"steps": steps, "final_answer": ANSWER}
    tau = {"task_id": 1, "traj": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "bye"}]}
    assert _place_answer(tau, _Answer("bye")) is tau  # it already ends with that answer
    with pytest.raises(ValueError, match="cannot be placed in a tau-bench trace"):
        _place_answer(tau, a)
    with pytest.raises(ValueError, match="cannot be placed in a batch of 2 runs"):
        _place_answer([ACE_TRACE, ACE_TRACE], a)
    assert _place_answer(ace, None) is ace


def test_the_trace_file_a_reflection_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(monkeypatch, tmp_path / "home")
    settings = Settings.from_env()
    ace = {k: v for k, v in ACE_TRACE.items() if k != "final_answer"}
    no_answer = write_trace(tmp_path, ace, "ace.json")

    def read(traces: Any, answer: _Answer | None, s: Settings = settings) -> tuple[str, str, bool]:
        with _trace_file(traces, answer, "q", "408", None, s) as (path, name):
            return path.read_text(), name, path.parent == s.home / "tmp"

    text, name, temporary = read(no_answer, None)  # a file as it is
    assert (json.loads(text), name, temporary) == (ace, "ace.json", False)
    text, name, temporary = read(str(no_answer), _Answer(ANSWER))  # with the answer placed: a temporary copy
    assert (json.loads(text), name, temporary) == ({**ace, "final_answer": ANSWER}, IN_MEMORY, True)
    text, name, temporary = read(write_trace(tmp_path), _Answer("398"))  # it ends with that answer already
    assert (name, temporary) == ("trace.json", False)
    jsonl = "\n".join(json.dumps(m) for m in MESSAGES)
    assert read(jsonl, None) == (jsonl, IN_MEMORY, True)  # text is stored verbatim
    text, _, _ = read(jsonl, _Answer(ANSWER))
    assert json.loads(text) == {"messages": MESSAGES, "final_answer": ANSWER}
    text, _, _ = read(None, _Answer(ANSWER, reasoning="17 * 24 = 398"))
    assert json.loads(text) == {
        "question": "q",
        "ground_truth": "408",
        "agent_output": {"reasoning": "17 * 24 = 398", "final_answer": ANSWER, "skill_ids": []},
    }
    small = dataclasses.replace(settings, lazy_trace_bytes=10)
    with pytest.raises(ValueError, match="not rewritten"):  # a large file is never read whole to place it
        read(no_answer, _Answer(ANSWER), small)
    assert not list((settings.home / "tmp").iterdir())  # every temporary file is gone


def test_the_context_a_step_returns() -> None:
    out = ReflectorOutput(
        reasoning="r",
        error_identification="e",
        root_cause_analysis="a",
        correct_approach="c",
        key_insight="k",
    )
    got = (out,)
    ctx = {"trace": {}, "skillbook": ""}
    assert _with_reflections(ctx, got) == {**ctx, "reflections": got} and "reflections" not in ctx
    frozen = StepContext(trace={})
    assert _with_reflections(frozen, got) == StepContext(trace={}, reflections=got)

    @dataclasses.dataclass(frozen=True)
    class Plain:
        trace: object = None
        reflections: tuple[ReflectorOutput, ...] = ()

    assert _with_reflections(Plain(), got) == Plain(reflections=got)

    class Model(BaseModel):
        trace: object = None
        reflections: tuple[ReflectorOutput, ...] = ()

    assert _with_reflections(Model(), got).reflections == got

    class Anything:
        trace = None

    thing = Anything()
    assert _with_reflections(thing, got) is thing and thing.reflections == got


def test_skillbooks_become_the_text_the_workflow_takes() -> None:
    class Skillbook:
        def as_prompt(self) -> str:
            return "[s-1] confirm dates"

    class Plain:
        def __str__(self) -> str:
            return "[s-2] plain"

    assert [_skillbook_text(s) for s in (None, "text", Skillbook(), Plain())] == [
        "",
        "text",
        "[s-1] confirm dates",
        "[s-2] plain",
    ]


def test_reflect_in_a_running_event_loop_runs_on_a_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As ACE's reflector: a sync call where an event loop runs (Jupyter, ACE's pipeline) runs on a thread of
    its own (here it gets as far as the configured server being down: the call did run, with no deadlock)."""
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}")

    async def in_a_loop() -> None:
        reflect(traces=ACE_TRACE)

    with pytest.raises(ReflectError, match="is not reachable"):
        asyncio.run(asyncio.wait_for(in_a_loop(), 60))


@pytest.mark.parametrize(
    ("traces", "error", "needle"),
    [
        ("no-such-trace.json", TraceError, "trace file not found: no-such-trace.json"),
        (Path("no-such-trace.json"), TraceError, "trace file not found: no-such-trace.json"),
        ('{"question": "q", ', TraceError, f"invalid JSON in {IN_MEMORY}"),
        ({"question": "q", "when": object()}, ValueError, "the trace cannot be stored as JSON"),
        (object(), ValueError, "traces must be a path, a dict, a list"),
        ("no-such-dir/trace", TraceError, "trace file not found: no-such-dir/trace"),
        (None, ValueError, "nothing to reflect on"),
    ],
)
def test_a_bad_trace_is_a_one_line_error(
    traces: Any, error: type[Exception], needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _isolate(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as e:
        reflect(traces=traces)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not list((tmp_path / "home").rglob("api-*.json"))  # the temporary trace file is gone


def test_bad_arguments_are_value_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _isolate(monkeypatch, tmp_path)
    with pytest.raises(ValueError, match="agent_output must be a str, or have a str `final_answer`"):
        reflect(agent_output=42)
    with pytest.raises(ValueError, match="differs from the trace's final_answer"):
        reflect(traces=ACE_TRACE, agent_output=ANSWER)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        reflect(traces=ACE_TRACE, timeout=0)
    with pytest.raises(TypeError, match="unknown default"):
        RRStep(trace={})
    assert RRStep.requires == {"trace", "skillbook"} and RRStep.provides == {"reflections"}


def test_a_configured_server_that_is_down_is_a_reflect_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv(
        "TEMPORAL_ADDRESS", f"127.0.0.1:{free_port()}"
    )  # never replaced by the embedded server
    with pytest.raises(ReflectError, match="is not reachable"):
        reflect(traces=ACE_TRACE)


# ------------------------------------------------------------------------------------------ on a server


@pytest.mark.slow
def test_reflect_on_a_file_a_dict_a_list_and_json_text(on_server: Path, tmp_path: Path) -> None:
    path = write_trace(tmp_path)
    by_path = _completed(reflect(traces=path))
    by_str_path = _completed(reflect(traces=str(path), question="What is 17 * 24?"))
    assert by_path.raw["workflow_id"] != by_str_path.raw["workflow_id"]
    by_dict = _completed(reflect(traces=ACE_TRACE))
    assert by_dict.raw["answer_correct"] is False and "398" in by_dict.error_identification
    assert by_dict.error_identification == by_path.error_identification  # the same trace, in memory
    by_text = _completed(reflect(traces=json.dumps(ACE_TRACE, indent=1)))
    assert by_text.error_identification == by_path.error_identification
    jsonl = "\n".join(json.dumps(m) for m in MESSAGES) + "\n"
    _judged(reflect(traces=jsonl, agent_output=ANSWER, ground_truth="408"))  # JSON-lines text, wrapped
    _judged(reflect(traces=MESSAGES, agent_output=ANSWER, ground_truth="408"))  # a list of messages
    assert not list(on_server.rglob("api-*.json"))  # every temporary trace file was removed


@pytest.mark.slow
def test_reflect_on_an_answer_alone_with_usage_reported_once(on_server: Path) -> None:
    calls: list[UsageSummary] = []
    cfg = RRConfig(max_requests=20, usage_callback=calls.append)

    class AgentOutput(BaseModel):  # ACE's shape
        reasoning: str
        final_answer: str
        skill_ids: list[str] = []

    out = reflect(
        question=QUESTION,
        agent_output=AgentOutput(reasoning="17 * 24 = 398", final_answer=ANSWER),
        ground_truth="408",
        feedback="Incorrect: expected 408.",
        config=cfg,
        workflow_id=f"api-answer-{uuid.uuid4().hex[:6]}",
    )
    _judged(out)
    assert out.raw["workflow_id"].startswith("api-answer-")
    assert len(calls) == 1 and isinstance(calls[0], UsageSummary)
    assert calls[0].model_dump() == out.raw["usage"] and calls[0].requests >= 1


@pytest.mark.slow
def test_areflect_runs_on_the_callers_loop(on_server: Path) -> None:
    async def main() -> tuple[ReflectorOutput, int]:
        ticks = 0

        async def tick() -> None:  # the caller's loop keeps running while the reflection does
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        try:
            return await areflect(traces=MESSAGES, agent_output=ANSWER, ground_truth="408"), ticks
        finally:
            ticker.cancel()

    out, ticks = asyncio.run(main())
    _judged(out)
    # every tick ran before `areflect` returned (the ticker is cancelled at once after): a call that held the
    # loop would leave 0 however long it took; how many depends only on how fast the reflection was
    assert ticks >= 1


def _cells_rebuilt(wf_id: str) -> int:
    """How many of the workflow's cells found their sandbox host gone (`rr audit --json`)."""
    p = prefork.run(
        [sys.executable, "-m", "reflector.cli", "audit", wf_id, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RR_PLUGINS": "reflector.testing.scripted"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return int(json.loads(p.stdout)["cells_rebuilt"])


@pytest.mark.slow
def test_a_call_that_ends_leaves_the_hosts_of_a_call_beside_it(on_server: Path) -> None:
    """Two `areflect` calls on one loop, each with its own in-process worker (two task queues): when the
    short one ends, the long one's sandbox host keeps running. Each call used to stop every host of the
    loop as it ended, and the other reflection's next cell had to rebuild its host from the journal."""
    import reflector.testing.scripted  # noqa: F401  (scripted-paced-20: 20 cells, 0.25 s per model request)

    long_id = f"api-beside-{uuid.uuid4().hex[:6]}"

    async def main() -> tuple[ReflectorOutput, ReflectorOutput, bool]:
        long = asyncio.ensure_future(
            areflect(
                traces=MESSAGES,
                ground_truth="408",
                workflow_id=long_id,
                config=RRConfig(model="scripted-paced-20", max_requests=40),
            )
        )
        # the long one has its host and has run cells: its first cell is in its journal
        journal = Settings.from_env().blob_dir / "sessions" / long_id
        deadline = time.monotonic() + 60
        while not any(journal.glob("*.json")) and not long.done():
            assert time.monotonic() < deadline, "the long reflection ran no cell"
            await asyncio.sleep(0.02)
        other = dataclasses.replace(
            Settings.from_env(), task_queue_setting=f"api-other-{uuid.uuid4().hex[:6]}"
        )
        short = await areflect(traces=MESSAGES, agent_output=ANSWER, ground_truth="408", settings=other)
        overlapped = not long.done()
        return short, await long, overlapped

    short, long, overlapped = asyncio.run(main())
    assert overlapped, "the short call must end while the long one runs (20 model requests of 0.25 s)"
    _judged(short)
    assert _completed(long).raw["rr_trace"]["cells"] == 20
    assert _cells_rebuilt(long_id) == 0


@pytest.mark.slow
def test_rrstep_as_a_pipeline_step_and_as_a_reflector(on_server: Path) -> None:
    step = RRStep(config=RRConfig(max_requests=20), ground_truth="408")

    class Skillbook:
        def as_prompt(self) -> str:
            return "[math-00001] Double-check multiplications with a second method."

    trace = {"question": QUESTION, "steps": [{"thought": "17 * 24 = 340 + 58 = 398"}], "final_answer": ANSWER}
    ctx = StepContext(trace=trace, skillbook=Skillbook())
    new = step(ctx)
    assert isinstance(new, StepContext) and new is not ctx and ctx.reflections == ()
    assert new.trace is ctx.trace and len(new.reflections) == 1
    _judged(new.reflections[0])

    as_dict = {"trace": MESSAGES, "skillbook": "", "other": 1}
    out = step(as_dict)
    assert set(out) == {"trace", "skillbook", "other", "reflections"} and "reflections" not in as_dict
    _completed(out["reflections"][0])

    no_trace = step(StepContext(agent_output=ANSWER))  # the context's answer alone
    _judged(no_trace.reflections[0])

    direct = step.reflect(
        question=QUESTION, agent_output=ANSWER, skillbook="", ground_truth="408", feedback="Incorrect."
    )
    _judged(direct)
    assert isinstance(asyncio.run(step.areflect(traces=ACE_TRACE)), ReflectorOutput)


@pytest.mark.slow
def test_a_reflection_that_takes_too_long_is_a_timeout_error(on_server: Path, temporal_server: Any) -> None:
    wf_id = f"api-timeout-{uuid.uuid4().hex[:6]}"
    with pytest.raises(
        TimeoutError, match=rf"reflection {wf_id} did not finish within 0.01 s; it goes on durably"
    ):
        reflect(traces=ACE_TRACE, timeout=0.01, workflow_id=wf_id)

    async def stop() -> None:  # no worker polls its private task queue any more
        from temporalio.client import Client

        client = await Client.connect(temporal_server.address)
        await client.get_workflow_handle(wf_id).terminate("test over")

    asyncio.run(stop())


# ------------------------------------------------------------------------------------------ the embedded default


@pytest.mark.slow
def test_reflect_on_the_embedded_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "rr-home"
    _isolate(monkeypatch, home)
    port = free_port()
    monkeypatch.setenv("RR_EMBEDDED_PORT", str(port))  # its own embedded server, whatever else runs here
    out = _completed(reflect(traces=ACE_TRACE))
    assert (home / "temporal.sqlite").exists()  # the embedded server's database: the reflection is kept there
    # and the server stops once no process of the home uses it (its keeper looks every 0.2 s, then stops it)
    deadline = time.monotonic() + 15
    while is_reachable(f"localhost:{port}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_reachable(f"localhost:{port}")
    assert out.raw["workflow_id"]
