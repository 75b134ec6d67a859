"""The index columns of a plain chat message without building its canonical step.

The index pass (`reflector.analysis.traces.index.write_index`) needs, per step, only its role, whether it is an
error, its tool name, the names of its tool calls and (for the run's question and answer) its text.
Building the whole canonical step (`reflector.analysis.traces.adapters.messages._message_steps`: the actor
rule, each call's arguments as text, the step dict) is most of the pass's time on a large trace, and
most records of one are plain chat messages. `message_columns` reads those five values from such a
message directly, exactly as the adapter would give them, and declines (None) every record that is not
plain, which the adapter then handles: it stays the one rule (tests/unit/test_fastscan.py compares the
two on generated and hostile records).
"""

from __future__ import annotations

from typing import Any

from reflector.analysis.traces.view import looks_like_error

__all__ = ["message_columns", "PLAIN_KEYS", "PLAIN_ROLES"]

# The keys a plain message may have. `tool_name` is not read by the message adapter (ACE steps carry
# it); `name` only names the actor (not a column) except on a tool result, where it is the tool's.
PLAIN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "tool_name"})
# Chat roles the adapter keeps as they are: no synonym to map, never read as an agent's name.
PLAIN_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

Columns = tuple[str, str, bool, Any, list[str]]


def message_columns(msg: Any, call_names: dict[str, str]) -> Columns | None:
    """(role, content, is_error, tool_name, call names) of the one step a plain chat message gives,
    or None when `msg` is not plain. `call_names` is read and extended as the adapter does (tool-call
    id -> name); it is left unchanged when the message is declined."""
    if type(msg) is not dict or not msg.keys() <= PLAIN_KEYS:
        return None
    role = msg.get("role")
    content = msg.get("content")
    if type(role) is not str or role not in PLAIN_ROLES or type(content) is not str:
        return None
    names: list[str] = []
    tool_calls = msg.get("tool_calls")
    if tool_calls:
        if type(tool_calls) is not list:
            return None
        ids: list[tuple[str, str]] = []
        for item in tool_calls:
            if type(item) is not dict:
                return None
            fn = item.get("function")
            if fn is None or (type(fn) is dict and not fn):
                fn = item  # the adapter's `_as_dict(item.get("function")) or item`
            elif type(fn) is not dict:
                return None
            name = fn.get("name", "")
            arguments = fn.get("arguments")
            if type(name) is not str or (arguments is not None and type(arguments) is not str):
                return None
            names.append(name)
            call_id = item.get("id")
            if call_id:
                if type(call_id) is not str:
                    return None
                ids.append((call_id, name))
        for call_id, name in ids:
            call_names[call_id] = name
    if role == "tool":
        tool = msg.get("name") or call_names.get(str(msg.get("tool_call_id")))
        return "tool", content, looks_like_error(content), tool, names
    return role, content, False, None, names
