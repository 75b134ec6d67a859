"""Issue 25, points 1 and 2: checks the cell cannot steer, hooks the cell cannot shadow.

1. A safe wrapper must decide with what the cell cannot control (`type(x)` and the MRO read through
   `type`'s own descriptor), never `isinstance(x, ...)` / `x.__class__` / `==` / `in`, which a cell
   class answers itself; and nothing in the host evaluates a string the cell wrote.
2. The rewriter's hooks (`x.attr = ...`, `del x.attr`, `.format`, `.register`, the display of the
   last expression) must be unreachable by name from cell code: no scope a cell writes, class bodies
   included, can bind them.

The first tests are the concrete attacks on the normal cell path (a real host process); the rest run
the sandbox namespace in-process, so they can look at the real stdlib objects after each cell, and
fuzz every scope kind the rewriter can meet.
"""

from __future__ import annotations

import abc
import ast
import collections
import collections.abc
import dis
import importlib
import itertools
import json
import statistics
import textwrap
import tokenize
import types
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.executor import SubprocessExecutor
from sandbox.host import guards, safe_modules
from sandbox.host.guards import GuardError, prepare
from sandbox.host.namespace import SandboxNamespace
from sandbox.host.safe_modules import ModuleProxy
from tests.sandbox.conftest import CONTAINED, attempt

pytestmark = pytest.mark.timeout(60)

# A class whose instances answer "I am a class" to the first `isinstance(x, type)` only.
FLIP = (
    "class Flip:\n"
    "    reads = [0]\n"
    "    x: \"type('Z', (), {'b': __builtins__})\"\n"
    "    @property\n"
    "    def __class__(self):\n"
    "        Flip.reads[0] += 1\n"
    "        return type if Flip.reads[0] == 1 else int\n"
)


# --- 1. on the normal cell path ----------------------------------------------------------------------
async def test_singledispatch_register_with_a_lying_class(executor: SubprocessExecutor) -> None:
    """The issue's case: the check says "a class", functools then evaluates the annotation string."""
    code = (
        FLIP + "import functools\n@functools.singledispatch\ndef g(x):\n    return 0\n"
        "g.register(Flip())\n"
        "Z = [k for k in g.registry if k is not object][0]\n"
        "print('escaped', 'open' in Z.b, 'exec' in Z.b)"
    )
    r = await attempt(executor, code, CONTAINED)
    assert "escaped" not in r.stdout


async def test_class_body_may_not_define_dunder_class(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, FLIP + "print(isinstance(Flip(), type))")
    assert "__class__" in (r.error or "")


async def test_singledispatch_register_still_takes_classes(executor: SubprocessExecutor) -> None:
    """What the fix must keep: register(cls) / register(cls, f) with real classes; an instance whose
    `__getattr__` answers every question (`__bases__`...) is still refused (a regression variant)."""
    code = (
        "import functools\n@functools.singledispatch\ndef g(x):\n    return 0\n"
        "class Liar:\n    x: 'print(1)'\n    def __getattr__(self, name):\n        return (str,)\n"
        "g.register(Liar())"
    )
    await attempt(executor, code, CONTAINED)
    ok = await executor.run_cell(
        "import functools\n@functools.singledispatch\ndef g(x):\n    return 'any'\n"
        "@g.register(int)\ndef _(x):\n    return 'int'\ng.register(str, lambda x: 'str')\n"
        "print(g(1), g('a'), g(1.5))"
    )
    assert ok.ok and ok.stdout == "int str any\n", ok


# --- 2. on the normal cell path ----------------------------------------------------------------------
async def test_class_body_hook_shadow_cannot_mutate_stdlib(executor: SubprocessExecutor) -> None:
    """The issue's case: `def __rr_mut__` in a class body made `json.JSONDecoder.decode = len` pass."""
    code = (
        "import json\nclass A:\n    def __rr_mut__(o):\n        return o\n    json.JSONDecoder.decode = len\n"
    )
    await attempt(executor, code)
    r = await executor.run_cell("import json\nprint(json.loads('[1, 2]'), json.JSONDecoder().decode('3'))")
    assert r.ok and r.stdout == "[1, 2] 3\n", r


async def test_class_body_attr_hook_shadow(executor: SubprocessExecutor) -> None:
    code = "class A:\n    def __rr_attr__(o, name):\n        return o\n    print('{0.__class__}'.format(1))\n"
    r = await attempt(executor, code)
    assert "int" not in r.stdout


