"""Known sandbox-escape attempts, one case each: every one must be refused or contained.

After each attempt the same executor must still work (`print(1+1)` gives "2"), and the test process
(standing in for the worker) must be unaffected (see the autouse fixture in conftest.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from sandbox.executor import SubprocessExecutor
from tests.sandbox.conftest import CONTAINED, SECRET_NAME, SECRET_VALUE, TEST_LIMITS, attempt

pytestmark = pytest.mark.timeout(30)


# --- class hierarchy walks -------------------------------------------------------------------------
async def test_subclasses_walk_from_tuple(executor: SubprocessExecutor) -> None:
    r = await attempt(
        executor,
        "for c in ().__class__.__base__.__subclasses__():\n    if c.__name__ == 'Popen': c(['id'])",
    )
    assert "dunder" in (r.error or "")


async def test_mro_walk_from_list(executor: SubprocessExecutor) -> None:
    await attempt(executor, "[].__class__.__mro__[1].__subclasses__()")


async def test_object_subclasses_via_type(executor: SubprocessExecutor) -> None:
    await attempt(executor, "type(()).mro()[-1].__subclasses__()")


# --- globals / builtins through functions and modules ---------------------------------------------
async def test_function_globals(executor: SubprocessExecutor) -> None:
    await attempt(executor, "def f():\n    pass\nf.__globals__['__builtins__']")


async def test_builtin_function_self_is_builtins_module(executor: SubprocessExecutor) -> None:
    await attempt(executor, "print.__self__.open('/etc/passwd')")


async def test_preloaded_helper_globals(executor: SubprocessExecutor) -> None:
    await attempt(executor, "SHOW_VARS.__func__.__globals__['os']")


async def test_builtins_name(executor: SubprocessExecutor) -> None:
    await attempt(executor, "__builtins__['open']('/etc/passwd')")


async def test_module_dict(executor: SubprocessExecutor) -> None:
    await attempt(executor, "json.__dict__")


async def test_module_leaks_its_imports(executor: SubprocessExecutor) -> None:
    # json imports codecs, codecs imports sys: the proxy must not expose module attributes.
    r = await attempt(executor, "json.codecs.sys.modules['os'].system('id')", CONTAINED)
    assert "AttributeError" in (r.error or "")


async def test_typing_leaks_sys(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import typing\ntyping.sys.modules", CONTAINED)


# --- imports ---------------------------------------------------------------------------------------
async def test_dunder_import(executor: SubprocessExecutor) -> None:
    await attempt(executor, "__import__('os').system('id')")


async def test_importlib(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import importlib\nimportlib.import_module('os')")


async def test_import_os_system(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "import os\nos.system('id')")
    assert "allowed modules" in (r.error or "")


async def test_from_subprocess_import(executor: SubprocessExecutor) -> None:
    await attempt(executor, "from subprocess import check_output\ncheck_output(['id'])")


async def test_import_private_name_from_allowed_module(executor: SubprocessExecutor) -> None:
    await attempt(executor, "from collections import _sys")


async def test_import_alias_to_dunder(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import json as __builtins__")


async def test_sys_modules(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import sys\nsys.modules['os']")


# --- files -----------------------------------------------------------------------------------------
async def test_open_file(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "print(open('/etc/passwd').read())")
    assert "no file access" in (r.error or "")


async def test_pathlib_and_io(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import pathlib, io\npathlib.Path('/etc/passwd').read_text()")


# --- frames, generators, tracebacks ----------------------------------------------------------------
async def test_generator_frame(executor: SubprocessExecutor) -> None:
    await attempt(executor, "def g():\n    yield 1\nx = g()\nx.gi_frame.f_back.f_globals")


async def test_traceback_frame(executor: SubprocessExecutor) -> None:
    await attempt(executor, "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back")


async def test_exit_handler_traceback(executor: SubprocessExecutor) -> None:
    code = (
        "class C:\n"
        "    def __enter__(self):\n        return self\n"
        "    def __exit__(self, t, v, tb):\n        self.tb = tb\n        return True\n"
        "c = C()\nwith c:\n    1/0\nc.tb.tb_frame.f_globals"
    )
    await attempt(executor, code)


async def test_coroutine_frame(executor: SubprocessExecutor) -> None:
    await attempt(executor, "async def a():\n    pass\nco = a()\nco.cr_frame.f_locals")


# --- format strings --------------------------------------------------------------------------------
async def test_format_attribute(executor: SubprocessExecutor) -> None:
    await attempt(executor, "print('{0.__class__.__base__}'.format(1))")


async def test_format_map_attribute(executor: SubprocessExecutor) -> None:
    await attempt(executor, "'{x.__init__.__globals__}'.format_map({'x': SHOW_VARS})")


async def test_unbound_str_format(executor: SubprocessExecutor) -> None:
    await attempt(executor, "f = str.format\nf('{0.__class__}', 1)")


async def test_nested_format_spec(executor: SubprocessExecutor) -> None:
    await attempt(executor, "'{0:{1.__class__}}'.format(1, 2)")


async def test_str_subclass_super_format(executor: SubprocessExecutor) -> None:
    await attempt(executor, "class S(str):\n    pass\nsuper(S, S('{0.__class__}')).format(1)")


async def test_fstring_dunder(executor: SubprocessExecutor) -> None:
    await attempt(executor, "x = 1\nprint(f'{x.__class__.__mro__}')")


async def test_attrgetter_format_bypass(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import operator\noperator.attrgetter('format')('{0.__class__}')(1)")


async def test_match_keyword_format_bypass(executor: SubprocessExecutor) -> None:
    await attempt(executor, "match '{0.__class__}':\n    case str(format=f):\n        f(1)")


async def test_string_formatter(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import string\nstring.Formatter().format('{0.__class__}', 1)", CONTAINED)


async def test_userstring_format(executor: SubprocessExecutor) -> None:
    await attempt(executor, "collections.UserString('{0.__class__}').format(1)", CONTAINED)


# --- string -> attribute gadgets -------------------------------------------------------------------
async def test_getattr_constructed_name(executor: SubprocessExecutor) -> None:
    await attempt(executor, "getattr(1, '__cl' + 'ass__')")


async def test_operator_attrgetter(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import operator\noperator.attrgetter('__cl' + 'ass__')(1)")


async def test_operator_methodcaller(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import operator\noperator.methodcaller('__reduce_ex__', 2)(print)")


async def test_functools_update_wrapper(executor: SubprocessExecutor) -> None:
    code = (
        "import functools\nclass W:\n    pass\nw = W()\n"
        "functools.update_wrapper(w, SHOW_VARS, assigned=('__glob' + 'als__',), updated=())"
    )
    await attempt(executor, code)


async def test_make_dataclass_dunder_field(executor: SubprocessExecutor) -> None:
    await attempt(
        executor, "import dataclasses\ndataclasses.make_dataclass('W', [('__glob' + 'als__', object)])"
    )


async def test_typing_get_type_hints_eval(executor: SubprocessExecutor) -> None:
    code = "import typing\ndef f(x: 'os'):\n    pass\ntyping.get_type_hints(f, {}, {})"
    await attempt(executor, code, CONTAINED)


async def test_singledispatch_annotation_eval(executor: SubprocessExecutor) -> None:
    # register() with an annotation would eval this string outside the AST check.
    code = (
        "import functools\n@functools.singledispatch\ndef g(x):\n    pass\n"
        '@g.register\ndef h(x: "().__class__.__base__.__subclasses__()[0]"):\n    pass\nprint(g.registry)'
    )
    await attempt(executor, code)
    ok = await executor.run_cell(
        "import functools\n@functools.singledispatch\ndef g(x):\n    return 'any'\n"
        "@g.register(int)\ndef h(x):\n    return 'int'\nprint(g(1), g('a'))"
    )
    assert ok.stdout == "int any\n"


async def test_match_args_metaclass_gadget(executor: SubprocessExecutor) -> None:
    code = (
        "T = type(type)\n"
        "X = T('X', (), {'__match_args__': ('gi_frame',)})\n"
        "def g():\n    yield 1\n"
        "match g():\n    case X(fr):\n        print(fr)"
    )
    await attempt(executor, code)


async def test_match_keyword_dunder(executor: SubprocessExecutor) -> None:
    await attempt(executor, "match 1:\n    case int(__class__=c):\n        print(c)")


# --- dangerous builtins ----------------------------------------------------------------------------
async def test_exec(executor: SubprocessExecutor) -> None:
    await attempt(executor, "exec('import os')")


async def test_eval(executor: SubprocessExecutor) -> None:
    await attempt(executor, "eval('1+1')")


async def test_compile(executor: SubprocessExecutor) -> None:
    await attempt(executor, "compile('1', 'x', 'eval')")


async def test_breakpoint(executor: SubprocessExecutor) -> None:
    await attempt(executor, "breakpoint()")


async def test_globals_vars_locals(executor: SubprocessExecutor) -> None:
    await attempt(executor, "globals()['__builtins__']; vars(); locals()")


async def test_memoryview_and_help(executor: SubprocessExecutor) -> None:
    await attempt(executor, "memoryview(b'x'); help(print)")


async def test_exit_and_system_exit(executor: SubprocessExecutor) -> None:
    await attempt(executor, "exit(0)")
    r = await attempt(executor, "raise SystemExit(0)", ("runtime",))
    assert "session continues" in (r.error or "")


# --- type / lambda / decorator / metaclass tricks ---------------------------------------------------
async def test_type_reassign_bases(executor: SubprocessExecutor) -> None:
    code = "C = type('C', (), {})\nC.__bases__ = (object,)"
    await attempt(executor, code)


async def test_lambda_default_arg(executor: SubprocessExecutor) -> None:
    await attempt(executor, "(lambda p=print: p.__self__)()")


async def test_decorator_reaches_globals(executor: SubprocessExecutor) -> None:
    await attempt(executor, "def deco(f):\n    return f.__globals__\n@deco\ndef g():\n    pass")


async def test_metaclass_instancecheck(executor: SubprocessExecutor) -> None:
    await attempt(executor, "class M(type):\n    def __instancecheck__(cls, o):\n        return True")


async def test_private_attribute_names(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import re\nre._compile('x', 0)")


async def test_del_finalizer(executor: SubprocessExecutor) -> None:
    await attempt(executor, "class A:\n    def __del__(self):\n        print('late')")


# --- signals, processes, native code ----------------------------------------------------------------
async def test_pickle_marshal(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import pickle, marshal\npickle.loads(b'cos\\nsystem\\n.')")


async def test_ctypes(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import ctypes\nctypes.string_at(0)")


async def test_signal_and_fork(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import signal, os\nos.fork()\nsignal.pause()")


async def test_threads_and_sockets(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import threading, socket\nsocket.create_connection(('1.1.1.1', 80))")


async def test_clock_and_random(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import time, random\ntime.time(), random.random()")


async def test_datetime_now(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "datetime.datetime.now()")
    assert "no clock" in (r.error or "")


async def test_datetime_clock_via_min_instance(executor: SubprocessExecutor) -> None:
    await attempt(executor, "d = datetime.date.min\nd.today()")


# --- resource exhaustion -----------------------------------------------------------------------------
async def test_memory_bomb_string(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "x = 'x' * 10**10", ("memory",))
    assert "memory" in (r.error or "").lower()


async def test_memory_bomb_list_growth() -> None:
    # its own host with a long wall clock: on a loaded machine the growth to the 512 MB limit (near which the
    # kernel reclaims and throttles) can outlast the suite's 2 s, and the cell would end as a timeout instead
    ex = SubprocessExecutor(dataclasses.replace(TEST_LIMITS, cell_timeout_s=60.0))
    await ex.start(None, "auto", {"task": {"question": "q"}})
    try:
        await attempt(ex, "l = []\nwhile True:\n    l.append(bytearray(10**7))", ("memory", "crash"))
    finally:
        await ex.close()


async def test_infinite_loop_swallowing_exceptions(executor: SubprocessExecutor) -> None:
    code = "while True:\n    try:\n        pass\n    except BaseException:\n        pass"
    r = await attempt(executor, code, ("timeout",))
    assert "killed" in (r.error or "")


async def test_output_flood(executor: SubprocessExecutor) -> None:
    result = await executor.run_cell("print('x' * 10_000_000)\nfor i in range(10_000):\n    print('y' * 100)")
    assert result.ok and result.truncated
    assert len(result.stdout) < executor.limits.max_output_chars + 500
    assert "chars truncated" in result.stdout
    assert (await executor.run_cell("print(1+1)")).stdout == "2\n"


async def test_deep_recursion(executor: SubprocessExecutor) -> None:
    r = await attempt(executor, "def f(n):\n    return f(n + 1)\nf(0)", ("runtime",))
    assert "RecursionError" in (r.error or "")
    assert len(r.error or "") < 5000


async def test_deeply_nested_repr(executor: SubprocessExecutor) -> None:
    await attempt(executor, "l = []\nfor i in range(300000):\n    l = [l]\nrepr(l)", ("runtime", "crash"))


async def test_hostile_exception_str(executor: SubprocessExecutor) -> None:
    code = "class E(Exception):\n    def __str__(self):\n        raise E()\nraise E()"
    await attempt(executor, code, ("runtime",))


# --- the protocol channel and the worker ------------------------------------------------------------
async def test_write_real_stdout(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import sys\nsys.__stdout__.write('\\x00\\x00\\x00\\x05{}')")


async def test_os_write_fd1(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import os\nos.write(1, b'\\x00\\x00\\x00\\x02{}')")


async def test_print_to_fake_file_stays_in_cell(executor: SubprocessExecutor) -> None:
    # A cell can only print into objects it owns; nothing reaches the protocol stream.
    result = await executor.run_cell(
        "class F:\n    def write(self, s):\n        pass\nprint('x', file=F())\nprint('ok')"
    )
    assert result.ok and result.stdout == "ok\n"


async def test_overwrite_scaffolding(executor: SubprocessExecutor) -> None:
    r = await executor.run_cell(
        "print = None\ntraces = 'hijacked'\nSHOW_VARS = 1\nFINAL_ANSWER = len\njson = 0"
    )
    assert r.ok
    check = await executor.run_cell(
        "print(traces is None, callable(SHOW_VARS), json.dumps([1]))\nFINAL_ANSWER(3)"
    )
    assert check.ok and check.stdout.startswith("True True [1]")
    assert check.submitted == 3


async def test_overwrite_registered_helper(executor: SubprocessExecutor) -> None:
    r = await executor.run_cell("register_helper('double', 'def double(x):\\n    return 2 * x')")
    assert r.ok, r
    await executor.run_cell("double = lambda x: 'hijacked'")
    check = await executor.run_cell("print(double(2), run_helper('double', 3))")
    assert check.stdout == "4 6\n"


async def test_helper_source_is_guarded(executor: SubprocessExecutor) -> None:
    await attempt(executor, "register_helper('h', 'def h():\\n    return h.__globals__')")


async def test_env_secret_not_visible(executor: SubprocessExecutor) -> None:
    await attempt(executor, "import os\nprint(os.environ)")
    await attempt(executor, "print(open('/proc/self/environ').read())")
    # ...and the host process really has no such variable (checked from the worker side).
    assert executor.pid is not None
    environ = Path(f"/proc/{executor.host_pid}/environ").read_bytes()
    assert SECRET_NAME.encode() not in environ and SECRET_VALUE.encode() not in environ
    assert os.environ[SECRET_NAME] == SECRET_VALUE  # the parent does have it
