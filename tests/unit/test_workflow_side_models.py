"""Workflow-side model resolution uses only what `prepare_workflow_side` built or imported at worker start."""

from __future__ import annotations

import sys

import pytest

from reflector.runtime import models

_FAMILIES_BEFORE: set[str] = set()


@pytest.fixture(scope="module")
def prepared() -> list[str]:
    _FAMILIES_BEFORE.update(models._prepared_families)  # other tests (a replayer) may have prepared some
    mp = pytest.MonkeyPatch()
    mp.setenv(models.WORKER_MODELS_ENV, "deepseek, openai:gpt-4o")  # a bare provider prefix and a model name
    try:
        return models.prepare_workflow_side(["openai-chat:rr-served"])
    finally:
        mp.undo()


def test_prepare_builds_the_heuristic_and_registered_models(prepared: list[str]) -> None:
    assert prepared[0] == models.HEURISTIC and {"openai-chat:rr-served", "openai:gpt-4o"} <= set(prepared)
    assert models.HEURISTIC in models._instances
    assert {"openai", "openai-chat", "deepseek"} <= models._prepared_families
    # not served here: its SDK import is not paid (unless something earlier in this process prepared it)
    assert "anthropic" not in models._prepared_families - _FAMILIES_BEFORE


def test_a_new_name_of_a_prepared_family_resolves_without_importing(prepared: list[str]) -> None:
    before = set(sys.modules)
    for name in ("openai-chat:rr-never-seen-1", "openai:rr-never-seen-2", "deepseek:deepseek-reasoner"):
        assert models.workflow_side_model(name).model_name == name.split(":", 1)[1]
    assert set(sys.modules) - before == set()


def test_a_family_that_could_not_be_prepared_is_refused_with_the_reason(
    prepared: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        models._unavailable_families, "rr-nowhere", "ImportError: the rr-nowhere SDK is not installed"
    )
    before = set(sys.modules)
    with pytest.raises(
        models.UnknownModelError, match="cannot be used on this worker: ImportError: the rr-nowhere"
    ):
        models.workflow_side_model("rr-nowhere:m1")
    assert set(sys.modules) - before == set()


def test_preparing_again_does_nothing_new(prepared: list[str]) -> None:
    before = set(sys.modules)
    models.prepare_workflow_side(["openai-chat:rr-served"])
    assert set(sys.modules) - before == set()


def test_in_process_models_are_told_apart_from_provider_models(prepared: list[str]) -> None:
    """In-process models keep local-activity requests and the 4 s task timeout; provider models get
    regular activities and 10 s (workflows.durability, reflector.client)."""
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from reflector.client import PROVIDER_WORKFLOW_TASK_TIMEOUT, WORKFLOW_TASK_TIMEOUT, task_timeout_for

    def answer(messages: object, info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("x")])

    models.register_model("rr-test-in-process", FunctionModel(answer))
    for name in (None, models.HEURISTIC, "rr-test-in-process"):
        assert models.answers_in_process(name), name
    for name in ("openai-chat:rr-served", "openai:rr-never-seen-3", "rr-nowhere:model"):
        assert not models.answers_in_process(name), name
    assert task_timeout_for(models.HEURISTIC) == WORKFLOW_TASK_TIMEOUT
    assert task_timeout_for("openai-chat:rr-served") == PROVIDER_WORKFLOW_TASK_TIMEOUT > WORKFLOW_TASK_TIMEOUT
