"""Runtime guards: module proxies for the import allowlist, and the dynamic attribute-access routes.

Why proxies and not the real modules: a real module leaks the modules *it* imported
(`json.codecs.sys.modules['os']`, `typing.sys`, `statistics.random`), plus gadgets that turn a
string into an attribute read (`operator.attrgetter('__globals__')`, `string.Formatter`,
`functools.update_wrapper(assigned=...)`, `typing.get_type_hints` which calls `eval` with fresh
builtins). A proxy exposes only public, non-module attributes, replaces those gadgets with checked
versions and drops the rest. Clocks are absent: cells must replay deterministically.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib
import operator
import string
import types
from collections.abc import Callable, Iterable
from typing import Any

from sandbox.guards import (
    ALLOWED_MODULES,
    GuardError,
    check_attr_name,
    check_dynamic_attr_name,
    module_refusal,
)

__all__ = ["ModuleProxy", "SafeImporter", "guarded_attr", "check_format_string"]


class ModuleProxy:
    """A read-only, module-like view of an allowlisted module."""

    __slots__ = ("_rr_name", "_rr_attrs")

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        object.__setattr__(self, "_rr_name", name)
        object.__setattr__(self, "_rr_attrs", attrs)

    def __getattr__(self, item: str) -> Any:
        attrs: dict[str, Any] = object.__getattribute__(self, "_rr_attrs")
        try:
            return attrs[item]
        except KeyError:
            name = object.__getattribute__(self, "_rr_name")
            raise AttributeError(f"module '{name}' has no attribute '{item}' in the sandbox") from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("sandbox modules are read-only")

    def __delattr__(self, key: str) -> None:
        raise AttributeError("sandbox modules are read-only")

    def __dir__(self) -> list[str]:
        return sorted(object.__getattribute__(self, "_rr_attrs"))

    def __repr__(self) -> str:
        return f"<sandbox module '{object.__getattribute__(self, '_rr_name')}'>"

    def __reduce__(self) -> Any:
        raise TypeError("sandbox modules cannot be copied")


# ---------------------------------------------------------------------------------------------------
# Checked replacements for string -> attribute gadgets
# ---------------------------------------------------------------------------------------------------


def _check_attr_path(path: str) -> None:
    for part in str(path).split("."):
        why = check_dynamic_attr_name(part)
        if why:
            raise GuardError(why)


def check_format_string(fmt: str, depth: int = 0) -> None:
    """Refuse format fields that read attributes the sandbox forbids (`"{0.__class__}"`)."""
    import _string  # CPython's own field-name parser, so we see exactly what str.format will do

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
    if not isinstance(fmt, str):
        raise TypeError("format() needs a str")
    check_format_string(fmt)
    return str.format(fmt, *args, **kwargs)


def _safe_format_map(fmt: str, mapping: Any) -> str:
    if not isinstance(fmt, str):
        raise TypeError("format_map() needs a str")
    check_format_string(fmt)
    return str.format_map(fmt, mapping)


_STR_METHODS: dict[str, Callable[..., str]] = {"format": _safe_format, "format_map": _safe_format_map}


def guarded_attr(obj: Any, name: str) -> Any:
    """Runtime hook for `x.format` / `x.format_map` (inserted by the AST rewriter)."""
    if isinstance(obj, type) and issubclass(obj, str):
        return _STR_METHODS[name]
    if isinstance(obj, str):
        return functools.partial(_STR_METHODS[name], obj)
    value = getattr(obj, name)
    bound_to = getattr(value, "__self__", None)
    if isinstance(bound_to, str):  # e.g. super(S, s).format on a str subclass
        return functools.partial(_STR_METHODS[name], str(bound_to))
    if value is str.format or value is str.format_map:
        return _STR_METHODS[name]
    return value


def _safe_attrgetter(*names: str) -> Any:
    for name in names:
        _check_attr_path(name)
    return operator.attrgetter(*names)


def _safe_methodcaller(name: str, /, *args: Any, **kwargs: Any) -> Any:
    _check_attr_path(name)
    return operator.methodcaller(name, *args, **kwargs)


def _safe_update_wrapper(wrapper: Any, wrapped: Any, *args: Any, **kwargs: Any) -> Any:
    if args or kwargs:
        raise GuardError("functools.update_wrapper/wraps: custom 'assigned'/'updated' are not allowed")
    return functools.update_wrapper(wrapper, wrapped)


def _safe_wraps(wrapped: Any, *args: Any, **kwargs: Any) -> Any:
    if args or kwargs:
        raise GuardError("functools.wraps: custom 'assigned'/'updated' are not allowed in the sandbox")
    return functools.wraps(wrapped)


def _safe_singledispatch(func: Callable[..., Any]) -> Any:
    """singledispatch whose `register` needs an explicit type.

    The annotation form (`@f.register def _(x: "...")`) evaluates the annotation string with
    `typing.get_type_hints`, i.e. `eval` of code the AST check never saw.
    """
    dispatcher = functools.singledispatch(func)
    real_register = dispatcher.register

    def register(cls: Any, func: Callable[..., Any] | None = None) -> Any:
        if not isinstance(cls, type):
            raise GuardError("singledispatch: pass the type explicitly, e.g. @f.register(int)")
        return real_register(cls, func)

    dispatcher.register = register  # type: ignore[method-assign]
    return dispatcher


def _safe_make_dataclass(cls_name: str, fields: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
    import dataclasses

    fields = list(fields)
    for spec in fields:
        name = spec if isinstance(spec, str) else spec[0]
        if not isinstance(name, str) or name.startswith("_"):
            raise GuardError("make_dataclass: field names must not start with '_' in the sandbox")
    for key in kwargs.get("namespace") or {}:
        if str(key).startswith("_"):
            raise GuardError("make_dataclass: namespace keys must not start with '_' in the sandbox")
    return dataclasses.make_dataclass(cls_name, fields, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------
# datetime without clocks
# ---------------------------------------------------------------------------------------------------

_NO_CLOCK = (
    "there is no clock in the sandbox (cells must be re-executable deterministically); "
    "use timestamps from the trace instead"
)


class _date(_dt.date):
    """`datetime.date` minus `today()`."""

    @classmethod
    def today(cls) -> Any:  # noqa: D102
        raise GuardError(f"date.today(): {_NO_CLOCK}")

    @classmethod
    def fromtimestamp(cls, t: float) -> Any:  # noqa: D102 - local time zone is host state; use UTC
        raise GuardError("date.fromtimestamp(): use datetime.fromtimestamp(t, tz=timezone.utc).date()")


class _datetime(_dt.datetime):
    """`datetime.datetime` minus `now()`, `utcnow()`, `today()`."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:  # noqa: D102
        raise GuardError(f"datetime.now(): {_NO_CLOCK}")

    @classmethod
    def utcnow(cls) -> Any:  # noqa: D102
        raise GuardError(f"datetime.utcnow(): {_NO_CLOCK}")

    @classmethod
    def today(cls) -> Any:  # noqa: D102
        raise GuardError(f"datetime.today(): {_NO_CLOCK}")


