"""Read-only look-ups in a skillbook text (used by the online-mode skill evaluation tools).

A skillbook is plain text (often markdown) whose skills carry ids like `[section-00001]`:
`## Section` headings group them, and a skill is the id with the text that follows it up to the
next id or heading. Ids are matched exactly, never as substrings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from reflector.analysis.limits import (
    MAX_SKILL_ID_CHARS,
    MAX_SKILL_IDS,
    MAX_SKILL_TOOL_CHARS,
    MAX_SKILLBOOK_BYTES,
    InputTooLarge,
)
from reflector.contract import SKILL_TOOLS

__all__ = [
    "Skill",
    "parse_skillbook",
    "iter_skills",
    "SKILL_ID_RE",
    "IDS_LINE",
    "ids_from_prompt",
    "check_skillbook",
    "look_up",
]

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
    return list(iter_skills(text))


def iter_skills(text: str) -> Iterator[Skill]:
    """The skills of a skillbook text, in order (`parse_skillbook`, one at a time)."""
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
        if skills:
            yield from skills
            skills.clear()
    flush()
    yield from skills


def ids_from_prompt(prompt: str) -> list[str]:
    """The skillbook ids listed in a task prompt's IDS_LINE (never ids quoted from the trace)."""
    for line in prompt.splitlines():
        if line.startswith(IDS_LINE):
            return SKILL_ID_RE.findall(line)
    return []


_TWO = b'"\\\b\f\n\r\t'  # escaped as two characters in JSON
_SIX = bytes(b for b in range(0x20) if b not in _TWO)  # escaped as \u00XX


def json_size(text: str) -> int:
    """The bytes of `text` as a UTF-8 JSON string (how the sandbox host receives it), without building it."""
    data = text.encode("utf-8", "surrogatepass")
    two = len(data) - len(data.translate(None, _TWO))
    six = len(data) - len(data.translate(None, _SIX))
    surrogates = len(data) - len(data.translate(None, b"\xed"))  # at most: a lone surrogate is escaped too
    return len(data) + 2 + two + 5 * six + 3 * surrogates


def check_skillbook(text: str) -> int:
    """Refuse a skillbook over its caps (`reflector.analysis.limits`) with a one-line `InputTooLarge`; else its number
    of skill ids. Run by the client before it uploads the skillbook, and by the prepare activity."""
    size = json_size(text)
    if size > MAX_SKILLBOOK_BYTES:
        raise InputTooLarge(
            f"skillbook is {size:,} bytes (as the sandbox receives it), over the limit of {MAX_SKILLBOOK_BYTES:,} "
            "(reflector.analysis.limits.MAX_SKILLBOOK_BYTES): keep the sections this reflection needs, or split it"
        )
    n = 0
    for m in SKILL_ID_RE.finditer(text):
        n += 1
        if n > MAX_SKILL_IDS:
            raise InputTooLarge(
                f"skillbook has more than {MAX_SKILL_IDS:,} skill ids, over the limit of {MAX_SKILL_IDS:,} "
                "(reflector.analysis.limits.MAX_SKILL_IDS): split it, or keep the skills this reflection needs"
            )
        if len(m.group(1)) > MAX_SKILL_ID_CHARS:
            raise InputTooLarge(
                f"skillbook skill id [{m.group(1)[:40]}...] is {len(m.group(1)):,} characters, over the limit of "
                f"{MAX_SKILL_ID_CHARS} (reflector.analysis.limits.MAX_SKILL_ID_CHARS)"
            )
    return n


def _bounded(text: str, limit: int = MAX_SKILL_TOOL_CHARS) -> str:
    if len(text) <= limit:
        return text
    return (
        text[:limit]
        + f"\n[... {len(text) - limit:,} more characters: read the variable `skillbook` in a cell]"
    )


def look_up(skills: Sequence[Skill], tool: str, arg: str = "") -> str:
    """What the skill look-up tool `tool` answers (`list_skill_sections`, `get_skill` with an id, `search_skills`
    with a query), at most `MAX_SKILL_TOOL_CHARS` characters: the same answers as the tools gave when they
    parsed an inline skillbook in workflow code, cut where they are long."""
    list_sections, get_skill, search_skills = SKILL_TOOLS
    if tool == list_sections:
        sections: dict[str, list[str]] = {}
        for skill in skills:
            sections.setdefault(skill.section or "(no section)", []).append(skill.id)
        return _bounded(
            "\n".join(f"{name}: {', '.join(ids)}" for name, ids in sections.items()) or "(no skills)"
        )
    if tool == get_skill:
        wanted = arg.strip().strip("[]")
        for skill in skills:
            if skill.id == wanted:
                return _bounded(f"[{skill.id}] ({skill.section}) {skill.text}")
        return f"NOT FOUND: no skill has the exact id {wanted[:200]!r}."
    if tool == search_skills:
        words = arg.lower().split()
        hits = [
            f"[{s.id}] {_bounded(s.text, 1_000)}" for s in skills if all(w in s.text.lower() for w in words)
        ]
        return _bounded("\n".join(hits[:20])) or "(no skill matches)"
    raise ValueError(f"unknown skill look-up {tool!r}")
