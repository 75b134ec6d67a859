"""The layout's rules, checked on the source (the AST of every module), so that they cannot erode.

- `reflector/` is in rooms: `contract/` (durable names and
  persisted models), `analysis/` (the domain: traces, toolkit, heuristic, prompts, rules), `runtime/`
  (infrastructure: settings, storage, servers, supervisor, telemetry), `client/` (what a user's machine
  runs: the Python API, the workflow client, status, audit), `cli/` (the `rr` command). Dependencies go
  one way: analysis and contract import neither runtime, client nor cli; runtime imports neither
  client nor cli; client never imports cli.
- `reflector/` never imports `workflows/` or `activities/`, and only the entry points (the CLI, the
  Python API `reflector/client/api.py`) reach the composition root `worker`, which never imports the CLI.
- No import circle among the project's modules: none among the imports a module runs when it is
  imported (its top level, `if __name__ == "__main__"` blocks included), and among all imports
  (deferred ones in functions too) only the listed ones, each inside one room.
- No module of the product is over 500 lines (those still to split are listed, and may only shrink).
- `sandbox/` imports only the trace reader (`reflector.analysis.traces`) and the toolkit
  (`reflector.analysis.toolkit`: pure functions over the trace; it imports only the trace reader and the
  stdlib-only answer rules).
- `reflector/analysis/traces/` is stdlib-only; `reflector/runtime/models.py` has no temporalio.
- `workflows/` never imports `sandbox/`.
- One module reads the environment (`reflector/runtime/settings.py`); the exceptions are processes of
  their own that read the private variables their parent set for them.
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
    "sandbox/cgroups.py": "runs in the host: reads the cgroup base its worker put in the host's environment",
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


def _offending(
    prefix: str, allowed: tuple[str, ...] = (), banned: tuple[str, ...] = ()
) -> dict[str, list[str]]:
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
    assert {
        "worker.py",
        "reflector/contract/names.py",
        "workflows/reflection.py",
        "sandbox/executor.py",
    } <= set(MODULES)
    assert {
        "reflector/analysis/traces/view.py",
        "reflector/runtime/settings.py",
        "reflector/cli/__init__.py",
    } <= set(MODULES)
    assert "workflows.reflection" in _project_imports(MODULES["worker.py"])


def test_reflector_never_imports_workflows_or_activities() -> None:
    bad = _offending("reflector", banned=("workflows", "activities"))
    assert bad == {}
    entry = _offending("reflector", banned=("worker",))
    # the entry points: the CLI, and the Python API (`reflect` runs an in-process worker as `rr reflect` does)
    assert all(_under(rel, "reflector/cli") or rel == "reflector/client/api.py" for rel in entry), (
        f"only entry points may reach the composition root: {entry}"
    )


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
            others = [
                m
                for m in _imports(tree)
                if m.split(".")[0] not in stdlib and not m.startswith("reflector.analysis.traces")
            ]
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
    body = [node for rel, tree in MODULES.items() if _under(rel, "reflector/contract") for node in tree.body]
    assert any(isinstance(n, ast.Assign) for n in body)
    for node in body:
        if not (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
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
        if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets
        ):
            docstrings.update(id(c) for c in ast.walk(n.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


# Literals spelled like a durable name that name something else (checked one by one, with the reason).
COINCIDENTAL = {
    (
        "reflector/analysis/toolkit/calls.py",
        "think",
    ): "tau-bench's own `think` tool (NO_EFFECT_TOOLS), not rr's think tool",
}


def test_every_durable_name_is_defined_once() -> None:
    durable = _durable_values()
    assert {
        "ReflectionWorkflow",
        "execute_code",
        "rr.sandbox.run_cell",
        "rr-provider-model-activities",
    } <= set(durable)
    bad = [
        f"{rel}:{line}: {value!r} (use reflector.contract.{durable[value]})"
        for rel, tree in MODULES.items()
        if not _under(rel, "reflector/contract")
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


# -- rooms ------------------------------------------------------------------------------------------
ROOMS = ("reflector/contract", "reflector/analysis", "reflector/runtime", "reflector/client", "reflector/cli")
# what each room never imports (its own and lower rooms it may)
ROOM_NEVER_IMPORTS = {
    "reflector/contract": ("reflector.runtime", "reflector.client", "reflector.cli"),
    "reflector/analysis": ("reflector.runtime", "reflector.client", "reflector.cli"),
    "reflector/runtime": ("reflector.client", "reflector.cli"),
    "reflector/client": ("reflector.cli",),
}


def test_reflector_is_in_rooms() -> None:
    here = {
        p.name for p in (ROOT / "reflector").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert here == {"__init__.py", "testing", *(r.split("/")[1] for r in ROOMS)}, sorted(here)
    for room in ROOMS:
        assert any(_under(rel, room) for rel in MODULES), room  # the rules below see every room


@pytest.mark.parametrize("room", sorted(ROOM_NEVER_IMPORTS))
def test_rooms_depend_one_way(room: str) -> None:
    assert _offending(room, banned=ROOM_NEVER_IMPORTS[room]) == {}


def test_the_composition_root_never_imports_the_cli() -> None:
    assert _offending("worker.py", banned=("reflector.cli",)) == {}
    assert _offending("reflector/runtime", banned=("worker",)) == {}


# -- size -------------------------------------------------------------------------------------------
MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    lines = {rel: len((ROOT / rel).read_text().splitlines()) for rel in MODULES}
    over = {rel: n for rel, n in lines.items() if n > MAX_LINES and not _under(rel, TEST_DOUBLES)}
    assert over == {}, "split these by concern (one concern per module)"


# -- import circles ---------------------------------------------------------------------------------
def _dotted(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


DOTTED = {_dotted(rel): rel for rel in MODULES}


def _targets(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The project modules an import statement loads (a package's `__init__` loading first is no edge)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in DOTTED}
    if node.level or not node.module:
        return set()
    out = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in DOTTED}
    if len(out) < len(node.names) and node.module in DOTTED:
        out.add(node.module)  # names defined in the module itself
    return out


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_nodes(body: list[ast.stmt], deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it is imported (`deferred`: those in functions too)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif _is_type_checking(node):
            continue
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if deferred:
                yield from _import_nodes(node.body, deferred)
        else:  # if/try/with/for/while/match/class bodies run on import
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, []):
                    yield from _import_nodes(
                        child.body if isinstance(child, ast.excepthandler | ast.match_case) else [child],
                        deferred,
                    )


def _graph(deferred: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, tree in MODULES.items():
        me = _dotted(rel)
        graph[me] = {t for node in _import_nodes(tree.body, deferred) for t in _targets(node)} - {me}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


# Circles of deferred imports (in functions), each inside one room, left as they are; no new ones.
DEFERRED_CIRCLES = {
    frozenset(
        {
            "reflector.runtime.settings",
            "reflector.runtime.storage.identity",
            "reflector.runtime.storage.stores",
        }
    ): "a store's settings, and the task queue named after the store",
    frozenset({"workflows.rerun", "workflows.state"}): "a rerun's state is the reflection's",
}


def test_the_rules_see_import_circles() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert "reflector.runtime.settings" in _graph(deferred=False)["reflector.runtime.storage.stores"]
    assert "worker" in _graph(deferred=True)["reflector.cli.serve"]  # deferred: `rr worker` runs the worker


def test_no_import_circle_when_modules_are_imported() -> None:
    assert _circles(_graph(deferred=False)) == []


def test_no_new_import_circle_through_deferred_imports() -> None:
    found = {frozenset(c) for c in _circles(_graph(deferred=True))}
    assert found <= set(DEFERRED_CIRCLES), sorted(sorted(c) for c in found - set(DEFERRED_CIRCLES))
    assert set(DEFERRED_CIRCLES) <= found, (
        f"broken already, drop from DEFERRED_CIRCLES: {set(DEFERRED_CIRCLES) - found}"
    )
