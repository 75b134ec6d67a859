"""Prompt texts, kept as files in the package and filled with `render` (no `str.format`).

`render` substitutes `{{name}}` placeholders only, so braces in trace previews, skillbooks or JSON
never break the template. What a prompt says about tools and splitting is decided by the same
functions that decide what is offered (`may_split`, `tools_section`), so the two cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Literal

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
    "tools_section",
    "tool_names_in",
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
SYSTEM = _load("system.md").replace("{{modules}}", allowed_modules_text()).replace("{{output_tool}}", OUTPUT_TOOL)
ONLINE = _load("online.md")
STRATEGY_SMALL = _load("strategy_small.md")
STRATEGY_LARGE = _load("strategy_large.md")
STRATEGY_SPLIT = _load("strategy_split.md")
# The output tool's description as the model reads it (`ToolOutput(description=...)`); without it the
# tool would be described by `ReflectionDraft`'s docstring.
OUTPUT_TOOL_DESCRIPTION = _load("output_tool.md").strip()
LARGE_TRACE_BYTES = 256 * 1024

_TOOL_LINE = re.compile(r"^- `(\w+)\(")
# one line per tool, keyed by its name: the system prompt lists exactly the tools a request offers
_TOOL_LINES: dict[str, str] = {
    m.group(1): line for line in _load("tools.md").splitlines() if (m := _TOOL_LINE.match(line))
}
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


def tools_section(names: Sequence[str]) -> str:
    """The system prompt's tool list: one line for each offered tool, in the order given."""
    unknown = [n for n in names if n not in _TOOL_LINES]
    if unknown:
        raise KeyError(f"no line in prompts/tools.md for the tools {unknown}")
    return "\n".join(_TOOL_LINES[n] for n in names)


def tool_names_in(system_prompt: str) -> list[str]:
    """The tools a rendered system prompt lists under `Tools:` (the inverse of `tools_section`, for checks)."""
    section = system_prompt.split("\nTools:\n", 1)[-1].split("\n\n", 1)[0]
    return [m.group(1) for line in section.splitlines() if (m := _TOOL_LINE.match(line))]


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
