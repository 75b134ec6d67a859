"""What a snapshot or export may contain: its versions and caps, the plain data types, the globals it may
name and their checked constructors (`sandbox.host.snapshot` says why; `sandbox.host.snapshot_data` loads it)."""

from __future__ import annotations

import collections
import copyreg
import datetime
import decimal
import fractions
import itertools
import pickle
import re
import types
from collections.abc import Callable
from typing import Any

from reflector.analysis.traces.lazy import LAZY_TYPES

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


_CALLABLE_TYPES: frozenset[type] = frozenset(
    {
        types.FunctionType,
        types.BuiltinFunctionType,
        types.MethodType,
        types.MethodDescriptorType,
        types.WrapperDescriptorType,
        types.ClassMethodDescriptorType,
        types.MethodWrapperType,
    }
)


class SnapshotRefused(Exception):
    """The namespace cannot be snapshotted exactly; the journal replay stays the recovery path."""


# -- what a snapshot may contain: plain data types and their checked constructors -----------------
_FACTORY_TYPES: tuple[Any, ...] = (
    list,
    dict,
    set,
    frozenset,
    tuple,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    bool,
    collections.OrderedDict,
    collections.defaultdict,
    collections.deque,
    collections.Counter,
)


_SIGNALS: tuple[type, ...] = (
    decimal.Clamped,
    decimal.DivisionByZero,
    decimal.Inexact,
    decimal.Overflow,
    decimal.Rounded,
    decimal.Underflow,
    decimal.InvalidOperation,
    decimal.Subnormal,
    decimal.FloatOperation,
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
    return (
        len(args) == 2
        and args[0] == ()
        and type(args[0]) is tuple
        and (args[1] is None or type(args[1]) is int)
    )


def _ok_counter(args: tuple[Any, ...]) -> bool:
    return args == () or (len(args) == 1 and type(args[0]) is dict)


def _tz_ok(tz: Any) -> bool:
    return tz is None or type(tz) is datetime.timezone


def _ok_dt(size: int) -> Callable[[tuple[Any, ...]], bool]:
    def check(args: tuple[Any, ...]) -> bool:
        return (
            1 <= len(args) <= 2
            and type(args[0]) is bytes
            and len(args[0]) == size
            and (len(args) == 1 or _tz_ok(args[1]))
        )

    return check


def _ok_timezone(args: tuple[Any, ...]) -> bool:
    return (
        1 <= len(args) <= 2
        and type(args[0]) is datetime.timedelta
        and (len(args) == 1 or type(args[1]) is str)
    )


def _ok_decimal(args: tuple[Any, ...]) -> bool:
    return len(args) == 1 and type(args[0]) is str


def _ok_context(args: tuple[Any, ...]) -> bool:
    if len(args) != 8 or not _ints(args[:1] + args[2:6], 5, 5) or type(args[1]) is not str:
        return False
    return all(type(lst) is list and all(id(c) in _SIGNAL_IDS for c in lst) for lst in args[6:])


def _ok_pattern(args: tuple[Any, ...]) -> bool:
    return (
        len(args) == 2
        and type(args[0]) in (str, bytes)
        and type(args[1]) is int
        and 0 <= args[1]
        and not args[1] & ~_RE_FLAGS
    )


def _ok_flag(args: tuple[Any, ...]) -> bool:
    return len(args) == 1 and type(args[0]) is int and 0 <= args[0] and not args[0] & ~_RE_FLAGS


def _ok_count(args: tuple[Any, ...]) -> bool:
    return 1 <= len(args) <= 2 and all(
        type(a) in (int, float, complex, decimal.Decimal, fractions.Fraction) for a in args
    )


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
_ITEMS: dict[Any, str] = {
    collections.deque: "list",
    collections.OrderedDict: "dict",
    collections.defaultdict: "dict",
}


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


def _is_class(obj: Any) -> bool:
    return bool(_TYPE_FLAGS.__get__(type(obj)) & (1 << 31))  # Py_TPFLAGS_TYPE_SUBCLASS: a class, by its type


# Elements whose hash and equality are the interpreter's own (no cell method runs when a set of them is
# rebuilt): exact atomic types, and tuples / frozensets of them; plus listed stdlib value types.
_HASH_SAFE: frozenset[type] = frozenset(
    {
        *_ATOMIC,
        range,
        slice,
        decimal.Decimal,
        fractions.Fraction,
        datetime.date,
        datetime.datetime,
        datetime.time,
        datetime.timedelta,
        datetime.timezone,
        re.RegexFlag,
        re.Pattern,
    }
)
