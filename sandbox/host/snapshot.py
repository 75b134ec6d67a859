"""Namespace snapshots (host side): bounded recovery without giving up exact state.

Why: rebuilding a session by replaying every journaled cell costs O(cells). A snapshot every N
cells bounds that: rebuild = fresh host, load the latest snapshot, replay only the later cells.

What a snapshot holds: the user's variables (one pickle, so aliasing between them is kept), the
registered helpers as *source* (rebuilt by re-running it), the full key order of the namespace, the
cell counter (traceback filenames) and the decimal context. It never pickles the preloaded
scaffolding: references to `traces` / the extra variables (and to any dict or list inside them),
to the preloaded callables, to module proxies and their attributes, and to registered helpers are
written as *persistent references* and resolved against the fresh host. So `steps = traces['steps']`
costs nothing and stays an alias of `traces['steps']` after a restore.

Exactness: a snapshot is only written if the restored state is guaranteed to equal the live one;
otherwise `SnapshotRefused` and the session manager keeps replaying the journal (always correct):
  * anything defined by a cell (functions, classes and their instances, lambdas), generators and
    other unpicklable values refuse the snapshot; so does a helper with state of its own (function
    attributes, mutable defaults);
  * if the preloaded data was mutated in place (compared by an identity fingerprint taken at start:
    every dict/list and the identity of every item), it is pickled together with the variables;
  * every set must come back with the same iteration order and table size (a set that shrank, or
    whose elements collided, can iterate differently when rebuilt from its elements).
`history` (the archived transcripts, a scaffold list that cells extend) is user state: it is pickled
by value in the same pickle as the variables (aliases such as `h = history` are kept) and becomes
the restored host's `history`.
Loading accepts data only (issue 25: a breached host writes the bytes a *fresh* host or a child's host
loads). Every load, the meta included, goes through `_DataUnpickler`: pure-Python unpickling whose
opcodes that call or mutate something are checked one by one. A global is one of a short list of plain
types and constructors (`_GLOBALS`, no `builtins` wholesale, nothing getattr/eval-like); REDUCE calls only
a constructor of `_CONSTRUCTORS`, with arguments checked to be what that type's own reduce writes (so
`defaultdict` gets a factory of a fixed list of types, `re._compile` no DEBUG flag, `Fraction` two ints);
BUILD, NEWOBJ, INST/OBJ and the extension registry are refused; APPENDS/SETITEMS/ADDITEMS only fill exact
lists/deques, dicts (and their stdlib subclasses) and sets; persistent references are only of the kinds
expected (`_PID_ARITY`) and are resolved against this host's own objects. A claimed length never
allocates more than the bytes present. The pickler writes nothing else (it runs the same argument checks
on every reduce it emits), so a state that would need more is refused and the journal replay rebuilds it.

Identity (a rebuilt session must equal the live one): an atomic value (a str, a float, a big int) that
is the very object held in the unmutated preloaded data is written as a reference to its place in the
data ("D"), so `q = traces['question']` stays `q is traces['question']`; an identifier-like string that is
the interpreter's interned copy (cell literals, dict keys) is written as ("i", text) and re-interned, so
`k is 'role'` answers as in the live host. The data's fingerprint is sound because the index keeps every
original item alive (no replaced string can reuse an old address). Checks run on types only (`type(x)`,
never `isinstance`, `__class__` or a cell's `__hash__`), and the whole snapshot or export has a strict
time bound (`budget_s`, at most the cell timeout).

Namespace *exports* (`take_export` / `restore_export`) seed a child session with a copy of the
parent's state. They reuse the pickler but never refuse: what cannot be carried is skipped and
named. Exported: every non-callable variable whose value pickles without session-defined code
(by value, also when it aliases `traces` or the extra variables: the child has its own data),
`history` (by value; unpicklable items dropped) and the registered helpers (by source). Skipped:
functions, classes and other callables defined in cells, module proxies, values that hold them,
generators and other unpicklable values. References to preloaded callables, module attributes and
helpers inside exported values resolve to the child's own. An export is self-contained (no
reference into the parent's data), so a child can never reach or change the parent's objects.
"""

from __future__ import annotations

import collections
import copyreg
import datetime
import decimal
import fractions
import io
import itertools
import pickle
import re
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reflector.analysis.traces.lazy import LAZY_TYPES, resolve_ref
from sandbox.host.guards import CELL_MODULE

if TYPE_CHECKING:
    from sandbox.host.namespace import SandboxNamespace

__all__ = [
    "DataIndex",
    "SnapshotRefused",
    "take_snapshot",
    "restore_snapshot",
    "take_export",
    "restore_export",
    "SNAPSHOT_VERSION",
    "EXPORT_VERSION",
    "BUDGET_S",
]

SNAPSHOT_VERSION = 1
EXPORT_VERSION = 1
_EXPORT_KIND = "rr-namespace-export"
_HISTORY = "history"  # sandbox.host.namespace.HISTORY (not imported: keep this module free of the namespace)
PROTOCOL = 5
_ATOMIC: frozenset[type] = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN: frozenset[type] = frozenset({dict, list, tuple, set, frozenset, bytearray})
_WALK: frozenset[type] = frozenset({dict, list, tuple})
# Atomic values whose identity a restore could lose (None, bools and small ints are singletons anyway).
_IDENTITY_ATOMS: frozenset[type] = frozenset({int, float, complex, str, bytes})
# The lazy trace sequences (`reflector.analysis.traces.lazy`): immutable views of the trace file, written as
# persistent references ("L", kind, start, stop, step) and resolved against the restored host's (or the
# child's) own view of the same trace: a snapshot or an export never copies the trace.
_LAZY: frozenset[type] = frozenset(LAZY_TYPES)
EXPORT_MAX_BYTES = 64 * 1024**2  # all variables handed to a child session, pickled
EXPORT_VAR_MAX_BYTES = 16 * 1024**2  # one variable
BUDGET_S = 60.0  # most wall time one snapshot or export may take (never more than the cell timeout)
_CHECK_EVERY = 1024  # objects pickled between two looks at the clock
# The reducers pickling may use, copied at import (before any cell): whatever ends up in the global
# `copyreg.dispatch_table` later can never run while the host pickles cell state.
_DISPATCH_TABLE: dict[Any, Any] = dict(copyreg.dispatch_table)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: every class a cell creates is a heap type
_TYPE_FLAGS: Any = vars(type)["__flags__"]
_TYPE_MODULE: Any = vars(type)["__module__"]
_TYPE_QUALNAME: Any = vars(type)["__qualname__"]
_TYPE_MRO: Any = vars(type)["__mro__"]
_CALLABLE_TYPES: frozenset[type] = frozenset({
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
    types.MethodWrapperType,
})


