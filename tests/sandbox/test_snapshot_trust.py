"""Snapshots and exports are data, never code; checking them runs no cell code; a rebuilt session
equals the live one (issue 25, points 4, 8 and 10).

Assume-breach tests play the attacker with the host's test-only unguarded op (real builtins): it makes
the host hand the worker a malicious snapshot / export, which a *fresh* host must refuse without
running anything (the session then rebuilds from its journal). Guarded-path tests use normal cells.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import decimal
import functools
import io
import json
import operator
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.executor import SubprocessExecutor
from sandbox.host.namespace import SandboxNamespace
from sandbox.host.snapshot import (
    DataIndex,
    SnapshotRefused,
    restore_export,
    restore_snapshot,
    take_export,
    take_snapshot,
)
from sandbox.sessions import SessionManager
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = pytest.mark.timeout(120)

MARK = "RR_TEST_PWNED"
SET_MARK = f"setattr(__import__('builtins'), {MARK!r}, 'pwned')"


@pytest.fixture(autouse=True)
def _no_mark() -> Any:
    yield
    if hasattr(builtins, MARK):
        delattr(builtins, MARK)


@pytest.fixture
def trace_file(tmp_path: Path) -> str:
    path = tmp_path / "trace.json"
    path.write_text(
        json.dumps(
            {
                "question": "What is 2+2?",
                "score": 1.5,
                "steps": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "4"}],
            }
        )
    )
    return str(path)


def _kw(trace_file: str | None, **changes: Any) -> dict[str, Any]:
    return {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {"task": {"id": 1, "note": "original note"}},  # decoded in the host: held once
        "limits": dataclasses.replace(TEST_LIMITS, **changes),
    }


def _kill(sessions: SessionManager, sid: str) -> None:
    ex = sessions.executor_for(sid)
    assert isinstance(ex, SubprocessExecutor) and ex.pid is not None
    os.killpg(ex.pid, signal.SIGKILL)


# -- malicious pickles: what a breached host could write ------------------------------------------
class _Call:
    """Pickles as `func(*args)` (REDUCE); `func` may itself be a _Call (a chain)."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> Any:
        return (self.func, self.args)

    def __call__(self, *args: Any) -> Any:  # pickle wants a callable first item; never called here
        raise AssertionError("only the unpickler calls what this stands for")


PAYLOADS: dict[str, Any] = {
    "eval": _Call(eval, SET_MARK),
    "exec": _Call(exec, SET_MARK),
    "getattr-chain": _Call(_Call(getattr, _Call(__import__, "builtins"), "exec"), SET_MARK),
    "attrgetter-chain": _Call(_Call(operator.attrgetter("exec"), _Call(__import__, "builtins")), SET_MARK),
    "partial": _Call(_Call(functools.partial, eval, SET_MARK)),
}


def _ns(traces: Any = None) -> tuple[SandboxNamespace, DataIndex]:
    ns = SandboxNamespace(1000)
    ns.start(
        traces if traces is not None else {"question": "q", "steps": [{"role": "user"}]}, {"task": {"id": 1}}
    )
    return ns, DataIndex([ns._scaffold[n] for n in ns._data_names])


def _run(ns: SandboxNamespace, code: str) -> None:
    exec(ns.compile_cell(code), ns.ns)  # checked code, as the host does
    ns.restore()


def _real_meta(blob: bytes) -> dict[str, Any]:
    meta = pickle.load(io.BytesIO(blob))  # the test's own trusted snapshot
    assert isinstance(meta, dict)
    return meta


def _evil_snapshot(meta: dict[str, Any], payload: Any, *, in_meta: bool) -> bytes:
    state: dict[str, Any] = {
        "vars": {"a": payload},
        "data": None,
        "history": [],
        "decimal": decimal.Context(),
    }
    return pickle.dumps(payload if in_meta else meta, protocol=5) + pickle.dumps(state, protocol=5)


