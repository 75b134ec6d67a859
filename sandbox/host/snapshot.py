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
Loading only accepts globals from a short module allowlist; the pickle is written by this host from
cell-reachable objects and only ever loaded by a fresh host from the session's own journal dir.

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

import copyreg
import decimal
import io
import pickle
import re  # noqa: F401 - registers its reducer in copyreg before the private copy below is taken
import sys
import types
from typing import TYPE_CHECKING, Any

from reflector.traces.lazy import LAZY_TYPES, resolve_ref

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
]

SNAPSHOT_VERSION = 1
EXPORT_VERSION = 1
_EXPORT_KIND = "rr-namespace-export"
_HISTORY = "history"  # sandbox.host.namespace.HISTORY (not imported: keep this module free of the namespace)
PROTOCOL = 5
_ATOMIC: frozenset[type] = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN: frozenset[type] = frozenset({dict, list, tuple, set, frozenset, bytearray})
_WALK: frozenset[type] = frozenset({dict, list, tuple})
# The lazy trace sequences (`reflector.traces.lazy`): immutable views of the trace file, written as
# persistent references ("L", kind, start, stop, step) and resolved against the restored host's (or the
# child's) own view of the same trace: a snapshot or an export never copies the trace.
_LAZY: frozenset[type] = frozenset(LAZY_TYPES)
EXPORT_MAX_BYTES = 64 * 1024**2  # all variables handed to a child session, pickled
EXPORT_VAR_MAX_BYTES = 16 * 1024**2  # one variable
# Modules whose classes/functions may appear by reference in a snapshot (stdlib, no cell code).
TRUSTED_MODULES: frozenset[str] = frozenset(
    "builtins copyreg collections collections.abc re datetime decimal fractions functools itertools "
    "operator string statistics textwrap difflib heapq bisect pprint json _codecs "
    "_collections _collections_abc _decimal _pydecimal numbers".split()
)
# The reducers pickling may use, copied at import (before any cell): whatever ends up in the global
# `copyreg.dispatch_table` later can never run while the host pickles cell state.
_DISPATCH_TABLE: dict[Any, Any] = dict(copyreg.dispatch_table)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: every class a cell creates is a heap type
_TYPE_FLAGS: Any = vars(type)["__flags__"]
_CALLABLE_TYPES = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)


class SnapshotRefused(Exception):
    """The namespace cannot be snapshotted exactly; the journal replay stays the recovery path."""


class DataIndex:
    """Identity fingerprint and DFS index of the containers of the preloaded data.

    Taken right after start (before any cell): if a later fingerprint equals it, every dict/list of
    the data is the same object holding the same items, so the data is unmutated and containers can
    be referenced by DFS index, which is identical in a fresh host loading the same file.
    """

    def __init__(self, roots: list[Any]) -> None:
        self.objs, self.fingerprint = _walk(roots)
        self.ids = {id(o): i for i, o in enumerate(self.objs)}

    def unchanged(self, roots: list[Any]) -> bool:
        _, fp = _walk(roots)
        return fp is not None and fp == self.fingerprint


def _walk(roots: list[Any]) -> tuple[list[Any], int | None]:
    objs: list[Any] = []
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
        seen[id(obj)] = len(objs)
        objs.append(obj)
        if kind is dict:
            sig.append(hash((len(obj), tuple(map(id, obj)), tuple(map(id, obj.values())))))
            children = [v for v in obj.values() if type(v) not in _ATOMIC]
        else:
            sig.append(hash((kind is list, len(obj), tuple(map(id, obj)))))
            children = [v for v in obj if type(v) not in _ATOMIC]
        stack.extend(reversed(children))
    return objs, (hash(tuple(sig)) if trackable else None)


