"""The layout's rules, checked on the source (the AST of every module), so that they cannot erode.

- `reflector/` is the ground floor: it never imports `workflows/` or `activities/`, and only the entry
  points (the CLI, the Python API `reflector/client/api.py`) reach the composition root `worker`.
- `sandbox/` imports only the trace reader (`reflector.analysis.traces`) and the toolkit (`reflector.analysis.toolkit`: pure
  functions over the trace; it imports only the trace reader and the stdlib-only answer rules).
- `reflector/analysis/traces/` is stdlib-only; `reflector/runtime/models.py` has no temporalio.
- `workflows/` never imports `sandbox/`.
- One module reads the environment (`reflector/runtime/settings.py`); the exceptions are processes of their own
  that read the private variables their parent set for them.
- Every durable name is spelled out once, in `reflector/contract/`.
- pydantic-ai's and temporalio's private modules are used in one module only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflector import contract

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reflector", "workflows", "activities", "sandbox")
PROJECT = (*PACKAGES, "worker")

# Processes of their own, reading what their parent put in their environment (not user settings).
READS_ITS_OWN_ENV = {
    "sandbox/host/main.py": "the sandbox host: isolation mode and test switches from its parent",
    "sandbox/zygote.py": "the fork server: installs each host's environment before the host starts",
    "reflector/runtime/supervisor.py": "passes the environment on to its worker processes, which read it",
    "sandbox/wire.py": "passes the worker's RR_SANDBOX_CGROUP on to the host environment it builds from scratch",
    "sandbox/isolation.py": "runs in the host: reads the cgroup base its worker put in the host's environment",
}
TEST_DOUBLES = "reflector/testing"  # scripted models configured by the environment of the test using them
PRIVATE_API_HOME = "workflows/local_model.py"


def _modules() -> Iterator[tuple[str, ast.Module]]:
    files = [ROOT / "worker.py"] + [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        yield rel, ast.parse(path.read_text(), filename=rel)


MODULES = dict(_modules())


def _imports(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _project_imports(tree: ast.Module) -> set[str]:
    return {m for m in _imports(tree) if m.split(".")[0] in PROJECT}


def _under(rel: str, prefix: str) -> bool:
    return rel == prefix or rel.startswith(prefix.rstrip("/") + "/")


def _offending(prefix: str, allowed: tuple[str, ...] = (), banned: tuple[str, ...] = ()) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for rel, tree in MODULES.items():
        if not _under(rel, prefix):
            continue
        for m in sorted(_project_imports(tree)):
            top_ok = any(m == a or m.startswith(a + ".") for a in allowed) if allowed else True
            is_banned = any(m == b or m.startswith(b + ".") for b in banned)
            if not top_ok or is_banned:
                bad.setdefault(rel, []).append(m)
    return bad


def test_the_rules_see_every_layer() -> None:
    # a guard for the guards: if the walk found nothing, every rule below would pass vacuously
    assert {"worker.py", "reflector/contract/__init__.py", "workflows/reflection.py", "sandbox/executor.py"} <= set(MODULES)
    assert "workflows.reflection" in _project_imports(MODULES["worker.py"])


def test_reflector_never_imports_workflows_or_activities() -> None:
    bad = _offending("reflector", banned=("workflows", "activities"))
    assert bad == {}
    entry = _offending("reflector", banned=("worker",))
    # the entry points: the CLI, and the Python API (`reflect` runs an in-process worker as `rr reflect` does)
    assert set(entry) <= {"reflector/cli/__init__.py", "reflector/client/api.py"}, f"only entry points may reach the composition root: {entry}"


def test_sandbox_imports_only_the_trace_reader_and_the_toolkit() -> None:
    allowed = ("sandbox", "reflector.analysis.traces", "reflector.analysis.toolkit")
    assert _offending("sandbox", allowed=allowed) == {}


def test_the_toolkit_is_pure() -> None:
    # what a sandbox host loads from the project: the trace reader, the answer rules (stdlib-only text) and itself
    allowed = ("reflector.analysis.toolkit", "reflector.analysis.traces", "reflector.analysis.answers")
    assert _offending("reflector/analysis/toolkit", allowed=allowed) == {}
    assert _offending("reflector/analysis/answers.py", banned=PROJECT) == {}
    assert "reflector/analysis/toolkit/divergence.py" in MODULES  # the rule sees the package


def test_workflows_never_import_the_sandbox() -> None:
    assert _offending("workflows", banned=("sandbox",)) == {}


def test_trace_reader_is_stdlib_only() -> None:
    stdlib = sys.stdlib_module_names
    bad = {}
    for rel, tree in MODULES.items():
        if _under(rel, "reflector/analysis/traces"):
            others = [m for m in _imports(tree) if m.split(".")[0] not in stdlib and not m.startswith("reflector.analysis.traces")]
            if others:
                bad[rel] = sorted(others)
    assert bad == {}
    assert any(_under(rel, "reflector/analysis/traces") for rel in MODULES)


def test_models_resolution_has_no_temporalio() -> None:
    assert not [m for m in _imports(MODULES["reflector/runtime/models.py"]) if m.startswith("temporalio")]


def _reads_env(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv", "environb") for a in node.names):
                return True
    return False


def test_one_module_reads_the_environment() -> None:
    readers = {rel for rel, tree in MODULES.items() if _reads_env(tree) and not _under(rel, TEST_DOUBLES)}
    assert "reflector/runtime/settings.py" in readers
    assert readers - {"reflector/runtime/settings.py"} <= set(READS_ITS_OWN_ENV), sorted(readers)


def _durable_values() -> dict[str, str]:
    """The string (and tuple-of-string) constants `reflector/contract/` itself defines."""
    out = {}
    for node in MODULES["reflector/contract/__init__.py"].body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if not name.isupper() or name.startswith("_"):
            continue
        value = getattr(contract, name)
        if isinstance(value, str):
            out[value] = name
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            out.update({v: name for v in value})
    return out


def _string_constants(tree: ast.Module) -> Iterator[tuple[int, str]]:
    docstrings = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }
    for n in ast.walk(tree):  # `__all__` lists name Python objects, which may be spelled like a durable name
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets):
            docstrings.update(id(c) for c in ast.walk(n.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


# Literals spelled like a durable name that name something else (checked one by one, with the reason).
COINCIDENTAL = {
    ("reflector/analysis/toolkit/calls.py", "think"): "tau-bench's own `think` tool (NO_EFFECT_TOOLS), not rr's think tool",
}


def test_every_durable_name_is_defined_once() -> None:
    durable = _durable_values()
    assert {"ReflectionWorkflow", "execute_code", "rr.sandbox.run_cell", "rr-provider-model-activities"} <= set(durable)
    bad = [
        f"{rel}:{line}: {value!r} (use reflector.contract.{durable[value]})"
        for rel, tree in MODULES.items()
        if rel != "reflector/contract/__init__.py"
        for line, value in _string_constants(tree)
        if value in durable and (rel, value) not in COINCIDENTAL
    ]
    assert bad == []


@pytest.mark.parametrize("private", ["pydantic_ai.durable_exec._", "pydantic_ai.durable_exec.temporal._"])
def test_private_api_lives_in_one_module(private: str) -> None:
    users = {rel for rel, tree in MODULES.items() if any(m.startswith(private) for m in _imports(tree))}
    assert users <= {PRIVATE_API_HOME}, users
    source = {rel for rel, tree in MODULES.items() if "_Definition" in ast.dump(tree)}
    assert source <= {PRIVATE_API_HOME}, source