@pytest.mark.parametrize("in_meta", [False, True], ids=["state", "meta"])
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_malicious_snapshot_runs_no_code(name: str, in_meta: bool) -> None:
    parent, index = _ns()
    _run(parent, "a = [1]")
    meta = _real_meta(take_snapshot(parent, index))
    fresh, fresh_index = _ns()
    with pytest.raises(pickle.UnpicklingError):
        restore_snapshot(fresh, fresh_index, _evil_snapshot(meta, PAYLOADS[name], in_meta=in_meta))
    assert not hasattr(builtins, MARK)


@pytest.mark.parametrize("in_meta", [False, True], ids=["state", "meta"])
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_malicious_export_runs_no_code(name: str, in_meta: bool) -> None:
    meta = {"version": 1, "kind": "rr-namespace-export", "helpers": []}
    state = {"vars": {"a": PAYLOADS[name]}, "history": []}
    blob = pickle.dumps(PAYLOADS[name] if in_meta else meta, protocol=5) + pickle.dumps(state, protocol=5)
    child, _ = _ns()
    with pytest.raises(pickle.UnpicklingError):
        restore_export(child, blob)
    assert not hasattr(builtins, MARK)


EXPORT_META = pickle.dumps({"version": 1, "kind": "rr-namespace-export", "helpers": []}, protocol=5)


def _raw(*parts: bytes) -> bytes:
    return b"\x80\x05" + b"".join(parts) + b"."


