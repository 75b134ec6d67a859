"""Prompt files: braces in user data never break rendering; the strategy follows the trace size."""

from __future__ import annotations

from reflector import prompts


def test_render_leaves_braces_in_values_alone() -> None:
    text = prompts.render(prompts.TASK, format="ace", size=10, question="what is {x}? {{y}} {{preview}}", ground_truth="{}",
                          feedback="{'a': 1}", mode="offline", skillbook_line="", strategy="", preview="{\"k\": [1]}")
    assert "what is {x}? {{y}}" in text and "{'a': 1}" in text and '{"k": [1]}' in text
    assert "{{y}} {{preview}}" in text  # user text is not scanned for placeholders
    assert text.count('{"k": [1]}') == 1


def test_strategy_adapts_to_trace_size_and_recursion() -> None:
    small = prompts.strategy(10_000, can_recurse=True)
    large = prompts.strategy(50_000_000, can_recurse=True)
    leaf = prompts.strategy(50_000_000, can_recurse=False)
    assert "few focused checks" in small and "recurse" not in small
    assert "Survey first" in large and "recurse(" in large
    assert "Survey first" in leaf and "recurse" not in leaf


def test_system_prompt_budget_line_is_filled() -> None:
    text = prompts.render(prompts.SYSTEM, budget_line="X BUDGET")
    assert "X BUDGET" in text and "{{" not in text


def test_unknown_placeholder_is_an_error() -> None:
    import pytest

    with pytest.raises(KeyError):
        prompts.render("{{missing}}")
