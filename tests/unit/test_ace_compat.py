"""Issue 27 without ACE installed: the ACE trace shapes, the LiteLLM model names, the trace objects the API
takes, `RRStep`'s ACE constructor and `RRConfig`'s ACE fields. (With `ace-framework` installed,
tests/e2e/test_ace_dropin.py runs the same against ACE's real classes.)"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.models.test import TestModel

from reflector import ReflectorOutput, RRConfig, RRStep
from reflector.analysis.model_names import UnmappedModelName, from_litellm
from reflector.analysis.traces import TraceError, detect_format, normalize
from reflector.client.ace import _handed_off
from reflector.client.api import _per_request_callback, _with_ace_raw
from reflector.client.api_traces import _trace_file
from reflector.contract import ExtractedLearning, SkillTag
from reflector.runtime.models import check_model_name
from reflector.runtime.settings import Settings

# ACE's RRStep._build_traces_dict (ace/steps/rr_step.py, 0.13.0) and EvaluateStep's trace (ace/steps/evaluate.py)
ACE_RR_TRACE = {
    "question": "What is 15 x 24?",
    "ground_truth": "360",
    "feedback": "Incorrect. The answer is 360.",
    "injected_skill_ids": ["math-001", "math-002"],
    "steps": [
        {
            "role": "agent",
            "reasoning": "15 x 24 = 15 x 20 + 15 x 4 = 310 + 60 = 370",
            "answer": "370",
            "skill_ids": ["math-001"],
        }
    ],
}
ACE_EVALUATE_TRACE = {
    "question": "What is 2+2?",
    "context": "arithmetic",
    "ground_truth": "4",
    "reasoning": "2 and 2 make 5",
    "answer": "5",
    "skill_ids": ["math-002"],
    "feedback": "Incorrect. Expected: 4",
}


def test_aces_own_step_shape_is_not_read_as_chat_messages() -> None:
    view = normalize(ACE_RR_TRACE)
    assert detect_format(ACE_RR_TRACE) == "ace"
    assert view["final_answer"] == "370"  # was None: the step was read as a message without content
    assert view["metadata"]["skill_ids"] == ["math-001"]  # was dropped: online mode tagged nothing
    assert view["metadata"]["injected_skill_ids"] == ["math-001", "math-002"]
    content = view["steps"][0]["content"]
    assert "310 + 60 = 370" in content and "answer: 370" in content
    # a chat message with a role is still a message
    chat = normalize({"question": "q", "steps": [{"role": "assistant", "content": "hello"}]})
    assert chat["steps"][0]["content"] == "hello" and chat["steps"][0]["role"] == "assistant"


def test_evaluate_steps_trace_keeps_its_answer() -> None:
    view = normalize(ACE_EVALUATE_TRACE)
    assert view["final_answer"] == "5"
    assert view["metadata"]["skill_ids"] == ["math-002"]
    assert any(s["content"] == "5" for s in view["steps"])
    assert any("2 and 2 make 5" in s["content"] for s in view["steps"])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("gpt-4o-mini", "openai:gpt-4o-mini"),
        ("o3-mini", "openai:o3-mini"),
        ("claude-3-5-sonnet-20241022", "anthropic:claude-3-5-sonnet-20241022"),
        ("gemini-2.0-flash", "google:gemini-2.0-flash"),
        ("openai/gpt-4o", "openai:gpt-4o"),
        ("anthropic/claude-3-5-haiku-latest", "anthropic:claude-3-5-haiku-latest"),
        (
            "bedrock/us.anthropic.claude-3-5-haiku-20241022-v1:0",
            "bedrock:us.anthropic.claude-3-5-haiku-20241022-v1:0",
        ),
        ("openrouter/openai/gpt-4o", "openrouter:openai/gpt-4o"),
        ("gemini/gemini-1.5-pro", "google:gemini-1.5-pro"),
        ("vertex_ai/gemini-1.5-pro", "google-cloud:gemini-1.5-pro"),
        ("groq/llama-3.1-70b", "groq:llama-3.1-70b"),
        ("together_ai/meta-llama/Llama-3-70b", "together:meta-llama/Llama-3-70b"),
        ("ollama/llama3", "ollama:llama3"),
        ("openai:gpt-4o", "openai:gpt-4o"),  # pydantic-ai's form: unchanged
        ("bedrock:us.anthropic.claude-3-5-haiku-v1:0", "bedrock:us.anthropic.claude-3-5-haiku-v1:0"),
        ("heuristic", "heuristic"),  # no LiteLLM shape: left to the registry
    ],
)
def test_litellm_spellings_map_onto_pydantic_ai_providers(given: str, expected: str) -> None:
    assert from_litellm(given) == expected
    assert RRConfig(model=given).to_reflection_config().model == expected


def test_the_mapped_names_are_ones_rr_can_build() -> None:
    for name in ("gpt-4o-mini", "claude-3-5-sonnet-20241022", "openrouter/openai/gpt-4o"):
        check_model_name(from_litellm(name))  # syntax and provider, not credentials


def test_an_unmapped_name_is_a_clear_error_naming_the_accepted_forms() -> None:
    with pytest.raises(UnmappedModelName, match=r"LiteLLM prefix 'sagemaker'.*accepted: .*provider:model"):
        from_litellm("sagemaker/my-endpoint")
    with pytest.raises(ValueError, match="accepted: "):
        RRConfig(model="sagemaker/my-endpoint")


def test_rrstep_is_built_as_ace_builds_it() -> None:
    step = RRStep("gpt-4o-mini", config=RRConfig(max_requests=7))
    assert (step.config.model, step.config.max_requests) == ("gpt-4o-mini", 7)
    assert step.config.to_reflection_config().model == "openai:gpt-4o-mini"
    assert RRStep(model="heuristic").config.model == "heuristic"
    assert RRStep(RRConfig(max_requests=3)).config.max_requests == 3  # rr's older form still works
    with_settings = RRStep("anthropic:claude-3-5-haiku-latest", model_settings={"temperature": 0.2})
    assert with_settings.config.to_reflection_config().model_settings == {"temperature": 0.2, "cache": "5m"}
    instance = TestModel()
    by_instance = RRStep(instance)
    assert by_instance.config.model is not None and by_instance.config.model.startswith("instance:test:")
    assert RRStep(instance).config.model == by_instance.config.model  # one name per object
    check_model_name(by_instance.config.model)  # registered: the in-process worker resolves it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RRStep("heuristic", prompt_template="{traces_description}")
    assert any("prompt_template is ignored" in str(w.message) for w in caught)
    with pytest.raises(TypeError, match="model must be a model name or a pydantic-ai Model"):
        RRStep(42)  # type: ignore[arg-type]


@dataclasses.dataclass
class RecursiveConfig:
    """The fields of ACE's `RecursiveConfig` dataclass (ace/implementations/rr/config.py, 0.13.0)."""

    max_tokens: int = 500_000
    max_requests: int = 50
    context_window: int = 128_000
    max_depth: int = 2
    child_budget_fraction: float = 0.5
    max_compactions: int = 3
    microcompact_keep_recent: int = 3
    timeout: float = 60.0
    max_output_chars: int = 50_000
    usage_callback: Any = None
    cache_prompts: bool = True
    cache_ttl: str = "5m"