class SnapshotRefused(Exception):
    """The namespace cannot be snapshotted exactly; the journal replay stays the recovery path."""


# -- what a snapshot may contain: plain data types and their checked constructors -----------------
_FACTORY_TYPES: tuple[Any, ...] = (
    list, dict, set, frozenset, tuple, int, float, complex, str, bytes, bytearray, bool,
    collections.OrderedDict, collections.defaultdict, collections.deque, collections.Counter,
)
_SIGNALS: tuple[type, ...] = (
    decimal.Clamped, decimal.DivisionByZero, decimal.Inexact, decimal.Overflow, decimal.Rounded,
    decimal.Underflow, decimal.InvalidOperation, decimal.Subnormal, decimal.FloatOperation,
)
_RE_COMPILE: Any = vars(re)["_compile"]  # what a Pattern reduces to (`re.compile` minus the flag check)
# Globals a snapshot may name (module, name) -> object: plain types, constants, the signal classes a
# decimal.Context lists, and the constructors below. Each is safe to hold as a value (a cell can reach
# all but `re._compile`, which is `re.compile` without the flag check); calling is `_CONSTRUCTORS`' job.
_GLOBALS: dict[tuple[str, str], Any] = {
    **{("builtins", t.__name__): t for t in _FACTORY_TYPES if t.__module__ == "builtins"},
    ("builtins", "range"): range,
    ("builtins", "slice"): slice,
    ("builtins", "Ellipsis"): Ellipsis,
    ("builtins", "NotImplemented"): NotImplemented,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): collections.defaultdict,
    ("collections", "deque"): collections.deque,
    ("collections", "Counter"): collections.Counter,
    ("datetime", "date"): datetime.date,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("decimal", "Decimal"): decimal.Decimal,
    ("decimal", "Context"): decimal.Context,
    **{("decimal", c.__name__): c for c in _SIGNALS},
    ("fractions", "Fraction"): fractions.Fraction,
    ("re", "_compile"): _RE_COMPILE,
    ("re", "RegexFlag"): re.RegexFlag,
    ("itertools", "count"): itertools.count,
}
_GLOBAL_IDS: dict[int, Any] = {id(v): v for v in _GLOBALS.values()}
_FACTORY_IDS = frozenset(id(t) for t in _FACTORY_TYPES)
_SIGNAL_IDS = frozenset(id(c) for c in _SIGNALS)
_NUMBER = (int, float)
_RE_FLAGS = sum(int(f) for f in re.RegexFlag) & ~int(re.DEBUG) & ~int(re.TEMPLATE)


def _exact(value: Any, *kinds: type) -> bool:
    return type(value) in kinds


def _ints(args: tuple[Any, ...], lo: int, hi: int) -> bool:
    return lo <= len(args) <= hi and all(type(a) is int for a in args)


def _ok_complex(args: tuple[Any, ...]) -> bool:
    return len(args) == 2 and all(type(a) in _NUMBER for a in args)


def _ok_slice(args: tuple[Any, ...]) -> bool:
    return len(args) == 3 and all(a is None or type(a) is int for a in args)


def _ok_none(args: tuple[Any, ...]) -> bool:
    return args == ()


def _ok_defaultdict(args: tuple[Any, ...]) -> bool:
    return args == () or (len(args) == 1 and (args[0] is None or id(args[0]) in _FACTORY_IDS))


def _ok_deque(args: tuple[Any, ...]) -> bool:
    if args == ():
        return True
    return len(args) == 2 and args[0] == () and type(args[0]) is tuple and (args[1] is None or type(args[1]) is int)


def _ok_counter(args: tuple[Any, ...]) -> bool:
    return args == () or (len(args) == 1 and type(args[0]) is dict)


def _tz_ok(tz: Any) -> bool:
    return tz is None or type(tz) is datetime.timezone


def _ok_dt(size: int) -> Callable[[tuple[Any, ...]], bool]:
    def check(args: tuple[Any, ...]) -> bool:
        return 1 <= len(args) <= 2 and type(args[0]) is bytes and len(args[0]) == size and (len(args) == 1 or _tz_ok(args[1]))
    return check


def _ok_timezone(args: tuple[Any, ...]) -> bool:
    return 1 <= len(args) <= 2 and type(args[0]) is datetime.timedelta and (len(args) == 1 or type(args[1]) is str)


def _ok_decimal(args: tuple[Any, ...]) -> bool:
    return len(args) == 1 and type(args[0]) is str


def _ok_context(args: tuple[Any, ...]) -> bool:
    if len(args) != 8 or not _ints(args[:1] + args[2:6], 5, 5) or type(args[1]) is not str:
        return False
    return all(type(lst) is list and all(id(c) in _SIGNAL_IDS for c in lst) for lst in args[6:])


def _ok_pattern(args: tuple[Any, ...]) -> bool:
    return (len(args) == 2 and type(args[0]) in (str, bytes) and type(args[1]) is int
            and 0 <= args[1] and not args[1] & ~_RE_FLAGS)


def _ok_flag(args: tuple[Any, ...]) -> bool:
    return len(args) == 1 and type(args[0]) is int and 0 <= args[0] and not args[0] & ~_RE_FLAGS


def _ok_count(args: tuple[Any, ...]) -> bool:
    return 1 <= len(args) <= 2 and all(type(a) in (int, float, complex, decimal.Decimal, fractions.Fraction) for a in args)


