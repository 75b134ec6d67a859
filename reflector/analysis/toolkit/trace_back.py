"""Tracing a failure back from its symptom: where a value came from, what conflicts, which rules were kept.

Why: the step where a failure becomes visible (the wrong write, the wrong final answer) is rarely where it
was made. A person looking for the root cause asks three questions, and each has a tool here:

- `provenance(run, value)`: every step where a value appears, in order, and who introduced it first (the
  user, a tool's output, the agent itself, the system prompt). A value the agent introduced itself was made
  up or computed; a value a tool introduced was read (or misread) there.
- `contradictions(run)`: values the agent used (call arguments; ids, dates and stated results in its
  messages) that no earlier step holds (`ungrounded`: made up), or that differ from what the last tool
  output giving that field said and from anything the user said (`conflict`: the misread output, the
  misremembered request). Each comes with the earlier values it conflicts with and their steps.
- `requirements(run)` (`policy.py`): the imperative rules of the system prompt / policy (`must`, `before`, `never`,
  `only if`, ...), each with the steps that honour or break it up to the first state-changing call
  (confirmation before a write; a lookup the rule asks for before acting; a forbidden tool).

Values are compared canonically, whatever their spelling: numbers as numbers (`1,234.0` is `1234`, `$55` is
`55`), dates as month and day (`2024-05-19`, `May 19`, `19 May 2024`), ids case-insensitively
(`HAT229`, `credit_card_7407366`, `K1NW8N`: a token with letters and digits), any other text as its
lower-cased words. Pure functions of the run's view (a lazy view is read in one pass), plain data out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from reflector.analysis.toolkit.calls import (
    check_limit,
    check_run,
    iter_steps,
    parse_args,
)
from reflector.analysis.toolkit.diff import as_data

__all__ = ["provenance", "contradictions", "canonical", "text_keys", "step_source"]


_SNIPPET = 60  # characters each side of a match


_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}


_MONTH = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)


_ISO = re.compile(r"(?<!\d)(\d{4})-(\d{1,2})-(\d{1,2})(?!\d)")


_MD = re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}}))?", re.IGNORECASE)


_DM = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b(?:,?\s+(\d{{4}}))?", re.IGNORECASE)


_ID = re.compile(r"(?<![\w-])(?=[A-Za-z0-9_]*\d)(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{4,}(?![\w-])")


_NUM = re.compile(r"(?<![\w.])[-+]?\$?\d[\d,]*(?:\.\d+)?%?(?![\w])")


_WORDS = re.compile(r"[a-z0-9]+")


_EXECUTOR = re.compile(
    r"\A\s*(?:exitcode:\s*-?\d+|there is no code from the last \d+ message)", re.IGNORECASE
)


_CLAIM = re.compile(
    r"\b(?:final answer|answer|result|total|conclusion)[ \t]*(?:is|was|:|=)[ \t]*([^\n]{1,120})",
    re.IGNORECASE,
)


_BOXED = re.compile(r"\\boxed\{([^}\n]{1,120})\}")


# -- canonical values ---------------------------------------------------------------------------------
def _num_key(text: str) -> str | None:
    raw = text.replace("$", "").replace(",", "").rstrip("%").lstrip("+")
    try:
        x = float(raw)
    except ValueError:
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return None
    return "num:" + (str(int(x)) if x.is_integer() else repr(round(x, 6)))


def _date_key(month: int, day: int) -> str | None:
    return f"date:{month:02d}-{day:02d}" if 1 <= month <= 12 and 1 <= day <= 31 else None


def _month(word: str) -> int:
    return _MONTHS.get(word.lower()[:3], 0)


def _dates(text: str) -> Iterator[tuple[str, int, int]]:
    if "-" in text:
        for m in _ISO.finditer(text):
            k = _date_key(int(m.group(2)), int(m.group(3)))
            if k:
                yield k, m.start(), m.end()
    low = text.lower()
    if not any(m in low for m in _MONTHS):  # a substring test first: the month patterns are slow
        return
    for m in _MD.finditer(text):
        k = _date_key(_month(m.group(1)), int(m.group(2)))
        if k:
            yield k, m.start(), m.end()
    for m in _DM.finditer(text):
        k = _date_key(_month(m.group(2)), int(m.group(1)))
        if k:
            yield k, m.start(), m.end()


def _spans(text: str) -> list[tuple[str, int, int]]:
    """The canonical values found in `text` with their spans: dates, then ids, then numbers outside both."""
    found = list(_dates(text))
    taken = [(a, b) for _k, a, b in found]
    for m in _ID.finditer(text):
        if not any(a < m.end() and m.start() < b for a, b in taken):
            found.append(("id:" + m.group(0).lower(), m.start(), m.end()))
            taken.append((m.start(), m.end()))
    for m in _NUM.finditer(text):
        if any(a < m.end() and m.start() < b for a, b in taken):
            continue
        k = _num_key(m.group(0))
        if k:
            found.append((k, m.start(), m.end()))
    return found


def text_keys(text: str) -> set[str]:
    """The canonical keys of the values `text` mentions (dates, ids, numbers)."""
    return {k for k, _a, _b in _spans(text)}


def canonical(value: Any) -> str | None:
    """The canonical key of one scalar value (None for None, a bool, an empty string or a container)."""
    if value is None or isinstance(value, bool) or isinstance(value, (dict, list)):
        return None
    if isinstance(value, (int, float)):
        return _num_key(repr(value))
    text = " ".join(str(value).split())
    if not text:
        return None
    spans = _spans(text)
    if len(spans) == 1 and spans[0][1] == 0 and spans[0][2] == len(text):
        return spans[0][0]
    words = _WORDS.findall(text.lower())
    return "text:" + " ".join(words) if words else None


def _distinctive(key: str) -> bool:
    """Whether a value is specific enough to trace: an id, a date, a number that is not a small count, a
    text of 3+ characters."""
    kind, _, v = key.partition(":")
    if kind in ("id", "date"):
        return True
    if kind == "num":
        try:
            x = abs(float(v))
        except ValueError:
            return False
        return x >= 10 or not x.is_integer()
    return len(v) >= 3


# -- steps --------------------------------------------------------------------------------------------
def step_source(s: dict[str, Any]) -> str:
    """Who a step speaks for: `user`, `tool` (a tool's or a code executor's output), `system` or `agent`."""
    role = s["role"]
    if role == "tool" or s["tool_name"] is not None or _EXECUTOR.match(s["content"]):
        return "tool"
    if role == "system":
        return "system"
    if role == "user" and s["actor"] is None:
        return "user"
    return "agent"


def _call_text(s: dict[str, Any]) -> str:
    return "\n".join(
        f"{c['name']}({c['arguments'] if isinstance(c['arguments'], str) else json.dumps(c['arguments'])})"
        for c in s["tool_calls"]
    )


def _has(
    key: str, text: str, low: str, spans: list[tuple[str, int, int]] | None = None
) -> tuple[int, int] | None:
    """Where `text` mentions the value of `key` (its span), or None (`spans`: `_spans(text)` if known)."""
    if key.startswith("text:"):
        words = key[5:]
        m = re.search(
            r"(?<![a-z0-9])" + r"[^a-z0-9]+".join(map(re.escape, words.split())) + r"(?![a-z0-9])", low
        )
        return (m.start(), m.end()) if m else None
    for k, a, b in _spans(text) if spans is None else spans:
        if k == key:
            return a, b
    return None


def _snippet(text: str, a: int, b: int) -> str:
    lo, hi = max(0, a - _SNIPPET), min(len(text), b + _SNIPPET)
    flat = " ".join(text[lo:hi].split())
    return ("..." if lo else "") + flat + ("..." if hi < len(text) else "")


def provenance(run: Any, value: Any, limit: Any = 50) -> dict[str, Any]:
    """Every step where `value` appears (canonicalised), in order, and who introduced it first:

    `{"value", "key", "introduced_by": "user"|"tool"|"agent"|"system"|None, "first": {step row} | None,
    "steps": [{"step", "source", "role", "actor", "where": "content"|"call", "snippet"}], "n_steps"}`
    (at most `limit` rows; `n_steps` counts all). `where`: the step's text or its tool-call arguments."""
    run = check_run(run, "provenance")
    n = check_limit(limit, "provenance")
    assert n is not None
    val = as_data(value, "provenance: value")
    key = canonical(val)
    if key is None:
        raise TypeError("provenance: value must be a number or a non-empty string (an id, a name, a date)")
    rows: list[dict[str, Any]] = []
    count = 0
    for s in iter_steps(run, "provenance"):
        for where, text in (("content", s["content"]), ("call", _call_text(s))):
            if not text:
                continue
            hit = _has(key, text, text.lower())
            if hit is None:
                continue
            count += 1
            if len(rows) < n:
                rows.append(
                    {
                        "step": s["index"],
                        "source": step_source(s),
                        "role": s["role"],
                        "actor": s["actor"],
                        "where": where,
                        "snippet": _snippet(text, *hit),
                    }
                )
            break
    first = rows[0] if rows else None
    return {
        "value": val,
        "key": key,
        "introduced_by": first["source"] if first else None,
        "first": first,
        "steps": rows,
        "n_steps": count,
    }