def _lookup(module: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _trusted_global(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module not in TRUSTED_MODULES:
        return False
    return _lookup(module, qualname) is obj


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, refs: dict[int, tuple[Any, ...]], *, check_sets: bool = True) -> None:
        super().__init__(file, protocol=PROTOCOL)
        self.dispatch_table = _DISPATCH_TABLE
        self._refs = refs
        self._check_sets = check_sets

    def persistent_id(self, obj: Any) -> Any:
        # Called for every object (reducer_override is skipped for exact builtin containers).
        kind = type(obj)
        if kind in _ATOMIC:
            return None
        if kind in _LAZY:
            return ("L", *obj.rr_ref())
        if (kind is set or kind is frozenset) and self._check_sets:
            _check_set(obj)
        return self._refs.get(id(obj))

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in _PLAIN:
            return NotImplemented
        if isinstance(obj, _CALLABLE_TYPES):
            if _trusted_global(obj):
                return NotImplemented
            name = getattr(obj, "__qualname__", kind.__name__)
            raise SnapshotRefused(f"{name} is defined in the session (function or class)")
        if _builtin_type(kind) or _trusted_global(kind) or id(kind) in self._refs:
            return NotImplemented  # C types and stdlib classes: their reduce is not cell code
        raise SnapshotRefused(f"an instance of {kind.__qualname__} (defined in the session)")


def _builtin_type(kind: type) -> bool:
    """A C type of `builtins` (`range`, `slice`, ...): not a heap type, so no cell made it (a cell class
    can claim `__module__ == "builtins"` and carry its own `__reduce_ex__`)."""
    return not _TYPE_FLAGS.__get__(kind) & _HEAPTYPE and vars(type)["__module__"].__get__(kind) == "builtins"


def _check_set(obj: set[Any] | frozenset[Any]) -> None:
    items = list(obj)
    rebuilt = type(obj)(items)  # what unpickling does: insert the elements in iteration order
    if sys.getsizeof(rebuilt) != sys.getsizeof(obj) or any(a is not b for a, b in zip(rebuilt, items, strict=True)):
        raise SnapshotRefused("a set would iterate in another order after a restore")


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, resolve: Any) -> None:
        super().__init__(file)
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        return self._resolve(tuple(pid))

    def find_class(self, module: str, name: str) -> Any:
        if module not in TRUSTED_MODULES:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a snapshot")
        return super().find_class(module, name)


def _refs(ns: SandboxNamespace, index: DataIndex | None, data_unchanged: bool) -> dict[int, tuple[Any, ...]]:
    refs: dict[int, tuple[Any, ...]] = {}
    if data_unchanged and index is not None:
        for i, obj in enumerate(index.objs):
            refs[id(obj)] = ("d", i)
    for modname, proxy in ns.importer._cache.items():
        for key, value in object.__getattribute__(proxy, "_rr_attrs").items():
            if type(value) not in _ATOMIC:
                refs[id(value)] = ("a", modname, key)
        refs[id(proxy)] = ("m", modname)
    for name, (fn, _src) in ns._helpers.items():
        refs[id(fn)] = ("h", name)
    data_names = set(ns._data_names)
    for name, value in ns._scaffold.items():
        if type(value) in _ATOMIC or name == _HISTORY or (name in data_names and not data_unchanged):
            continue
        refs[id(value)] = ("s", name)
    return refs


def _check_helper(name: str, fn: Any) -> None:
    if not isinstance(fn, types.FunctionType):
        raise SnapshotRefused(f"helper {name!r} is not a plain function")
    if fn.__dict__ or fn.__closure__:
        raise SnapshotRefused(f"helper {name!r} carries state of its own")
    defaults = (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).values())
    if any(type(d) not in _ATOMIC for d in defaults):
        raise SnapshotRefused(f"helper {name!r} has non-constant default arguments")


def take_snapshot(ns: SandboxNamespace, index: DataIndex | None) -> bytes:
    """Serialise the user's state of `ns`; raises SnapshotRefused if it cannot be restored exactly."""
    data_roots = [ns._scaffold[n] for n in ns._data_names]
    data_unchanged = index is not None and index.unchanged(data_roots)
    helpers = [(name, src) for name, (_fn, src) in ns._helpers.items()]
    for name, (fn, _src) in ns._helpers.items():
        _check_helper(name, fn)
    meta = {
        "version": SNAPSHOT_VERSION,
        "order": list(ns.ns),
        "helpers": helpers,
        "cell_no": ns._cell_no,
        "data_count": len(index.objs) if index is not None else -1,
        "data_included": not data_unchanged,
    }
    skip = set(ns._scaffold) | set(ns._helpers)
    state = {
        "vars": {k: v for k, v in ns.ns.items() if k not in skip},
        "data": None if data_unchanged else {n: ns._scaffold[n] for n in ns._data_names},
        "history": ns._scaffold.get(_HISTORY),
        "decimal": decimal.getcontext(),
    }
    return _dump(meta, state, _refs(ns, index, data_unchanged))