_Check = Callable[[tuple[Any, ...]], bool]
# Constructors REDUCE may call, by identity, with the arguments their own type's reduce writes.
_BASE_CONSTRUCTORS: dict[Any, _Check] = {
    complex: _ok_complex,
    range: lambda a: _ints(a, 3, 3),
    slice: _ok_slice,
    collections.OrderedDict: _ok_none,
    collections.defaultdict: _ok_defaultdict,
    collections.deque: _ok_deque,
    collections.Counter: _ok_counter,
    datetime.date: _ok_dt(4),
    datetime.datetime: _ok_dt(10),
    datetime.time: _ok_dt(6),
    datetime.timedelta: lambda a: _ints(a, 3, 3),
    datetime.timezone: _ok_timezone,
    decimal.Decimal: _ok_decimal,
    decimal.Context: _ok_context,
    fractions.Fraction: lambda a: len(a) == 2 and type(a[0]) is int and type(a[1]) is int and a[1] > 0,
    _RE_COMPILE: _ok_pattern,
    re.RegexFlag: _ok_flag,
    itertools.count: _ok_count,
}
# Instances that may be pickled (exact types) and what their reduce may carry besides the arguments.
_ITEMS: dict[Any, str] = {collections.deque: "list", collections.OrderedDict: "dict", collections.defaultdict: "dict"}
_WITH_DICT = frozenset({collections.OrderedDict, collections.Counter})  # their instances can hold attributes


def _constructors() -> dict[int, tuple[Any, _Check]]:
    """By id: every constructor above plus the sandbox's own `date`/`datetime` (clock-less subclasses
    that cells get from the `datetime` proxy; they reduce like their bases)."""
    global _CONSTRUCTOR_CACHE
    if _CONSTRUCTOR_CACHE is None:
        table: dict[Any, _Check] = dict(_BASE_CONSTRUCTORS)
        try:
            from sandbox.host.safe_modules import _date, _datetime
        except ImportError:  # pragma: no cover - the host always has it
            pass
        else:
            table[_date] = _BASE_CONSTRUCTORS[datetime.date]
            table[_datetime] = _BASE_CONSTRUCTORS[datetime.datetime]
        _CONSTRUCTOR_CACHE = {id(k): (k, v) for k, v in table.items()}
        kinds = [k for k in table if _is_class(k)] + [re.Pattern]
        _INSTANCE_TYPES.update({id(k): k for k in kinds})
    return _CONSTRUCTOR_CACHE


_CONSTRUCTOR_CACHE: dict[int, tuple[Any, _Check]] | None = None
# The exact types whose instances may be pickled (by id), filled with the constructors: each reduces to
# one of the constructors (a Pattern to `re._compile`).
_INSTANCE_TYPES: dict[int, type] = {}


def _checked_call(func: Any, args: Any) -> Any:
    """REDUCE: call `func(*args)` only for a listed constructor and the arguments it accepts."""
    entry = _constructors().get(id(func))
    if entry is None or entry[0] is not func:
        raise pickle.UnpicklingError(f"a snapshot may not call {_describe_obj(func)}")
    if type(args) is not tuple or not entry[1](args):
        raise pickle.UnpicklingError(f"unexpected arguments for {_describe_obj(func)}")
    return func(*args)


def _describe_obj(obj: Any) -> str:
    kind = type(obj)
    if kind is type or _TYPE_FLAGS.__get__(kind) & (1 << 31):  # a class
        return f"the class {_TYPE_QUALNAME.__get__(obj)}"
    return f"a {_TYPE_QUALNAME.__get__(kind)}"


