"""Language-layer gadgets found by reading guards.py / safe_modules.py: one case per shape.

Each attack must be refused or contained (never the secret, never host internals), and the same
executor must still run `print(1+1)` afterwards (see `attempt`). The cases that need the host's
own objects (its modules, its pickler) run the sandbox namespace in-process at the end of the file.
"""

from __future__ import annotations

import copyreg
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.executor import SubprocessExecutor
from sandbox.host.guards import ALLOWED_MODULES, allowed_modules_text, module_refusal
from sandbox.host.namespace import FINAL_ANSWER_MAX_BYTES
from sandbox.protocol import CellResult
from tests.sandbox.conftest import CONTAINED, GUARD, TEST_LIMITS
from tests.sandbox.conftest import attempt as _attempt

pytestmark = pytest.mark.timeout(30)


async def attempt(ex: SubprocessExecutor, code: str, kinds: tuple[str, ...] = GUARD) -> CellResult:
    """The shared attack check, and nothing printed may be a class listing or a module."""
    return await _attempt(ex, code, kinds, never_printed=("__subclasses__",), never_shown=("<module '",))


async def works(ex: SubprocessExecutor, code: str, stdout: str) -> None:
    result = await ex.run_cell(code)
    assert result.ok, result
    assert result.stdout == stdout, result


# --- 1. type() of what a checked wrapper hands out -------------------------------------------------
async def test_type_of_attrgetter_is_not_the_real_constructor(executor: SubprocessExecutor) -> None:
    await attempt(
        executor, "import operator\nA = type(operator.attrgetter('x'))\nA('__class__')(1)", CONTAINED
    )


async def test_type_of_methodcaller_is_not_the_real_constructor(executor: SubprocessExecutor) -> None:
    code = "import operator\nM = type(operator.methodcaller('x'))\nM('__reduce_ex__', 2)(print)"
    await attempt(executor, code, CONTAINED)


async def test_type_of_wrapper_through_decorator(executor: SubprocessExecutor) -> None:
    code = "import operator\n@type(operator.attrgetter('x'))\ndef g():\n    pass\n"
    await attempt(executor, code, CONTAINED)


async def test_checked_wrappers_hand_out_plain_functions(executor: SubprocessExecutor) -> None:
    code = (
        "import operator, functools\n"
        "made = [operator.attrgetter('a'), operator.attrgetter('a', 'b.c'), operator.methodcaller('m', 1),\n"
        "        functools.wraps(len), functools.singledispatch(lambda x: x)]\n"
        "print(all(type(x) is type(lambda: 0) for x in made))\n"
        "class P:\n    a = 1\n    def m(self, k):\n        return k + 1\n"
        "print(operator.attrgetter('a')(P()), operator.methodcaller('m', 1)(P()))"
    )
    await works(executor, code, "True\n1 2\n")


# --- 2. str subclasses whose methods lie -----------------------------------------------------------
LIAR = "class S(str):\n    def __str__(self):\n        return 'x'\n    def split(self, sep=None):\n        return ['x']\n"


async def test_lying_str_attrgetter(executor: SubprocessExecutor) -> None:
    await attempt(executor, LIAR + "import operator\noperator.attrgetter(S('__class__'))(1)")


async def test_lying_str_methodcaller(executor: SubprocessExecutor) -> None:
    await attempt(executor, LIAR + "import operator\noperator.methodcaller(S('__reduce_ex__'), 2)(print)")


async def test_lying_str_format(executor: SubprocessExecutor) -> None:
    await attempt(executor, LIAR + "S('{0.__class__}').format(1)")
    await attempt(executor, LIAR + "S('{x.__class__}').format_map({'x': 1})")
    await attempt(executor, LIAR + "f = str.format\nf(S('{0.__class__}'), 1)")


async def test_lying_str_namespace_key(executor: SubprocessExecutor) -> None:
    await attempt(executor, LIAR + "type('X', (), {S('__match_args__'): ('gi_frame',)})")


async def test_lying_str_helper_name(executor: SubprocessExecutor) -> None:
    code = (
        "class S(str):\n    def isidentifier(self):\n        return True\n"
        "    def startswith(self, p):\n        return False\n"
        "register_helper(S('__builtins__'), 'def f():\\n    return 1')"
    )
    await attempt(executor, code)


