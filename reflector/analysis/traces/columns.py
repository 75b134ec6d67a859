"""The index columns of a plain chat message without building its canonical step.

The index pass (`reflector.analysis.traces.index.write_index`) needs, per step, only its role, whether it is an
error, its tool name, the names of its tool calls and (for the run's question and answer) its text.
Building the whole canonical step (`reflector.analysis.traces.adapters.messages._message_steps`: the actor
rule, each call's arguments as text, the step dict) is most of the pass's time on a large trace, and
most records of one are plain chat messages. `plain_run` reads those five values from a run of such
messages directly, exactly as the adapter would give them, and stops at the first record that is not
plain, which the adapter then handles: it stays the one rule (tests/unit/test_fastscan.py compares the
two on generated and hostile records, through `message_columns`, the one-message form).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from reflector.analysis.traces.view import looks_like_error

__all__ = ["message_columns", "plain_run", "PlainColumns", "PLAIN_KEYS", "PLAIN_ROLES"]

# The keys a plain message may have. `tool_name` is not read by the message adapter (ACE steps carry
# it); `name` only names the actor (not a column) except on a tool result, where it is the tool's.
PLAIN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "tool_name"})
# Chat roles the adapter keeps as they are: no synonym to map, never read as an agent's name. A plain
# message's content is a string or null (absent): the text of an assistant's message that only calls tools.
PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

Columns = tuple[str, str, bool, Any, list[str]]


class PlainColumns:
    """Columns of plain messages, appended in record order by `plain_run` (one entry per message, the
    call names of all of them in one list)."""

    __slots__ = ("roles", "contents", "errors", "tools", "calls")

    def __init__(self) -> None:
        self.roles: list[str] = []
        self.contents: list[str] = []
        self.errors: list[bool] = []
        self.tools: list[Any] = []  # the tool name (any JSON value) or None
        self.calls: list[str] = []


def plain_run(
    values: list[Any],
    start: int,
    call_names: OrderedDict[str, str] | None,
    out: PlainColumns,
    recent: int = 0,
) -> int:
    """Append to `out` the columns of `values[start]`, `values[start + 1]`, ... while they are plain messages;
    return the index of the first one that is not (`len(values)` when all are).

    `call_names` (tool-call id -> name, read and extended as the adapter does; None: each message has
    its own, as an ACE step does) is bounded: past `recent` entries (0: unbounded) the oldest is dropped
    after each insertion, as `reflector.analysis.traces.index._RecentCalls` does. A message that is not
    plain leaves it unchanged."""
    plain_keys, plain_roles, is_error = PLAIN_KEYS, PLAIN_ROLES, looks_like_error
    roles, contents, errors, tools, calls = out.roles, out.contents, out.errors, out.tools, out.calls
    setitem = OrderedDict.__setitem__  # the bound is kept here (a subclass's own __setitem__ is slower)
    for i in range(start, len(values)):
        msg = values[i]
        if type(msg) is not dict or not msg.keys() <= plain_keys:
            return i
        role = msg.get("role")
        content = msg.get("content")
        if type(content) is not str:
            if content is not None:
                return i
            content = ""  # the adapter's text of a null (or absent) content, as for a tool call's message
        if type(role) is not str or role not in plain_roles:
            return i
        tool_calls = msg.get("tool_calls")
        own = call_names
        if tool_calls:
            if type(tool_calls) is not list:
                return i
            names: list[str] = []
            ids: list[tuple[str, str]] = []
            for item in tool_calls:
                if type(item) is not dict:
                    return i
                fn = item.get("function")
                if fn is None or (type(fn) is dict and not fn):
                    fn = item  # the adapter's `_as_dict(item.get("function")) or item`
                elif type(fn) is not dict:
                    return i
                name = fn.get("name", "")
                arguments = fn.get("arguments")
                if type(name) is not str or (arguments is not None and type(arguments) is not str):
                    return i
                names.append(name)
                call_id = item.get("id")
                if call_id:
                    if type(call_id) is not str:
                        return i
                    ids.append((call_id, name))
            if ids:
                if own is None:
                    own = OrderedDict()
                for call_id, name in ids:
                    setitem(own, call_id, name)
                    if recent and len(own) > recent:
                        own.popitem(last=False)
            calls += names
        roles.append(role)
        contents.append(content)
        if role == "tool":
            errors.append(is_error(content))
            tools.append(
                msg.get("name") or (own.get(str(msg.get("tool_call_id"))) if own is not None else None)
            )
        else:
            errors.append(False)
            tools.append(None)
    return len(values)


def message_columns(msg: Any, call_names: dict[str, str]) -> Columns | None:
    """(role, content, is_error, tool_name, call names) of the one step a plain chat message gives,
    or None when `msg` is not plain. `call_names` is read and extended as the adapter does (tool-call
    id -> name); it is left unchanged when the message is declined."""
    out = PlainColumns()
    names: OrderedDict[str, str] = OrderedDict(call_names)
    if not plain_run([msg], 0, names, out):
        return None
    call_names.update(names)
    return out.roles[0], out.contents[0], out.errors[0], out.tools[0], out.calls
