"""Argument-level differences between two JSON-like values, and the plain copies every helper hands out.

Why a path per difference: "the booking was wrong" does not tell an engineer what to fix; the path
`passengers[1].dob` with the expected and the actual value does. Values are compared canonically, the
way `reflector.analysis.answers` compares actions (an integral float equals the int, key order is irrelevant),
and strings exactly: a difference of case or whitespace is still a difference (tau-bench compares the
database), but it is labelled so, because that is a different mistake from a wrong value.

`as_data` is the toolkit's guard at the boundary with sandbox cells: helpers are trusted host code that
receive model-made objects, so they copy their input into exact dict/list/str/number/bool/None values
(through the base types' own methods, whatever a subclass overrides) and only ever return such copies,
never references into the trace.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reflector.analysis.answers import canon  # integral floats are ints (250.0 and 250 are the same argument)
from reflector.analysis.traces.lazy import LazySeq

__all__ = ["as_data", "canon", "diff_values", "same_value", "MAX_DEPTH"]

MAX_DEPTH = 100  # nesting accepted in a value (a cycle is refused as too deep)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCALARS = (bool, int, float, str)


def as_data(value: Any, what: str = "value", _depth: int = 0) -> Any:
    """An exact JSON-like copy of `value` (dict keys become str, tuples lists); TypeError for anything else.

    Subclasses are read through the base type's own methods (`dict.copy`, `list.copy`, `str.__str__`),
    so an override defined in a cell is never called and cannot lie about the content.
    """
    kind = type(value)
    if value is None or kind in _SCALARS:
        return value
    if _depth > MAX_DEPTH:
        raise ValueError(f"{what} nests more than {MAX_DEPTH} levels (or contains itself)")
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in dict.items(dict.copy(value)):
            out[_key_text(key, what)] = as_data(item, what, _depth + 1)
        return out
    if isinstance(value, list):
        return [as_data(item, what, _depth + 1) for item in list.copy(value)]
    if isinstance(value, tuple):
        return [as_data(tuple.__getitem__(value, i), what, _depth + 1) for i in range(tuple.__len__(value))]
    raise TypeError(
        f"{what}: a {type(value).__name__} is not JSON-like data (dict, list, str, number, bool, None)"
        + ("; a lazy sequence: slice it and build a list first" if isinstance(value, LazySeq) else "")
    )


def _key_text(key: Any, what: str) -> str:
    """A dict key as JSON writes it (str; numbers, bools and None as their JSON text)."""
    if isinstance(key, str):
        return key if type(key) is str else str.__str__(key)
    if key is None or type(key) in (bool, int, float):
        return json.dumps(key)
    raise TypeError(f"{what}: a dict key is a {type(key).__name__}; JSON-like data has str keys")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _same_leaf(a: Any, b: Any) -> bool:
    """Equal scalars: numbers by value (1 == 1.0), anything else only with the same type (True != 1)."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def same_value(expected: Any, actual: Any) -> bool:
    """Whether two plain values are canonically equal (no differences)."""
    return not _diff(canon(expected), canon(actual), "", [], stop_at_first=True)


def diff_values(expected: Any, actual: Any, path: str = "") -> list[dict[str, Any]]:
    """The differences between two JSON-like values: `[{"path", "expected", "actual"}]`, in order.

    Recursive over dicts (by key, order irrelevant) and lists (element by element, by position; a
    missing or extra element is one difference, e.g. `{"path": "passengers[2]", "expected": {...},
    "actual": None}`). A difference may carry a `note`: "missing" / "not expected" (a key or element
    on one side only), "differs only in case or whitespace" (strings).
    """
    if not isinstance(path, str):
        raise TypeError(f"diff_values: path must be a str, not {type(path).__name__}")
    e = canon(as_data(expected, "diff_values: expected"))
    a = canon(as_data(actual, "diff_values: actual"))
    out: list[dict[str, Any]] = []
    _diff(e, a, str.__str__(path), out)
    return out


def _child(path: str, key: str) -> str:
    if _IDENT.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _diff(e: Any, a: Any, path: str, out: list[dict[str, Any]], stop_at_first: bool = False) -> bool:
    """Append the differences of `e` and `a` at `path` to `out`; True when there is any."""
    if isinstance(e, dict) and isinstance(a, dict):
        found = False
        for key in [*e, *(k for k in a if k not in e)]:
            where = _child(path, key)
            if key not in a:
                out.append({"path": where, "expected": e[key], "actual": None, "note": "missing"})
            elif key not in e:
                out.append({"path": where, "expected": None, "actual": a[key], "note": "not expected"})
            elif not _diff(e[key], a[key], where, out, stop_at_first):
                continue
            found = True
            if stop_at_first:
                return True
        return found
    if isinstance(e, list) and isinstance(a, list):
        found = False
        for i in range(max(len(e), len(a))):
            where = f"{path}[{i}]"
            if i >= len(a):
                out.append({"path": where, "expected": e[i], "actual": None, "note": "missing"})
            elif i >= len(e):
                out.append({"path": where, "expected": None, "actual": a[i], "note": "not expected"})
            elif not _diff(e[i], a[i], where, out, stop_at_first):
                continue
            found = True
            if stop_at_first:
                return True
        return found
    if _same_leaf(e, a):
        return False
    item: dict[str, Any] = {"path": path, "expected": e, "actual": a}
    if (
        isinstance(e, str)
        and isinstance(a, str)
        and " ".join(e.lower().split()) == " ".join(a.lower().split())
    ):
        item["note"] = "differs only in case or whitespace"
    out.append(item)
    return True
