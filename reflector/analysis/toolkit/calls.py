"""The agent's tool calls paired with their results, and the task's expected actions, from any adapter.

Why: every diagnosis starts from "what did the agent call, with what, and what came back". The
canonical view keeps calls (on the calling step) and results (on later `tool` steps) apart; this module
pairs them once, for every format: by call id when the raw trace carries ids (OpenAI `tool_call_id`,
Anthropic `tool_use_id`, OpenClaw `toolCallId`; a view read whole), else in the order of the tool
steps that follow, by tool name. OTel spans and free-form ACE steps are calls that carry their own
result. For tau-bench the view's `actions` are the calls (they carry `step` and `is_error`); the result
is added.

What the task expected (`expected_actions`) is read from the trace's ground truth only, never from
what the agent said: the two must stay apart for a comparison to mean anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from reflector.analysis.answers import READ_ONLY_PREFIXES
from reflector.analysis.toolkit.diff import as_data
from reflector.analysis.traces.adapters.messages import _message_steps
from reflector.analysis.traces.lazy import LazySeq, Steps
from reflector.analysis.traces.view import _THINKING_RE

__all__ = [
    "tool_calls",
    "expected_actions",
    "is_write",
    "check_run",
    "check_limit",
    "iter_steps",
    "plain_step",
    "parse_args",
    "short",
    "assistant_texts",
    "RESULT_CHARS",
]

RESULT_CHARS = 500  # a result is shortened to this many characters (the trace keeps the rest)
_IdRow = tuple[list[str | None], str | None]  # per step: the ids of its calls, the id its result answers


def check_run(run: Any, fn: str) -> dict[str, Any]:
    """`run` if it is one run's view; else a TypeError / ValueError that says what to pass."""
    hint = f"pass one run: {fn}(traces) for a single-run trace, {fn}(traces['runs'][i]) for a batch"
    if not isinstance(run, dict):
        raise TypeError(f"{fn}: got a {type(run).__name__}; {hint}")
    steps = dict.get(run, "steps")
    if steps is None and dict.__contains__(run, "runs"):
        runs = dict.get(run, "runs")
        n = len(runs) if isinstance(runs, (list, tuple, LazySeq)) else "several"
        raise ValueError(f"{fn}: this is a batch view of {n} runs; pass one run: {fn}(traces['runs'][i])")
    if not (isinstance(steps, (list, tuple)) or type(steps) is Steps):
        raise ValueError(f"{fn}: the dict has no 'steps' list, so it is not a run view; {hint}")
    return run


def check_limit(limit: Any, fn: str, allow_none: bool = False) -> int | None:
    """`limit` as an int >= 1 (or None when allowed)."""
    if limit is None and allow_none:
        return None
    if type(limit) is not int or limit < 1:
        raise TypeError(f"{fn}: limit must be an int >= 1{' or None' if allow_none else ''}, not {limit!r}")
    return limit


