"""Writing a namespace's state: the walk over the preloaded data (`DataIndex`), the time bound, and the pickler
that writes plain data and references only (`sandbox.host.snapshot` says why)."""

from __future__ import annotations

import io
import pickle
import re
import sys
import time
from typing import Any

from sandbox.host.guards import CELL_MODULE
from sandbox.host.snapshot_contents import (
    _ATOMIC,
    _CALLABLE_TYPES,
    _CHECK_EVERY,
    _DISPATCH_TABLE,
    _GLOBAL_IDS,
    _HASH_SAFE,
    _IDENTITY_ATOMS,
    _INSTANCE_TYPES,
    _ITEMS,
    _LAZY,
    _PLAIN,
    _TYPE_MODULE,
    _TYPE_QUALNAME,
    _WALK,
    _WITH_DICT,
    BUDGET_S,
    PROTOCOL,
    SnapshotRefused,
    _constructors,
    _is_class,
)


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


def _walk(
    roots: list[Any], *, keep_atoms: bool = False, clock: _Clock | None = None
) -> tuple[list[Any], int | None, list[Any]]:
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
                raise SnapshotRefused(
                    f"{_TYPE_QUALNAME.__get__(obj)} is defined in the session (function or class)"
                )
            name = _TYPE_QUALNAME.__get__(obj) if _is_class(obj) else _callable_name(obj)
            raise SnapshotRefused(
                f"{name} is defined in the session (function or class) or cannot be restored"
            )
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
        raise SnapshotRefused(
            f"an instance of {_TYPE_QUALNAME.__get__(kind)} with values that cannot be restored"
        )
    items_kind = _ITEMS.get(kind)
    if kind in _WITH_DICT and object.__getattribute__(obj, "__dict__"):
        raise SnapshotRefused(f"an instance of {_TYPE_QUALNAME.__get__(kind)} with attributes of its own")
    if (
        state is not None
        or (listitems is not None and items_kind != "list")
        or (dictitems is not None and items_kind != "dict")
    ):
        raise SnapshotRefused(
            f"an instance of {_TYPE_QUALNAME.__get__(kind)} with state that cannot be restored"
        )
    return (
        func,
        args,
        None,
        None if listitems is None else iter(list(listitems)),
        None if dictitems is None else iter(list(dictitems)),
    )


def _cached_pattern_args(pattern: re.Pattern[Any]) -> tuple[Any, ...]:
    """(pattern, flags) as `re`'s cache holds this very object, so that the restore, which compiles it
    through the cache, leaves `p is re.compile(text)` answering as in the live host. A pattern no
    longer in the cache cannot be restored so (the restore would put it back): refused."""
    for key, value in list(re._cache.items()):  # type: ignore[attr-defined]
        if value is pattern and type(key) is tuple and len(key) == 3 and type(key[2]) is int:
            return (key[1], key[2])
    raise SnapshotRefused("a compiled pattern is no longer in re's cache (a restore would put it back)")


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
            raise SnapshotRefused(
                "a set holds values whose hashing is defined in the session or not plain data"
            )
    items = list(obj)
    rebuilt = type(obj)(items)  # what unpickling does: insert the elements in iteration order
    if sys.getsizeof(rebuilt) != sys.getsizeof(obj) or any(
        a is not b for a, b in zip(rebuilt, items, strict=True)
    ):
        raise SnapshotRefused("a set would iterate in another order after a restore")
