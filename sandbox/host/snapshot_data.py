"""The unpickler that loads data only (`sandbox.host.snapshot` says why): every opcode that calls, builds or
fills something is checked against what a snapshot may contain (`sandbox.host.snapshot_contents`)."""

from __future__ import annotations

import collections
import io
import pickle
from collections.abc import Callable
from typing import Any

from sandbox.host.snapshot_contents import _GLOBALS as _GLOBALS  # the tests read these here too
from sandbox.host.snapshot_contents import _HASH_SAFE, PROTOCOL, _describe_obj
from sandbox.host.snapshot_contents import _RE_COMPILE as _RE_COMPILE
from sandbox.host.snapshot_contents import _checked_call as _checked_call

# -- loading: data only ---------------------------------------------------------------------------
_PID_ARITY: dict[str, tuple[type, ...]] = {
    "s": (str,),
    "d": (int,),
    "D": (int,),
    "m": (str,),
    "a": (str, str),
    "h": (str,),
    "b": (str,),
    "i": (str,),
    "L": (str, int, int, int),
    "f": (int, object),
}


_SNAPSHOT_PIDS = frozenset(_PID_ARITY)


_EXPORT_PIDS = frozenset({"s", "m", "a", "h", "b", "i", "L", "f"})


_NUMBERS = (int, float, complex)


_DICTS = frozenset({dict, collections.OrderedDict, collections.defaultdict, collections.Counter})


_LISTS = frozenset({list, collections.deque})


_Py: Any = pickle._Unpickler  # the pure-Python unpickler: each opcode is a method


_REFUSED_OPS = (
    pickle.BUILD,
    pickle.INST,
    pickle.OBJ,
    pickle.NEWOBJ,
    pickle.NEWOBJ_EX,
    pickle.EXT1,
    pickle.EXT2,
    pickle.EXT4,
    pickle.PERSID,
    pickle.NEXT_BUFFER,
    pickle.READONLY_BUFFER,
)


class _DataUnpickler(_Py):  # type: ignore[misc]
    """Unpickles data only (see the module doc): every opcode that calls, builds or fills something is
    checked; `resolve` maps a checked persistent reference to this host's object (None: none allowed)."""

    dispatch: dict[int, Any] = dict(_Py.dispatch)

    def __init__(
        self,
        file: io.BytesIO,
        resolve: Callable[[tuple[Any, ...]], Any] | None,
        kinds: frozenset[str] = frozenset(),
    ) -> None:
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
        raise pickle.UnpicklingError(
            "a snapshot holds only plain data (an opcode that builds objects was refused)"
        )


def _set_items(target: Any, items: list[Any]) -> None:
    for i in range(0, len(items), 2):
        key = items[i]
        if type(key) not in _HASH_SAFE:
            raise pickle.UnpicklingError("a snapshot dict key must be plain data")
        target[key] = items[i + 1]


def _load(
    buf: io.BytesIO, resolve: Callable[[tuple[Any, ...]], Any] | None, kinds: frozenset[str] = frozenset()
) -> Any:
    """One pickle of `buf`, data only; any failure is an UnpicklingError (the caller discards the host)."""
    try:
        return _DataUnpickler(buf, resolve, kinds).load()
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(f"refused pickle: {exc}") from None
    except Exception as exc:  # struct.error, EOFError, KeyError, ValueError from a reference, ...
        raise pickle.UnpicklingError(f"malformed pickle: {type(exc).__name__}: {exc}") from None


for _op, _name in (
    (pickle.REDUCE, "load_reduce"),
    (pickle.APPEND, "load_append"),
    (pickle.APPENDS, "load_appends"),
    (pickle.SETITEM, "load_setitem"),
    (pickle.SETITEMS, "load_setitems"),
    (pickle.ADDITEMS, "load_additems"),
    (pickle.PROTO, "load_proto"),
):
    _DataUnpickler.dispatch[_op[0]] = getattr(_DataUnpickler, _name)


for _op in _REFUSED_OPS:
    _DataUnpickler.dispatch[_op[0]] = _DataUnpickler.refused