async def test_lying_str_archive_name(executor: SubprocessExecutor) -> None:
    # A subclass could steer the path (`name[:2]`, `sep + name`) and the hash comparison; see also
    # test_read_archive_needs_an_exact_str.
    code = (
        "class S(str):\n"
        "    def __getitem__(self, i):\n        return '../../../../etc'\n"
        "    def __radd__(self, other):\n        return '/etc/passwd'\n"
        "    def __ne__(self, other):\n        return False\n"
        "ARCHIVE(S('0' * 64))"
    )
    r = await attempt(executor, code, CONTAINED)
    assert "root:" not in r.stdout + (r.error or "")


def test_read_archive_needs_an_exact_str(tmp_path: Path) -> None:
    from sandbox.host.namespace import read_archive

    class S(str):
        def __getitem__(self, i: object) -> str:
            return "../../../../etc"

    with pytest.raises(ValueError, match="expected a sha256"):
        read_archive(str(tmp_path), S("0" * 64))


# --- 3. functools.partial / wraps leaking the unchecked function -----------------------------------
async def test_wraps_func_is_not_update_wrapper(executor: SubprocessExecutor) -> None:
    code = (
        "import functools\nclass W:\n    pass\nw = W()\n"
        "functools.wraps(SHOW_VARS).func(w, SHOW_VARS, assigned=('__globals__',), updated=())"
    )
    await attempt(executor, code, CONTAINED)
    code = "import functools\nfunctools.wraps(SHOW_VARS).args"
    await attempt(executor, code, CONTAINED)


async def test_update_wrapper_does_not_hand_out_class_dict(executor: SubprocessExecutor) -> None:
    # The real update_wrapper does wrapper.__dict__.update(wrapped.__dict__): with wrapped=type and a
    # cell object as wrapper.__dict__ the cell got type.__dict__ ('__subclasses__', ... : an escape).
    code = (
        "import functools\n"
        "class D:\n    def update(self, m):\n        self.m = m\n"
        "class W:\n    @property\n    def __dict__(self):\n        return dd\n"
        "dd = D()\nfunctools.update_wrapper(W(), type)\n"
        "print(sorted(dd.m)[:3])"
    )
    await attempt(executor, code, CONTAINED)


async def test_wraps_still_works(executor: SubprocessExecutor) -> None:
    code = (
        "import functools\n"
        "def deco(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a) * 2\n    return inner\n"
        "@deco\ndef double(x):\n    'doc'\n    return x\n"
        "double.tag = 'mine'\n"
        "print(double(2), double.__name__, double.tag)\n"
        "p = functools.partial(len)\nprint(p.func is len, p('abc'))"
    )
    await works(executor, code, "4 double mine\nTrue 3\n")


# --- 4. class factories: removed modules, checked 3-argument type() ---------------------------------
@pytest.mark.parametrize("module", ["dataclasses", "enum", "typing", "copy", "copyreg"])
async def test_class_factory_modules_are_not_importable(executor: SubprocessExecutor, module: str) -> None:
    r = await attempt(executor, f"import {module}")
    assert "allowed modules" in (r.error or "")


async def test_dataclass_on_type_made_class(executor: SubprocessExecutor) -> None:
    code = (
        "import dataclasses\n"
        "C = type('C', (), {'__annotations__': {'x=().__class__.__base__.__subclasses__()': int}})\n"
        "dataclasses.dataclass(C)"
    )
    await attempt(executor, code)


async def test_type_three_args_checks_namespace(executor: SubprocessExecutor) -> None:
    await attempt(executor, "type('X', (), {'__init_subclass__': classmethod(lambda c: 1)})")
    await attempt(executor, "type('X', (), {'__del__': lambda s: print('late')})")
    await attempt(executor, "type('X', (), {'__module__': 'builtins', 'x': 1})")


async def test_real_type_is_not_reachable(executor: SubprocessExecutor) -> None:
    await attempt(executor, "type(type)('X', (), {'__match_args__': ('gi_frame',)})")
    await attempt(executor, "class C:\n    pass\ntype(C)('X', (), {'__set_name__': print})")
    await attempt(executor, "int.mro()[-1]")
    await attempt(executor, "import operator\noperator.methodcaller('mro')(int)")