class _Clock:
    """A strict wall-time bound on one snapshot or export (checked every `_CHECK_EVERY` objects)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        if not self.count % _CHECK_EVERY:
            self.tick_now()

    def tick_now(self) -> None:
        if time.monotonic() > self.deadline:
            raise SnapshotRefused(f"the state took longer than {self.budget_s:g}s to serialise")


class DataIndex:
    """Identity fingerprint and DFS index of the preloaded data (its containers and its atomic items).

    Taken right after start (before any cell): if a later fingerprint equals it, every dict/list of
    the data is the same object holding the same items, so the data is unmutated and containers can
    be referenced by DFS index, which is identical in a fresh host loading the same file. The index
    holds every original item (`atoms`), so no replaced value can be freed and its address reused by
    a new one: equal ids then really are the same, unchanged objects.
    """

    def __init__(self, roots: list[Any]) -> None:
        self.objs, self.fingerprint, self.atoms = _walk(roots, keep_atoms=True)
        self.ids = {id(o): i for i, o in enumerate(self.objs)}

    def unchanged(self, roots: list[Any], clock: _Clock | None = None) -> bool:
        _, fp, _ = _walk(roots, clock=clock)
        return fp is not None and fp == self.fingerprint


def _walk(roots: list[Any], *, keep_atoms: bool = False, clock: _Clock | None = None) -> tuple[list[Any], int | None, list[Any]]:
    objs: list[Any] = []
    atoms: list[Any] = []  # every item (keys too), in DFS order: keeps the originals alive
    seen: dict[int, int] = {}
    sig: list[int] = []
    stack = list(reversed(roots))
    trackable = True
    while stack:
        obj = stack.pop()
        kind = type(obj)
        if kind in _ATOMIC or kind in _LAZY:
            continue
        if kind not in _WALK:
            trackable = False  # a mutable object we cannot fingerprint (only after a mutation)
            continue
        idx = seen.get(id(obj))
        if idx is not None:
            sig.append(-1 - idx)
            continue
        if clock is not None and not len(objs) % _CHECK_EVERY:
            clock.tick_now()
        seen[id(obj)] = len(objs)
        objs.append(obj)
        if kind is dict:
            sig.append(hash((len(obj), tuple(map(id, obj)), tuple(map(id, obj.values())))))
            children = [v for v in obj.values() if type(v) not in _ATOMIC]
        else:
            sig.append(hash((kind is list, len(obj), tuple(map(id, obj)))))
            children = [v for v in obj if type(v) not in _ATOMIC]
        if keep_atoms:  # every item (a pointer each): what is not atomic is simply never looked up
            atoms.extend(obj)
            if kind is dict:
                atoms.extend(obj.values())
        stack.extend(reversed(children))
    return objs, (hash(tuple(sig)) if trackable else None), atoms


def _singleton(value: Any) -> bool:
    """Values the interpreter shares anyway (small ints, empty and 1-character strings and bytes)."""
    kind = type(value)
    if kind is int:
        return bool(-5 <= value <= 256)
    return (kind is str or kind is bytes) and len(value) <= 1


def _global_of(obj: Any) -> bool:
    """`obj` is one of the listed globals (then pickle writes it by module and name)."""
    return _GLOBAL_IDS.get(id(obj)) is obj


def _is_class(obj: Any) -> bool:
    return bool(_TYPE_FLAGS.__get__(type(obj)) & (1 << 31))  # Py_TPFLAGS_TYPE_SUBCLASS: a class, by its type


def _session_defined(kind: type) -> bool:
    try:
        return bool(_TYPE_MODULE.__get__(kind) == CELL_MODULE)
    except (AttributeError, TypeError):
        return False


def _interned(text: str) -> bool:
    """Whether `text` is the interpreter's interned copy of its value, without interning it: a fresh
    equal copy is interned instead (and freed again right away if nothing held the value before)."""
    return sys.intern((text + ".")[:-1]) is text


def _maybe_interned(text: str) -> bool:
    # What CPython interns by itself: identifiers in code (names, attribute names, string literals made
    # of name characters) and dict keys built from them; 1-character and empty strings are singletons.
    return len(text) > 1 and text.isascii() and (text.isidentifier() or text.replace("_", "a").isalnum())


class _Pickler(pickle.Pickler):
    def __init__(
        self,
        file: io.BytesIO,
        refs: dict[int, tuple[Any, ...]],
        *,
        check_sets: bool = True,
        atoms: dict[int, int] | None = None,
        atom_objs: list[Any] | None = None,
        clock: _Clock | None = None,
        shared: set[int] | None = None,
        record: bool = False,
    ) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self.dispatch_table = _DISPATCH_TABLE
        self._refs = refs
        self._check_sets = check_sets
        self._atoms = atoms or {}
        self._atom_objs = atom_objs or []
        self._clock = clock or _Clock(BUDGET_S)
        # The values inside the reference just returned: pickled next, by value (else a reference to a
        # string or number would contain a reference to itself).
        self._pending: set[int] = set()
        # Numbers are not memoised by pickle: one float held in two places would come back as two.
        # The first pass notes the numbers met twice (`found_shared`); a second pass, only then,
        # writes those as ("f", n, value) references that the unpickler resolves to one object.
        self._shared = shared
        self._numbers: dict[int, Any] = {}
        self._number_refs: dict[int, int] = {}
        self.found_shared: set[int] = set()
        # First pass (`record`): the atomic values met, by id, to look up in the preloaded data after.
        self.candidates: dict[int, Any] | None = {} if record else None

    def persistent_id(self, obj: Any) -> Any:
        # Called for every object (reducer_override is skipped for exact builtin containers).
        self._clock.tick()
        kind = type(obj)
        if kind in _ATOMIC:
            if self._pending and id(obj) in self._pending:
                self._pending.discard(id(obj))
                return None
            if kind in _IDENTITY_ATOMS:
                pos = self._atoms.get(id(obj))
                if pos is not None and self._atom_objs[pos] is obj:
                    return ("D", pos)  # the very object held in the preloaded data
                if self.candidates is not None and not _singleton(obj):
                    self.candidates[id(obj)] = obj
                if kind is str and _maybe_interned(obj) and _interned(obj):
                    return self._ref(("i", obj))
                if kind is not str and kind is not bytes and not _singleton(obj):
                    return self._number(obj)
            return None
        if kind in _LAZY:
            return self._ref(("L", *obj.rr_ref()))
        if (kind is set or kind is frozenset) and self._check_sets:
            _check_set(obj, self._clock)
        ref = self._refs.get(id(obj))
        return None if ref is None else self._ref(ref)

    def _number(self, obj: Any) -> tuple[Any, ...] | None:
        key = id(obj)
        if self._shared is None:
            if key in self._numbers:
                self.found_shared.add(key)
            else:
                self._numbers[key] = obj
            return None
        if key not in self._shared:
            return None
        return self._ref(("f", self._number_refs.setdefault(key, len(self._number_refs)), obj))

    def _ref(self, ref: tuple[Any, ...]) -> tuple[Any, ...]:
        self._pending = {id(v) for v in ref[1:] if type(v) in _IDENTITY_ATOMS}
        return ref

    def reducer_override(self, obj: Any) -> Any:
        # Types only: `type(obj)`, never isinstance / __class__ / a method the cell may have defined.
        kind = type(obj)
        if kind in _PLAIN:
            return NotImplemented
        if _global_of(obj):
            return NotImplemented  # written by module and name; `_DataUnpickler.find_class` admits it
        if _is_class(obj) or kind in _CALLABLE_TYPES:
            if _is_class(obj) and _session_defined(obj):
                raise SnapshotRefused(f"{_TYPE_QUALNAME.__get__(obj)} is defined in the session (function or class)")
            name = _TYPE_QUALNAME.__get__(obj) if _is_class(obj) else _callable_name(obj)
            raise SnapshotRefused(f"{name} is defined in the session (function or class) or cannot be restored")
        _constructors()
        if _INSTANCE_TYPES.get(id(kind)) is not kind:
            where = "defined in the session" if _session_defined(kind) else "not a plain data type"
            raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} ({where})")
        return _checked_reduce(obj, kind)


def _callable_name(obj: Any) -> str:
    try:
        name: Any = object.__getattribute__(obj, "__qualname__")
    except AttributeError:
        return str(_TYPE_QUALNAME.__get__(type(obj)))
    return name if type(name) is str else "?"


def _checked_reduce(obj: Any, kind: type) -> tuple[Any, ...]:
    """The reduce of an instance of a listed stdlib type, checked to be exactly what `_DataUnpickler`
    accepts (it runs the same argument check before calling): else the snapshot is refused."""
    reducer = _DISPATCH_TABLE.get(kind)
    reduce_ex: Any = kind.__reduce_ex__
    rv = reducer(obj) if reducer is not None else reduce_ex(obj, PROTOCOL)
    if type(rv) is not tuple or not 2 <= len(rv) <= 5:
        raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} does not reduce to plain data")
    func, args, state, listitems, dictitems = (*rv, None, None, None)[:5]
    if kind is re.Pattern:
        args = _cached_pattern_args(obj)
    entry = _constructors().get(id(func))
    if entry is None or entry[0] is not func or type(args) is not tuple or not entry[1](args):
        raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} with values that cannot be restored")
    items_kind = _ITEMS.get(kind)
    if kind in _WITH_DICT and object.__getattribute__(obj, "__dict__"):
        raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} with attributes of its own")
    if state is not None or (listitems is not None and items_kind != "list") or (dictitems is not None and items_kind != "dict"):
        raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} with state that cannot be restored")
    return (func, args, None, None if listitems is None else iter(list(listitems)), None if dictitems is None else iter(list(dictitems)))


def _cached_pattern_args(pattern: re.Pattern[Any]) -> tuple[Any, ...]:
    """(pattern, flags) as `re`'s cache holds this very object, so that the restore, which compiles it
    through the cache, leaves `p is re.compile(text)` answering as in the live host. A pattern no
    longer in the cache cannot be restored so (the restore would put it back): refused."""
    for key, value in list(re._cache.items()):  # type: ignore[attr-defined]
        if value is pattern and type(key) is tuple and len(key) == 3 and type(key[2]) is int:
            return (key[1], key[2])
    raise SnapshotRefused("a compiled pattern is no longer in re's cache (a restore would put it back)")


# Elements whose hash and equality are the interpreter's own (no cell method runs when a set of them is
# rebuilt): exact atomic types, and tuples / frozensets of them; plus listed stdlib value types.
_HASH_SAFE: frozenset[type] = frozenset({
    *_ATOMIC, range, slice, decimal.Decimal, fractions.Fraction, datetime.date, datetime.datetime, datetime.time,
    datetime.timedelta, datetime.timezone, re.RegexFlag, re.Pattern,
})


def _check_set(obj: set[Any] | frozenset[Any], clock: _Clock) -> None:
    # Types first: a set holding anything whose hash or equality a cell may define is refused before
    # a single element is hashed (`type(obj)(items)` below would call the cell's `__hash__`/`__eq__`).
    stack = list(obj)
    while stack:
        item = stack.pop()
        kind = type(item)
        clock.tick()
        if kind is tuple or kind is frozenset:
            stack.extend(item)
        elif kind not in _HASH_SAFE:
            raise SnapshotRefused("a set holds values whose hashing is defined in the session or not plain data")
    items = list(obj)
    rebuilt = type(obj)(items)  # what unpickling does: insert the elements in iteration order
    if sys.getsizeof(rebuilt) != sys.getsizeof(obj) or any(a is not b for a, b in zip(rebuilt, items, strict=True)):
        raise SnapshotRefused("a set would iterate in another order after a restore")


# -- loading: data only ---------------------------------------------------------------------------
_PID_ARITY: dict[str, tuple[type, ...]] = {
    "s": (str,), "d": (int,), "D": (int,), "m": (str,), "a": (str, str), "h": (str,), "b": (str,),
    "i": (str,), "L": (str, int, int, int), "f": (int, object),
}
_SNAPSHOT_PIDS = frozenset(_PID_ARITY)
_EXPORT_PIDS = frozenset({"s", "m", "a", "h", "b", "i", "L", "f"})
_NUMBERS = (int, float, complex)
_DICTS = frozenset({dict, collections.OrderedDict, collections.defaultdict, collections.Counter})
_LISTS = frozenset({list, collections.deque})
_Py: Any = pickle._Unpickler  # the pure-Python unpickler: each opcode is a method
_REFUSED_OPS = (
    pickle.BUILD, pickle.INST, pickle.OBJ, pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2,
    pickle.EXT4, pickle.PERSID, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER,
)


class _DataUnpickler(_Py):  # type: ignore[misc]
    """Unpickles data only (see the module doc): every opcode that calls, builds or fills something is
    checked; `resolve` maps a checked persistent reference to this host's object (None: none allowed)."""

    dispatch: dict[int, Any] = dict(_Py.dispatch)

    def __init__(self, file: io.BytesIO, resolve: Callable[[tuple[Any, ...]], Any] | None, kinds: frozenset[str] = frozenset()) -> None:
        super().__init__(file)
        self._resolve = resolve
        self._kinds = kinds
        self._numbers: dict[int, Any] = {}  # ("f", n, value): one object per n
        self._external: set[int] = set()  # ids of the host's own objects (references): never filled

    def find_class(self, module: str, name: str) -> Any:
        obj = _GLOBALS.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a snapshot")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        if self._resolve is None or type(pid) is not tuple or not pid or type(pid[0]) is not str:
            raise pickle.UnpicklingError("unexpected reference in a snapshot")
        shape = _PID_ARITY.get(pid[0])
        if pid[0] not in self._kinds or shape is None or len(pid) != 1 + len(shape):
            raise pickle.UnpicklingError(f"a {pid[0]!r} reference is not allowed here")
        if any(type(v) is not t and t is not object for v, t in zip(pid[1:], shape, strict=True)):
            raise pickle.UnpicklingError("malformed reference in a snapshot")
        if pid[0] == "f":
            if type(pid[2]) not in _NUMBERS:
                raise pickle.UnpicklingError("malformed number reference in a snapshot")
            return self._numbers.setdefault(pid[1], pid[2])
        obj = self._resolve(pid)
        self._external.add(id(obj))  # alive: the host holds it
        return obj

    def load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = _checked_call(self.stack[-1], args)

    def load_append(self) -> None:
        value = self.stack.pop()
        self._target(_LISTS, -1).append(value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        self._target(_LISTS, -1).extend(items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        _set_items(self._target(_DICTS, -1), [key, value])

    def load_setitems(self) -> None:
        items = self.pop_mark()
        _set_items(self._target(_DICTS, -1), items)

    def load_additems(self) -> None:
        items = self.pop_mark()
        self._target(frozenset({set}), -1).update(items)

    def load_proto(self) -> None:
        proto = self.read(1)[0]
        if proto > PROTOCOL:
            raise pickle.UnpicklingError(f"unsupported pickle protocol: {proto}")
        self.proto = proto

    def _target(self, kinds: frozenset[type], where: int) -> Any:
        target = self.stack[where]
        if type(target) not in kinds or id(target) in self._external:
            raise pickle.UnpicklingError(f"a snapshot may not fill {_describe_obj(target)}")
        return target

    def refused(self) -> None:
        raise pickle.UnpicklingError("a snapshot holds only plain data (an opcode that builds objects was refused)")


def _set_items(target: Any, items: list[Any]) -> None:
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) not in _HASH_SAFE:
            raise pickle.UnpicklingError("a snapshot dict key must be plain data")
        target[key] = items[i + 1]


for _op, _name in (
    (pickle.REDUCE, "load_reduce"), (pickle.APPEND, "load_append"), (pickle.APPENDS, "load_appends"),
    (pickle.SETITEM, "load_setitem"), (pickle.SETITEMS, "load_setitems"), (pickle.ADDITEMS, "load_additems"),
    (pickle.PROTO, "load_proto"),
):
    _DataUnpickler.dispatch[_op[0]] = getattr(_DataUnpickler, _name)
for _op in _REFUSED_OPS:
    _DataUnpickler.dispatch[_op[0]] = _DataUnpickler.refused


def _load(buf: io.BytesIO, resolve: Callable[[tuple[Any, ...]], Any] | None, kinds: frozenset[str] = frozenset()) -> Any:
    """One pickle of `buf`, data only; any failure is an UnpicklingError (the caller discards the host)."""
    try:
        return _DataUnpickler(buf, resolve, kinds).load()
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(f"refused pickle: {exc}") from None
    except Exception as exc:  # struct.error, EOFError, KeyError, ValueError from a reference, ...
        raise pickle.UnpicklingError(f"malformed pickle: {type(exc).__name__}: {exc}") from None


# -- snapshots --------------------------------------------------------------------------------------
def _budget(ns: SandboxNamespace) -> float:
    """The strict bound on one snapshot or export: the cell timeout the host was given (BUDGET_S at most)."""
    host = getattr(ns, "_host", None)
    limits = getattr(host, "limits", None)
    timeout: Any = limits.get("cell_timeout_s") if type(limits) is dict else None
    if type(timeout) in (int, float) and timeout > 0:
        return min(BUDGET_S, float(timeout))
    return BUDGET_S


def _proxy_refs(ns: SandboxNamespace, refs: dict[int, tuple[Any, ...]]) -> None:
    for modname, proxy in ns.importer._cache.items():
        for key, value in object.__getattribute__(proxy, "_rr_attrs").items():
            if type(value) not in _ATOMIC:
                refs[id(value)] = ("a", modname, key)
        refs[id(proxy)] = ("m", modname)
    for name, value in ns.builtins.items():  # `f = len`: the restored host's own builtin
        if type(value) not in _ATOMIC and not name.startswith("_") and id(value) not in refs and not _global_of(value):
            refs[id(value)] = ("b", name)


def _refs(ns: SandboxNamespace, index: DataIndex | None, data_unchanged: bool) -> dict[int, tuple[Any, ...]]:
    refs: dict[int, tuple[Any, ...]] = {}
    if data_unchanged and index is not None:
        for i, obj in enumerate(index.objs):
            refs[id(obj)] = ("d", i)
    _proxy_refs(ns, refs)
    for name, (fn, _src) in ns._helpers.items():
        refs[id(fn)] = ("h", name)
    data_names = set(ns._data_names)
    for name, value in ns._scaffold.items():
        if type(value) in _ATOMIC or name == _HISTORY or name.startswith("_") or (name in data_names and not data_unchanged):
            continue  # `_`-names are the harness's own (`__builtins__`, the rewriter's hooks): never referenced
        refs[id(value)] = ("s", name)
    return refs


def _check_helper(name: str, fn: Any) -> None:
    if type(fn) is not types.FunctionType:
        raise SnapshotRefused(f"helper {name!r} is not a plain function")
    if fn.__dict__ or fn.__closure__:
        raise SnapshotRefused(f"helper {name!r} carries state of its own")
    defaults = (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).values())
    if any(type(d) not in _ATOMIC for d in defaults):
        raise SnapshotRefused(f"helper {name!r} has non-constant default arguments")


