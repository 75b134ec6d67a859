"""Deterministic hashes: a rebuilt session (replayed, restored, in a zygote host or a directly started one)
must compute the hashes, and so the set and dict orders, the live one did."""

from __future__ import annotations

import decimal
import functools
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from sandbox.host.guards import (
    is_cell_class,
)

# -- deterministic hashes (a rebuilt session must compute what the live one did) --------------------
# `hash()` of an object whose type keeps `object.__hash__` (any `object()`, function, class, and any
# instance of a cell class without `__eq__`/`__hash__`) and of `float('nan')` is its address: a
# replayed or restored session, a zygote host and a directly started one all see other values, and
# sets of such objects iterate in another order. The cell's `hash` builtin answers a per-session
# number instead, assigned in the order of first hash (cells are deterministic, so a replay assigns
# the same numbers), and cell classes that would hash by address get that number as their
# `__hash__`, so sets and dicts of their instances also iterate identically after a replay.
# Bound methods and builtin functions hash by the number of the object they are bound to, a quiet
# Decimal NaN like nan. What remains address-based: the set/dict order of plain `object()`s,
# functions, classes, methods and NaNs themselves, and of instances of classes made by `type(...)`
# (their C-level hash cannot be replaced); cells that need a stable order sort.
_OBJECT_HASH: Any = vars(object)["__hash__"]


_TYPE_MRO: Any = vars(type)["__mro__"]


_TYPE_DICT: Any = vars(type)["__dict__"]


_REAL_HASH = hash


_STABLE_HASH: frozenset[type] = frozenset({str, bytes, int, bool, type(None)})


_MASK = (1 << 64) - 1


_HELD_HERE_ONLY = (
    3  # references to an object only IdentityHashes holds, seen from `live` (entry, local, argument)
)


_XXPRIME_1, _XXPRIME_2, _XXPRIME_5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


class IdentityHashes:
    """The per-session numbers standing in for address-based hashes (see above).

    An object keeps its number while it lives: weak-referenceable objects are held weakly (their
    entry goes when they do), others (`object()`, slotted classes) are kept for the session.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[bool, Any, int]] = {}
        self._next = 0

    def of(self, obj: Any) -> int:
        key = id(obj)
        entry = self._by_id.get(key)
        if entry is not None:
            weak, holder, number = entry
            if (holder() if weak else holder) is obj:
                return number
        self._next += 1
        try:
            ref: Any = weakref.ref(obj, functools.partial(self._forget, key))
            self._by_id[key] = (True, ref, self._next)
        except TypeError:  # not weak-referenceable
            self._by_id[key] = (False, obj, self._next)
        return self._next

    @property
    def issued(self) -> int:
        """How many numbers were handed out (a snapshot carries it: the next one continues from there)."""
        return self._next

    def resume(self, issued: int) -> None:
        """Continue the numbering of a restored snapshot (before any cell ran here)."""
        self._next = issued

    def live(self) -> int:
        """How many numbered objects are still alive (a snapshot cannot carry their numbers).

        Objects held only here (an `object()` hashed and dropped) are let go first: nothing can
        reach them any more, and their numbers are never handed out again.
        """
        for key, (weak, holder, _number) in list(self._by_id.items()):
            if not weak and sys.getrefcount(holder) <= _HELD_HERE_ONLY:
                del self._by_id[key]
        return len(self._by_id)

    def _forget(self, key: int, ref: Any) -> None:
        entry = self._by_id.get(key)
        if entry is not None and entry[1] is ref:
            del self._by_id[key]


def _resolved_hash(kind: type) -> Any:
    """The `__hash__` instances of `kind` use, read from the class dicts (no attribute lookup a
    metaclass could intercept)."""
    for klass in _TYPE_MRO.__get__(kind):
        attrs = _TYPE_DICT.__get__(klass)
        if "__hash__" in attrs:
            return attrs["__hash__"]
    return _OBJECT_HASH


def _signed(value: int) -> int:
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


def _tuple_hash(items: tuple[Any, ...], element: Callable[[Any], int]) -> int:
    """CPython's tuple hash (xxHash-based, 64-bit) over the deterministic element hashes."""
    acc = _XXPRIME_5
    for item in items:
        acc = (acc + (element(item) & _MASK) * _XXPRIME_2) & _MASK
        acc = ((acc << 31) | (acc >> 33)) & _MASK
        acc = (acc * _XXPRIME_1) & _MASK
    acc = (acc + (len(items) ^ (_XXPRIME_5 ^ 3527539))) & _MASK
    return 1546275796 if acc == _MASK else _signed(acc)