async def test_real_metaclass_is_checked(executor: SubprocessExecutor) -> None:
    await attempt(executor, "M = type(collections.abc.Sized)\nM('Y', (), {'__del__': lambda s: 1})")
    await attempt(
        executor, "import re\nE = type(re.RegexFlag)\nE('Y', (), {'__reduce_ex__': print})", CONTAINED
    )


async def test_cell_metaclass_direct_call_is_checked(executor: SubprocessExecutor) -> None:
    code = "class M(type):\n    pass\nM('Y', (), {'__getattribute__': lambda s, n: n})"
    await attempt(executor, code)


async def test_type_still_works(executor: SubprocessExecutor) -> None:
    code = (
        "T = type('T', (), {'a': 1, 'twice': lambda self: 2 * self.a})\n"
        "class M(type):\n    pass\n"
        "class X(metaclass=M):\n    def __init__(self):\n        self.v = '{}!'.format(1)\n"
        "class A(collections.abc.Mapping):\n"
        "    def __getitem__(self, k):\n        return 1\n"
        "    def __len__(self):\n        return 0\n"
        "    def __iter__(self):\n        return iter(())\n"
        "print(T().twice(), type(1).__name__, type(int) is type, isinstance(int, type), issubclass(M, type))\n"
        "print(type(X) is M, X().v, isinstance(A(), collections.abc.Mapping), type(T) is type)"
    )
    await works(executor, code, "2 int True True True\nTrue 1! True True\n")


# --- 5. writing into real modules (module= / __module__) ---------------------------------------------
async def test_enum_global_enum_into_guard_module(executor: SubprocessExecutor) -> None:
    await attempt(
        executor, "import enum\nenum.global_enum(enum.Enum('E', 'a b', module='sandbox.host.guards'))"
    )


async def test_namedtuple_module_argument(executor: SubprocessExecutor) -> None:
    await attempt(executor, "collections.namedtuple('P', 'x y', module='sandbox.host.guards')")
    await works(
        executor,
        "P = collections.namedtuple('P', 'x y')\nP.extra = 3\nprint(P(1, 2).x, P.extra, P(1, 2)._asdict())",
        "1 3 {'x': 1, 'y': 2}\n",
    )


# --- 6. mutating real classes (json framing, pure-Python stdlib classes) -----------------------------
async def test_json_encoder_encode_is_read_only(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "json.JSONEncoder.encode = lambda self, o: '{\"ok\": true}'")
    assert "not defined in a cell" in (r.error or "")


async def test_json_decoder_decode_is_read_only(executor: SubprocessExecutor) -> None:
    await attempt(executor, "json.JSONDecoder.decode = lambda self, s: {'op': 'cell', 'code': 'x'}")
    await attempt(executor, "del json.JSONEncoder.default")
    await attempt(executor, "json.JSONEncoder.iterencode = json.JSONEncoder.iterencode")


@pytest.mark.parametrize(
    "target",
    [
        "collections.OrderedDict",
        "collections.Counter",
        "collections.defaultdict",
        "collections.ChainMap",
        "collections.UserDict",
        "collections.abc.Mapping",
        "string.Template",
        "textwrap.TextWrapper",
        "difflib.SequenceMatcher",
        "pprint.PrettyPrinter",
        "statistics.NormalDist",
        "fractions.Fraction",
        "datetime.datetime",
        "datetime.date",
        "decimal.Context",
        "re.RegexFlag",
        "json.JSONDecodeError",
    ],
)
async def test_stdlib_class_attributes_are_read_only(executor: SubprocessExecutor, target: str) -> None:
    module = target.split(".")[0]
    await attempt(executor, f"import {module}\n{target}.hijacked = 1", CONTAINED)
    await attempt(executor, f"import {module}\n{target}.hijacked += 1", CONTAINED)


async def test_class_mutation_through_helpers_and_aliases(executor: SubprocessExecutor) -> None:
    await attempt(executor, "E = json.JSONEncoder\nfor k in ['encode']:\n    E.x = 1")
    await attempt(
        executor, "import functools\ndef f():\n    pass\nfunctools.update_wrapper(json.JSONEncoder, f)"
    )
    await attempt(executor, "import functools\nfunctools.total_ordering(json.JSONEncoder)")
    await attempt(executor, "class E(json.JSONEncoder):\n    pass\n[b for b in [json.JSONEncoder]][0].x = 1")