def test_rrconfig_has_aces_fields_and_methods() -> None:
    cfg = RRConfig(cache_prompts=False, cache_ttl="1h")
    limits = cfg.build_usage_limits()
    assert (limits.total_tokens_limit, limits.request_limit) == (500_000, 50)
    assert cfg.build_usage_limits(remaining_tokens=1000).total_tokens_limit == 1000
    cfg.max_requests = 9  # mutable
    assert cfg.build_usage_limits().request_limit == 9
    assert (
        RRConfig(model="heuristic").to_reflection_config().model_settings is None
    )  # no cache setting: a no-op
    one_hour = RRConfig(model="anthropic:claude-3-5-haiku-latest", cache_ttl="1h").to_reflection_config()
    assert one_hour.model_settings == {"temperature": 0.0, "cache": "1h"}
    theirs = RRConfig(model="openai:gpt-4o", model_settings={"cache": False}).to_reflection_config()
    assert theirs.model_settings == {"cache": False}  # the caller's own `cache` wins
    from_ace = RRStep("heuristic", config=RecursiveConfig(max_requests=11, timeout=5.0, cache_ttl="1h"))
    assert (from_ace.config.max_requests, from_ace.config.timeout, from_ace.config.cache_ttl) == (
        11,
        5.0,
        "1h",
    )


def test_the_output_has_aces_defaults_and_raw_keys() -> None:
    out = ReflectorOutput(reasoning="r", correct_approach="c", key_insight="k")
    assert (out.error_identification, out.root_cause_analysis) == ("", "")
    raw = {
        "rr_trace": {
            "total_iterations": 3,
            "compactions": 1,
            "depth": 0,
            "timed_out": False,
            "stop_reason": "request_budget",
        }
    }
    ace = _with_ace_raw(out.model_copy(update={"raw": raw})).raw
    assert (ace["iterations"], ace["compactions"], ace["depth"], ace["timed_out"], ace["timeout"]) == (
        3,
        1,
        0,
        True,
        True,
    )
    done = _with_ace_raw(out.model_copy(update={"raw": {"rr_trace": {"stop_reason": "completed"}}})).raw
    assert done["timed_out"] is False and "timeout" not in done


def test_the_handoff_puts_tags_and_learnings_where_aces_skill_manager_reads() -> None:
    out = ReflectorOutput(
        reasoning="checked cell 2",
        correct_approach="c",
        key_insight="k",
        skill_tags=[SkillTag(id="math-001", tag="harmful"), SkillTag(id="math-002", tag="helpful")],
        extracted_learnings=[
            ExtractedLearning(learning="Multiply exactly", atomicity_score=0.9, evidence='cell 2: "370"')
        ],
    )
    handed = _handed_off(out)
    assert handed.reasoning.startswith("checked cell 2\n\n")
    assert (
        "Skill tags (rr, from the trace's evidence): [math-001] harmful; [math-002] helpful"
        in handed.reasoning
    )
    assert 'Learning 1: Multiply exactly (evidence: cell 2: "370")' in handed.reasoning
    assert handed.skill_tags == out.skill_tags and _handed_off(handed).reasoning == handed.reasoning
    assert _handed_off(ReflectorOutput(reasoning="r", correct_approach="c", key_insight="k")).reasoning == "r"