def take_snapshot(ns: SandboxNamespace, index: DataIndex | None, budget_s: float | None = None) -> bytes:
    """Serialise the user's state of `ns`; raises SnapshotRefused if it cannot be restored exactly
    (or takes longer than `budget_s`, by default the host's cell timeout)."""
    clock = _Clock(_budget(ns) if budget_s is None else budget_s)
    data_roots = [ns._scaffold[n] for n in ns._data_names]
    data_unchanged = index is not None and index.unchanged(data_roots, clock)
    helpers = [(name, src) for name, (_fn, src) in ns._helpers.items()]
    for name, (fn, _src) in ns._helpers.items():
        _check_helper(name, fn)
    hashes = getattr(ns, "hashes", None)  # sandbox.host.namespace.IdentityHashes
    if hashes is not None and hashes.live():
        raise SnapshotRefused("hash() was taken of objects still alive (their numbers are session state)")
    meta = {
        "version": SNAPSHOT_VERSION,
        "order": list(ns.ns),
        "helpers": helpers,
        "cell_no": ns._cell_no,
        "data_count": len(index.objs) if index is not None else -1,
        "data_included": not data_unchanged,
        "hash_next": hashes.issued if hashes is not None else 0,
    }
    skip = set(ns._scaffold) | set(ns._helpers)
    state = {
        "vars": {k: v for k, v in ns.ns.items() if k not in skip},
        "data": None if data_unchanged else {n: ns._scaffold[n] for n in ns._data_names},
        "history": ns._scaffold.get(_HISTORY),
        "decimal": decimal.getcontext(),
    }
    buf = io.BytesIO()
    pickle.dump(meta, buf, protocol=PROTOCOL)
    try:
        data_atoms = index.atoms if data_unchanged and index is not None else None
        _dump_state(buf, state, _refs(ns, index, data_unchanged), clock, data_atoms=data_atoms)
    except SnapshotRefused:
        raise
    except RecursionError:
        raise SnapshotRefused("the state is nested too deeply to pickle") from None
    except Exception as exc:  # PicklingError, TypeError from reduce, ...
        raise SnapshotRefused(f"a value cannot be pickled: {type(exc).__name__}: {exc}") from None
    return buf.getvalue()