async def test_hook_names_refused_as_definitions_anywhere(executor: SubprocessExecutor) -> None:
    for code in (
        "class A:\n    def __rr_display__(self, v):\n        return v\n",
        "class A:\n    class B:\n        async def __rr_anything__(self):\n            pass\n",
        "X = type('X', (), {'__rr_mut__': lambda o: o})",
        "X = type('X', (), {'rr:mut': lambda o: o})",
    ):
        await attempt(executor, code)


# --- in-process: the namespace a host runs -------------------------------------------------------
@pytest.fixture(scope="module")
def ns() -> SandboxNamespace:
    space = SandboxNamespace(2000)
    space.start({"steps": [1]}, {})
    for name in sorted(guards.ALLOWED_MODULES):  # built (and hardened) before any state is compared
        space.importer.proxy(name)
    return space


def run(space: SandboxNamespace, code: str) -> BaseException | None:
    """One cell as the host runs it; the exception it ended with, if any."""
    space.begin_cell()
    try:
        exec(space.compile_cell(code), space.ns)  # checked code, as the host does
    except Exception as exc:
        return exc
    finally:
        space.restore()
    return None


def fails_closed(exc: BaseException | None) -> bool:
    """Refused by a guard, or by the read-only / immutable-type refusal of the object itself."""
    if isinstance(exc, GuardError):
        return True
    text = str(exc)
    return (isinstance(exc, AttributeError) and "read-only" in text) or (
        isinstance(exc, TypeError) and "immutable type" in text
    )


def test_hook_ids_cannot_be_written_by_parsed_code() -> None:
    for hook in guards.HOOK_NAMES:
        assert not hook.isidentifier() and not hook.startswith("__"), hook


def test_class_body_hooks_skip_the_class_namespace() -> None:
    """Even a class namespace that holds the hook keys (a metaclass `__prepare__` the cell does not have)
    cannot shadow them: class bodies look the hooks up as globals."""
    code = prepare(
        "import json\nclass A:\n    json.JSONDecoder.decode = len\n    x = '{0}'.format(1)\n", "<t>"
    )

    def walk(co: Any) -> Iterator[Any]:
        yield co
        for const in co.co_consts:
            if hasattr(const, "co_code"):
                yield from walk(const)

    body = next(co for co in walk(code) if co.co_name == "A")
    loads = {
        (ins.opname, ins.argval) for ins in dis.get_instructions(body) if ins.argval in guards.HOOK_NAMES
    }
    assert loads == {("LOAD_GLOBAL", guards.MUT_HOOK), ("LOAD_GLOBAL", guards.ATTR_HOOK)}, loads

    class Prefilled(type):
        @classmethod
        def __prepare__(mcs, name: str, bases: tuple[type, ...], /, **kw: Any) -> MutableMapping[str, object]:
            return {hook: (lambda o, *a: o) for hook in guards.HOOK_NAMES}

    space = SandboxNamespace(100)
    space.start(None, {})
    src = "import json\nclass A(metaclass=P):\n    json.JSONDecoder.decode = len\n"
    space.ns["P"] = Prefilled  # assume-breach: the cell holds such a metaclass
    with pytest.raises(GuardError):
        exec(prepare(src, "<t>"), space.ns)
    assert json.JSONDecoder.decode is not len  # type: ignore[comparison-overlap]


# --- 1. assume-breach: objects that lie, handed to the guards directly --------------------------------
class _Flip:
    """What the AST check no longer lets a cell write: `__class__` answering "a class" once."""

    __annotations__ = {"x": "type('Z', (), {'b': __builtins__})"}  # the string a cell wrote
    reads = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        type(self).reads += 1
        return type if type(self).reads == 1 else int


def test_singledispatch_register_checks_the_real_type(ns: SandboxNamespace) -> None:
    ns.ns["Flip"] = _Flip
    try:
        exc = run(
            ns,
            "import functools\n@functools.singledispatch\ndef g(x):\n    return 0\n"
            "g.register(Flip())\nleak = [k for k in g.registry if k is not object]",
        )
    finally:
        del ns.ns["Flip"]
    assert isinstance(exc, GuardError) and "the class itself" in str(exc), exc
    assert "leak" not in ns.ns


