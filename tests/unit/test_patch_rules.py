"""The rules of workflows/patches.py, checked from the source: every patch decided before the first command."""

from __future__ import annotations

import ast
from pathlib import Path

import reflector.contract.names as names
from reflector.contract import PATCHES_FIRST_PATCH
from workflows.patches import ASKED_AT_START, IMPLIED, LIBRARY_PATCHES

ROOT = Path(__file__).parents[2]
WORKFLOW_CODE = sorted((ROOT / "workflows").glob("*.py"))


def _calls(tree: ast.AST, attr: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
    ]


def test_workflow_code_asks_patches_only_through_patch_on() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{c.lineno}"
        for p in WORKFLOW_CODE
        if p.name != "patches.py"
        for c in _calls(ast.parse(p.read_text()), "patched")
        + _calls(ast.parse(p.read_text()), "deprecate_patch")
    ]
    assert not offenders, f"ask `workflows.patches.patch_on`, not workflow.patched: {offenders}"


def test_every_workflow_run_begins_by_deciding_its_patches() -> None:
    runs = []
    for p in WORKFLOW_CODE:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.AsyncFunctionDef) and any(
                isinstance(d, ast.Attribute) and d.attr == "run" for d in node.decorator_list
            ):
                body = [
                    s
                    for s in node.body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                ]
                first = body[0]
                runs.append(p.name)
                assert (
                    isinstance(first, ast.Expr)
                    and isinstance(first.value, ast.Call)
                    and isinstance(first.value.func, ast.Name)
                    and first.value.func.id == "begin"
                ), f"{p.name}:{node.lineno}: the first statement of a workflow run must be `begin()`"
    assert sorted(runs) == ["batch.py", "reflection.py"]


def test_every_patch_is_implied_or_asked_at_start() -> None:
    patches = {v for k, v in vars(names).items() if k.endswith("_PATCH") and isinstance(v, str)}
    assert PATCHES_FIRST_PATCH in patches
    undecided = patches - IMPLIED - set(ASKED_AT_START) - {PATCHES_FIRST_PATCH}
    assert not undecided, f"add each to workflows.patches.ASKED_AT_START: {sorted(undecided)}"
    assert not IMPLIED & set(ASKED_AT_START)
    assert len(set(ASKED_AT_START)) == len(ASKED_AT_START)
    assert not set(LIBRARY_PATCHES) & patches
