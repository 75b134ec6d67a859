"""The built wheel (what `pip install .` installs, non-editable) holds everything rr reads at run time.

The wheel is built from a clean copy of the sources (so neither the working tree's `build/` nor its
egg-info take part), without build isolation (setuptools and wheel are dev dependencies: no network),
installed with `pip install --no-deps --target`, and used from a directory outside the repository
with this venv's dependencies: the prompts and examples are loaded from the installed copy, and a
reflection runs end to end from it (its worker, sandbox host and prompts all from the wheel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.support.user_env import user_env

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "worker.py", "reflector", "workflows", "activities", "sandbox")
PACKAGES = ("reflector", "workflows", "activities", "sandbox")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        item = REPO_ROOT / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(item, src / name)
    out = root / "dist"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    wheels = list(out.glob("durable_recursive_reflector-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    return target


def _env(installed: Path, **extra: str) -> dict[str, str]:
    base = user_env(("RR_", "TEMPORAL_", "PYTHON"))
    return {**base, "PYTHONPATH": str(installed), **extra}


def test_the_wheel_holds_the_data_files_and_the_composition_root(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for pattern in (
        "reflector/analysis/prompts/*.md",
        "reflector/examples/*.json",
        "reflector/examples/*.jsonl",
    ):
        for f in REPO_ROOT.glob(pattern):
            assert f.relative_to(REPO_ROOT).as_posix() in names, f
    assert any(n.startswith("reflector/analysis/prompts/") and n.endswith(".md") for n in names)
    assert any(n.startswith("reflector/examples/") for n in names)
    assert "worker.py" in names  # the top-level composition root (py-modules)
    # every module of the packages, and nothing of the tests
    for pkg in PACKAGES:
        for f in (REPO_ROOT / pkg).rglob("*.py"):
            if "__pycache__" not in f.parts:
                assert f.relative_to(REPO_ROOT).as_posix() in names, f
    assert not [n for n in names if n.startswith("tests/")]
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "rr = reflector.cli:run" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_installed_copy_loads_its_prompts_and_examples(installed: Path, tmp_path: Path) -> None:
    script = r"""
import json, sys
from importlib import resources
from pathlib import Path
import reflector, reflector.analysis.prompts as prompts, worker, sandbox.host.main
root = Path(sys.argv[1]).resolve()
mods = {m.__name__: Path(m.__file__).resolve() for m in (reflector, prompts, worker, sandbox.host.main)}
assert all(root in p.parents for p in mods.values()), mods
texts = {f.name: f.read_text(encoding="utf-8") for f in resources.files("reflector.analysis.prompts").iterdir() if f.name.endswith(".md")}
examples = {}
for f in resources.files("reflector").joinpath("examples").iterdir():
    if f.name.endswith((".json", ".jsonl")):
        examples[f.name] = len(f.read_bytes())
print(json.dumps({"prompts": sorted(texts), "system": len(prompts.SYSTEM), "task": len(prompts.TASK),
                  "examples": examples, "from": str(Path(prompts.__file__).parent)}))
"""
    p = subprocess.run(
        [sys.executable, "-c", script, str(installed)],
        cwd=tmp_path,
        env=_env(installed),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["prompts"] == sorted(
        f.name for f in (REPO_ROOT / "reflector" / "analysis" / "prompts").glob("*.md")
    )
    assert got["system"] > 1000 and got["task"] > 0
    assert got["examples"] == {
        f.name: f.stat().st_size
        for f in (REPO_ROOT / "reflector" / "examples").iterdir()
        if f.suffix in (".json", ".jsonl")
    }
    assert Path(got["from"]).is_relative_to(installed)


@pytest.mark.server
def test_a_reflection_runs_from_the_installed_copy(installed: Path, tmp_path: Path, temporal_server) -> None:
    rr = installed / "bin" / "rr"
    assert rr.is_file()
    home = tmp_path / "rr-home"
    env = _env(
        installed,
        RR_HOME=str(home),
        TEMPORAL_ADDRESS=temporal_server.address,
        RR_TASK_QUEUE=f"rr-wheel-{uuid.uuid4().hex[:8]}",
    )
    version = subprocess.run(
        [str(rr), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("rr "), version.stderr
    example = installed / "reflector" / "examples" / "failed_math.json"
    p = subprocess.run(
        [str(rr), "reflect", str(example), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["raw"]["rr_trace"]["stop_reason"] == "completed" and out["raw"]["rr_trace"]["cells"] >= 1
    assert "408" in json.dumps(out)  # the ground truth reached the reflection through a sandbox cell
