"""Prompt files: braces in user data never break rendering; the strategy follows the trace size."""

from __future__ import annotations

from reflector.analysis import prompts


def test_render_leaves_braces_in_values_alone() -> None:
    text = prompts.render(prompts.TASK, format="ace", size=10, question_line="what is {x}? {{y}} {{preview}}", ground_truth="{}",
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
    text = prompts.render(prompts.SYSTEM, budget_line="X BUDGET", tools=prompts.tools_section(["execute_code"]))
    assert "X BUDGET" in text and "{{" not in text
    assert prompts.tool_names_in(text) == ["execute_code"]


def test_unknown_placeholder_is_an_error() -> None:
    import pytest

    with pytest.raises(KeyError):
        prompts.render("{{missing}}")


def test_every_tool_has_one_line_and_the_list_reads_back() -> None:
    from reflector.contract import EXECUTE_CODE_TOOL, OUTPUT_TOOL, RECURSE_TOOL, SKILL_TOOLS, THINK_TOOL

    names = [EXECUTE_CODE_TOOL, THINK_TOOL, RECURSE_TOOL, *SKILL_TOOLS, OUTPUT_TOOL]
    text = prompts.render(prompts.SYSTEM, budget_line="B", tools=prompts.tools_section(names))
    assert prompts.tool_names_in(text) == names
    assert "tool_calls" not in prompts.tool_names_in(text)  # toolkit functions are not tools


def test_offered_tools_follow_depth_strategy_and_skillbook() -> None:
    from reflector.contract import ReflectorDeps
    from workflows.tools import offered_tools

    deps = ReflectorDeps(workflow_id="w", depth=0, max_depth=2)
    assert offered_tools(deps) == ["execute_code", "think", "recurse"]
    assert "recurse" not in offered_tools(deps.model_copy(update={"may_recurse": False}))
    assert "recurse" not in offered_tools(deps.model_copy(update={"depth": 2}))
    assert offered_tools(deps.model_copy(update={"may_recurse": False, "has_skillbook": True})) == [
        "execute_code", "think", "list_skill_sections", "get_skill", "search_skills"]


def test_splitting_is_for_large_traces_unless_asked() -> None:
    assert not prompts.may_split(10_000) and prompts.may_split(prompts.LARGE_TRACE_BYTES)
    assert prompts.may_split(10, "always")


def test_task_fields_say_where_they_come_from() -> None:
    assert prompts.task_field("408", "398", key="ground_truth", none="-") == "408"
    assert prompts.task_field(None, "408", key="ground_truth", none="-") == "408 (from the trace)"
    assert prompts.task_field("  ", None, key="ground_truth", none="(none)") == "(none)"
    long = prompts.task_field(None, "x" * 5_000, key="question", none="-")
    assert long.endswith("(+3,500 chars: traces['question']) (from the trace)") and len(long) < 1_600


def test_every_output_field_is_described() -> None:
    from reflector.contract import ReflectionDraft

    schema = ReflectionDraft.model_json_schema()
    models = [schema, *schema["$defs"].values()]
    missing = [name for m in models for name, prop in m["properties"].items() if not prop.get("description")]
    assert missing == []
    assert "description" not in schema  # no docstring: the output tool's description is the prompt's own