def test_usage_callback_forms() -> None:
    def ace_style(usage: Any, model_id: str) -> None: ...

    def rr_style(summary: Any) -> None: ...

    calls: list[Any] = []
    assert _per_request_callback(ace_style) is ace_style
    assert _per_request_callback(lambda *a: None) is not None
    assert _per_request_callback(rr_style) is None and _per_request_callback(calls.append) is None
    assert _per_request_callback(None) is None


@dataclasses.dataclass
class AgentRun:
    question: str
    answer: str
    steps: list[str]


class Opaque:
    def __init__(self) -> None:
        self.question = "q"
        self.history = [{"role": "assistant", "content": "done"}]
        self._private = "not shown"


class Slotted:
    __slots__ = ("question", "answer")

    def __init__(self) -> None:
        self.question = "q"
        self.answer = "a"


@pytest.mark.parametrize(
    ("trace", "check"),
    [
        (
            AgentRun("2+2?", "5", ["add"]),
            lambda d: d == {"question": "2+2?", "answer": "5", "steps": ["add"]},
        ),
        (Opaque(), lambda d: d == {"question": "q", "history": [{"role": "assistant", "content": "done"}]}),
        (Slotted(), lambda d: d == {"question": "q", "answer": "a"}),
        (
            "The agent answered 5 and the user said that is wrong.",
            lambda d: d["steps"][0]["content"].startswith("The agent answered 5"),
        ),
        (42, lambda d: d["steps"][0]["content"] == "42"),
        ((1, 2), lambda d: d == [1, 2]),
        ({"question": "q", "nested": AgentRun("a", "b", [])}, lambda d: d["nested"]["answer"] == "b"),
    ],
)
def test_any_trace_object_becomes_json_data(
    trace: Any, check: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RR_HOME", str(tmp_path))
    with _trace_file(trace, None, "", None, None, Settings.from_env()) as (path, _name):
        assert check(json.loads(path.read_text())), path.read_text()


@pytest.mark.parametrize(
    ("trace", "needle"),
    [
        (object(), "traces must be a path, a dict, a list, JSON or plain text"),
        (print, "traces must be a path"),
        ("traces/run-7.json", "trace file not found: traces/run-7.json"),
        (f"no-such-dir{os.sep}x", "trace file not found"),
    ],
)
def test_what_cannot_be_a_trace_is_a_one_line_error(
    trace: Any, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RR_HOME", str(tmp_path))
    with (
        pytest.raises((ValueError, TraceError)) as e,
        _trace_file(trace, None, "", None, None, Settings.from_env()),
    ):
        pass
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_trace_sandbox_runs_cells_on_rrs_sandbox_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACE's `TraceSandbox` API (inject, execute -> ExecutionResult) on rr's guarded host."""
    from reflector import ExecutionResult, ExecutionTimeoutError, TraceSandbox

    monkeypatch.setenv("RR_HOME", str(tmp_path))
    with TraceSandbox(trace={"question": "2+2?", "steps": [{"role": "agent", "answer": "5"}]}) as sandbox:
        sandbox.inject("skillbook", "[s-1] add carefully")
        first = sandbox.execute("print(traces['final_answer'], skillbook); x = 3", timeout=5)
        assert (
            isinstance(first, ExecutionResult) and first.success and first.stdout == "5 [s-1] add carefully\n"
        )
        sandbox.inject("extra", {"a": [1, 2]})  # after the start: set by a cell
        assert sandbox.execute("print(x + extra['a'][1])").stdout == "5\n"
        refused = sandbox.execute("import os")
        assert isinstance(refused.exception, RuntimeError) and "not available in the sandbox" in str(
            refused.exception
        )
        slow = sandbox.execute("while True: pass")
        assert isinstance(slow.exception, ExecutionTimeoutError) and not slow.success
    with pytest.raises(TypeError, match="llm_query_fn"):
        TraceSandbox(trace={}, llm_query_fn=print)


def test_a_name_that_is_not_provider_model_says_which_forms_are_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflector import reflect
    from reflector.runtime.models import UnknownModelError

    monkeypatch.setenv("RR_HOME", str(tmp_path))
    with pytest.raises(UnknownModelError) as e:
        reflect(traces={"question": "q"}, config=RRConfig(model="my-finetune"))
    message = str(e.value)
    assert (
        "Unknown model: my-finetune" in message
        and "accepted: a registered name" in message
        and "\n" not in message
    )
    assert not list(tmp_path.rglob("api-*.json"))  # refused before anything is stored
