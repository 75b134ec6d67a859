"""docs/troubleshooting.md quotes every error message the CLI and the Python API can print (tests/docs/messages.py
reads them from the source), so a new or changed message cannot go undocumented."""

from __future__ import annotations

import ast

import pytest

from tests.docs.messages import HOLE, REPO, all_messages, normalise, skeleton

pytestmark = pytest.mark.docs  # `pytest -m docs`: the tests that keep README.md and docs/ true

PAGE = REPO / "docs" / "troubleshooting.md"


def test_every_error_message_is_in_the_troubleshooting_page() -> None:
    page = normalise(PAGE.read_text())
    messages = all_messages()
    assert len(messages) > 100, "the reader of the source found too few messages: is it still looking?"
    missing = [f"{m.where}: {m.skeleton}" for m in messages if m.skeleton not in page]
    assert not missing, (
        "messages missing from docs/troubleshooting.md (quote each with what to do):\n" + "\n".join(missing)
    )


def test_the_page_quotes_no_message_the_source_no_longer_has() -> None:
    """Each quoted message (a list item's leading code span) is one the source still prints."""
    known = {m.skeleton for m in all_messages()}
    stale = []
    for line in PAGE.read_text().splitlines():
        if line.startswith("- `"):
            quoted = (
                line[2:].split("``", 2)[1].strip() if line.startswith("- ``") else line[3:].split("`", 1)[0]
            )
            if normalise(quoted) not in known:
                stale.append(quoted)
    assert not stale, "quoted in docs/troubleshooting.md but printed nowhere:\n" + "\n".join(stale)


def test_skeletons_mark_every_value_filled_in() -> None:
    """The reader turns interpolated values into `…` and keeps the text around them."""
    tree = ast.parse('f"trace file {path} is {n:,} bytes" + " (" + reason')
    expr = tree.body[0]
    assert isinstance(expr, ast.Expr)
    assert skeleton(expr.value) == f"trace file {HOLE} is {HOLE} bytes ({HOLE}"