def _dump_state(
    buf: io.BytesIO, state: Any, refs: dict[int, tuple[Any, ...]], clock: _Clock, *, data_atoms: list[Any] | None = None, **kw: Any
) -> None:
    """Pickle `state` after `buf`'s contents. Then, only if needed, once more: with references for
    the numbers held in two places, and for the atomic values that are the very objects held in the
    unmutated preloaded data (found by one pass over the data's items: no index of them is kept)."""
    start = buf.tell()
    pickler = _Pickler(buf, refs, clock=clock, record=data_atoms is not None, **kw)
    pickler.dump(state)
    hits: dict[int, int] = {}
    if data_atoms is not None and pickler.candidates:
        met = pickler.candidates
        hits = {id(a): pos for pos, a in enumerate(data_atoms) if id(a) in met}
    if pickler.found_shared or hits:
        buf.seek(start)
        buf.truncate()
        _Pickler(buf, refs, clock=clock, shared=pickler.found_shared, atoms=hits, atom_objs=data_atoms, **kw).dump(state)


def _resolve_here(ns: SandboxNamespace, index: DataIndex | None, pid: tuple[Any, ...]) -> Any:
    kind = pid[0]
    if kind == "s":
        if pid[1].startswith("_"):
            raise ValueError(f"a snapshot cannot refer to {pid[1]!r}")
        return ns._scaffold[pid[1]]
    if kind in ("d", "D"):
        if index is None:
            raise ValueError("snapshot refers to preloaded data but none is indexed")
        items = index.objs if kind == "d" else index.atoms
        if not 0 <= pid[1] < len(items):
            raise ValueError("snapshot refers to preloaded data this session does not have")
        return items[pid[1]]
    if kind == "m":
        return ns.importer.proxy(pid[1])
    if kind == "a":
        proxy = ns.importer.proxy(pid[1])
        return object.__getattribute__(proxy, "_rr_attrs")[pid[2]]
    if kind == "h":
        return ns._helpers[pid[1]][0]
    if kind == "b":
        if pid[1].startswith("_"):
            raise ValueError(f"unknown builtin {pid[1]!r}")
        return ns.builtins[pid[1]]
    if kind == "i":
        return sys.intern(pid[1])
    if kind == "L":
        return resolve_ref(ns.lazy_roots, pid[1:])
    raise ValueError(f"unknown reference {pid!r}")