def _dump(meta: dict[str, Any], state: dict[str, Any], refs: dict[int, tuple[Any, ...]]) -> bytes:
    buf = io.BytesIO()
    pickle.dump(meta, buf, protocol=PROTOCOL)
    try:
        _Pickler(buf, refs).dump(state)
    except SnapshotRefused:
        raise
    except RecursionError:
        raise SnapshotRefused("the state is nested too deeply to pickle") from None
    except Exception as exc:  # PicklingError, TypeError from reduce, ...
        raise SnapshotRefused(f"a value cannot be pickled: {type(exc).__name__}: {exc}") from None
    return buf.getvalue()


def _resolve_here(ns: SandboxNamespace, index: DataIndex | None, pid: tuple[Any, ...]) -> Any:
    kind = pid[0]
    if kind == "s":
        return ns._scaffold[pid[1]]
    if kind == "d":
        if index is None:
            raise ValueError("snapshot refers to preloaded data but none is indexed")
        return index.objs[pid[1]]
    if kind == "m":
        return ns.importer.proxy(pid[1])
    if kind == "a":
        proxy = ns.importer.proxy(pid[1])
        return object.__getattribute__(proxy, "_rr_attrs")[pid[2]]
    if kind == "h":
        return ns._helpers[pid[1]][0]
    if kind == "L":
        return resolve_ref(ns.lazy_roots, pid[1:])
    raise ValueError(f"unknown reference {pid!r}")


def restore_snapshot(ns: SandboxNamespace, index: DataIndex | None, blob: bytes) -> int:
    """Load a snapshot into a freshly started namespace; returns the number of variables restored.

    Raises on any mismatch (the caller discards the host and replays the journal instead).
    """
    buf = io.BytesIO(blob)
    meta = pickle.load(buf)
    if not isinstance(meta, dict) or meta.get("version") != SNAPSHOT_VERSION:
        raise ValueError("unknown snapshot version")
    if not meta["data_included"] and (index is None or len(index.objs) != meta["data_count"]):
        raise ValueError("the preloaded data differs from the snapshot's")
    for name, source in meta["helpers"]:
        ns.define_helper(name, source)
    state = _Unpickler(buf, lambda pid: _resolve_here(ns, index, pid)).load()
    if state["data"] is not None:
        for name, value in state["data"].items():
            ns._scaffold[name] = value
    if isinstance(state.get("history"), list) and _HISTORY in ns._scaffold:
        ns._scaffold[_HISTORY] = state["history"]
    values = dict(ns.ns)
    values.update(state["vars"])
    values.update(ns._scaffold)
    for name, (fn, _src) in ns._helpers.items():
        values[name] = fn
    order = [k for k in meta["order"] if k in values]
    ns.ns.clear()
    ns.ns.update((k, values[k]) for k in order)
    decimal.setcontext(state["decimal"])
    ns._cell_no = int(meta["cell_no"])
    return len(state["vars"])



# -- exports (child sessions) ----------------------------------------------------------------------
def _export_refs(ns: SandboxNamespace) -> dict[int, tuple[Any, ...]]:
    """References that resolve to the same thing in any host: modules, their attributes, helpers,
    preloaded callables. Never the data (`traces`, extra variables, `history`): that is copied."""
    refs: dict[int, tuple[Any, ...]] = {}
    for modname, proxy in ns.importer._cache.items():
        for key, value in object.__getattribute__(proxy, "_rr_attrs").items():
            if type(value) not in _ATOMIC:
                refs[id(value)] = ("a", modname, key)
        refs[id(proxy)] = ("m", modname)
    data_names = {*ns._data_names, _HISTORY}
    for name, value in ns._scaffold.items():
        if name not in data_names and callable(value) and not isinstance(value, type):
            refs[id(value)] = ("s", name)
    for name, (fn, _src) in ns._helpers.items():
        refs[id(fn)] = ("h", name)
    return refs


def _pickled_size(value: Any, refs: dict[int, tuple[Any, ...]]) -> int | None:
    """The size of `value` pickled for an export (None: it cannot be carried)."""
    buf = io.BytesIO()
    try:
        _Pickler(buf, refs, check_sets=False).dump(value)
    except Exception:  # SnapshotRefused, PicklingError, RecursionError, MemoryError, ...
        return None
    return buf.tell()


