"""Runtime guards: module proxies for the import allowlist, and the dynamic attribute-access routes.

Why proxies and not the real modules: a real module leaks the modules *it* imported
(`json.codecs.sys.modules['os']`, `typing.sys`, `statistics.random`), plus gadgets that turn a
string into an attribute read (`operator.attrgetter('__globals__')`, `string.Formatter`,
`functools.update_wrapper(assigned=...)`, `typing.get_type_hints` which calls `eval` with fresh
builtins). A proxy exposes only public, non-module attributes, replaces those gadgets with checked
versions and drops the rest. Clocks and randomness are absent: cells must replay deterministically.

What a checked replacement hands back is a plain function of this module, never an instance of the
real gadget class (`type(operator.attrgetter('x'))` would be the unchecked constructor), nor a
`functools.partial` whose `.func` is the unchecked original. Real classes and functions reachable
from a proxy are shared with the host (its framing uses `json`): `check_mutable` refuses attribute
assignment on them, and the few mutable containers and singletons they hold are frozen or dropped.
"""

from __future__ import annotations

import collections
import datetime as _dt
import functools
import importlib
import operator
import types
from collections.abc import Callable
from typing import Any

from sandbox.host.attr_hooks import _check_abc_register as _check_abc_register  # the tests call it here
from sandbox.host.attr_hooks import _check_attr_path, check_format_string, guarded_attr
from sandbox.host.guards import (
    ALLOWED_MODULES,
    CELL_MODULE,
    GuardError,
    check_attr_name,
    exact_str,
    is_cell_class,
    module_refusal,
    real_subclass,
)

__all__ = ["ModuleProxy", "SafeImporter", "guarded_attr", "check_format_string", "check_mutable"]


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
# Checked replacements for string -> attribute gadgets (the `x.format` hook and the format-string check:
# `sandbox.host.attr_hooks`)
# ---------------------------------------------------------------------------------------------------


def _safe_attrgetter(*names: Any) -> Callable[[Any], Any]:
    """`operator.attrgetter` with checked names; a plain function (its type constructs nothing)."""
    checked = [_check_attr_path(name) for name in names]
    getter = operator.attrgetter(*checked)

    def attrgetter(obj: Any) -> Any:
        return getter(obj)

    attrgetter.__qualname__ = f"attrgetter({', '.join(map(repr, checked))})"
    return attrgetter