async def test_module_functions_and_singletons_are_read_only(executor: SubprocessExecutor) -> None:
    await attempt(executor, "json.dumps.x = 1")
    await attempt(executor, "json.JSONEncoder.encode.x = 1")
    await attempt(executor, "import re\nre.IGNORECASE.x = 1", CONTAINED)
    await attempt(
        executor, "import textwrap\ntextwrap.TextWrapper.unicode_whitespace_trans[32] = 'X'", CONTAINED
    )
    await attempt(executor, "import decimal\ndecimal.DefaultContext.prec = 3", CONTAINED)


async def test_abc_registry_of_real_classes(executor: SubprocessExecutor) -> None:
    await attempt(executor, "collections.abc.Sequence.register(dict)")
    await attempt(executor, "M = type(collections.abc.Sequence)\nM.register(collections.abc.Sequence, dict)")
    await attempt(executor, "import operator\noperator.attrgetter('register')(collections.abc.Sequence)")
    await works(
        executor,
        "class Mine:\n    pass\ncollections.abc.Sequence.register(Mine)\n"
        "print(isinstance(Mine(), collections.abc.Sequence), isinstance({}, collections.abc.Sequence))",
        "True False\n",
    )


async def test_framing_survives_refused_mutation(executor: SubprocessExecutor) -> None:
    await attempt(executor, "json.JSONEncoder.encode = lambda self, o: 'forged'")
    r = await executor.run_cell("FINAL_ANSWER({'a': [1, 2]})\nprint(json.dumps({'b': 1}))")
    assert r.ok and r.submitted == {"a": [1, 2]} and r.stdout.endswith('{"b": 1}\n'), r


async def test_cell_objects_stay_mutable(executor: SubprocessExecutor) -> None:
    code = (
        "class A:\n    n = 0\n    def bump(self):\n        self.n += 1\n        return self\n"
        "A.extra = 1\nA.extra += 1\ndel A.extra\n"
        "class E(json.JSONEncoder):\n    def default(self, o):\n        return sorted(o)\n"
        "E.item_separator = ';'\n"
        "def f():\n    pass\nf.tag = 1\n"
        "enc = json.JSONEncoder()\nenc.indent = 2\n"
        "print(A().bump().bump().n, json.dumps([{2, 1}, 3], cls=E), f.tag, enc.indent)"
    )
    await works(executor, code, "2 [[1;2];3] 1 2\n")


# --- 7. lone surrogates ----------------------------------------------------------------------------
async def test_print_lone_surrogate(executor: SubprocessExecutor) -> None:
    r = await executor.run_cell("print('a\\ud800b')\nFINAL_ANSWER('\\udc00')")
    assert r.ok, r
    assert r.stdout.startswith("a\\ud800b\n"), r.stdout
    r.stdout.encode("utf-8")  # what the worker got is valid UTF-8
    assert (await executor.run_cell("print(1+1)")).stdout == "2\n"


@pytest.fixture
async def surrogate_session(tmp_path: Path) -> AsyncIterator[SubprocessExecutor]:
    path = tmp_path / "trace.json"
    path.write_text('{"question": "q\\ud800", "steps": [{"role": "user", "content": "\\ud800 hi"}]}')
    ex = SubprocessExecutor(TEST_LIMITS)
    await ex.start(str(path), "auto", {"task": {"question": "q"}})
    yield ex
    await ex.close()


async def test_trace_with_lone_surrogate(surrogate_session: SubprocessExecutor) -> None:
    r = await surrogate_session.run_cell("describe_traces()\nprint(traces)")
    assert r.ok, r
    assert "\\ud800" in r.stdout
    r.stdout.encode("utf-8")
    assert (await surrogate_session.run_cell("print(1+1)")).stdout == "2\n"


# --- 8. randomness ---------------------------------------------------------------------------------
async def test_normal_dist_samples(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "import statistics\nstatistics.NormalDist().samples(3)")
    assert "no randomness" in (r.error or "")
    await attempt(executor, "import statistics\nstatistics.NormalDist().samples(3, seed=1)")
    await attempt(
        executor, "import statistics, operator\noperator.methodcaller('samples', 2)(statistics.NormalDist())"
    )
    await works(
        executor, "import statistics\nprint(round(statistics.NormalDist(0, 1).inv_cdf(0.5), 3))", "0.0\n"
    )