def _shuffle(h: int) -> int:
    h &= _MASK
    return (((h ^ 89869747) ^ (h << 16)) * 3644798167) & _MASK


def _frozenset_hash(items: frozenset[Any], element: Callable[[Any], int]) -> int:
    """CPython's frozenset hash over the deterministic element hashes."""
    acc = 0
    for item in items:
        acc ^= _shuffle(element(item))
    acc ^= ((len(items) + 1) * 1927868237) & _MASK
    acc ^= (acc >> 11) ^ (acc >> 25)
    acc = (acc * 69069 + 907133923) & _MASK
    return 590923713 if acc == _MASK else _signed(acc)


def _float_hash(value: float) -> int:
    return 0 if value != value else _REAL_HASH(value)


def cell_hash(hashes: IdentityHashes) -> Callable[[Any], int]:
    """The cell's `hash` builtin: the real hash, except that address-based hashes are replaced by the
    session's deterministic numbers (and nan hashes to 0, as before Python 3.10)."""

    def hash(obj: Any, /) -> int:  # the builtin's stand-in
        kind = type(obj)
        if kind in _STABLE_HASH:
            return _REAL_HASH(obj)
        if kind is float:
            return _float_hash(obj)
        if kind is tuple:
            if all(type(item) in _STABLE_HASH for item in obj):
                return _REAL_HASH(obj)
            return _tuple_hash(obj, hash)
        if kind is frozenset:
            if all(type(item) in _STABLE_HASH for item in obj):
                return _REAL_HASH(obj)
            return _frozenset_hash(obj, hash)
        if kind is complex:
            if obj == obj:
                return _REAL_HASH(obj)
            combined = (_float_hash(obj.real) & _MASK) + 1000003 * (_float_hash(obj.imag) & _MASK)
            value = _signed(combined)
            return -2 if value == -1 else value
        if _resolved_hash(kind) is _OBJECT_HASH:
            return hashes.of(obj)
        if kind is types.MethodType or kind is types.BuiltinFunctionType:
            # By the identity of the object bound (as equality is), and the function / its name.
            func = obj.__func__ if kind is types.MethodType else obj.__name__
            return _signed(hashes.of(obj.__self__) ^ (hash(func) & _MASK)) or 1
        if kind is decimal.Decimal and obj.is_qnan():
            return 0  # a quiet NaN hashes by address (a signalling one raises, as before)
        return _REAL_HASH(obj)

    return hash


def with_identity_hash(build_class: Callable[..., Any], hashes: IdentityHashes) -> Callable[..., Any]:
    """Wrap `__build_class__`: a cell class whose instances would hash by address gets the session's
    deterministic number as its `__hash__` instead (sets of its instances then iterate identically in
    a replayed session and in any host)."""

    def identity_hash(self: Any) -> int:
        return hashes.of(self)

    identity_hash.__name__ = identity_hash.__qualname__ = "__hash__"

    def __build_class__(*args: Any, **kwargs: Any) -> Any:
        cls = build_class(*args, **kwargs)
        if (
            vars(type)["__flags__"].__get__(type(cls)) & (1 << 31)
            and is_cell_class(cls)
            and _resolved_hash(cls) is _OBJECT_HASH
        ):
            type.__setattr__(cls, "__hash__", identity_hash)
        return cls

    return __build_class__
