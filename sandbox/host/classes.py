"""Classes in the sandbox: what a guard may trust about a class (its real MRO, whether a cell made it, the
real characters of a str), and the sandbox's `type`, which checks the namespace of every class made by a
call and never hands out the real `type` or another real metaclass (`sandbox.host.guards` says why)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "CELL_MODULE",
    "GuardError",
    "SafeType",
    "check_class_namespace",
    "exact_str",
    "is_cell_class",
    "real_subclass",
]

# `__name__` of the cell namespace, hence `__module__` of every class a cell creates (see is_cell_class).
CELL_MODULE = "__sandbox__"
# Defined by no cell, anywhere (the hooks' old, plain names: defence in depth).
_HOOK_PREFIX = "__rr_"


class GuardError(Exception):
    """Raised when a cell (or a helper's source) violates the sandbox rules; the message is for the model."""


def exact_str(value: Any, what: str) -> str:
    """The real characters of a str (a fresh exact `str` for a subclass, whatever it overrides).

    Checks must look at what C code will use: `str(s)` calls a subclass's `__str__`, which can lie,
    and its other methods (`split`, `startswith`, `__getitem__`, `__eq__`) can too.
    """
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if not real_subclass(kind, str):  # not `isinstance`: a cell class answers that with its `__class__`
        raise TypeError(f"{what} must be a str, not {_TYPE_NAME.__get__(kind)}")
    return str.__str__(value)


def real_subclass(cls: Any, base: type) -> bool:
    """Whether `base` is in the real MRO of the class `cls` (False when `cls` is not a class).

    What a guard must use instead of `isinstance`/`issubclass`, which a cell class can steer
    (`__class__`, `__bases__`, a metaclass' `__subclasscheck__` or `__eq__`).
    """
    # `type.__subclasscheck__` called on real classes is CPython's PyType_IsSubtype: the real MRO,
    # compared by identity, no metaclass consulted (`type(cls)` is always a real class).
    return bool(_IS_SUBTYPE(type, type(cls)) and _IS_SUBTYPE(base, cls))


def is_cell_class(cls: Any) -> bool:
    """True for a class created by a cell (its own `__module__` is the cell namespace's name).

    Read through `type`'s own descriptor so a metaclass cannot lie; a real class cannot be made to
    claim it, because attribute assignment on real classes is refused (`safe_modules.check_mutable`)
    and `type(...)` refuses a `__module__` key.
    """
    try:
        module = _TYPE_MODULE.__get__(cls)
    except (AttributeError, TypeError):
        return False
    return type(module) is str and module == CELL_MODULE  # exact str first: no cell `__eq__` runs


_TYPE_MODULE: Any = vars(type)["__module__"]
_TYPE_NAME: Any = vars(type)["__name__"]
_IS_SUBTYPE: Any = vars(type)["__subclasscheck__"]


# Dunder methods a class body may *define*; the others only serve to hook interpreter machinery, or
# make an object lie about what it is (`__class__` answers `isinstance`, `__bases__` `issubclass`,
# `__self__`/`__func__`/`__wrapped__`/`__dict__` what a bound method or wrapper holds).
_DENIED_DUNDER_DEFS: frozenset[str] = frozenset(
    "__instancecheck__ __subclasscheck__ __subclasshook__ __class_getitem__ __set_name__ __prepare__ "
    "__mro_entries__ __getattribute__ __del__ __reduce__ __reduce_ex__ __getstate__ __setstate__ "
    "__init_subclass__ __builtins__ __globals__ __match_args__ __class__ __dict__ __bases__ __base__ "
    "__mro__ __weakref__ __self__ __func__ __wrapped__ __code__ __closure__ __objclass__".split()
)


# Class-namespace keys a namespace dict may not hold (besides the denied dunder definitions).
_DENIED_NAMESPACE_KEYS: frozenset[str] = _DENIED_DUNDER_DEFS | {
    "__dict__",
    "__weakref__",
    "__class__",
    "__bases__",
    "__base__",
    "__mro__",
}


def check_class_namespace(ns: Any) -> dict[str, Any]:
    """A checked copy of the namespace given to `type(name, bases, ns)` or to a cell metaclass.

    A `class` body was checked by the AST pass, a namespace built as a dict was not: it may not hold
    a dunder the AST check refuses to define (`__match_args__`, `__del__`, `__init_subclass__`, ...),
    and its `__module__` is the cell namespace's (so `is_cell_class` cannot be fooled).
    """
    if not real_subclass(type(ns), dict):
        raise TypeError("type(): the namespace must be a dict")
    copy = dict.copy(ns)  # the real items, whatever a dict subclass overrides
    for key in copy:
        if type(key) is not str:
            raise GuardError("type(): namespace keys must be plain str in the sandbox")
        if key in _DENIED_NAMESPACE_KEYS or key.startswith(_HOOK_PREFIX):
            raise GuardError(f"type(): the namespace key '{key}' is not allowed in the sandbox")
        if not key.isidentifier():  # e.g. the rewriter's hooks, which are no identifiers
            raise GuardError(f"type(): the namespace key {key!r} is not an identifier; use attribute names")
    module = copy.setdefault("__module__", CELL_MODULE)
    if type(module) is not str or module != CELL_MODULE:
        raise GuardError("type(): the namespace key '__module__' is not allowed in the sandbox")
    if "__slots__" in copy:
        _check_slots(copy["__slots__"])
    return copy


def _check_slots(slots: Any) -> None:
    """A slot is a class attribute too: `__slots__ = ('__class__',)` would put a settable `__class__`
    descriptor on the class. Plain str / tuple / list of identifiers only (no cell iterator runs)."""
    names = [slots] if type(slots) is str else list(slots) if type(slots) in (tuple, list) else None
    if names is None:
        raise GuardError("type(): '__slots__' must be a str, tuple or list of attribute names in the sandbox")
    for name in names:
        if (
            type(name) is not str
            or not name.isidentifier()
            or name.startswith(_HOOK_PREFIX)
            or (name in _DENIED_NAMESPACE_KEYS and name not in ("__dict__", "__weakref__"))
        ):
            raise GuardError(f"type(): the slot {name!r} is not allowed in the sandbox")


class _TypeMeta(type):
    """Metaclass of `SafeType`: checks class creation by call, keeps `isinstance(x, type)` working."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SafeType:
            if len(args) == 1 and not kwargs:
                return _visible_type(type(args[0]))
            if len(args) != 3:
                raise TypeError("type() takes 1 or 3 arguments")
            name, bases, ns = args
            return type(exact_str(name, "type() name"), bases, check_class_namespace(ns), **kwargs)
        if len(args) == 3:  # a cell metaclass (a subclass of `type`): class statement or direct call
            args = (args[0], args[1], check_class_namespace(args[2]))
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        real = _REAL_METACLASS.get(cls)
        return isinstance(obj, real) if real is not None else type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: Any) -> bool:
        real = _REAL_METACLASS.get(cls)
        return issubclass(sub, real) if real is not None else type.__subclasscheck__(cls, sub)


class SafeType(type, metaclass=_TypeMeta):
    """The sandbox's `type`: `type(x)` as usual; `type(name, bases, ns)` with a checked namespace.

    The real `type` is never handed out (`type(type)` and `type(SomeClass)` give this class back, and
    `.mro()` is refused), so a namespace key the AST check would refuse in a class body
    (`__match_args__`, `__del__`, `__init_subclass__`, `__module__`, ...) cannot be set that way.
    """


SafeType.__name__ = SafeType.__qualname__ = "type"
SafeType.__module__ = "builtins"

# checked stand-in -> the real metaclass it stands for (isinstance/issubclass answer for the real one)
_REAL_METACLASS: dict[type, type] = {SafeType: type}
# id of a real metaclass -> (it, its checked stand-in)
_CHECKED_METACLASS: dict[int, tuple[type, type]] = {
    id(type): (type, SafeType),
    id(_TypeMeta): (_TypeMeta, SafeType),
}


def _visible_type(kind: type) -> type:
    """What `type(x)` shows a cell: the class itself, or for a class `x` a checked stand-in of a real
    metaclass (`type`, `ABCMeta`, `EnumType`), whose calls check the namespace like `type(...)`."""
    known = _CHECKED_METACLASS.get(id(kind))  # by id: a cell class' metaclass answers `==`/hash
    if known is not None and known[0] is kind:
        return known[1]
    # (issubclass(x, SafeType) is answered for the real `type`: look at the MRO itself)
    if not real_subclass(kind, type) or real_subclass(kind, SafeType) or is_cell_class(kind):
        return kind
    checked = _TypeMeta(kind.__name__, (kind,), {"__module__": "builtins", "__qualname__": kind.__qualname__})
    _CHECKED_METACLASS[id(kind)] = (kind, checked)
    _REAL_METACLASS[checked] = kind
    return checked