_date.__name__ = _date.__qualname__ = "date"
_datetime.__name__ = _datetime.__qualname__ = "datetime"


def _datetime_attrs() -> dict[str, Any]:
    return {
        "date": _date,
        "datetime": _datetime,
        "time": _dt.time,
        "timedelta": _dt.timedelta,
        "timezone": _dt.timezone,
        "tzinfo": _dt.tzinfo,
        "MINYEAR": _dt.MINYEAR,
        "MAXYEAR": _dt.MAXYEAR,
        "UTC": _dt.UTC,
    }


# ---------------------------------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------------------------------

# Per-module attributes that are dropped (gadgets that cannot be made safe, or are pointless).
_DENIED: dict[str, frozenset[str]] = {
    "typing": frozenset({"get_type_hints", "ForwardRef", "TYPE_CHECKING", "no_type_check_decorator"}),
    "string": frozenset({"Formatter"}),
    "collections": frozenset({"UserString"}),  # its .format() calls str.format unchecked
    "pprint": frozenset(),
    # singledispatchmethod.register evaluates string annotations (see _safe_singledispatch).
    "functools": frozenset({"WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES", "singledispatchmethod"}),
    "dataclasses": frozenset({"Field"}),
}

_OVERRIDES: dict[str, dict[str, Any]] = {
    "operator": {"attrgetter": _safe_attrgetter, "methodcaller": _safe_methodcaller},
    "functools": {
        "update_wrapper": _safe_update_wrapper,
        "wraps": _safe_wraps,
        "singledispatch": _safe_singledispatch,
    },
    "dataclasses": {"make_dataclass": _safe_make_dataclass},
}

_SUBMODULES: dict[str, tuple[str, ...]] = {"collections": ("abc",)}


class SafeImporter:
    """The sandbox's `__import__`: allowlisted modules only, each returned as a cached proxy."""

    def __init__(self) -> None:
        self._cache: dict[str, ModuleProxy] = {}

    def proxy(self, name: str) -> ModuleProxy:
        """Return the proxy of an allowlisted module (built on first use to keep host startup fast)."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        if name not in ALLOWED_MODULES:
            raise ImportError(module_refusal(name))
        if name == "datetime":
            attrs = _datetime_attrs()
        else:
            module = importlib.import_module(name)
            denied = _DENIED.get(name, frozenset())
            attrs = {
                key: value
                for key, value in vars(module).items()
                if not key.startswith("_") and key not in denied and not isinstance(value, types.ModuleType)
            }
            attrs.update(_OVERRIDES.get(name, {}))
            for sub in _SUBMODULES.get(name, ()):
                attrs[sub] = self.proxy(f"{name}.{sub}")
        proxy = ModuleProxy(name, attrs)
        self._cache[name] = proxy
        return proxy

    def __call__(
        self,
        name: str,
        globals: Any = None,  # noqa: A002 - signature of builtins.__import__
        locals: Any = None,  # noqa: A002
        fromlist: Any = (),
        level: int = 0,
    ) -> ModuleProxy:
        if level:
            raise ImportError("relative imports are not available in the sandbox")
        if name not in ALLOWED_MODULES:
            raise ImportError(module_refusal(name))
        for item in fromlist or ():
            why = check_attr_name(str(item))
            if why:
                raise ImportError(why)
        if fromlist:
            return self.proxy(name)
        return self.proxy(name.split(".")[0])