def test_real_subclass_ignores_what_an_object_claims() -> None:
    class Bases:
        @property
        def __bases__(self) -> tuple[type, ...]:
            return (str,)

    class Meta(type):
        def __subclasscheck__(cls, sub: Any) -> bool:
            return True

        def __eq__(cls, other: object) -> bool:
            return True

        __hash__ = type.__hash__

    liar = Meta("Liar", (), {})
    assert isinstance(_Flip(), type) and issubclass(Bases(), str)  # type: ignore[arg-type]
    assert not guards.real_subclass(_Flip(), object) and not guards.real_subclass(Bases(), str)
    assert not guards.real_subclass(liar, str) and guards.real_subclass(liar, object)
    assert guards.real_subclass(bool, int) and not guards.real_subclass(1, int)


def test_exact_str_of_a_liar() -> None:
    class Claims:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return str

    with pytest.raises(TypeError, match="must be a str, not Claims"):
        guards.exact_str(Claims(), "name")


def test_visible_type_ignores_metaclass_eq_and_hash() -> None:
    class Meta(type):
        def __eq__(cls, other: object) -> bool:
            return True

        def __hash__(cls) -> int:
            return hash(type)

    cell_class = Meta("X", (), {"__module__": guards.CELL_MODULE})
    assert guards.SafeType(cell_class()) is cell_class  # type: ignore[comparison-overlap]


