"""Who took a step: the one rule every adapter applies to name a step's `actor` (and its `addressee`).

The actor of a step is the most specific agent identity its record carries, looked for in this order:

1. `name` (OpenAI's participant name; AutoGen / AG2 group chats and Who&When put the speaking agent there);
2. the agent fields of the common multi-agent exports: `agent_name`, `agent` (a name, or an object with a
   `name`: the OpenAI Agents SDK's run items, CrewAI task outputs), `agent_role` (CrewAI), `sender` (AutoGen
   / AG2 messages), `source` (AutoGen AgentChat messages), `speaker`, and `metadata.langgraph_node`
   (LangGraph stream events); OTel spans: `gen_ai.agent.name`, `agent.name` (`span_agent`);
3. a `role` that is not a chat role (system, user, assistant, tool, function, developer, and the synonyms
   model, human, ai, ipython; `is_chat_role`): Magentic-One style traces name the agent only there.

Whatever is found is normalised the same way: a parenthesised or arrowed suffix is not part of the name.
`"Orchestrator (thought)"` is actor `Orchestrator`; `"Orchestrator (-> WebSurfer)"` is actor `Orchestrator`
addressing `WebSurfer`, kept as the step's `addressee` (also `"A -> B"`, `"A (to B)"`, `"A (→ B)"`). A value
that is itself a chat role (`sender: "user"`) names no agent, except in `name`, which a framework sets on
purpose. A tool's message is never given an actor here: its `name` is the tool's.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["CHAT_ROLES", "agent_of", "normalise_agent", "span_agent", "is_chat_role"]

CHAT_ROLES = frozenset(
    {
        "system",
        "user",
        "assistant",
        "tool",
        "function",
        "developer",
        "model",
        "human",
        "ai",
        "ipython",
        "toolresult",
        "tool_result",
    }
)
_AGENT_FIELDS = ("agent_name", "agent", "agent_role", "sender", "source", "speaker")
_SPAN_FIELDS = ("gen_ai.agent.name", "agent.name")
_MAX_NAME = 200
# "X (-> Y)", "X (→ Y)", "X (to Y)", "X -> Y": X addressing Y
_ADDRESS = re.compile(
    r"^(?P<who>.+?)\s*(?:\(\s*(?:->|→|=>|to\s)\s*(?P<to>[^()]+?)\s*\)|(?:->|→|=>)\s*(?P<to2>.+?))\s*$"
)
_SUFFIX = re.compile(r"^(?P<who>.+?)\s*\([^()]*\)\s*$")  # "X (thought)", "X (final answer)"


def is_chat_role(value: Any) -> bool:
    """Whether `value` is a chat role (who speaks in a two-party chat), not an agent's identity. Case does
    not matter, except for a capitalised `Assistant`: Magentic-One's coding agent is named so, and taking
    it as a name costs nothing where it is a chat role (the step's role is `assistant` either way)."""
    if not isinstance(value, str):
        return False
    v = value.strip()
    low = v.lower()
    return low in CHAT_ROLES and not (low == "assistant" and v != low)


def normalise_agent(value: Any) -> tuple[str | None, str | None]:
    """`(actor, addressee)` of an agent identity as a record spells it (see the module doc); (None, None)
    for anything that is not a non-empty string."""
    if not isinstance(value, str):
        return None, None
    text = " ".join(value.split())[:_MAX_NAME]
    if not text:
        return None, None
    to: str | None = None
    m = _ADDRESS.match(text)
    if m and m.group("who").strip():
        text, to = m.group("who").strip(), (m.group("to") or m.group("to2") or "").strip() or None
    while True:
        m = _SUFFIX.match(text)
        if not m or not m.group("who").strip():
            break
        text = m.group("who").strip()
    return text or None, to


def _field_name(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("name")
    return value


def agent_of(record: Any) -> tuple[str | None, str | None]:
    """`(actor, addressee)` of one (non-tool) message or event record, by the module's rule."""
    if not isinstance(record, dict):
        return None, None
    actor, to = normalise_agent(record.get("name"))
    if actor is not None:
        return actor, to
    for key in _AGENT_FIELDS:
        value = _field_name(record.get(key))
        if is_chat_role(value):
            continue
        actor, to = normalise_agent(value)
        if actor is not None:
            return actor, to
    meta = record.get("metadata")
    if isinstance(meta, dict):
        actor, to = normalise_agent(meta.get("langgraph_node"))
        if actor is not None and not is_chat_role(actor):
            return actor, to
    role = record.get("role")
    if isinstance(role, str) and not is_chat_role(role):
        actor, to = normalise_agent(role)
        if actor is not None and not is_chat_role(actor):
            return actor, to
    return None, None


def span_agent(attrs: dict[str, Any]) -> tuple[str | None, str | None]:
    """`(actor, addressee)` of an OTel span from its attributes (`gen_ai.agent.name`, `agent.name`)."""
    for key in _SPAN_FIELDS:
        actor, to = normalise_agent(attrs.get(key))
        if actor is not None:
            return actor, to
    return None, None
