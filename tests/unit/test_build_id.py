"""The worker's build id (reflector/runtime/build_id.py): follows rr's sources, costs little."""

from __future__ import annotations

import shutil
from pathlib import Path

from reflector.runtime.build_id import build_id, digest

ROOT = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> Path:
    for package in ("reflector", "workflows", "activities", "sandbox"):
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"# {package}\n")
        (root / package / "sub" / "mod.py").write_text("X = 1\n")
    (root / "worker.py").write_text("W = 1\n")
    return root


def test_the_id_is_the_installed_sources_id_and_stable() -> None:
    assert build_id() == digest(ROOT) == build_id()
    assert build_id().startswith("rr-") and len(build_id()) == 35


def test_the_id_changes_with_any_source_and_only_with_sources(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a")
    first = digest(a)
    shutil.copytree(a, tmp_path / "b")
    assert digest(tmp_path / "b") == first, "same sources, same id, wherever they are installed"
    (a / "notes.txt").write_text("not code")
    (a / "reflector" / "data.json").write_text("{}")
    assert digest(a) == first, "only Python sources count"
    for changed in ("workflows/sub/mod.py", "sandbox/__init__.py", "worker.py"):
        tree = tmp_path / f"c-{changed.replace('/', '-')}"
        shutil.copytree(a, tree)
        (tree / changed).write_text((tree / changed).read_text() + "# edited\n")
        assert digest(tree) != first, changed
    moved = tmp_path / "moved"
    shutil.copytree(a, moved)
    (moved / "reflector" / "sub" / "mod.py").rename(moved / "reflector" / "sub" / "other.py")
    assert digest(moved) != first, "a renamed module is other code"