def _ustr(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def test_a_snapshot_cannot_build_on_or_call_host_objects() -> None:
    """BUILD on a persistent reference would set attributes of the host's own objects (a real stdlib
    function here); REDUCE on one would call it at restore time; SETITEMS would fill the host's own
    data or harness dicts. All are refused (a reference only ever names a whole object)."""
    ref = _ustr("a") + _ustr("json") + _ustr("dumps") + b"\x87Q"  # TUPLE3, BINPERSID
    build = _raw(ref, b"}" + _ustr("rr_marker") + b"K\x01s" + b"b")  # {rr_marker: 1}, BUILD
    call = _raw(ref, _ustr("x") + b"\x85R")  # ('x',), REDUCE
    task = _ustr("s") + _ustr("task") + b"\x86Q"  # TUPLE2, BINPERSID: the child's own preloaded `task`
    fill = _raw(task, b"(" + _ustr("id") + b"K\x02u")  # MARK, 'id', 2, SETITEMS
    harness = _raw(_ustr("s") + _ustr("__builtins__") + b"\x86Q")  # the namespace's builtins dict
    ns, _ = _ns()
    for blob in (build, call, fill, harness):
        with pytest.raises(pickle.UnpicklingError):
            restore_export(ns, EXPORT_META + blob)
    assert not hasattr(json.dumps, "rr_marker") and ns.ns["task"] == {"id": 1}


def test_claimed_sizes_allocate_nothing() -> None:
    """A claimed 1 TiB bytes object or a memo index of 2**32 is refused at once (the C unpickler would
    allocate the memo)."""
    ns, _ = _ns()
    huge_bytes = b"\x80\x05\x8e" + (1 << 40).to_bytes(8, "little") + b"xx"  # BINBYTES8
    huge_memo = _raw(b"K\x01r" + (1 << 32 - 1).to_bytes(4, "little"))  # LONG_BINPUT
    for blob in (huge_bytes, huge_memo):
        t0 = time.perf_counter()
        with pytest.raises((pickle.UnpicklingError, ValueError)):
            restore_export(ns, EXPORT_META + blob)
        assert time.perf_counter() - t0 < 1


def test_globals_outside_the_data_list_are_refused_cleanly() -> None:
    """What today's pickler could write by name (`f = len` as builtins.len) is refused, never called;
    a state of plain data and listed types restores as before."""
    parent, index = _ns()
    meta = _real_meta(take_snapshot(parent, index))
    for value in (len, getattr, print, os.system):
        state: dict[str, Any] = {
            "vars": {"f": value},
            "data": None,
            "history": [],
            "decimal": decimal.Context(),
        }
        fresh, fresh_index = _ns()
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            restore_snapshot(
                fresh, fresh_index, pickle.dumps(meta, protocol=5) + pickle.dumps(state, protocol=5)
            )
    _run(
        parent,
        "import collections, fractions, decimal\nf = len\nc = collections.Counter('aab')\n"
        "dd = collections.defaultdict(list)\nfr = fractions.Fraction(1, 3)\np = re.compile('a+', re.I)\n"
        "d = datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone.utc)\nz = [1.5, 2j, range(3), ...]",
    )
    fresh, fresh_index = _ns()
    restore_snapshot(fresh, fresh_index, take_snapshot(parent, index))
    for name in ("c", "dd", "fr", "p", "d", "z"):
        assert fresh.ns[name] == parent.ns[name], name
    assert fresh.ns["f"] is fresh.builtins["len"]


@pytest.mark.parametrize("what", ["snapshot", "export"])
async def test_a_breached_host_cannot_run_code_in_the_next_host(
    tmp_path: Path, trace_file: str, what: str
) -> None:
    """Assume-breach: the host answers `snapshot` (`export`) with a pickle that calls `eval`. The fresh
    host the worker builds after a restart refuses it, and the session rebuilds from its journal with
    the right state (a child's start fails clearly)."""
    sessions = SessionManager(
        tmp_path / "j",
        snapshot_every=1,
        executor_factory=lambda limits: SubprocessExecutor(limits, index_data=True, unguarded_for_tests=True),
    )
    kw = _kw(trace_file)
    assert (await sessions.run_cell("s", 1, "a = [1]", **kw)).ok
    ex = sessions.executor_for("s")
    assert isinstance(ex, SubprocessExecutor)
    breach = (
        "import gc, io, pickle, decimal\n"
        "host = [o for o in gc.get_objects() if type(o).__name__ == 'Host'][0]\n"
        "class Call:\n"
        "    def __init__(self, f, *a):\n"
        "        self.f, self.a = f, a\n"
        "    def __reduce__(self):\n"
        "        return (self.f, self.a)\n"
        f"payload = Call(eval, \"{SET_MARK} or 'pwned'\")\n"
        "real = host.snapshot\n"
        "def evil():\n"
        "    resp, blob = real()\n"
        "    meta = pickle.load(io.BytesIO(blob))\n"
        "    state = {'vars': {'a': payload}, 'data': None, 'history': [], 'decimal': decimal.Context()}\n"
        "    blob = pickle.dumps(meta, protocol=5) + pickle.dumps(state, protocol=5)\n"
        "    return {**resp, 'size': len(blob)}, blob\n"
        "def evil_export():\n"
        "    meta = {'version': 1, 'kind': 'rr-namespace-export', 'helpers': []}\n"
        "    blob = pickle.dumps(meta, protocol=5) + pickle.dumps({'vars': {'a': payload}, 'history': []}, protocol=5)\n"
        "    return {'ok': True, 'size': len(blob), 'skipped': []}, blob\n"
        "host.snapshot = evil\n"
        "host.export = evil_export\n"
    )
    assert (await ex.run_unguarded(breach)).ok
    assert (await sessions.run_cell("s", 2, "a.append(2)", **kw)).ok  # its snapshot is the evil one
    if what == "snapshot":
        _kill(sessions, "s")
        r = await sessions.run_cell("s", 3, "print(a)", **kw)
        assert r.ok and r.stdout == "[1, 2]\n", r
        assert sessions.stats.snapshot_restore_failures == 1 and r.meta["cells_replayed"] == 2
        again = sessions.executor_for("s")
        assert isinstance(again, SubprocessExecutor)
        probe = await again.run_unguarded(f"import builtins\nprint(getattr(builtins, {MARK!r}, 'clean'))")
        assert probe.stdout == "clean\n"
    else:
        blob, _ = await ex.export_namespace()
        assert blob is not None
        child = SubprocessExecutor(TEST_LIMITS, unguarded_for_tests=True)
        with pytest.raises(Exception, match="inherited namespace"):
            await child.start(trace_file, "auto", {}, inherit=blob)
        await child.close()
    await sessions.close_all()


# -- point 8: checks run no cell code and are bounded ----------------------------------------------
LOOPING_HASH = (
    "calls = []\narmed = []\n"
    "class H:\n"
    "    def __hash__(self):\n"
    "        calls.append(1)\n"
    "        while armed:\n"
    "            pass\n"
    "        return 1\n"
    "    def __eq__(self, other):\n"
    "        calls.append(2)\n"
    "        while armed:\n"
    "            pass\n"
    "        return self is other\n"
    "s = {H(), H()}\nnested = {(1, (H(),)), frozenset({H()})}\nbefore = len(calls)\narmed.append(1)\n"
    "del H"  # the sets come first in the namespace: nothing refuses the snapshot before they are checked
)


async def test_snapshot_and_export_run_no_cell_hash(trace_file: str) -> None:
    """A set of objects whose `__hash__`/`__eq__` loop: the snapshot is refused by type, at once, and
    neither the snapshot nor the export calls them."""
    ex = SubprocessExecutor(TEST_LIMITS, index_data=True)
    await ex.start(trace_file, "auto", {})
    try:
        assert (await ex.run_cell(LOOPING_HASH)).ok
        t0 = time.perf_counter()
        snap, resp = await asyncio.wait_for(ex.snapshot(), 10)
        assert snap is None and resp.get("refused"), resp
        blob, info = await asyncio.wait_for(ex.export_namespace(), 10)
        assert blob is not None and "s" in info["skipped"], info
        assert time.perf_counter() - t0 < 5
        r = await ex.run_cell("armed.clear()\nprint(len(calls) - before)")
        assert r.ok and r.stdout == "0\n", r
    finally:
        await ex.close()


async def test_snapshot_and_export_never_read_a_cell_class_attribute(trace_file: str) -> None:
    """Assume-breach (a `__class__` property the guards would refuse to define): an object whose
    `__class__`, `__hash__` and `__reduce_ex__` loop sits in the namespace; snapshot and export
    look at its type only, finish at once and skip it."""
    ex = SubprocessExecutor(TEST_LIMITS, index_data=True, unguarded_for_tests=True)
    await ex.start(trace_file, "auto", {})
    plant = (
        "import gc\n"
        "host = [o for o in gc.get_objects() if type(o).__name__ == 'Host'][0]\n"
        "import builtins\n"
        "class Liar:\n"
        "    @property\n"
        "    def __class__(self):\n"
        "        builtins.RR_TOUCHED = 1\n"
        "        while True:\n"
        "            pass\n"
        "    def __hash__(self):\n"
        "        builtins.RR_TOUCHED = 1\n"
        "        while True:\n"
        "            pass\n"
        "    def __reduce_ex__(self, proto):\n"
        "        builtins.RR_TOUCHED = 1\n"
        "        while True:\n"
        "            pass\n"
        "host.ns.ns['liar'] = Liar()\n"
        "host.ns.ns['liars'] = [Liar()]\n"
        "host.ns.ns['kept'] = [1, 2]\n"
    )
    try:
        assert (await ex.run_unguarded(plant)).ok
        t0 = time.perf_counter()
        snap, resp = await asyncio.wait_for(ex.snapshot(), 10)
        assert snap is None and resp.get("refused"), resp
        blob, info = await asyncio.wait_for(ex.export_namespace(), 10)
        assert blob is not None and info["skipped"] == ["liar", "liars"], info
        assert time.perf_counter() - t0 < 5
        probe = await ex.run_unguarded("import builtins\nprint(getattr(builtins, 'RR_TOUCHED', 0))")
        assert probe.stdout == "0\n"
    finally:
        await ex.close()


def test_a_snapshot_has_a_strict_time_bound() -> None:
    ns, index = _ns()
    _run(ns, "big = [[i] for i in range(50_000)]")
    with pytest.raises(SnapshotRefused, match="longer than"):
        take_snapshot(ns, index, budget_s=0.0)
    with pytest.raises(SnapshotRefused, match="longer than"):
        take_export(ns, budget_s=0.0)
    assert take_snapshot(ns, index)  # the default bound (the cell timeout) is ample


# -- point 10: a rebuilt session equals the live one ----------------------------------------------
RECURSE = (
    "def depth(n):\n    try:\n        return depth(n + 1)\n    except RecursionError:\n        return n\n"
)
IDENTITY_CELLS = [
    "q = traces['question']\nf = traces['raw']['score']\nk = list({'role': 1})[0]\np = re.compile('a+b')\n"
    "print(hash(object()), hash(float('nan')), hash((float('nan'), 1)))",
    "print(hash(object()))",
]
MUTATING_CELLS = [
    "traces['steps'][0] = None",  # the data is mutated: pickled by value from now on
    "traces['steps'][0] = {'role': 'user', 'content': 'hi'}",
    "traces['question'] = None\ntraces['question'] = ''.join(['What is ', '3+3?'])",  # a replaced string
]
IDENTITY_PROBE = (
    RECURSE + "print(depth(0), hash(object()), q is traces['question'], f is traces['raw']['score'], "
    "k is ['role'][0], p is re.compile('a+b'))\nprint(traces['question'], q)"
)


async def _live_then_rebuilt(
    tmp_path: Path,
    trace_file: str,
    cells: list[str],
    probe: str,
    *,
    every: int,
    zygote: bool,
    rebuild_zygote: bool,
) -> tuple[str, str, dict[str, Any]]:
    first = SessionManager(
        tmp_path / f"j{every}{zygote}{rebuild_zygote}", snapshot_every=every, zygote=zygote, pool_size=0
    )
    kw = _kw(trace_file)
    for seq, code in enumerate(cells, start=1):
        r = await first.run_cell("s", seq, code, **kw)
        assert r.ok, (seq, r)
    assert (await first.run_cell("s", len(cells) + 1, probe, **kw)).ok
    live = await first.run_cell("s", len(cells) + 2, probe, **kw)  # the live answer to the last cell
    assert live.ok, live
    _kill(first, "s")
    # A new manager (another worker), another kind of host: the same last cell again on a rebuild.
    second = SessionManager(first.journal_root, snapshot_every=every, zygote=rebuild_zygote, pool_size=0)
    rebuilt = await second.run_cell("s", len(cells) + 2, probe, **kw)
    assert rebuilt.ok, rebuilt
    await first.close_all()
    await second.close_all()
    return live.stdout, rebuilt.stdout, rebuilt.meta


@pytest.mark.parametrize("mutated", [False, True], ids=["data-unchanged", "data-mutated"])
@pytest.mark.parametrize("every", [0, 1], ids=["journal", "snapshot"])
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
async def test_a_rebuilt_session_prints_what_the_live_one_did(
    tmp_path: Path, trace_file: str, every: int, zygote: bool, mutated: bool
) -> None:
    """hash(object()), hash(nan), the recursion depth reached, identity with the preloaded data, an
    interned key, re's cache and a replaced string: the same after a rebuild from the journal or
    from a snapshot, in a zygote's fork or a direct host, whichever kind the live one was."""
    cells = IDENTITY_CELLS + (MUTATING_CELLS if mutated else [])
    live, rebuilt, meta = await _live_then_rebuilt(
        tmp_path, trace_file, cells, IDENTITY_PROBE, every=every, zygote=zygote, rebuild_zygote=not zygote
    )
    if mutated:
        assert live.endswith(" False True True True\nWhat is 3+3? What is 2+2?\n"), live
    else:
        assert live.endswith(" True True True True\nWhat is 2+2? What is 2+2?\n"), live
    assert rebuilt == live
    assert ("snapshot_seq" in meta) == bool(every), meta


async def test_a_replaced_string_is_never_taken_for_the_original(tmp_path: Path, trace_file: str) -> None:
    """The new string is built right after the old one is freed (same size: the allocator reuses
    its address): the data's fingerprint must still see the change."""
    replace = "task['note'] = None\ntask['note'] = ''.join(['replaced', ' note'])"
    for zygote in (True, False):
        live, rebuilt, meta = await _live_then_rebuilt(
            tmp_path,
            trace_file,
            [replace],
            "print(task['note'])",
            every=1,
            zygote=zygote,
            rebuild_zygote=zygote,
        )
        assert live == rebuilt == "replaced note\n" and meta.get("snapshot_seq") == 2, (live, rebuilt, meta)


SET_CELLS = [
    "class P:\n    def __init__(self, n):\n        self.n = n\n    def m(self):\n        return self.n\n"
    "ps = [P(i) for i in range(40)]\n"
    "print([p.n for p in set(ps)][:12], hash(ps[3]))",
    "class Q(Exception):\n    pass\nqs = {Q(i) for i in range(12)}\nprint([q.args[0] for q in qs])",
]


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "direct"])
async def test_sets_of_cell_objects_iterate_alike_in_every_host(
    tmp_path: Path, trace_file: str, zygote: bool
) -> None:
    probe = (
        "import decimal\nprint([p.n for p in set(ps)], [q.args[0] for q in qs], hash(ps[0]), hash(P(0)), hash(ps[1].m),"
        " hash(len), hash(json), hash(P), hash(decimal.Decimal('NaN')), hash((ps[2], float('nan'))))"
    )
    live, rebuilt, meta = await _live_then_rebuilt(
        tmp_path, trace_file, SET_CELLS, probe, every=1, zygote=zygote, rebuild_zygote=not zygote
    )
    assert rebuilt == live and meta["cells_replayed"] == 3, (live, rebuilt, meta)