# -- contradictions -----------------------------------------------------------------------------------
def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(path, last key, scalar) of every leaf of a JSON-like value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        last = re.split(r"[.\[]", path)[-1].rstrip("]") if path else ""
        yield path, last, value


def _key_of_path(path: str) -> str:
    """The last named key of a path (`flights[1].date` -> `date`, `payment_methods[0].payment_id` ->
    `payment_id`)."""
    names = [p for p in re.split(r"[.\[\]]", path) if p and not p.isdigit()]
    return names[-1] if names else ""


def _family(key: str) -> str:
    """The family of a canonical value: dates with dates, numbers with numbers, ids by their shape
    (`credit_card_#`, `hat#`, `code6`), texts with texts."""
    kind, _, v = key.partition(":")
    if kind != "id":
        return kind
    if "_" in v or re.fullmatch(r"[a-z]+\d+", v):
        return "id:" + re.sub(r"\d+", "#", v)
    return f"id:code{len(v)}"


def _json_fields(text: str) -> dict[str, set[str]]:
    """field name -> canonical values, of a tool output that is JSON (empty otherwise)."""
    body = text.strip()
    if not body or body[0] not in "[{":
        return {}
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    out: dict[str, set[str]] = {}
    for path, _last, v in _leaves(data):
        k = canonical(v)
        if k is not None:
            out.setdefault(_key_of_path(path), set()).add(k)
    return out