def _safe_methodcaller(name: Any, /, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """`operator.methodcaller` with a checked name; a plain function (its type constructs nothing)."""
    checked = _check_attr_path(name)
    caller = operator.methodcaller(checked, *args, **kwargs)

    def methodcaller(obj: Any) -> Any:
        return caller(obj)

    methodcaller.__qualname__ = f"methodcaller({checked!r}, ...)"
    return methodcaller


_WRAPPER_STRINGS = ("__module__", "__name__", "__qualname__", "__doc__")


def _safe_update_wrapper(wrapper: Any, wrapped: Any, *args: Any, **kwargs: Any) -> Any:
    """`functools.update_wrapper` that copies only what a cell could read itself.

    The real one hands `wrapped.__dict__` to `wrapper.__dict__.update(...)`: with `wrapped=type` and
    a cell object as `wrapper.__dict__`, the cell gets `type.__dict__` (`__subclasses__`, ...). Here:
    the name/doc strings, the public attributes of a plain `__dict__`, and `__wrapped__`; and
    `wrapper` must be something the cell may change (not a real class, function or module member).
    """
    if args or kwargs:
        raise GuardError("functools.update_wrapper/wraps: custom 'assigned'/'updated' are not allowed")
    check_mutable(wrapper)
    for attr in _WRAPPER_STRINGS:
        try:
            value = getattr(wrapped, attr)
        except AttributeError:
            continue
        if value is None or type(value) is str:
            setattr(wrapper, attr, value)
    try:
        extra = wrapped.__dict__
    except AttributeError:
        extra = None
    if type(extra) is dict:
        for key, value in list(extra.items()):
            if type(key) is str and check_attr_name(key) is None:
                setattr(wrapper, key, value)
    wrapper.__wrapped__ = wrapped
    return wrapper


def _safe_wraps(wrapped: Any, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """`functools.wraps` as a plain closure (the real one is a `partial` exposing `update_wrapper`)."""
    if args or kwargs:
        raise GuardError("functools.wraps: custom 'assigned'/'updated' are not allowed in the sandbox")

    def decorator(wrapper: Any) -> Any:
        return _safe_update_wrapper(wrapper, wrapped)

    return decorator


def _safe_total_ordering(cls: Any) -> Any:
    """`functools.total_ordering` for classes defined in a cell (it sets methods on its argument)."""
    if not is_cell_class(cls):
        raise GuardError("functools.total_ordering: only classes defined in a cell can be decorated")
    return functools.total_ordering(cls)


def _safe_namedtuple(typename: Any, field_names: Any, **kwargs: Any) -> Any:
    """`collections.namedtuple` without `module=` (the class belongs to the cell namespace)."""
    if kwargs.get("module") is not None:
        raise GuardError("namedtuple(module=...) is not allowed in the sandbox")
    kwargs["module"] = CELL_MODULE
    return collections.namedtuple(typename, field_names, **kwargs)


def _safe_singledispatch(func: Callable[..., Any]) -> Any:
    """singledispatch whose `register` needs an explicit type.

    The annotation form (`@f.register def _(x: "...")`) evaluates the annotation string with
    `typing.get_type_hints`, i.e. `eval` of code the AST check never saw, with the real builtins.
    functools takes that form for anything that is not a class by `isinstance(cls, type)`, which a
    cell object answers with its `__class__`: so the check here is on the real type of `cls`, and a
    real class is what functools then sees too.
    """
    dispatcher = functools.singledispatch(func)
    real_register = dispatcher.register

    def register(cls: Any, func: Callable[..., Any] | None = None) -> Any:
        if not real_subclass(type(cls), type):
            raise GuardError(
                "singledispatch: register() takes the class itself, e.g. @f.register(int) or "
                "f.register(int, func) (annotations and unions are not read in the sandbox)"
            )
        return real_register(cls, func)

    dispatcher.register = register  # type: ignore[method-assign]
    return dispatcher


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
    def today(cls) -> Any:
        raise GuardError(f"date.today(): {_NO_CLOCK}")

    @classmethod
    def fromtimestamp(cls, t: float) -> Any:  # local time zone is host state; use UTC
        raise GuardError("date.fromtimestamp(): use datetime.fromtimestamp(t, tz=timezone.utc).date()")


class _datetime(_dt.datetime):
    """`datetime.datetime` minus `now()`, `utcnow()`, `today()`."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        raise GuardError(f"datetime.now(): {_NO_CLOCK}")

    @classmethod
    def utcnow(cls) -> Any:
        raise GuardError(f"datetime.utcnow(): {_NO_CLOCK}")

    @classmethod
    def today(cls) -> Any:
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
    "string": frozenset({"Formatter"}),
    "collections": frozenset({"UserString"}),  # its .format() calls str.format unchecked
    "pprint": frozenset(),
    # singledispatchmethod.register evaluates string annotations (see _safe_singledispatch).
    "functools": frozenset({"WRAPPER_ASSIGNMENTS", "WRAPPER_UPDATES", "singledispatchmethod"}),
    # Process-wide mutable contexts (DefaultContext seeds every Context()); use decimal.Context(...).
    "decimal": frozenset({"DefaultContext", "BasicContext", "ExtendedContext"}),
}

_OVERRIDES: dict[str, dict[str, Any]] = {
    "operator": {"attrgetter": _safe_attrgetter, "methodcaller": _safe_methodcaller},
    "functools": {
        "update_wrapper": _safe_update_wrapper,
        "wraps": _safe_wraps,
        "singledispatch": _safe_singledispatch,
        "total_ordering": _safe_total_ordering,
    },
    "collections": {"namedtuple": _safe_namedtuple},
}


def _no_samples(self: Any, n: int, *, seed: Any = None) -> Any:
    raise GuardError(
        "NormalDist.samples(): there is no randomness in the sandbox (cells must be re-executable "
        "deterministically); use inv_cdf() on fixed quantiles instead"
    )


def _harden(name: str, module: Any) -> None:
    """Host-side changes to real stdlib objects a proxy exposes (once per process, before any cell).

    Patched on the real classes, not on subclasses: `cls.mro()`/`super()` would reach the originals.
    """
    if name == "statistics":
        module.NormalDist.samples = _no_samples  # reads os.urandom through random.Random()
    elif name == "textwrap":
        trans = module.TextWrapper.unicode_whitespace_trans  # a class-level dict shared by all wrappers
        if isinstance(trans, dict):
            module.TextWrapper.unicode_whitespace_trans = types.MappingProxyType(dict(trans))


# ids of the real objects proxies hand out (module functions, classes, singletons): never mutable
_PROTECTED_IDS: set[int] = set()
_CELL_CODE_PREFIXES = ("<cell", "<helper")


def check_mutable(obj: Any) -> Any:
    """Runtime hook around the object of `x.attr = ...` / `del x.attr` (inserted by the rewriter).

    Refused: real classes (`json.JSONEncoder.encode = f` would rewrite the host's own framing; any
    change would outlive the cell and a snapshot restore), functions not defined in a cell, module
    proxies and whatever a proxy hands out. Objects a cell made, and instances, are fine.
    """
    kind = type(obj)  # never `isinstance`/`obj.__code__`: a cell object answers those itself
    if real_subclass(kind, type):
        if not is_cell_class(obj):
            raise GuardError(
                f"changing attributes of the class '{_name_of(obj)}' is not allowed in the sandbox (it is not "
                "defined in a cell); define a subclass, or store your data in your own objects"
            )
    elif kind is types.FunctionType:
        filename = _FUNCTION_CODE.__get__(obj).co_filename
        if type(filename) is not str or not filename.startswith(_CELL_CODE_PREFIXES):
            raise GuardError(
                "changing attributes of a function not defined in a cell is not allowed in the sandbox"
            )
    elif real_subclass(kind, ModuleProxy) or id(obj) in _PROTECTED_IDS:
        raise GuardError("sandbox modules and the objects they provide are read-only")
    return obj


_FUNCTION_CODE: Any = vars(types.FunctionType)["__code__"]


def _name_of(cls: type) -> str:
    name = vars(type)["__name__"].__get__(cls)
    return name if type(name) is str else "?"


_SUBMODULES: dict[str, tuple[str, ...]] = {"collections": ("abc",)}
_ATOMIC = (type(None), bool, int, float, complex, str, bytes)


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
            _harden(name, module)
            for sub in _SUBMODULES.get(name, ()):
                attrs[sub] = self.proxy(f"{name}.{sub}")
        _PROTECTED_IDS.update(id(v) for v in attrs.values() if type(v) not in _ATOMIC)
        proxy = ModuleProxy(name, attrs)
        self._cache[name] = proxy
        return proxy

    def __call__(
        self,
        name: str,
        globals: Any = None,  # signature of builtins.__import__
        locals: Any = None,
        fromlist: Any = (),
        level: int = 0,
    ) -> ModuleProxy:
        if level:
            raise ImportError("relative imports are not available in the sandbox")
        name = exact_str(name, "module name")
        if name not in ALLOWED_MODULES:
            raise ImportError(module_refusal(name))
        for item in fromlist or ():
            why = check_attr_name(exact_str(item, "imported name"))
            if why:
                raise ImportError(why)
        if fromlist:
            return self.proxy(name)
        return self.proxy(name.split(".")[0])
