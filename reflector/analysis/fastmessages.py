"""Plain chat messages parsed by msgspec into typed records, and their index columns.

The index pass reads a plain chat message's columns with `reflector.analysis.traces.columns.plain_run`,
which checks in Python, key by key, that the message is plain (its keys, the types of its role,
content and calls). Here msgspec does those checks while it parses: a window of records decodes as a
list of `Message` only when every record is an object whose keys and value types are among the ones
`plain_run` accepts (a subset of them: a falsy `tool_calls` other than `null` / `[]`, a falsy call id
that is not a string, an extra key in a call, ... make the window go the general way, where
`plain_run` and the adapter read it). The types bound the nesting (a message is at most 4 levels
deep), so no depth check is needed. `message_run` then gives exactly the columns `plain_run` gives
for the same records (tests/unit/test_fastscan.py compares them on generated messages).

Not in `reflector/analysis/traces/` (stdlib-only, imported by the sandbox host).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

from reflector.analysis.traces.columns import PlainColumns
from reflector.analysis.traces.view import looks_like_error

__all__ = ["MESSAGES", "message_run"]


class _Function(Struct, forbid_unknown_fields=True, gc=False):
    name: str | UnsetType = UNSET
    arguments: str | None | UnsetType = UNSET


class _Call(Struct, forbid_unknown_fields=True, gc=False):
    id: str | None | UnsetType = UNSET
    type: str | None | UnsetType = UNSET
    function: _Function | None = None
    name: str | UnsetType = UNSET
    arguments: str | None | UnsetType = UNSET


class Message(Struct, forbid_unknown_fields=True, gc=False):
    """A plain chat message (`reflector.analysis.traces.columns.PLAIN_KEYS` / `PLAIN_ROLES`)."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = None
    tool_calls: list[_Call] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    tool_name: str | None = None


MESSAGES = msgspec.json.Decoder(list[Message])  # a window of records (a JSON array) as plain messages


def message_run(
    values: list[Any], call_names: OrderedDict[str, str] | None, out: PlainColumns, recent: int
) -> None:
    """`plain_run(values, 0, call_names, out, recent)` for `values` decoded by `MESSAGES` (all plain)."""
    roles, contents, errors, tools, calls = out.roles, out.contents, out.errors, out.tools, out.calls
    setitem = OrderedDict.__setitem__
    is_error = looks_like_error
    for msg in values:
        role = msg.role
        own = call_names
        tool_calls = msg.tool_calls
        if tool_calls:  # (all plain: no call can decline the message after its ids are taken)
            for call in tool_calls:
                fn = call.function
                # the function's name; the call's own when the function is null, absent or {}; else ""
                name = call.name if fn is None or (fn.name is UNSET and fn.arguments is UNSET) else fn.name
                if name is UNSET:
                    name = ""
                calls.append(name)
                if call.id:
                    if own is None:
                        own = OrderedDict()
                    setitem(own, call.id, name)
                    if recent and len(own) > recent:
                        own.popitem(last=False)
        content = msg.content
        if content is None:
            content = ""
        roles.append(role)
        contents.append(content)
        if role == "tool":
            errors.append(is_error(content))
            tools.append(msg.name or (own.get(str(msg.tool_call_id)) if own is not None else None))
        else:
            errors.append(False)
            tools.append(None)
