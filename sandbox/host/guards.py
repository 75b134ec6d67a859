"""Static guards for model-written cells: AST validation, rewriting and restricted builtins.

Why static checks: model code is untrusted (prompt injection through the trace). The classic CPython
escapes all go through *attribute access* to interpreter internals (`().__class__.__base__...`,
`f.__globals__`, `g.gi_frame.f_back`, `e.__traceback__.tb_frame`) or through the few builtins that
run or look up code by string (`getattr`, `eval`, `exec`, `__import__`, `open`). We refuse those
in the syntax tree before anything runs, and we close the *dynamic* routes that turn a string into an
attribute access (`str.format` fields, `operator.attrgetter`, `functools.update_wrapper`, class
pattern `__match_args__`) in `sandbox.host.safe_modules`; the sandbox's `type` and the checks on classes
are in `sandbox.host.classes`. The invariant the rest relies on: a cell can
never read a dunder, `_`-prefixed or frame/code attribute of any object.

Error messages are written for the model that wrote the cell: say what is refused and what to do.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sandbox.host.classes import (
    _DENIED_DUNDER_DEFS,
    _HOOK_PREFIX,
    CELL_MODULE,
    GuardError,
    SafeType,
    check_class_namespace,
    exact_str,
    is_cell_class,
    real_subclass,
)

__all__ = [
    "ALLOWED_MODULES",
    "FORBIDDEN_ATTRS",
    "FORBIDDEN_BUILTINS",
    "GuardError",
    "check_attr_name",
    "check_dynamic_attr_name",
    "make_builtins",
    "module_refusal",
    "prepare",
    "ATTR_HOOK",
    "CELL_MODULE",
    "DISPLAY_HOOK",
    "HOOK_NAMES",
    "MUT_HOOK",
    "SafeType",
    "allowed_modules_text",
    "check_class_namespace",
    "exact_str",
    "is_cell_class",
    "real_subclass",
]

# Pure modules that help analyse a trace. Not here on purpose: `dataclasses`, `enum`, `typing` (class
# factories that build code with `exec`/`eval` from names, or write into `sys.modules`), `copy` (its
# dispatch tables are the pickler's: `copy.dispatch_table is copyreg.dispatch_table`).
ALLOWED_MODULES: frozenset[str] = frozenset(
    "json re math collections collections.abc datetime itertools functools statistics string textwrap "
    "difflib heapq bisect operator pprint decimal fractions".split()
)


# str methods that read attributes named in their argument: reachable only through the checked hook,
# never through by-name gadgets (attrgetter, class patterns).
FORMAT_ATTRS: frozenset[str] = frozenset({"format", "format_map"})

# Attribute reads routed through the runtime hook (`ATTR_HOOK`): the format methods, and `register`
# (`collections.abc.Sequence.register(dict)` would change a real class for every later cell).
HOOKED_ATTRS: frozenset[str] = FORMAT_ATTRS | {"register"}

# Non-dunder attributes that lead to frames, code objects or globals.
FORBIDDEN_ATTRS: frozenset[str] = frozenset(
    "gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await cr_origin ag_frame ag_code ag_await "
    "f_back f_globals f_locals f_builtins f_code f_trace f_lasti tb_frame tb_next tb_lasti "
    "func_globals func_code im_func im_self co_code co_consts co_names co_varnames "
    "mro_entries".split()
)

# `cls.mro()` hands out the real base classes, including the real `type` (see SafeType).
MRO_ATTRS: frozenset[str] = frozenset({"mro"})

# Clock sources: re-execution of cells after a crash must be deterministic.
CLOCK_ATTRS: frozenset[str] = frozenset({"now", "utcnow", "today"})

# `_`-prefixed attributes that are public API (namedtuple) and harmless.
ALLOWED_UNDERSCORE_ATTRS: frozenset[str] = frozenset(
    {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}
)

# Dunder attributes that are plain strings and used all the time (`type(x).__name__`).
ALLOWED_DUNDER_READS: frozenset[str] = frozenset({"__name__"})

FORBIDDEN_BUILTINS: frozenset[str] = frozenset(
    "getattr setattr delattr vars globals locals eval exec compile open input breakpoint __import__ "
    "memoryview help exit quit id copyright credits license __loader__ __spec__ __build_class__".split()
)

# Safe builtins exposed to cells (plus every builtin exception class).
_SAFE_BUILTINS: tuple[str, ...] = tuple(
    "abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict dir divmod "
    "enumerate filter float format frozenset hasattr hash hex int isinstance issubclass iter len list "
    "map max min next object oct ord pow print property range repr reversed round set slice sorted "
    "staticmethod str sum super tuple type zip NotImplemented Ellipsis".split()
)

# The rewriter's hooks are global names that are not identifiers: no parsed source can bind them (not a
# class body, a `def`, an import alias, a match capture...), nor name-mangle them, and `type(...)`
# refuses such namespace keys. They live in the scaffold (globals, put back after every cell), and
# every class body declares them `global`, so not even a prepared class namespace is consulted.
ATTR_HOOK = "rr:attr"
DISPLAY_HOOK = "rr:display"
MUT_HOOK = (
    "rr:mut"  # wraps the object of every `x.attr = ...` / `del x.attr` (see safe_modules.check_mutable)
)
HOOK_NAMES: tuple[str, ...] = (ATTR_HOOK, DISPLAY_HOOK, MUT_HOOK)
# (`_HOOK_PREFIX`, the hooks' old plain names that no cell may define, is in `sandbox.host.classes`.)

_DUNDER_HINT = (
    "attribute access to dunder names is not allowed in the sandbox; use the provided helpers instead "
    "(type(x).__name__ is allowed; use isinstance()/type() for types, describe_traces() and SHOW_VARS() "
    "to inspect data)"
)


@dataclass(frozen=True)
class _Violation:
    line: int
    message: str


def check_attr_name(name: str) -> str | None:
    """Return why reading attribute `name` is refused, or None if it is allowed.

    Shared by the AST check and the runtime guards (attrgetter, format fields) so both agree.
    """
    if name in ALLOWED_DUNDER_READS or name in ALLOWED_UNDERSCORE_ATTRS:
        return None
    if name.startswith("__") and name.endswith("__"):
        return f"'.{name}': {_DUNDER_HINT}"
    if name.startswith("_"):
        return (
            f"'.{name}': attribute names starting with '_' are not allowed in the sandbox (they reach "
            "internals); use public attributes, and name your own attributes without a leading '_'"
        )
    if name in FORBIDDEN_ATTRS:
        return f"'.{name}': frame, code and generator internals are not available in the sandbox"
    if name in MRO_ATTRS:
        return f"'.{name}': class hierarchies cannot be walked in the sandbox; use isinstance()/issubclass()"
    if name in CLOCK_ATTRS:
        return (
            f"'.{name}': there is no clock in the sandbox (cells must be re-executable deterministically); "
            "use timestamps from the trace instead"
        )
    return None


def check_dynamic_attr_name(name: str) -> str | None:
    """Like `check_attr_name`, for attribute names given as data (attrgetter, class patterns)."""
    if type(name) is not str:
        return "attribute names must be plain str in the sandbox"
    if name in FORMAT_ATTRS:
        return (
            f"'{name}' cannot be looked up by name in the sandbox; call s.{name}(...) directly on the string"
        )
    if name in HOOKED_ATTRS:
        return f"'{name}' cannot be looked up by name in the sandbox; write x.{name} directly"
    return check_attr_name(name)


class _Checker(ast.NodeVisitor):
    """Collects every violation of one module so the model can fix them all at once."""

    def __init__(self) -> None:
        self.violations: list[_Violation] = []
        self._class_depth: list[bool] = []  # True when the innermost scope is a class body

    def _bad(self, node: ast.AST, message: str) -> None:
        self.violations.append(_Violation(getattr(node, "lineno", 0), message))

    def _check_name(self, node: ast.AST, name: str, what: str) -> None:
        if name in FORBIDDEN_BUILTINS:
            self._bad(node, f"'{name}' is not available in the sandbox" + _builtin_hint(name))
        elif name.startswith("__"):
            self._bad(node, f"{what} '{name}': names starting with '__' are reserved in the sandbox")

    # -- names -------------------------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        self._check_name(node, node.id, "name")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not (
            node.attr == "__init__" and _is_zero_arg_super(node.value) and isinstance(node.ctx, ast.Load)
        ):
            why = check_attr_name(node.attr)
            if why is None and node.attr in ALLOWED_DUNDER_READS and not isinstance(node.ctx, ast.Load):
                why = f"'.{node.attr}' can be read but not assigned or deleted in the sandbox"
            if why:
                self._bad(node, why)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        in_class = bool(self._class_depth and self._class_depth[-1])
        if node.name.startswith("__"):
            if not in_class:
                self._bad(node, f"function name '{node.name}': names starting with '__' are reserved")
            elif node.name in _DENIED_DUNDER_DEFS:
                self._bad(node, f"defining '{node.name}' is not allowed in the sandbox")
            elif node.name.startswith(_HOOK_PREFIX):
                self._bad(
                    node, f"'{node.name}': names starting with '{_HOOK_PREFIX}' are reserved for the sandbox"
                )
        elif node.name in FORBIDDEN_BUILTINS:
            self._bad(node, f"function name '{node.name}' shadows a removed builtin; pick another name")
        if getattr(node, "type_params", None):
            self._bad(node, "type parameter lists are not supported in the sandbox; leave them out")
        for deco in node.decorator_list:
            self.visit(deco)
        self.visit(node.args)
        if node.returns:
            self.visit(node.returns)
        self._class_depth.append(False)
        for stmt in node.body:
            self.visit(stmt)
        self._class_depth.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self._class_depth.append(False)
        self.visit(node.body)
        self._class_depth.pop()

    def visit_TypeAlias(self, node: ast.AST) -> None:  # Python 3.12+ `type X = ...`: a lazily evaluated scope
        self._bad(node, "'type X = ...' statements are not supported in the sandbox; assign X = ... instead")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if getattr(node, "type_params", None):  # Python 3.12+ `class C[T]`: an annotation scope
            self._bad(node, "type parameter lists are not supported in the sandbox; leave them out")
        if node.name.startswith("__"):
            self._bad(node, f"class name '{node.name}': names starting with '__' are reserved")
        for expr in [*node.decorator_list, *node.bases]:
            self.visit(expr)
        for kw in node.keywords:
            self.visit(kw.value)
        self._class_depth.append(True)
        for stmt in node.body:
            self.visit(stmt)
        self._class_depth.pop()

    def visit_arg(self, node: ast.arg) -> None:
        if node.arg.startswith("__"):
            self._bad(node, f"argument '{node.arg}': names starting with '__' are reserved")
        if node.annotation:
            self.visit(node.annotation)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self._check_name(node, name, "global")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        for name in node.names:
            self._check_name(node, name, "nonlocal")

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._check_name(node, node.name, "exception name")
        self.generic_visit(node)

    # -- imports -----------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            if alias.asname:
                self._check_name(node, alias.asname, "import alias")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self._bad(node, "relative imports are not available in the sandbox")
            return
        self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self._bad(node, f"'from {node.module} import *' is not allowed; import the names you need")
                continue
            why = check_attr_name(alias.name)
            if why:
                self._bad(node, why)
            if alias.asname:
                self._check_name(node, alias.asname, "import alias")

    def _check_module(self, node: ast.AST, module: str) -> None:
        if module not in ALLOWED_MODULES:
            self._bad(node, module_refusal(module))

    # -- pattern matching --------------------------------------------------------------------------
    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        if node.patterns:
            self._bad(
                node,
                "positional sub-patterns in class patterns are not allowed in the sandbox (they read "
                "attributes by name); use keyword patterns like Point(x=px) or isinstance()",
            )
        for attr in node.kwd_attrs:
            why = check_dynamic_attr_name(attr)
            if why:
                self._bad(node, why)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._check_name(node, node.name, "capture name")
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._check_name(node, node.name, "capture name")

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._check_name(node, node.rest, "capture name")
        self.generic_visit(node)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_zero_arg_super(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and not node.args
        and not node.keywords
    )


def _builtin_hint(name: str) -> str:
    hints = {
        "getattr": "; access attributes directly (obj.attr) or use dict lookups",
        "open": "; there is no file access: the data you need is already in `traces` and your variables",
        "eval": "; write the code directly in the cell",
        "exec": "; write the code directly in the cell, or use register_helper(name, source)",
        "compile": "; write the code directly in the cell, or use register_helper(name, source)",
        "__import__": "; use a plain `import json` statement (allowed modules only)",
        "globals": "; use SHOW_VARS() to list your variables",
        "locals": "; use SHOW_VARS() to list your variables",
        "vars": "; use SHOW_VARS() to list your variables",
        "id": "; object ids are not deterministic across re-execution",
    }
    return hints.get(name, "")


def module_refusal(module: str) -> str:
    """Message for an import that is not on the allowlist."""
    return (
        f"module '{module}' is not available in the sandbox; allowed modules: "
        f"{', '.join(sorted(ALLOWED_MODULES))}. The trace is already loaded in `traces`."
    )


def allowed_modules_text() -> str:
    """The importable modules, for prompts and messages (derived from ALLOWED_MODULES)."""
    return " ".join(sorted(ALLOWED_MODULES))


class _Rewriter(ast.NodeTransformer):
    """Routes `x.format` / `x.format_map` / `x.register` reads through the runtime hook, and the
    object of every attribute assignment or deletion through the mutability check.

    The hooks are named by ids no source can bind (`HOOK_NAMES`); a class body looks names up in its
    own namespace first, so each class body also declares them `global` (a namespace a metaclass'
    `__prepare__` filled is then never consulted for them; nested functions, lambdas and
    comprehensions look them up as globals anyway).
    """

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self.generic_visit(node)
        at = 1 if _is_docstring(node.body[0]) else 0  # the docstring stays the first statement
        node.body.insert(at, ast.copy_location(ast.Global(names=list(HOOK_NAMES)), node.body[0]))
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            hooked = ast.Call(func=ast.Name(id=MUT_HOOK, ctx=ast.Load()), args=[node.value], keywords=[])
            node.value = ast.copy_location(hooked, node.value)
            return node
        if node.attr in HOOKED_ATTRS:
            call = ast.Call(
                func=ast.Name(id=ATTR_HOOK, ctx=ast.Load()),
                args=[node.value, ast.Constant(node.attr)],
                keywords=[],
            )
            return ast.copy_location(call, node)
        return node


def prepare(source: str, filename: str, *, display_last: bool = True) -> Any:
    """Validate and compile one cell (or helper source) for `exec` in the sandbox namespace.

    Args:
        source: model-written code.
        filename: name shown in tracebacks (e.g. "<cell 3>").
        display_last: echo the value of a trailing expression like a notebook, so `len(traces)` alone
            shows something useful to the model.

    Returns:
        A code object.

    Raises:
        SyntaxError: the code does not parse.
        GuardError: the code uses something the sandbox refuses (all violations listed).
    """
    tree = ast.parse(source, filename=filename, mode="exec")
    checker = _Checker()
    checker.visit(tree)
    if checker.violations:
        lines = [f"line {v.line}: {v.message}" for v in checker.violations[:20]]
        more = len(checker.violations) - len(lines)
        if more > 0:
            lines.append(f"... and {more} more")
        raise GuardError("the sandbox refused this code:\n" + "\n".join(lines))
    tree = _Rewriter().visit(tree)
    if display_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        call = ast.Call(func=ast.Name(id=DISPLAY_HOOK, ctx=ast.Load()), args=[last.value], keywords=[])
        tree.body[-1] = ast.copy_location(ast.Expr(value=call), last)
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", dont_inherit=True)


def make_builtins(overrides: dict[str, Any], importer: Callable[..., Any]) -> dict[str, Any]:
    """Build the restricted `__builtins__` dict for the sandbox namespace.

    `__build_class__` (needed by `class` statements) and the guarded `__import__` are present but
    cannot be named by cells (names starting with `__` are refused by the AST check).
    """
    table: dict[str, Any] = {name: getattr(builtins, name) for name in _SAFE_BUILTINS}
    table["type"] = SafeType
    table.update(_exception_classes())
    table["__build_class__"] = builtins.__build_class__
    table["__import__"] = importer
    table["__name__"] = "builtins"
    table.update(overrides)
    return table


def _exception_classes() -> Iterable[tuple[str, Any]]:
    for name, value in vars(builtins).items():
        if isinstance(value, type) and issubclass(value, BaseException) and not name.startswith("_"):
            yield name, value
