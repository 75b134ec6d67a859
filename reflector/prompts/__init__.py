"""Prompt texts, kept as files in the package and filled with `render` (no `str.format`).

`render` substitutes `{{name}}` placeholders only, so braces in trace previews, skillbooks or JSON
never break the template.
"""

from __future__ import annotations

import re
from importlib import resources

from sandbox.host.guards import allowed_modules_text

__all__ = ["SYSTEM", "TASK", "ONLINE", "render", "strategy"]


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
SYSTEM = _load("system.md").replace("{{modules}}", allowed_modules_text())
ONLINE = _load("online.md")
STRATEGY_SMALL = _load("strategy_small.md")
STRATEGY_LARGE = _load("strategy_large.md")
LARGE_TRACE_BYTES = 256 * 1024


def strategy(trace_bytes: int, can_recurse: bool) -> str:
    """How to approach the data, by its size (the big-trace advice only mentions recursion if allowed)."""
    if trace_bytes < LARGE_TRACE_BYTES:
        return STRATEGY_SMALL
    if can_recurse:
        return STRATEGY_LARGE
    return STRATEGY_LARGE.split("\ndelegate")[0].rstrip(", \n") + ", and analyse each part in turn.\n"
