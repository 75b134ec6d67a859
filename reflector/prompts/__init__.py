"""Prompt texts, kept as files in the package and filled with `render` (no `str.format`).

`render` substitutes `{{name}}` placeholders only, so braces in trace previews, skillbooks or JSON
never break the template.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["SYSTEM", "TASK", "ONLINE", "render"]


def _load(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


SYSTEM = _load("system.md")
TASK = _load("task.md")


def render(template: str, **values: object) -> str:
    out = template
    for key, value in values.items():
        out = out.replace("{{" + key + "}}", str(value))
    return out
ONLINE = _load("online.md")
