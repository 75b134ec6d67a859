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

import decimal
import io
import pickle
import sys
import types
from typing import TYPE_CHECKING, Any

from reflector.analysis.traces.lazy import resolve_ref
from sandbox.host.snapshot_contents import (
    _ATOMIC,
    _EXPORT_KIND,
    _HISTORY,
    BUDGET_S,
    EXPORT_MAX_BYTES,
    EXPORT_VAR_MAX_BYTES,
    EXPORT_VERSION,
    PROTOCOL,
    SNAPSHOT_VERSION,
    SnapshotRefused,
    _is_class,
)
from sandbox.host.snapshot_data import _EXPORT_PIDS, _SNAPSHOT_PIDS, _load
from sandbox.host.snapshot_pickle import DataIndex, _Clock, _global_of, _Pickler

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
        if (
            type(value) not in _ATOMIC
            and not name.startswith("_")
            and id(value) not in refs
            and not _global_of(value)
        ):
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
        if (
            type(value) in _ATOMIC
            or name == _HISTORY
            or name.startswith("_")
            or (name in data_names and not data_unchanged)
        ):
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
    hashes = getattr(ns, "hashes", None)  # sandbox.host.hashes.IdentityHashes
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
    buf: io.BytesIO,
    state: Any,
    refs: dict[int, tuple[Any, ...]],
    clock: _Clock,
    *,
    data_atoms: list[Any] | None = None,
    **kw: Any,
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
        _Pickler(
            buf, refs, clock=clock, shared=pickler.found_shared, atoms=hits, atom_objs=data_atoms, **kw
        ).dump(state)


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
        type(h) is tuple
        and len(h) == 2
        and type(h[0]) is str
        and type(h[1]) is str
        and h[0].isidentifier()
        and not h[0].startswith("_")
        for h in helpers
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
    if (
        type(state) is not dict
        or type(state.get("vars")) is not dict
        or type(state.get("decimal")) is not decimal.Context
    ):
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
    meta = {
        "version": EXPORT_VERSION,
        "kind": _EXPORT_KIND,
        "helpers": [(n, s) for n, (_f, s) in ns._helpers.items()],
    }
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


def _dump_export(
    meta: dict[str, Any], state: dict[str, Any], refs: dict[int, tuple[Any, ...]], clock: _Clock
) -> bytes:
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
    return {
        "vars": count,
        "helpers": helpers,
        "history": len(history) if type(history) is list else 0,
        "shadowed": shadowed,
    }