def _pickles(value: Any, refs: dict[int, tuple[Any, ...]]) -> bool:
    try:
        _Pickler(io.BytesIO(), refs, check_sets=False).dump(value)
    except Exception:  # SnapshotRefused, PicklingError, RecursionError, MemoryError, ...
        return False
    return True


def take_export(ns: SandboxNamespace) -> tuple[bytes, list[str]]:
    """Serialise what a child session inherits; returns (bytes, names of the user variables skipped).

    Never refuses (see the module doc). Skipped names are user variables in namespace order, plus
    `history` if some of its items could not be carried; the scaffolding is never exported nor listed.
    """
    from sandbox.host.safe_modules import ModuleProxy  # lazy: keep snapshot imports light

    refs = _export_refs(ns)
    hidden = set(ns._scaffold) | set(ns._helpers)
    skipped: list[str] = []
    candidates: dict[str, Any] = {}
    for name, value in ns.ns.items():
        if name in hidden or name.startswith("__"):
            continue
        if isinstance(value, ModuleProxy) or (callable(value) and id(value) not in refs):
            skipped.append(name)
            continue
        candidates[name] = value
    history = ns._scaffold.get(_HISTORY)
    if not isinstance(history, list):
        history = []
    meta = {"version": EXPORT_VERSION, "kind": _EXPORT_KIND, "helpers": [(n, s) for n, (_f, s) in ns._helpers.items()]}
    try:
        blob = _dump_export(meta, {"vars": candidates, "history": history}, refs)
        if len(blob) <= EXPORT_VAR_MAX_BYTES:  # then no variable can be over either limit
            return blob, skipped
    except Exception:  # find what cannot be carried, one value at a time
        pass
    history_dropped = False
    if not _pickles(history, refs):
        original, history = history, [item for item in history if _pickles(item, refs)]
        history_dropped = True
        for name, value in candidates.items():  # aliases such as `h = history` follow the filtered list
            if value is original:
                candidates[name] = history
    kept = {}
    total = 0
    mb = 1024**2
    for name, value in candidates.items():
        size = _pickled_size(value, refs)
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
    return _dump_export(meta, {"vars": kept, "history": history}, refs), skipped


def _dump_export(meta: dict[str, Any], state: dict[str, Any], refs: dict[int, tuple[Any, ...]]) -> bytes:
    buf = io.BytesIO()
    pickle.dump(meta, buf, protocol=PROTOCOL)
    _Pickler(buf, refs, check_sets=False).dump(state)
    return buf.getvalue()


def _resolve_export(ns: SandboxNamespace, pid: tuple[Any, ...]) -> Any:
    if pid[0] not in ("s", "m", "a", "h", "L"):
        raise ValueError(f"an export cannot refer to {pid!r}")
    return _resolve_here(ns, None, pid)


def restore_export(ns: SandboxNamespace, blob: bytes) -> dict[str, Any]:
    """Load an export into a freshly started namespace (before any cell).

    The child's own scaffolding wins: an exported name that is preloaded in the child (an extra
    variable, a preloaded function) is not restored and is reported as `shadowed`. Raises on a
    malformed export (the caller discards the host).
    """
    buf = io.BytesIO(blob)
    meta = _Unpickler(buf, lambda pid: _resolve_export(ns, pid)).load()
    if not isinstance(meta, dict) or meta.get("kind") != _EXPORT_KIND or meta.get("version") != EXPORT_VERSION:
        raise ValueError("not a namespace export of this version")
    shadowed: list[str] = []
    helpers = 0
    for name, source in meta["helpers"]:
        if name in ns._scaffold:
            shadowed.append(name)
            continue
        ns.define_helper(str(name), str(source))
        helpers += 1
    state = _Unpickler(buf, lambda pid: _resolve_export(ns, pid)).load()
    count = 0
    for name, value in state["vars"].items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__"):
            continue
        if name in ns._scaffold or name in ns._helpers:
            shadowed.append(name)
            continue
        ns.ns[name] = value
        count += 1
    history = state.get("history")
    if isinstance(history, list) and history and _HISTORY in ns._scaffold:
        current = ns._scaffold[_HISTORY]
        # The exported list object itself (keeps aliases such as `h = history` in the child).
        ns._scaffold[_HISTORY] = history
        if isinstance(current, list) and current:
            history.extend(current)
    return {"vars": count, "helpers": helpers, "history": len(history) if isinstance(history, list) else 0, "shadowed": shadowed}