def short(text: str, limit: int = RESULT_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    return text if len(text) <= limit else f"{text[:limit]}...(+{len(text) - limit:,} chars)"


def parse_args(value: Any) -> Any:
    """Call arguments as data: a JSON string parsed (the raw string if it is not JSON), nothing as {}."""
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def plain_step(raw: Any, pos: int, fn: str, fresh: bool = False) -> dict[str, Any]:
    """One step with the canonical fields, as exact plain data. `fresh`: `raw` was just parsed by the host
    (a lazy view's step: exact types, shared with nobody), so it is not copied first; any other step may
    hold what a cell put there, and is copied through `as_data`."""
    if not isinstance(raw, dict):
        raise TypeError(f"{fn}: steps[{pos}] is a {type(raw).__name__}, not a step dict")
    step = raw if fresh and type(raw) is dict else as_data(raw, f"{fn}: steps[{pos}]")
    index = step.get("index")
    calls = []
    for c in step.get("tool_calls") or []:
        if isinstance(c, dict):
            calls.append({"name": _text(c.get("name")), "arguments": c.get("arguments")})
    tool = step.get("tool_name")
    actor = step.get("actor")
    addressee = step.get("addressee")
    return {
        "index": index if type(index) is int else pos,
        "role": _text(step.get("role")) or "unknown",
        "content": _text(step.get("content")),
        "tool_calls": calls,
        "tool_name": tool if isinstance(tool, str) and tool else None,
        "is_error": bool(step.get("is_error")),
        "actor": actor if isinstance(actor, str) else None,
        "addressee": addressee if isinstance(addressee, str) else None,
    }


def iter_steps(run: dict[str, Any], fn: str) -> Iterator[dict[str, Any]]:
    """The run's steps as plain dicts (a lazy view is read in order, one block at a time)."""
    steps: Any = dict.get(run, "steps")
    seq: Any
    if type(steps) is Steps:
        seq = steps
    elif isinstance(steps, list):
        seq = list.copy(steps)
    else:
        seq = [tuple.__getitem__(steps, i) for i in range(tuple.__len__(steps))]
    fresh = type(steps) is Steps
    for pos, raw in enumerate(seq):
        yield plain_step(raw, pos, fn, fresh)


def assistant_texts(run: dict[str, Any], fn: str) -> list[tuple[int, str]]:
    """(step, text without thinking blocks) of every assistant step; a lazy view parses only those."""
    steps = dict.get(run, "steps")
    if type(steps) is Steps:
        chosen = (plain_step(steps[p], p, fn, fresh=True) for p in steps.where(role="assistant"))
    else:
        chosen = (s for s in iter_steps(run, fn) if s["role"] == "assistant")
    return [(s["index"], _THINKING_RE.sub("", s["content"]).strip()) for s in chosen]


# Tools of the traced agent (tau-bench's own `think` and `calculate`) that change no state although their names
# have no read-only prefix: a root-cause or write search skips them. Not rr's tools of the same name.
NO_EFFECT_TOOLS: frozenset[str] = frozenset({"think", "calculate"})


def is_write(name: Any) -> bool:
    """Whether a tool changes state: any name without a read-only prefix (`get_`, `search_`, `list_`,
    ...: `reflector.analysis.answers.READ_ONLY_PREFIXES`), which is what a tau-bench grader compares."""
    if not isinstance(name, str):
        raise TypeError(f"is_write: name must be a tool name (str), not {type(name).__name__}")
    return not str.__str__(name).startswith(READ_ONLY_PREFIXES)


def expected_actions(run: Any) -> list[dict[str, Any]] | None:
    """The task's expected actions `[{"name", "args"}]` when the trace carries them (tau-bench), else None.

    Read from the ground truth only (`run["expected_actions"]`), never derived from the agent's messages.
    An empty list is kept: the task expected no action at all.
    """
    run = check_run(run, "expected_actions")
    raw = dict.get(run, "expected_actions")
    if not isinstance(raw, (list, tuple)):
        return None
    out: list[dict[str, Any]] = []
    for a in as_data(raw, "expected_actions"):
        if isinstance(a, dict):
            args = a["args"] if "args" in a else a.get("arguments", a.get("kwargs"))
            out.append({"name": _text(a.get("name")), "args": parse_args(args)})
    return out


def tool_calls(run: Any, limit: Any = None) -> list[dict[str, Any]]:
    """Every tool call the agent made, in order, with its result:
    `{"step", "name", "args", "result", "result_step", "is_error", "actor"}`.

    `step` is the step that made the call, `args` the parsed arguments (the raw string if not JSON),
    `result` the answering tool step's content (shortened to ~500 chars; None if no result was
    recorded), `is_error` whether that result is a failure. `limit`: at most that many calls (a lazy
    view is then read only as far as needed).
    """
    run = check_run(run, "tool_calls")
    n = check_limit(limit, "tool_calls", allow_none=True)
    calls = _step_calls(run, n)
    actions = dict.get(run, "actions")
    if isinstance(actions, (list, tuple)):
        calls = _with_actions(as_data(actions, "tool_calls: run['actions']"), calls, n)
    return calls


def _new_call(c: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": s["index"],
        "name": c["name"],
        "args": parse_args(c["arguments"]),
        "result": None,
        "result_step": None,
        "is_error": False,
        "actor": s["actor"],
    }


def _answer(call: dict[str, Any], s: dict[str, Any]) -> None:
    call.update(result=short(s["content"]), result_step=s["index"], is_error=s["is_error"])


def _step_calls(run: dict[str, Any], limit: int | None) -> list[dict[str, Any]]:
    steps: Any = dict.get(run, "steps")
    if type(steps) is Steps:
        seq: Any = iter_steps(run, "tool_calls")
        ids = None
    else:
        seq = list(iter_steps(run, "tool_calls"))
        ids = _call_ids(run, seq)
    self_answered = dict.get(run, "format") == "otel"  # a span is the call and its result at once
    calls: list[dict[str, Any]] = []
    call_ids: list[str | None] = []
    pending: list[int] = []
    full = False
    for k, s in enumerate(seq):
        made, answers = ids[k] if ids is not None else ([], None)
        if s["tool_calls"] and (self_answered or s["role"] == "tool"):
            if full:
                break
            for c in s["tool_calls"][: None if limit is None else limit - len(calls)]:
                calls.append(_new_call(c, s))
                call_ids.append(None)
                _answer(calls[-1], s)
            full = limit is not None and len(calls) >= limit
        elif s["role"] == "tool":
            j = _pending_for(s, answers, pending, calls, call_ids)
            if j is not None:
                pending.remove(j)
                _answer(calls[j], s)
        elif s["tool_calls"]:
            if full:
                break
            for n, c in enumerate(s["tool_calls"]):
                if limit is not None and len(calls) >= limit:
                    break
                calls.append(_new_call(c, s))
                call_ids.append(made[n] if n < len(made) else None)
                pending.append(len(calls) - 1)
            full = limit is not None and len(calls) >= limit
        if full and not pending:
            break
    return calls


def _pending_for(
    s: dict[str, Any],
    answers: str | None,
    pending: list[int],
    calls: list[dict[str, Any]],
    call_ids: list[str | None],
) -> int | None:
    """The pending call a tool step answers: the one with its call id, else the first of its tool name
    (among calls without an id of their own), else (a result without a name) the first pending call."""
    if answers is not None:
        for j in pending:
            if call_ids[j] == answers:
                return j
    open_ = [j for j in pending if answers is None or call_ids[j] is None]
    if s["tool_name"] is None:
        return open_[0] if open_ else None
    return next((j for j in open_ if calls[j]["name"] == s["tool_name"]), None)


def _with_actions(actions: list[Any], calls: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
    """The view's `actions` as calls (their `step` and `is_error` win), with the results paired above."""
    by_key: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for c in calls:
        by_key.setdefault((c["step"], c["name"]), []).append(c)
    out: list[dict[str, Any]] = []
    for a in actions:
        if limit is not None and len(out) >= limit:
            break
        if not isinstance(a, dict):
            continue
        name = _text(a.get("name"))
        step = a.get("step") if type(a.get("step")) is int else None
        same = by_key.get((step, name))
        match = same.pop(0) if same else None
        args = a["args"] if "args" in a else a.get("arguments")
        flag = a.get("is_error")
        out.append(
            {
                "step": step,
                "name": name,
                "args": parse_args(args),
                "result": match["result"] if match else None,
                "result_step": match["result_step"] if match else None,
                "is_error": flag if isinstance(flag, bool) else bool(match and match["is_error"]),
                "actor": match["actor"] if match else None,
            }
        )
    return out


# -- call ids from the raw trace ---------------------------------------------------------------------


def _id(value: Any) -> str | None:
    return str(value) if value is not None and value != "" and not isinstance(value, (dict, list)) else None


def _parts(content: Any, *types: str) -> list[dict[str, Any]]:
    return (
        [p for p in content if isinstance(p, dict) and p.get("type") in types]
        if isinstance(content, list)
        else []
    )


def _message_ids(msg: Any, n_steps: int) -> list[_IdRow] | None:
    """The id rows of the `n_steps` steps one raw chat message became (None: they do not line up)."""
    if not isinstance(msg, dict):
        return [([], None)] * n_steps
    if msg.get("role") in ("tool", "function"):
        return [([], _id(msg.get("tool_call_id")))] if n_steps == 1 else None
    raw = msg.get("tool_calls") or msg.get("function_call")
    items = raw if isinstance(raw, list) else [raw] if isinstance(raw, dict) else []
    made = [_id(item.get("id")) for item in items if isinstance(item, dict)]
    made += [_id(p.get("id")) for p in _parts(msg.get("content"), "tool_use", "toolCall")]
    results: list[_IdRow] = [
        ([], _id(p.get("tool_use_id"))) for p in _parts(msg.get("content"), "tool_result")
    ]
    if n_steps == len(results) + 1:
        return [(made, None), *results]
    if n_steps == len(results) and not made:
        return results
    return None


def _call_ids(run: dict[str, Any], steps: list[dict[str, Any]]) -> list[_IdRow] | None:
    """Per step, the call ids it makes and the id it answers, read from the raw trace; None when the raw
    trace has none or does not line up with the steps (pairing then goes by tool name)."""
    fmt, raw = dict.get(run, "format"), dict.get(run, "raw")
    rows: list[_IdRow] | None
    try:
        if fmt == "openclaw" and isinstance(raw, list):
            rows = _openclaw_ids(as_data(raw))
        else:
            msgs: Any = None
            if fmt == "tau-bench" and isinstance(raw, dict):
                msgs = dict.get(raw, "traj")
            elif fmt == "messages":
                msgs = (
                    raw
                    if isinstance(raw, list)
                    else dict.get(raw, "messages")
                    if isinstance(raw, dict)
                    else None
                )
            elif fmt == "ace" and isinstance(raw, dict):
                msgs = dict.get(raw, "messages")
            if not isinstance(msgs, list):
                return None
            rows = _chat_ids(as_data(msgs))
    except (TypeError, ValueError, AttributeError, KeyError):
        return None
    if rows is None or len(rows) > len(steps):
        return None
    rows += [([], None)] * (len(steps) - len(rows))  # ACE: steps appended after the messages make no calls
    if any(len(made) != len(s["tool_calls"]) for (made, _r), s in zip(rows, steps, strict=True)):
        return None
    return rows


def _chat_ids(msgs: list[Any]) -> list[_IdRow] | None:
    rows: list[_IdRow] = []
    names: dict[str, str] = {}
    for msg in msgs:
        got = _message_ids(msg, len(_message_steps(msg, names, len(rows))))
        if got is None:
            return None
        rows.extend(got)
    return rows


def _openclaw_ids(events: list[Any]) -> list[_IdRow]:
    rows: list[_IdRow] = []
    for ev in events:
        msg = ev.get("message") if isinstance(ev, dict) and ev.get("type") == "message" else None
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "toolResult":
            rows.append(([], _id(msg.get("toolCallId"))))
        else:
            rows.append(([_id(p.get("id")) for p in _parts(msg.get("content"), "toolCall")], None))
    return rows