def _display(key: str) -> str:
    return key.partition(":")[2]


def contradictions(run: Any, limit: Any = 50) -> list[dict[str, Any]]:
    """Values the agent used that nothing before supports, or that conflict with what it was told:

    `[{"step", "actor", "kind": "ungrounded"|"conflict", "where": "call"|"message", "tool", "argument",
    "value", "earlier": [{"step", "source", "values"}]}]`, in step order, at most `limit`.

    - `ungrounded`: a call argument (or an id, a date or a stated result in an agent message) that no
      earlier step mentions: the agent introduced it (made up, or computed without a tool).
    - `conflict`: a call argument (an id or a date) that neither the user nor any tool output ever said
      (only the agent's own earlier steps did), while an earlier tool output gives that same field
      (`date`, `payment_id`, ...) other values of the same family, or the user stated other dates. `earlier` lists what the last such output and the
      user said (the misread output, the misremembered request)."""
    run = check_run(run, "contradictions")
    n = check_limit(limit, "contradictions")
    assert n is not None
    return _contradictions(iter_steps(run, "contradictions"), n)


def _contradictions(steps: Any, n: int) -> list[dict[str, Any]]:
    seen: set[str] = set()
    told: set[str] = set()  # what tool outputs and the user said
    user_vals: list[tuple[int, set[str]]] = []
    tool_fields: list[tuple[int, dict[str, set[str]]]] = []
    out: list[dict[str, Any]] = []
    for s in steps:
        source = step_source(s)
        text = s["content"]
        keys = text_keys(text)
        if source == "agent":
            found = list(_call_findings(s, seen, told, user_vals, tool_fields)) + list(
                _message_findings(s, seen)
            )
            out.extend(found[: n - len(out)])
            if len(out) >= n:
                break
        if source == "user":
            user_vals.append((s["index"], keys))
        if source in ("tool", "user"):
            told |= keys
        if source == "tool":
            fields = _json_fields(text)
            if fields:
                tool_fields.append((s["index"], fields))
        seen |= keys
        for c in s["tool_calls"]:
            for _p, _l, v in _leaves(parse_args(c["arguments"])):
                k = canonical(v)
                if k:
                    seen.add(k)
    return out