def _check_meta_helpers(helpers: Any) -> list[tuple[str, str]]:
    if type(helpers) is not list or not all(
        type(h) is tuple and len(h) == 2 and type(h[0]) is str and type(h[1]) is str and h[0].isidentifier()
        and not h[0].startswith("_") for h in helpers
    ):
        raise ValueError("malformed helpers in a snapshot")
    return helpers


def restore_snapshot(ns: SandboxNamespace, index: DataIndex | None, blob: bytes) -> int:
    """Load a snapshot into a freshly started namespace; returns the number of variables restored.

    Raises on any mismatch (the caller discards the host and replays the journal instead).
    """
    buf = io.BytesIO(blob)
    meta = _load(buf, None)
    if type(meta) is not dict or meta.get("version") != SNAPSHOT_VERSION:
        raise ValueError("unknown snapshot version")
    order, cell_no, hash_next = meta.get("order"), meta.get("cell_no"), meta.get("hash_next", 0)
    if type(order) is not list or not all(type(k) is str for k in order) or type(cell_no) is not int:
        raise ValueError("malformed snapshot")
    if type(hash_next) is not int or hash_next < 0:
        raise ValueError("malformed snapshot")
    if not meta.get("data_included") and (index is None or len(index.objs) != meta.get("data_count")):
        raise ValueError("the preloaded data differs from the snapshot's")
    for name, source in _check_meta_helpers(meta.get("helpers")):
        if name in ns._scaffold:
            raise ValueError(f"a snapshot helper shadows the preloaded {name!r}")
        ns.define_helper(name, source)  # checked like a cell (guards), as a journal replay would run it
    state = _load(buf, lambda pid: _resolve_here(ns, index, pid), _SNAPSHOT_PIDS)
    if type(state) is not dict or type(state.get("vars")) is not dict or type(state.get("decimal")) is not decimal.Context:
        raise ValueError("malformed snapshot")
    if not all(type(k) is str and (not k.startswith("__") or k == "__annotations__") for k in state["vars"]):
        raise ValueError("malformed snapshot (a variable name a cell cannot make)")
    data = state.get("data")
    if data is not None:
        if type(data) is not dict or set(data) != set(ns._data_names):
            raise ValueError("malformed snapshot data")
        for name, value in data.items():
            ns._scaffold[name] = value
    if type(state.get("history")) is list and _HISTORY in ns._scaffold:
        ns._scaffold[_HISTORY] = state["history"]
    values = dict(ns.ns)
    values.update(state["vars"])
    values.update(ns._scaffold)
    for name, (fn, _src) in ns._helpers.items():
        values[name] = fn
    order = [k for k in order if k in values]
    ns.ns.clear()
    ns.ns.update((k, values[k]) for k in order)
    decimal.setcontext(state["decimal"])
    ns._cell_no = cell_no
    hashes = getattr(ns, "hashes", None)
    if hashes is not None:
        hashes.resume(hash_next)
    return len(state["vars"])


# -- exports (child sessions) ----------------------------------------------------------------------
def _export_refs(ns: SandboxNamespace) -> dict[int, tuple[Any, ...]]:
    """References that resolve to the same thing in any host: modules, their attributes, helpers,
    preloaded callables. Never the data (`traces`, extra variables, `history`): that is copied."""
    refs: dict[int, tuple[Any, ...]] = {}
    _proxy_refs(ns, refs)
    data_names = {*ns._data_names, _HISTORY}
    for name, value in ns._scaffold.items():
        if name not in data_names and not name.startswith("_") and callable(value) and not _is_class(value):
            refs[id(value)] = ("s", name)
    for name, (fn, _src) in ns._helpers.items():
        refs[id(fn)] = ("h", name)
    return refs