def test_is_cell_class_needs_an_exact_module_str() -> None:
    class Module(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    class Claims:
        def __eq__(self, other: object) -> bool:
            return True

    real = type("Real", (), {})
    for forged in (Claims(), Module("json")):
        real.__module__ = forged  # type: ignore[assignment]
        assert not guards.is_cell_class(real)


def test_check_mutable_reads_nothing_from_the_object() -> None:
    reads: list[str] = []

    class Claims:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            reads.append("__class__")
            return types.FunctionType

        @property
        def __code__(self) -> Any:
            reads.append("__code__")
            return compile("", "<cell 1>", "exec")

    safe_modules.check_mutable(Claims())  # an instance a cell made: fine
    assert reads == []
    with pytest.raises(GuardError):
        safe_modules.check_mutable(json.dumps)


def test_guarded_attr_reads_no_self_from_cell_objects() -> None:
    reads: list[str] = []

    class Bound:
        @property
        def __self__(self) -> str:
            reads.append("__self__")
            return "{0.__class__}"

    class Holder:
        format = Bound()

    assert type(safe_modules.guarded_attr(Holder(), "format")) is Bound
    assert reads == []

    class S(str):
        pass

    fmt = safe_modules.guarded_attr(super(S, S("{0.__class__}")), "format")  # a real bound C method
    with pytest.raises(GuardError):
        fmt(1)


def test_abc_register_checks_the_real_metaclass() -> None:
    class Claims:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return abc.ABCMeta

    cell_class = type("C", (), {"__module__": guards.CELL_MODULE})
    with pytest.raises(TypeError, match="abstract base class"):
        safe_modules._check_abc_register(Claims(), cell_class)


def test_no_new_eval_in_the_allowed_modules() -> None:
    """Nothing a cell can reach evaluates a string, except the two audited places: namedtuple's
    `eval` (exact-str identifiers only, empty builtins) and singledispatch's annotation path (closed
    by `register` taking real classes only). A Python upgrade that adds one fails here."""
    found: set[tuple[str, str]] = set()
    for name in sorted(guards.ALLOWED_MODULES):
        path = getattr(importlib.import_module(name), "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as fh:
            tokens = list(tokenize.generate_tokens(fh.readline))
        for prev, tok, nxt in zip(tokens, tokens[1:], tokens[2:], strict=False):
            if (
                tok.type == tokenize.NAME
                and tok.string in _EVALUATORS
                and prev.string not in (".", "def")
                and nxt.string in ("(", ")", ",")
            ):  # the builtin itself, called or passed on
                found.add((name, tok.string))
    assert found <= {("collections", "eval"), ("functools", "get_type_hints")}, found


_EVALUATORS = frozenset(
    {"eval", "exec", "compile", "get_type_hints", "ForwardRef", "__import__", "import_module"}
)


# the real objects a cell reaches through the proxies, and what must not change about them
TARGETS: dict[str, tuple[str, str]] = {
    # name in the cell: (expression, an attribute it has)
    "decoder": ("json.JSONDecoder", "decode"),
    "counter": ("collections.Counter", "most_common"),
    "ordered": ("collections.OrderedDict", "move_to_end"),
    "dumps": ("json.dumps", "x"),
    "proxy": ("json", "loads"),
    "wrapper": ("textwrap.TextWrapper", "wrap"),
    "normal": ("statistics.NormalDist", "samples"),
    "clock": ("datetime.date", "fromtimestamp"),  # deleting the override would bring back local time
    "abc": ("collections.abc.Sequence", "index"),
}


def _state() -> dict[str, Any]:
    """What must stay as it is: the namespaces of the real targets, the ABC registry, the proxies."""
    return {
        "JSONDecoder": dict(vars(json.JSONDecoder)),
        "Counter": dict(vars(collections.Counter)),
        "dumps": dict(vars(json.dumps)),
        "TextWrapper": dict(vars(textwrap.TextWrapper)),
        "NormalDist": dict(vars(statistics.NormalDist)),
        "Sequence": dict(vars(collections.abc.Sequence)),
        "dict_is_sequence": issubclass(dict, collections.abc.Sequence),
        "json_loads": json.loads,
        "date": dict(vars(safe_modules._date)),
    }


@pytest.fixture
def guarded_state() -> Iterator[Callable[[], None]]:
    """Check-and-restore: a test that escaped must not poison the next ones."""
    before = _state()

    def check() -> None:
        assert _state() == before

    yield check
    for cls, saved in (
        (json.JSONDecoder, before["JSONDecoder"]),
        (collections.Counter, before["Counter"]),
        (textwrap.TextWrapper, before["TextWrapper"]),
        (statistics.NormalDist, before["NormalDist"]),
        (safe_modules._date, before["date"]),
    ):
        for key in set(vars(cls)) - set(saved):
            delattr(cls, key)
        for key, value in saved.items():
            if key not in ("__dict__", "__weakref__", "__doc__") and vars(cls).get(key) is not value:
                setattr(cls, key, value)
    json.dumps.__dict__.clear()
    json.dumps.__dict__.update(before["dumps"])


# Statement actions ({T}: the target expression, {A}: its attribute), then expression actions.
STMT_ACTIONS = (
    "{T}.{A} = len",
    "del {T}.{A}",
    "{T}.{A} += 1",
    "{T}.{A}: int = 1",
    "for {T}.{A} in [len]:\n    pass",
    "(_a, {T}.{A}) = (1, len)",
    "[{T}.{A}] = [len]",
    "with open_nothing() as {T}.{A}:\n    pass",
)
EXPR_ACTIONS = (
    "'{{0.__class__}}'.format(1)",
    "'{{x.__globals__}}'.format_map({{'x': len}})",
    "str.format('{{0.__class__}}', 1)",
    "collections.abc.Sequence.register(dict)",
    "[0 for {T}.{A} in [len]]",
)
# Hook shadows a cell may try; each must be refused (or be harmless) wherever it is placed.
SHADOWS = (
    "",
    "def __rr_mut__(o):\n    return o\n",
    "def __rr_attr__(o, name):\n    return o\n",
    "def __rr_display__(v):\n    return v\n",
    "__rr_mut__ = lambda o: o\n",
)

# Scope templates: a line "@S" (at some indentation) is the statement action, "@H" the shadow, both
# at that indentation; "@E" in a line is the expression action.
STMT_SCOPES = (
    "@H\n@S",
    "class C:\n    @H\n    @S",
    "class C:\n    class D:\n        @H\n        @S",
    "class C:\n    @H\n    def m(self):\n        @S\nC().m()",
    "def f():\n    @H\n    def g():\n        @S\n    g()\nf()",
    "class C:\n    @H\n    def m(self):\n        def g():\n            @S\n        g()\n        return 0\n    k = m(None)",
    "match 1:\n    case 1:\n        @H\n        @S",
    "class C:\n    match 1:\n        case _:\n            @H\n            @S",
    "try:\n    @H\n    @S\nfinally:\n    pass",
    "class C:\n    if True:\n        @H\n        @S",
    "class C:\n    while True:\n        @H\n        @S\n        break",
    "class C:\n    try:\n        @H\n        @S\n    except ZeroDivisionError:\n        pass",
)
EXPR_SCOPES = (
    "@H\n_r = @E",
    "class C:\n    @H\n    _r = @E",
    "class C:\n    class D:\n        @H\n        _r = @E",
    "class C:\n    @H\n    _r = [@E for _ in [0]]",
    "class C:\n    @H\n    _r = {@E for _ in [0]}",
    "class C:\n    @H\n    _r = {0: @E for _ in [0]}",
    "class C:\n    @H\n    _r = list(@E for _ in [0])",
    "class C:\n    @H\n    _r = (lambda: @E)()",
    "class C:\n    @H\n    def m(self, d=lambda: @E):\n        return d()\n    _r = m(None)",
    "@H\n_r = [@E for _ in [0]]",
    "@H\n_r = list(@E for _ in [0])",
    "@H\n_r = (lambda: @E)()",
    "@H\ndef f(d=@E):\n    return d",
    "@H\n@(lambda fn: @E)\ndef f():\n    pass",
    "class C:\n    @H\n    @(lambda fn: @E)\n    def f(self):\n        pass",
    "@H\nmatch 1:\n    case 1 if @E:\n        pass",
    "class C:\n    @H\n    _r = [[@E for _ in [0]] for _ in [0]]",
    "class C:\n    @H\n    class D(dict, x=@E):\n        pass",
)
PRELUDE = (
    "import json, collections, collections.abc, textwrap, statistics, datetime\n"
    "class open_nothing:\n    def __enter__(self):\n        return len\n"
    "    def __exit__(self, *a):\n        return False\n"
)


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in text.splitlines() if line.strip()]


def fill(template: str, stmt: str, shadow: str, expr: str = "") -> str:
    """Expand a scope template: "@S" / "@H" lines become the (indented) action / shadow."""
    lines: list[str] = []
    for line in template.splitlines():
        mark = line.strip()
        prefix = line[: len(line) - len(line.lstrip())]
        if mark == "@S":
            lines += _indent(stmt, prefix)
        elif mark == "@H":
            lines += _indent(shadow, prefix)
        else:
            lines.append(line.replace("@E", expr))
    return "\n".join(lines) + "\n"


def build_cell(scope: str, action: str, target: str, shadow: str) -> str:
    """One fuzz cell: the action on `target`, placed in `scope`, with `shadow` in the same scope."""
    expr, attr = TARGETS[target]
    text = action.format(T=expr, A=attr)
    return PRELUDE + fill(scope, text, shadow, text.replace("\n", " "))


def _fuzz_cases(shadowed: bool) -> list[str]:
    """Every scope x action x target, bare (`shadowed=False`) or with one of the shadows (rotating)."""
    cells: list[str] = []
    shadows = itertools.cycle(SHADOWS[1:])
    for scope, action, target in itertools.product(STMT_SCOPES, STMT_ACTIONS, TARGETS):
        cells.append(build_cell(scope, action, target, next(shadows) if shadowed else ""))
    for scope, action, target in itertools.product(EXPR_SCOPES, EXPR_ACTIONS, ("decoder", "proxy", "abc")):
        cells.append(build_cell(scope, action, target, next(shadows) if shadowed else ""))
    return cells


BARE_CELLS = _fuzz_cases(shadowed=False)
FUZZ_CELLS = BARE_CELLS + _fuzz_cases(shadowed=True)


class Prefilled(type):
    """Assume-breach: a metaclass whose class namespaces already bind every hook id to a pass-through
    (what a cell would get if it could ever write such a key), so only the way class bodies look the
    hooks up stands between the cell and the real classes."""

    @classmethod
    def __prepare__(mcs, name: str, bases: tuple[type, ...], /, **kw: Any) -> MutableMapping[str, object]:
        return {
            guards.MUT_HOOK: lambda o: o,
            guards.ATTR_HOOK: lambda o, name: getattr(o, name),
            guards.DISPLAY_HOOK: lambda v: None,
        }


def test_fuzz_cells_are_valid_python() -> None:
    """The generator makes real cells (a fuzz of syntax errors would prove nothing)."""
    for cell in FUZZ_CELLS:
        ast.parse(cell)
    assert len(FUZZ_CELLS) > 1000


def test_fuzz_every_scope_fails_closed(ns: SandboxNamespace, guarded_state: Callable[[], None]) -> None:
    """Every placement of a mutation / hooked read, with or without a shadow attempt, is refused and
    leaves the real objects as they were."""
    escaped = []
    for cell in FUZZ_CELLS:
        exc = run(ns, cell)
        if not fails_closed(exc):
            escaped.append((cell, repr(exc)))
    assert not escaped, f"{len(escaped)} cells got through, e.g.:\n{escaped[0][0]}\n-> {escaped[0][1]}"
    guarded_state()


_SCOPE_WRAPPERS = (
    "class K:\n    @H\n    @S",
    "def f():\n    @H\n    @S\n    return 0\nf()",
    "class K:\n    @H\n    def m(self):\n        @S\n        return 0\n    _v = m(None)",
    "for _i in [0]:\n    @H\n    @S",
    "if True:\n    @H\n    @S",
    "class K:\n    _v = [0 for _ in [0]]\n    @S",
)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    chain=st.lists(st.integers(0, len(_SCOPE_WRAPPERS) - 1), min_size=1, max_size=4),
    action=st.sampled_from(STMT_ACTIONS[:4]),
    target=st.sampled_from(sorted(TARGETS)),
    shadow=st.sampled_from(SHADOWS),
)
def test_fuzz_nested_scopes(
    ns: SandboxNamespace, chain: list[int], action: str, target: str, shadow: str
) -> None:
    """Random nestings of classes, functions, methods and blocks (the shadow at every level)."""
    expr, attr = TARGETS[target]
    block = fill("@H\n@S", action.format(T=expr, A=attr), shadow)
    for kind in reversed(chain):
        block = fill(_SCOPE_WRAPPERS[kind], block, shadow)
    before = _state()
    exc = run(ns, PRELUDE + block)
    assert fails_closed(exc), (PRELUDE + block, exc)
    assert _state() == before


