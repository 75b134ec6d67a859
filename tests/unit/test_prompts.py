"""Prompt files: braces in user data never break rendering; the strategy follows the trace size."""

from __future__ import annotations

from reflector.analysis import prompts


def test_render_leaves_braces_in_values_alone() -> None:
    text = prompts.render(
        prompts.TASK,
        format="ace",
        size=10,
        question_line="what is {x}? {{y}} {{preview}}",
        ground_truth="{}",
        feedback="{'a': 1}",
        mode="offline",
        skillbook_line="",
        strategy="",
        preview='{"k": [1]}',
    )
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


def test_system_prompt_is_static_and_the_budget_is_its_own_instruction() -> None:
    from reflector.contract import OUTPUT_TOOL

    assert "{{" not in prompts.SYSTEM and f"`{OUTPUT_TOOL}`" in prompts.SYSTEM
    assert (
        "Budget:" not in prompts.SYSTEM
    )  # it differs between sessions: a provider's cache holds SYSTEM for all
    leaf = prompts.budget(7, 12_000, shared_with_children=False)
    tree = prompts.budget(7, 12_000, shared_with_children=True)
    assert "7 model requests and 12,000 tokens" in leaf and "recurse" not in leaf
    assert "7 model requests and 12,000 tokens" in tree and "child sessions" in tree


def test_unknown_placeholder_is_an_error() -> None:
    import pytest

    with pytest.raises(KeyError):
        prompts.render("{{missing}}")


def test_system_prompt_names_no_tool_that_may_be_withheld() -> None:
    """`recurse` and the skill tools are offered by session (depth, strategy, skillbook); the static prompt must
    not name them (the strategy and online parts of the task prompt do, chosen by the same rules)."""
    from reflector.contract import RECURSE_TOOL, SKILL_TOOLS

    for name in (RECURSE_TOOL, *SKILL_TOOLS):
        assert f"`{name}" not in prompts.SYSTEM, name


def test_recurse_follows_depth_and_strategy() -> None:
    from reflector.contract import ReflectorDeps
    from workflows.tools import recurse_offered

    deps = ReflectorDeps(workflow_id="w", depth=0, max_depth=2)
    assert recurse_offered(deps)
    assert not recurse_offered(deps.model_copy(update={"may_recurse": False}))
    assert not recurse_offered(deps.model_copy(update={"depth": 2}))


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
    # the nested models' docstrings are for readers of the code: the model reads the field's description
    assert [name for name, d in schema["$defs"].items() if "description" in d] == []


def test_task_prompt_shows_cell_1_without_the_signatures_the_system_prompt_gives() -> None:
    from reflector.analysis.toolkit import TOOLKIT_DOC

    cell_1 = f"traces: dict (9 keys)\n{TOOLKIT_DOC}\n  ['steps']: list (4 items)\npreview:\n" + "x" * 50
    shown = prompts.shown_preview(cell_1, limit=10_000)
    assert TOOLKIT_DOC in prompts.SYSTEM and TOOLKIT_DOC not in shown
    assert shown.startswith("traces: dict (9 keys)\n(toolkit: its signatures are in the system prompt)\n")
    assert shown.endswith("x" * 50)
    cut = prompts.shown_preview(cell_1, limit=60)
    assert cut.startswith(shown[:60]) and "preview truncated" in cut


def test_the_offline_output_schema_has_no_skill_tags() -> None:
    from reflector.contract import ReflectionDraft

    schema = ReflectionDraft.model_json_schema()
    offline = prompts.without_skill_tags(schema)
    assert "skill_tags" in schema["properties"] and "SkillTag" in schema["$defs"]  # the input is not changed
    assert "skill_tags" not in offline["properties"] and "SkillTag" not in offline["$defs"]
    assert offline["required"] == schema["required"] and "diagnosis" in offline["properties"]
    assert ReflectionDraft.model_validate({k: "x" for k in schema["required"]}).skill_tags == []
