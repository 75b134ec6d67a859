"""Checked routes from a string to an attribute read, which the AST check cannot see: the runtime hook
for `x.format` / `x.format_map` / `x.register` (`guards.ATTR_HOOK`, inserted by the rewriter), the
format-string check, and attribute paths given as data (`operator.attrgetter`); `sandbox.host.guards` says why.
"""

from __future__ import annotations

import abc
import functools
import string
import types
from collections.abc import Callable
from typing import Any

from sandbox.host.guards import (
    GuardError,
    check_attr_name,
    check_dynamic_attr_name,
    exact_str,
    is_cell_class,
    real_subclass,
)

__all__ = ["check_format_string", "guarded_attr"]


def _check_attr_path(path: Any) -> str:
    """The exact str of an attribute path ("a.b") whose every part may be read; what C code gets."""
    text = exact_str(path, "attribute name")
    for part in text.split("."):
        why = check_dynamic_attr_name(part)
        if why:
            raise GuardError(why)
    return text


def check_format_string(fmt: str, depth: int = 0) -> None:
    """Refuse format fields that read attributes the sandbox forbids (`"{0.__class__}"`)."""
    import _string  # CPython's own field-name parser, so we see exactly what str.format will do

    fmt = exact_str(fmt, "format string")
    if depth > 3:
        raise GuardError("format specification nested too deeply")
    for _literal, field, spec, _conv in string.Formatter().parse(fmt):
        if field is not None:
            _first, rest = _string.formatter_field_name_split(field)
            for is_attr, key in rest:
                if is_attr:
                    why = check_attr_name(str(key))
                    if why:
                        raise GuardError(f"format field '{{{field}}}': {why}")
        if spec:
            check_format_string(spec, depth + 1)


def _safe_format(fmt: str, *args: Any, **kwargs: Any) -> str:
    fmt = exact_str(fmt, "format()'s format string")
    check_format_string(fmt)
    return str.format(fmt, *args, **kwargs)


def _safe_format_map(fmt: str, mapping: Any) -> str:
    fmt = exact_str(fmt, "format_map()'s format string")
    check_format_string(fmt)
    return str.format_map(fmt, mapping)


_STR_METHODS: dict[str, Callable[..., str]] = {"format": _safe_format, "format_map": _safe_format_map}


def guarded_attr(obj: Any, name: str) -> Any:
    """Runtime hook for `x.format` / `x.format_map` / `x.register` (inserted by the AST rewriter).

    What `obj` is, is read from its real type (`isinstance` would ask the cell's `__class__`).
    """
    if name == "register":
        return _guarded_register(obj)
    kind = type(obj)
    if real_subclass(kind, type) and real_subclass(obj, str):  # str or a subclass: the unbound method
        return _STR_METHODS[name]
    if real_subclass(kind, str):
        return functools.partial(_STR_METHODS[name], exact_str(obj, "str"))
    value = getattr(obj, name)
    if value is str.format or value is str.format_map:
        return _STR_METHODS[name]
    bound_to = _builtin_self(value)
    if real_subclass(type(bound_to), str):  # e.g. super(S, s).format on a str subclass
        return functools.partial(_STR_METHODS[name], exact_str(bound_to, "str"))
    return value


_BUILTIN_SELF: Any = vars(types.BuiltinMethodType)["__self__"]


def _builtin_self(value: Any) -> Any:
    """The object a C method (`"x".format`) is bound to, read through its type's own descriptor (a
    cell object's `__self__` attribute answers what the cell likes); None for anything else."""
    if type(value) is types.BuiltinMethodType:
        return _BUILTIN_SELF.__get__(value)
    return None


_ABC_REGISTER: Any = abc.ABCMeta.register


def _guarded_register(obj: Any) -> Any:
    """`X.register` as usual, except that an ABC only takes classes a cell created: registering `dict`
    with `collections.abc.Sequence` would change `isinstance` for the host and for every later cell,
    and a snapshot restore would not bring it back. That holds for a cell's own ABCs too: a real ABC
    asks its subclasses and its registered classes in turn (`class S(Sequence)`, `S.register(dict)`
    made `isinstance({}, Sequence)` true), so no real class is ever registered."""
    value = obj.register
    if value is _ABC_REGISTER:  # ABCMeta.register(cls, subclass)

        def register_any(cls: Any, subclass: Any) -> Any:
            return _check_abc_register(cls, subclass)

        return register_any
    if type(value) is types.MethodType and _METHOD_FUNC.__get__(value) is _ABC_REGISTER:
        target = _METHOD_SELF.__get__(value)

        def register(subclass: Any) -> Any:
            return _check_abc_register(target, subclass)

        return register
    return value


_METHOD_FUNC: Any = vars(types.MethodType)["__func__"]
_METHOD_SELF: Any = vars(types.MethodType)["__self__"]


def _check_abc_register(cls: Any, subclass: Any) -> Any:
    if not real_subclass(type(cls), abc.ABCMeta):
        raise TypeError("register(): the class to register with must be an abstract base class")
    if not is_cell_class(subclass):
        raise GuardError(
            "register(): only classes defined in a cell can be registered with an ABC in the sandbox (registering "
            "a real class would change isinstance() for everything, also through a subclass of a real ABC); "
            "define your own class (a subclass of the ABC, or one you register) or test the type directly"
        )
    return _ABC_REGISTER(cls, subclass)