def _pickled_size(value: Any, refs: dict[int, tuple[Any, ...]], clock: _Clock) -> int | None:
    """The size of `value` pickled for an export (None: it cannot be carried)."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, refs, check_sets=False, clock=clock).dump(value)
    except SnapshotRefused as exc:
        if "longer than" in str(exc):
            raise
        return None
    except Exception:  # PicklingError, RecursionError, MemoryError, ...
        return None
    return buf.tell()


def _pickles(value: Any, refs: dict[int, tuple[Any, ...]], clock: _Clock) -> bool:
    return _pickled_size(value, refs, clock) is not None


def take_export(ns: SandboxNamespace, budget_s: float | None = None) -> tuple[bytes, list[str]]:
    """Serialise what a child session inherits; returns (bytes, names of the user variables skipped).

    Never refuses what it can skip (see the module doc). Skipped names are user variables in namespace
    order, plus `history` if some of its items could not be carried; the scaffolding is never exported
    nor listed. Raises SnapshotRefused only past `budget_s` (by default the host's cell timeout).
    """
    from sandbox.host.safe_modules import ModuleProxy  # lazy: keep snapshot imports light

    clock = _Clock(_budget(ns) if budget_s is None else budget_s)
    refs = _export_refs(ns)
    hidden = set(ns._scaffold) | set(ns._helpers)
    skipped: list[str] = []
    candidates: dict[str, Any] = {}
    for name, value in ns.ns.items():
        if name in hidden or name.startswith("__"):
            continue
        # `callable()` reads the type's call slot and `type()` the object's type: no cell code runs
        # (isinstance would read a `__class__` the cell may have defined).
        if type(value) is ModuleProxy or (callable(value) and id(value) not in refs):
            skipped.append(name)
            continue
        candidates[name] = value
    history = ns._scaffold.get(_HISTORY)
    if type(history) is not list:
        history = []
    meta = {"version": EXPORT_VERSION, "kind": _EXPORT_KIND, "helpers": [(n, s) for n, (_f, s) in ns._helpers.items()]}
    try:
        blob = _dump_export(meta, {"vars": candidates, "history": history}, refs, clock)
        if len(blob) <= EXPORT_VAR_MAX_BYTES:  # then no variable can be over either limit
            return blob, skipped
    except SnapshotRefused as exc:
        if "longer than" in str(exc):
            raise
    except Exception:  # find what cannot be carried, one value at a time
        pass
    history_dropped = False
    if not _pickles(history, refs, clock):
        original, history = history, [item for item in history if _pickles(item, refs, clock)]
        history_dropped = True
        for name, value in candidates.items():  # aliases such as `h = history` follow the filtered list
            if value is original:
                candidates[name] = history
    kept = {}
    total = 0
    mb = 1024**2
    for name, value in candidates.items():
        size = _pickled_size(value, refs, clock)
        if size is None:
            skipped.append(name)
        elif size > EXPORT_VAR_MAX_BYTES or total + size > EXPORT_MAX_BYTES:
            skipped.append(
                f"{name} ({size / mb:.1f} MB: too big to hand down, the limit is {EXPORT_VAR_MAX_BYTES / mb:.0f} MB "
                f"per variable and {EXPORT_MAX_BYTES / mb:.0f} MB in all; slices of `traces` are handed down by "
                "reference, so pass a slice through context_code instead)"
            )
        else:
            kept[name] = value
            total += size
    order = {name: i for i, name in enumerate(ns.ns)}
    skipped.sort(key=lambda n: order.get(n.split(" ", 1)[0], len(order)))
    if history_dropped:
        skipped.append(_HISTORY)
    return _dump_export(meta, {"vars": kept, "history": history}, refs, clock), skipped


def _dump_export(meta: dict[str, Any], state: dict[str, Any], refs: dict[int, tuple[Any, ...]], clock: _Clock) -> bytes:
    buf = io.BytesIO()
    pickle.dump(meta, buf, protocol=PROTOCOL)
    _dump_state(buf, state, refs, clock, check_sets=False)
    return buf.getvalue()


def _resolve_export(ns: SandboxNamespace, pid: tuple[Any, ...]) -> Any:
    return _resolve_here(ns, None, pid)


def restore_export(ns: SandboxNamespace, blob: bytes) -> dict[str, Any]:
    """Load an export into a freshly started namespace (before any cell).

    The child's own scaffolding wins: an exported name that is preloaded in the child (an extra
    variable, a preloaded function) is not restored and is reported as `shadowed`. Raises on a
    malformed export (the caller discards the host).
    """
    buf = io.BytesIO(blob)
    meta = _load(buf, None)
    if type(meta) is not dict or meta.get("kind") != _EXPORT_KIND or meta.get("version") != EXPORT_VERSION:
        raise ValueError("not a namespace export of this version")
    shadowed: list[str] = []
    helpers = 0
    for name, source in _check_meta_helpers(meta.get("helpers")):
        if name in ns._scaffold:
            shadowed.append(name)
            continue
        ns.define_helper(name, source)  # checked like a cell (guards)
        helpers += 1
    state = _load(buf, lambda pid: _resolve_export(ns, pid), _EXPORT_PIDS)
    if type(state) is not dict or type(state.get("vars")) is not dict:
        raise ValueError("malformed namespace export")
    count = 0
    for name, value in state["vars"].items():
        if type(name) is not str or not name.isidentifier() or name.startswith("__"):
            continue
        if name in ns._scaffold or name in ns._helpers:
            shadowed.append(name)
            continue
        ns.ns[name] = value
        count += 1
    history = state.get("history")
    if type(history) is list and history and _HISTORY in ns._scaffold:
        current = ns._scaffold[_HISTORY]
        # The exported list object itself (keeps aliases such as `h = history` in the child).
        ns._scaffold[_HISTORY] = history
        if type(current) is list and current:
            history.extend(current)
    return {"vars": count, "helpers": helpers, "history": len(history) if type(history) is list else 0, "shadowed": shadowed}