# -- the data list itself: fails closed for names and arguments not on it --------------------------
def test_only_the_listed_globals_load() -> None:
    """Every global of the modules an attacker would reach for (and of the stdlib modules a snapshot
    does name) is refused unless it is on the data list; nothing on the list runs code by name."""
    import codecs
    import collections
    import copyreg
    import datetime
    import fractions
    import importlib
    import itertools
    import re
    import sys
    import types

    from sandbox.host.snapshot_data import _GLOBALS, _DataUnpickler

    unpickler = _DataUnpickler(io.BytesIO(b""), None)
    modules = (
        builtins,
        os,
        operator,
        functools,
        copyreg,
        pickle,
        sys,
        types,
        importlib,
        codecs,
        io,
        collections,
        datetime,
        decimal,
        fractions,
        itertools,
        re,
        json,
    )
    for module in modules:
        for name in dir(module):
            key = (module.__name__, name)
            if key in _GLOBALS:
                assert unpickler.find_class(*key) is _GLOBALS[key]
                continue
            with pytest.raises(pickle.UnpicklingError):
                unpickler.find_class(*key)
    dangerous = {
        eval,
        exec,
        getattr,
        setattr,
        delattr,
        __import__,
        open,
        compile,
        globals,
        vars,
        type,
        object,
        functools.partial,
        functools.reduce,
        operator.attrgetter,
        operator.methodcaller,
        vars(copyreg)["_reconstructor"],
    }
    assert not any(value is d for value in _GLOBALS.values() for d in dangerous)