def test_fuzz_prepared_class_namespaces_cannot_shadow(
    ns: SandboxNamespace, guarded_state: Callable[[], None]
) -> None:
    """The bare fuzz cells again, every class of them made with `Prefilled`: still all refused."""
    ns.ns["P"] = Prefilled
    escaped = []
    try:
        for cell in BARE_CELLS:
            if "class " not in cell.replace("class open_nothing", ""):
                continue
            code = cell.replace("class C:", "class C(metaclass=P):").replace(
                "class D:", "class D(metaclass=P):"
            )
            code = code.replace("class D(dict, x=", "class D(dict, metaclass=P, x=")
            exc = run(ns, code)
            if not fails_closed(exc):
                escaped.append((code, repr(exc)))
    finally:
        del ns.ns["P"]
    assert not escaped, f"{len(escaped)} cells got through, e.g.:\n{escaped[0][0]}\n-> {escaped[0][1]}"
    guarded_state()


def test_module_proxy_stays_a_proxy(ns: SandboxNamespace) -> None:
    assert type(ns.ns["json"]) is ModuleProxy
    assert run(ns, "json.loads = len") is not None
    assert run(ns, "print(json.loads('[1]'))") is None


def test_type_namespace_refuses_lying_slots(ns: SandboxNamespace) -> None:
    """`type()` with a `__slots__` entry named like a denied key would put that descriptor on the class."""
    for slots in ("('__class__',)", "'__class__'", "['__rr_mut__']", "('rr:mut',)", "iter(['__class__'])"):
        exc = run(ns, f"X = type('X', (), {{'__slots__': {slots}}})")
        assert isinstance(exc, GuardError), (slots, exc)
    assert run(ns, "X = type('X', (), {'__slots__': ('a', '__dict__')})\nx = X()\nx.a = 1\nx.b = 2") is None


