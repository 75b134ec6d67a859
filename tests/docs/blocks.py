"""The fenced code blocks of README.md and docs/*.md, and what the docs test does with each.

A block runs when its info string is `bash`, `sh` or `python`; every other block (`text`, none, a
diagram) is shown, not run. An HTML comment on the line before a fence (blank lines between are allowed)
says how a runnable block is treated, visibly in the markdown source:

- `<!-- norun: REASON -->`: not run, for REASON (listed by the test, so skipping is deliberate);
- `<!-- background: until "TEXT" -->`: a long-running command (`rr server`, `rr worker`), started before
  the other blocks, ready when it prints TEXT, stopped by its PID with SIGTERM after them;
- `<!-- stand-in: WHAT -->`: runs against a local stand-in the test provides (WHAT says which).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = {"bash": "shell", "sh": "shell", "python": "python"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_NOTE = re.compile(r"^\s*<!--\s*(?P<kind>norun|background|stand-in)\s*:\s*(?P<text>.*?)\s*-->\s*$")
_UNTIL = re.compile(r'^until\s+"(?P<text>[^"]+)"$')


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    norun: str | None = None  # the reason it is not run
    ready: str | None = None  # a background block: the text that says it is ready
    stand_in: str | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def kind(self) -> str | None:
        return RUNNABLE.get(self.lang)


def markdown_files() -> list[Path]:
    """README.md, then the manual's pages in the order of mkdocs.yml's nav."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages: list[str] = []
    for entry in config["nav"]:
        pages.extend(entry.values() if isinstance(entry, dict) else [entry])
    return [REPO / "README.md", *(REPO / "docs" / page for page in pages)]


def blocks_of(path: Path) -> list[Block]:
    rel = path.relative_to(REPO).as_posix()
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        lang = m["info"].strip().split(" ")[0] if m["info"].strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        notes: dict[str, str] = {}
        k = i - 1
        while k >= 0 and (not lines[k].strip() or _NOTE.match(lines[k])):
            note = _NOTE.match(lines[k])
            if note:
                notes[note["kind"]] = note["text"]
            k -= 1
        ready = None
        if "background" in notes:
            until = _UNTIL.match(notes["background"])
            if not until:
                raise ValueError(f'{rel}:{i + 1}: write <!-- background: until "TEXT" -->')
            ready = until["text"]
        out.append(
            Block(rel, i + 1, lang, "\n".join(body) + "\n", notes.get("norun"), ready, notes.get("stand-in"))
        )
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for path in markdown_files() for b in blocks_of(path)]