def _call_findings(
    s: dict[str, Any],
    seen: set[str],
    told_any: set[str],
    user_vals: list[tuple[int, set[str]]],
    tool_fields: list[tuple[int, dict[str, set[str]]]],
) -> Iterator[dict[str, Any]]:
    said = set().union(*(v for _i, v in user_vals)) if user_vals else set()
    for c in s["tool_calls"]:
        args = parse_args(c["arguments"])
        if not isinstance(args, (dict, list)):
            continue
        for path, _last, v in _leaves(args):
            key = canonical(v)
            if key is None or key.startswith("text:") or not _distinctive(key):
                continue
            field = _key_of_path(path)
            base = {
                "step": s["index"],
                "actor": s["actor"],
                "where": "call",
                "tool": c["name"],
                "argument": path,
                "value": v,
            }
            fam = _family(key)
            last_tool = next(((i, f[field]) for i, f in reversed(tool_fields) if field in f), None)
            told = [
                (i, sorted(_display(k) for k in vals if _family(k) == fam and k != key))
                for i, vals in user_vals
            ]
            told = [(i, vals) for i, vals in told if vals]
            earlier: list[dict[str, Any]] = []
            if last_tool is not None:
                same = sorted(_display(k) for k in last_tool[1] if _family(k) == fam)
                if same:
                    earlier.append({"step": last_tool[0], "source": "tool", "values": same[:8]})
            if key not in seen:
                earlier += [{"step": i, "source": "user", "values": vals[:8]} for i, vals in told[-2:]]
                yield {**base, "kind": "ungrounded", "earlier": earlier}
                continue
            if key in said or fam == "num":  # amounts are computed: only an unsupported one is reported
                continue
            if key in told_any:
                continue  # a tool output or the user gave that value (in some field: read, not invented)
            tool_conflict = bool(earlier)
            user_conflict = fam == "date" and bool(told)
            if tool_conflict or user_conflict:
                earlier += [
                    {"step": i, "source": "user", "values": vals[:8]}
                    for i, vals in told[-2:]
                    if user_conflict
                ]
                yield {**base, "kind": "conflict", "earlier": earlier}


def _message_findings(s: dict[str, Any], seen: set[str]) -> Iterator[dict[str, Any]]:
    text = s["content"]
    if not text or s["tool_calls"]:
        return
    claimed = set()
    for rx in (_CLAIM, _BOXED):
        for m in rx.finditer(text):
            claimed |= {k for k in text_keys(m.group(1)) if k.startswith("num:")}
    done: set[str] = set()
    for key, a, b in _spans(text):
        if key in done or key in seen or not _distinctive(key):
            continue
        if not (key.startswith(("id:", "date:")) or key in claimed):
            continue
        done.add(key)
        yield {
            "step": s["index"],
            "actor": s["actor"],
            "kind": "ungrounded",
            "where": "message",
            "tool": None,
            "argument": None,
            "value": text[a:b],
            "earlier": [],
        }