async def test_real_class_registered_through_a_cell_abc(executor: SubprocessExecutor) -> None:
    """A real ABC asks its subclasses' (and registered classes') registries: registering `dict` with a
    cell subclass of `Sequence`, or with a cell ABC later registered with it, made `dict` a Sequence for
    the host and every later cell."""
    for code in (
        "import collections.abc\nclass S(collections.abc.Sequence):\n    pass\nS.register(dict)",
        "import collections.abc\nclass A(metaclass=type(collections.abc.Sequence)):\n    pass\n"
        "A.register(dict)\ncollections.abc.Sequence.register(A)",
        "import collections.abc\nclass S(collections.abc.Sized):\n    pass\ntype(S).register(S, int)",
    ):
        r = await attempt(executor, code)
        assert "only classes defined in a cell" in (r.error or ""), r
    r = await executor.run_cell(
        "import collections.abc\nprint(isinstance({}, collections.abc.Sequence), isinstance(1, collections.abc.Sized))\n"
        "class S(collections.abc.Sequence):\n    pass\nclass Mine:\n    pass\nS.register(Mine)\n"
        "collections.abc.Sequence.register(Mine)\nprint(isinstance(Mine(), S), isinstance({}, S))"
    )
    assert r.ok and r.stdout == "False False\nTrue False\n", r
