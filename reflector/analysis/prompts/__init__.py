"""Prompt texts, kept as files in the package and filled with `render` (no `str.format`).

`render` substitutes `{{name}}` placeholders only, so braces in trace previews, skillbooks or JSON
never break the template. What a prompt says about splitting is decided by the same function that decides
whether `recurse` is offered (`may_split`), so the two cannot disagree. The system prompt (`SYSTEM`) is the same
for every session and names no tool that may be withheld: the tools describe themselves in their definitions
(sent with every request), and a provider's prompt cache can hold `SYSTEM` for every reflection
(`reflector.analysis.prompt_cache`); the session's budget follows it as an instruction of its own (`budget`).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Literal

from reflector.analysis.toolkit import TOOLKIT_DOC
from reflector.contract import OUTPUT_TOOL
from sandbox.host.guards import allowed_modules_text

__all__ = [
    "SYSTEM",
    "TASK",
    "ONLINE",
    "OUTPUT_TOOL_DESCRIPTION",
    "LARGE_TRACE_BYTES",
    "render",
    "strategy",
    "may_split",
    "budget",
    "shown_preview",
    "without_skill_tags",
    "task_field",
]


def _load(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


TASK = _load("task.md")


_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render(template: str, **values: object) -> str:
    """Fill `{{name}}` placeholders in one pass over the template: text inside the values (questions,
    previews, skillbooks) is never scanned again, so braces or even `{{preview}}` in user data stay as
    they are. An unknown placeholder is an error, not a silent gap."""

    def fill(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise KeyError(f"prompt placeholder {{{{{m.group(1)}}}}} has no value")
        return str(values[m.group(1)])

    return _PLACEHOLDER.sub(fill, template)


# The importable modules are the sandbox's own allowlist, filled in once (never a hand-kept copy).
# The toolkit's signatures too (`TOOLKIT_DOC`, what `describe_traces()` prints): told once here, where every session
# shares them, and left out of the task prompt's copy of cell 1 (`shown_preview`).
SYSTEM = (
    _load("system.md")
    .replace("{{modules}}", allowed_modules_text())
    .replace("{{output_tool}}", OUTPUT_TOOL)
    .replace("{{toolkit}}", TOOLKIT_DOC)
)
ONLINE = _load("online.md")
STRATEGY_SMALL = _load("strategy_small.md")
STRATEGY_LARGE = _load("strategy_large.md")
STRATEGY_SPLIT = _load("strategy_split.md")
# The output tool's description as the model reads it (`ToolOutput(description=...)`); without it the
# tool would be described by `ReflectionDraft`'s docstring.
OUTPUT_TOOL_DESCRIPTION = _load("output_tool.md").strip()
LARGE_TRACE_BYTES = 256 * 1024

FIELD_CHARS = 1_500  # a task field longer than this is cut in the prompt (the whole text is in `traces`)


def may_split(trace_bytes: int, recursion: Literal["auto", "always"] = "auto") -> bool:
    """Whether the strategy lets a session below max_depth split its work into child sessions:
    on a large trace ("auto"), or whenever the caller asked for it ("always")."""
    return recursion == "always" or trace_bytes >= LARGE_TRACE_BYTES


def strategy(trace_bytes: int, can_recurse: bool) -> str:
    """How to approach the data, by its size (the big-trace advice only mentions recursion if allowed)."""
    if trace_bytes < LARGE_TRACE_BYTES:
        return STRATEGY_SMALL
    return STRATEGY_LARGE + STRATEGY_SPLIT if can_recurse else STRATEGY_LARGE


def budget(max_requests: int, max_tokens: int, *, shared_with_children: bool) -> str:
    """The session's budget, told after `SYSTEM` (a separate instruction: it differs between sessions)."""
    if shared_with_children:
        return (
            f"Budget: this session may spend at most {max_requests} model requests and {max_tokens:,} tokens, "
            "and that includes everything its child sessions spend: a child started with `recurse` gets half of "
            "what remains (at least 10,000 tokens) and its usage is charged back here. When the budget runs out "
            "the session stops and returns what it has."
        )
    return (
        f"Budget: at most {max_requests} model requests and {max_tokens:,} tokens for this session; when they "
        "run out the session stops and returns what it has."
    )


def shown_preview(preview: str, limit: int) -> str:
    """Cell 1's output (`describe_traces()`) as the task prompt shows it: without the toolkit's signatures, which
    `SYSTEM` gives, and cut at `limit` characters."""
    preview = preview.replace(TOOLKIT_DOC + "\n", "(toolkit: its signatures are in the system prompt)\n", 1)
    if len(preview) > limit:
        return preview[:limit] + "\n[... preview truncated; call describe_traces() or slice `traces`]"
    return preview


def without_skill_tags(schema: dict[str, Any]) -> dict[str, Any]:
    """The output tool's JSON schema without `skill_tags` (and its `SkillTag` definition): offered to a session with
    no skillbook, where there is nothing to tag (`ReflectionDraft.skill_tags` defaults to empty)."""
    out = {
        **schema,
        "properties": {k: v for k, v in schema.get("properties", {}).items() if k != "skill_tags"},
    }
    if "$defs" in schema:
        out["$defs"] = {k: v for k, v in schema["$defs"].items() if k != "SkillTag"}
    if "required" in schema:
        out["required"] = [r for r in schema["required"] if r != "skill_tags"]
    return out


def task_field(given: str | None, traced: str | None, *, key: str, none: str) -> str:
    """One line of the task prompt: the caller's value, else the trace's own (said to come from the
    trace, cut when long), else `none`, which says what to use instead."""
    if given is not None and given.strip():
        return _cut(given.strip(), f"task['{key}']")
    if traced is not None and traced.strip():
        return _cut(traced.strip(), f"traces['{key}']") + " (from the trace)"
    return none


def _cut(text: str, where: str) -> str:
    if len(text) <= FIELD_CHARS:
        return text
    return text[:FIELD_CHARS] + f" ...(+{len(text) - FIELD_CHARS:,} chars: {where})"