async def test_no_random_or_clock_module(executor: SubprocessExecutor) -> None:
    for code in ("import random", "import uuid", "import secrets", "import time", "import os"):
        await attempt(executor, code)
    await attempt(executor, "datetime.datetime.mro()[1].now()")


# --- 9. FINAL_ANSWER size --------------------------------------------------------------------------
async def test_final_answer_is_capped(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, f"FINAL_ANSWER('x' * {FINAL_ANSWER_MAX_BYTES + 1})", ("runtime",))
    assert "limit" in (r.error or "") and f"{FINAL_ANSWER_MAX_BYTES:,}" in (r.error or "")
    ok = await executor.run_cell("FINAL_ANSWER({'summary': 'x' * 1000})")
    assert ok.ok and ok.submitted == {"summary": "x" * 1000}


# --- 10. pickle / copy dispatch tables -------------------------------------------------------------
async def test_copy_dispatch_tables_are_unreachable(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import copy\ncopy.dispatch_table[int] = print")
    await attempt(executor, "import copyreg\ncopyreg.pickle(int, print)")
    await attempt(executor, "import pickle\npickle.dumps(1)")


def test_no_proxy_hands_out_a_pickle_registry() -> None:
    from sandbox.host.safe_modules import SafeImporter

    registries = {id(copyreg.dispatch_table), id(copyreg._extension_registry), id(copyreg._inverted_registry)}  # type: ignore[attr-defined]
    importer = SafeImporter()
    for name in ALLOWED_MODULES:
        attrs = object.__getattribute__(importer.proxy(name), "_rr_attrs")
        for key, value in attrs.items():
            assert id(value) not in registries, f"{name}.{key}"
            for inner in vars(value).values() if isinstance(value, type) else ():
                assert id(inner) not in registries, f"{name}.{key}"


def test_snapshot_pickler_ignores_later_copyreg_entries() -> None:
    from sandbox.host.snapshot_pickle import _Pickler

    class Late:
        pass

    calls: list[object] = []
    copyreg.dispatch_table[Late] = lambda obj: calls.append(obj) or (Late, ())  # type: ignore[func-returns-value]
    try:
        with pytest.raises(Exception):  # noqa: B017 - refused as session-defined, whatever the type
            _Pickler(io.BytesIO(), {}).dump(Late())
        _Pickler(io.BytesIO(), {}).dump([1, "a", (2.0,)])
    finally:
        del copyreg.dispatch_table[Late]
    assert calls == []


def test_snapshot_refuses_forged_builtin_module() -> None:
    from sandbox.host.snapshot import SnapshotRefused
    from sandbox.host.snapshot_pickle import _Pickler

    forged = type("range", (), {"__module__": "builtins", "__reduce_ex__": lambda self, p: (print, ("x",))})
    with pytest.raises(SnapshotRefused):
        _Pickler(io.BytesIO(), {}).dump(forged())


# --- the model is told exactly what is importable --------------------------------------------------
def test_prompt_lists_exactly_the_allowlist() -> None:
    from reflector.analysis import prompts

    text = prompts.SYSTEM
    assert allowed_modules_text() in text
    for removed in ("dataclasses", "enum", "typing", "copy "):
        assert removed not in text.split("modules can be imported:")[1].split(";")[0] + " "
    refusal = module_refusal("os")
    assert all(m in refusal for m in ALLOWED_MODULES)


async def test_show_vars_lists_the_allowlist(executor: SubprocessExecutor) -> None:
    r = await executor.run_cell("SHOW_VARS()")
    assert r.ok and allowed_modules_text() in r.stdout


def test_framing_private_codec_ignores_json_class_changes() -> None:
    from sandbox import wire

    original = json.JSONEncoder.encode
    json.JSONEncoder.encode = lambda self, o: '"forged"'  # type: ignore[method-assign]
    try:
        assert wire.decode(wire.encode({"a": 1})[4:]) == {"a": 1}
    finally:
        json.JSONEncoder.encode = original  # type: ignore[method-assign]