@pytest.mark.parametrize(
    ("func", "args"),
    [
        ("defaultdict", (eval,)),  # a factory a later missing key would call
        ("defaultdict", (functools.partial(eval, SET_MARK),)),
        ("_compile", ("a", 128)),  # re.DEBUG prints while compiling
        ("Fraction", ("1e1000000000",)),  # 10**1000000000 computed from 12 bytes
        ("Counter", ([1, 2],)),
        ("deque", ([1] * 3, 10)),
        ("datetime", (b"\x00" * 10, "not a tz")),
        ("Context", (28, "ROUND_HALF_EVEN", -9, 9, 1, 0, [eval], [])),
        ("complex", ("1+2j", 0)),
        ("count", (object(),)),
    ],
)
def test_constructors_refuse_arguments_their_own_reduce_never_writes(
    func: str, args: tuple[Any, ...]
) -> None:
    import collections
    import datetime
    import fractions
    import itertools

    from sandbox.host.snapshot_data import _RE_COMPILE, _checked_call

    target = {
        "defaultdict": collections.defaultdict,
        "_compile": _RE_COMPILE,
        "Fraction": fractions.Fraction,
        "Counter": collections.Counter,
        "deque": collections.deque,
        "datetime": datetime.datetime,
        "Context": decimal.Context,
        "complex": complex,
        "count": itertools.count,
    }[func]
    with pytest.raises(pickle.UnpicklingError, match="unexpected arguments"):
        _checked_call(target, args)
    assert not hasattr(builtins, MARK)
