"""MkDocs hook: the CLI reference is rendered from `rr`'s argument parser at build time, so it cannot drift.

`docs/cli.md` holds the marker `<!-- rr-cli-reference -->`; this hook replaces it with the help of `rr` and of
every subcommand, in the parser's order. The parser is reached through one name, `reflector.cli.build_parser`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- rr-cli-reference -->"
WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page is the same on every machine


def _parser() -> argparse.ArgumentParser:
    from reflector.cli import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order the parser lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def render_cli_reference() -> str:
    """Markdown: `rr --help`, then one section per subcommand with its help."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = _parser()
        parts = ["```text", parser.format_help().rstrip(), "```", ""]
        for name, summary, sub in _subcommands(parser):
            parts += [f"## rr {name}", "", f"{summary[:1].upper()}{summary[1:]}.", ""]
            parts += ["```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(parts)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: replace the marker on the page that holds it."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_cli_reference())
