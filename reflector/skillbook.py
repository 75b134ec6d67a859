"""Read-only look-ups in a skillbook text (used by the online-mode skill evaluation tools).

A skillbook is plain text (often markdown) whose skills carry ids like `[section-00001]`:
`## Section` headings group them, and a skill is the id with the text that follows it up to the
next id or heading. Ids are matched exactly, never as substrings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Skill", "parse_skillbook", "SKILL_ID_RE", "IDS_LINE", "ids_from_prompt"]

# The task prompt lists the skillbook's ids on one line that starts with this (online mode only).
IDS_LINE = "Skill ids in the skillbook:"

SKILL_ID_RE = re.compile(r"\[([A-Za-z][A-Za-z0-9_]*-\d{3,})\]")
_HEADING_RE = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*$")


@dataclass(frozen=True)
class Skill:
    id: str
    section: str
    text: str


def parse_skillbook(text: str) -> list[Skill]:
    skills: list[Skill] = []
    section = ""
    current: tuple[str, list[str]] | None = None

    def flush() -> None:
        if current is not None:
            skills.append(Skill(current[0], section, " ".join(" ".join(current[1]).split())))

    for line in text.splitlines():
        heading = _HEADING_RE.match(line)
        if heading:
            flush()
            current = None
            section = heading.group(1)
            continue
        for piece in re.split(r"(?=\[[A-Za-z][A-Za-z0-9_]*-\d{3,}\])", line):
            m = SKILL_ID_RE.match(piece)
            if m:
                flush()
                current = (m.group(1), [piece[m.end() :].strip(" -:")])
            elif current is not None and piece.strip():
                current[1].append(piece.strip())
    flush()
    return skills


def ids_from_prompt(prompt: str) -> list[str]:
    """The skillbook ids listed in a task prompt's IDS_LINE (never ids quoted from the trace)."""
    for line in prompt.splitlines():
        if line.startswith(IDS_LINE):
            return SKILL_ID_RE.findall(line)
    return []
