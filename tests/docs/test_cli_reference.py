"""The manual's CLI reference is rendered from `rr`'s parser at build time (docs/hooks/cli_reference.py)."""

from __future__ import annotations

import argparse
import importlib.util
from types import ModuleType

import pytest
import yaml

from reflector.cli import build_parser
from tests.docs.blocks import REPO

pytestmark = pytest.mark.docs  # `pytest -m docs`: the tests that keep README.md and docs/ true

HOOK = REPO / "docs" / "hooks" / "cli_reference.py"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference_hook", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mkdocs_runs_the_hook_on_the_page_that_holds_the_marker() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert "docs/hooks/cli_reference.py" in config["hooks"]
    hook = _hook()
    page = (REPO / "docs" / "cli.md").read_text()
    assert hook.MARKER in page
    rendered = hook.on_page_markdown(page, None, None, None)
    assert hook.MARKER not in rendered and "## rr reflect" in rendered
    assert hook.on_page_markdown("no marker", None, None, None) == "no marker"


def test_every_subcommand_and_option_is_in_the_reference() -> None:
    text = _hook().render_cli_reference()
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(subparsers.choices) >= 13
    for name, sub in subparsers.choices.items():
        section = text.split(f"## rr {name}\n", 1)[1].split("\n## rr ", 1)[0]
        assert f"usage: rr {name}" in section
        for action in sub._actions:
            for option in action.option_strings:
                assert option in section, f"rr {name} {option} is missing from the CLI reference"
            if action.help and action.help != argparse.SUPPRESS:
                assert " ".join(action.help.split()[:3]) in " ".join(section.split()), action.help
