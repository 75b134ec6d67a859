"""Trace loading, validation and normalisation.

Every reflection starts from a file a user hands us, so the first job is to fail early with a
one-line message a human can act on (`TraceError`). The second job is to give the model one
canonical view of the many trace shapes in the wild (ACE dicts, OpenAI message lists, OpenClaw
session JSONL, tau-bench trajectories, OTel/OpenInference spans) while keeping the raw data at
hand, because no adapter sees everything and the model may need to dig further.

This module is imported by the CLI *and* by the sandbox host process, so it only depends on the
standard library and `reflector.types` and performs no I/O beyond reading the given file.

Canonical single-run view (`normalize` for one run)::

    {"format", "question", "ground_truth", "feedback", "final_answer", "reward",
     "steps": [{"index", "role", "content", "tool_calls": [{"name", "arguments"}],
                "tool_name", "is_error"}],
     "metadata": {...}, "raw": <the run as read>}

A tau-bench run also has `actions` (the agent's tool calls: `{"name", "arguments", "step",
"is_error"}`), `expected_actions` (`{"name", "arguments"}`) and `expected_outputs`; its
`final_answer` is the agent's last message verbatim and its `ground_truth` is None (the ground
truth is actions, compared with actions by `reflector.answers`, not text).

Canonical batch view (a list of runs, e.g. a whole tau-bench file)::

    {"format", "runs": [<single-run views>], "metadata": {"n_runs", ...}, "raw": <data>}
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from reflector.formats import TraceFormat

__all__ = [
    "TraceError",
    "FileFormat",
    "read_trace_file",
    "detect_format",
    "normalize",
    "load_normalized",
    "load_normalized_bytes",
    "parse_trace_bytes",
    "looks_like_error",
    "render_call",
    "iter_runs",
    "MAX_BYTES_ENV",
    "MAX_NESTING",
    "nesting_depth",
]

FileFormat = Literal["json", "jsonl"]
MAX_BYTES_ENV = "RR_MAX_TRACE_BYTES"
# Deepest nesting of arrays/objects a trace may have. `json.loads` and everything that walks the data
# afterwards (normalisation, the sandbox's schema sketch and preview, `json.dumps`, pickling a
# snapshot, a model's own recursive cell) recurse once or more per level, and Python's default
# recursion limit is 1,000 frames: 100 leaves room for several frames per level on top of a deep
# caller. Real traces nest well under 30 levels. Checked before parsing, without recursion.
MAX_NESTING = 100

_ERROR_SCAN_CHARS = 1000
_ERROR_RE = re.compile(
    r"\b(error|errors|exception|traceback|not found|invalid|no such file|enoent|permission denied)\b"
    r"|exited with code [1-9]",
    re.IGNORECASE,
)
_ACE_KEYS = frozenset(
    {
        "question",
        "ground_truth",
        "feedback",
        "agent_output",
        "reasoning",
        "trace",
        "final_answer",
        "generator_output",
        "skill_ids",
        "task",
    }
)
_THINKING_RE = re.compile(r"\[thinking\].*?\[/thinking\]", re.DOTALL)
_OPENCLAW_EVENTS = frozenset({"session", "message", "custom", "thinking_level_change", "model_change"})


class TraceError(ValueError):
    """A trace that cannot be used; the message is one line, meant for the user."""


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_trace_file(path: str | Path, max_bytes: int | None) -> tuple[Any, FileFormat]:
    """Read and parse a `.json` or `.jsonl` trace; returns (data, "json" | "jsonl").

    The container format is decided by content, the suffix is only a hint: people save JSONL
    as `.json` and pretty-printed JSON as `.jsonl`. `max_bytes=None` disables the size check.
    """
    p = Path(path)
    size = _check_file(p, max_bytes)
    if size == 0:
        raise TraceError(f"trace file is empty: {p}")
    return parse_trace_bytes(p.read_bytes(), p)


def parse_trace_bytes(raw: bytes, name: str | Path) -> tuple[Any, FileFormat]:
    """Parse the bytes of a trace file called `name` (its suffix is a hint), as `read_trace_file` does."""
    p = Path(name)
    text = raw.decode("utf-8-sig", errors="replace")
    if not text.strip():
        raise TraceError(f"trace file is empty (whitespace only): {p}")
    if nesting_depth(text, MAX_NESTING) > MAX_NESTING:
        raise TraceError(
            f"trace {p} nests deeper than {MAX_NESTING} levels of arrays/objects, the limit for traces "
            "(flatten the deepest values or store them as JSON strings)"
        )
    if p.suffix.lower() == ".jsonl":
        try:
            return _parse_jsonl(text, p), "jsonl"
        except TraceError:
            whole = _try_json(text)
            if whole is not _FAIL:
                return whole, "json"
            raise
    try:
        return json.loads(text), "json"
    except json.JSONDecodeError as exc:
        if _looks_like_jsonl(text, exc):
            return _parse_jsonl(text, p), "jsonl"
        raise TraceError(f"invalid JSON in {p} at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def _check_file(p: Path, max_bytes: int | None) -> int:
    """Existence, kind and size checks, before reading anything into memory."""
    if not p.exists():
        raise TraceError(f"trace file not found: {p}")
    if p.is_dir():
        raise TraceError(f"trace path is a directory, not a file: {p}")
    size = p.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise TraceError(
            f"trace file {p} is {size:,} bytes, over the limit of {max_bytes:,} bytes "
            f"(raise it with the environment variable {MAX_BYTES_ENV})"
        )
    return size


_FAIL = object()
# A JSON string, escapes included; the closing quote is optional so that an unterminated string
# consumes the rest of the text instead of being retried from every later quote (quadratic).
_JSON_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKET_RUN_RE = re.compile(r"[\[\]{}]+")


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """How deeply the arrays/objects of JSON (or JSON lines) `text` nest, brackets in strings aside.

    A linear scan with no recursion, so it is safe on a recursion bomb (`"[" * 200_000`) and on
    invalid JSON (stray closing brackets never go below 0). It stops as soon as the depth exceeds
    `stop_above` and returns that depth.
    """
    depth = deepest = 0
    for run in _BRACKET_RUN_RE.finditer(_JSON_STRING_RE.sub("", text)):
        for ch in run.group():
            if ch == "[" or ch == "{":
                depth += 1
                if depth > deepest:
                    deepest = depth
                    if stop_above is not None and deepest > stop_above:
                        return deepest
            elif depth:
                depth -= 1
    return deepest


def _try_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return _FAIL


def _loads_embedded(text: str) -> Any:
    """JSON held in a string of the trace (tool-call arguments); `_FAIL` if invalid or nested too deep.

    The file's nesting check cannot see inside strings, so JSON found there is checked again.
    """
    if nesting_depth(text, MAX_NESTING) > MAX_NESTING:
        return _FAIL
    return _try_json(text)


def _looks_like_jsonl(text: str, exc: json.JSONDecodeError) -> bool:
    """JSONL read as JSON fails with "Extra data" on line 2+, or on a stray-prefixed line 1."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return False
    if exc.msg.startswith("Extra data") and exc.lineno >= 2:
        return True
    return _parse_line(lines[0]) is not _FAIL and _parse_line(lines[1]) is not _FAIL


def _parse_line(line: str) -> Any:
    """One JSONL line; tolerates stray bytes before the first `{` (seen in real OpenClaw files)."""
    value = _try_json(line)
    if value is not _FAIL:
        return value
    start = line.find("{")
    if start > 0:
        return _try_json(line[start:])
    return _FAIL


def _parse_jsonl(text: str, p: Path) -> list[Any]:
    """Parse every non-blank line; one unrecoverable line is an error naming its number."""
    records: list[Any] = []
    bad: list[tuple[int, str]] = []
    numbered = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
    for lineno, line in numbered:
        value = _parse_line(line)
        if value is _FAIL:
            bad.append((lineno, _json_error(line)))
        else:
            records.append(value)
    if not records:
        lineno, msg = bad[0]
        raise TraceError(f"not valid JSON or JSONL: no line of {p} parses (line {lineno}: {msg})")
    if bad:
        lineno, msg = bad[0]
        more = f" (and {len(bad) - 1} more broken lines)" if len(bad) > 1 else ""
        raise TraceError(f"broken JSONL in {p}: line {lineno} is not valid JSON: {msg}{more}")
    return records


def _json_error(line: str) -> str:
    try:
        json.loads(line)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at column {exc.colno}"
    return "unparseable"


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def detect_format(data: Any) -> TraceFormat:
    """Guess the trace shape from its structure (never from the file name)."""
    if isinstance(data, dict):
        return _detect_dict(data)
    if isinstance(data, list):
        return _detect_list(data)
    return "unknown"


def _detect_dict(d: dict[str, Any]) -> TraceFormat:
    if isinstance(d.get("traj"), list):
        return "tau-bench"
    if "resourceSpans" in d or _is_span(d) or isinstance(d.get("spans"), list):
        return "otel"
    if isinstance(d.get("messages"), list):
        return "messages"
    if isinstance(d.get("steps"), list) or _ACE_KEYS & d.keys():
        return "ace"
    return "unknown"


def _detect_list(items: list[Any]) -> TraceFormat:
    dicts = [x for x in items if isinstance(x, dict)]
    if not dicts or len(dicts) != len(items):
        return "unknown"
    if all(isinstance(x.get("traj"), list) for x in dicts):
        return "tau-bench"
    if any(x.get("type") in _OPENCLAW_EVENTS for x in dicts) and any(
        isinstance(x.get("message"), dict) or x.get("type") == "session" for x in dicts
    ):
        return "openclaw"
    if all("role" in x for x in dicts):
        return "messages"
    if all(_is_span(x) or "resourceSpans" in x for x in dicts):
        return "otel"
    if all(_ACE_KEYS & x.keys() for x in dicts):
        return "ace"
    return "unknown"


def _is_span(d: dict[str, Any]) -> bool:
    ctx = d.get("context")
    return (
        (isinstance(ctx, dict) and "span_id" in ctx)
        or "span_id" in d
        or "spanId" in d
        or "startTimeUnixNano" in d
    )


# --------------------------------------------------------------------------------------------
# Normalisation: shared helpers
# --------------------------------------------------------------------------------------------


def looks_like_error(content: str) -> bool:
    """Whether a tool result reads like a failure (checked on its beginning only).

    Only the first characters are scanned: a large successful payload may mention "error"
    somewhere deep inside, while real failures announce themselves up front.
    """
    head = content.lstrip()[:_ERROR_SCAN_CHARS]
    return head.lower().startswith("error") or bool(_ERROR_RE.search(head))


def _text(value: Any) -> str:
    """Any content value (str, None, list of parts, dict) as plain text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_part_text(p) for p in value) if t)
    if isinstance(value, dict):
        return _part_text(value)
    return str(value)


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return "" if part is None else str(part)
    for key in ("text", "content", "thinking", "output"):
        if key in part and part[key] is not None:
            inner = _text(part[key])
            return f"[thinking] {inner} [/thinking]" if key == "thinking" else inner
    return ""


def _args_str(args: Any) -> str:
    if args is None:
        return ""
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False, default=str)


def _step(
    index: int,
    role: str,
    content: str,
    tool_calls: list[dict[str, str]] | None = None,
    tool_name: str | None = None,
    is_error: bool = False,
) -> dict[str, Any]:
    return {
        "index": index,
        "role": role,
        "content": content,
        "tool_calls": tool_calls or [],
        "tool_name": tool_name,
        "is_error": is_error,
    }


def _run_view(
    fmt: TraceFormat,
    raw: Any,
    steps: list[dict[str, Any]],
    *,
    question: str | None = None,
    ground_truth: str | None = None,
    feedback: str | None = None,
    final_answer: str | None = None,
    reward: float | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta = {"n_steps": len(steps), **(metadata or {})}
    return {
        "format": fmt,
        "question": question,
        "ground_truth": ground_truth,
        "feedback": feedback,
        "final_answer": final_answer,
        "reward": reward,
        "steps": steps,
        "metadata": meta,
        "raw": raw,
    }


def _batch_view(fmt: TraceFormat, raw: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [r["reward"] for r in runs if r.get("reward") is not None]
    meta: dict[str, Any] = {"n_runs": len(runs)}
    if rewards:
        meta["mean_reward"] = round(sum(rewards) / len(rewards), 4)
        meta["n_failed"] = sum(1 for x in rewards if x < 1)
    return {"format": fmt, "runs": runs, "metadata": meta, "raw": raw}


def _opt_str(value: Any) -> str | None:
    """Text of a scalar/content value; None stays None so "no ground truth" stays visible."""
    if value is None:
        return None
    if isinstance(value, (int, float, bool)):
        return str(value)
    return _text(value) if not isinstance(value, dict) else _args_str(value)


def _as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a dict, else {}: lets adapters read optional nested fields safely."""
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------


def _messages_steps(messages: list[Any]) -> list[dict[str, Any]]:
    """OpenAI-style (and Anthropic content-part) messages -> canonical steps."""
    steps: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for msg in messages:
        if not isinstance(msg, dict):
            steps.append(_step(len(steps), "unknown", _text(msg)))
            continue
        role = str(msg.get("role", "unknown"))
        content = msg.get("content")
        calls = _openai_calls(msg.get("tool_calls") or msg.get("function_call"), call_names)
        calls += _anthropic_calls(content, call_names)
        if role in ("tool", "function"):
            name = msg.get("name") or call_names.get(str(msg.get("tool_call_id")))
            text = _text(content)
            err = bool(msg.get("is_error")) or looks_like_error(text)
            steps.append(_step(len(steps), "tool", text, calls, name, err))
            continue
        results = _anthropic_results(content, call_names)
        text = (
            _text([p for p in content if _part_type(p) != "tool_result"])
            if isinstance(content, list)
            else _text(content)
        )
        if text or calls or not results:
            steps.append(_step(len(steps), role, text, calls))
        for name, rtext, err in results:
            steps.append(_step(len(steps), "tool", rtext, None, name, err))
    return steps


def _part_type(part: Any) -> str | None:
    return part.get("type") if isinstance(part, dict) else None


def _openai_calls(raw: Any, call_names: dict[str, str]) -> list[dict[str, str]]:
    items = raw if isinstance(raw, list) else [raw] if isinstance(raw, dict) else []
    calls: list[dict[str, str]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        fn = _as_dict(item.get("function")) or item
        name = str(fn.get("name", ""))
        calls.append({"name": name, "arguments": _args_str(fn.get("arguments"))})
        if item.get("id"):
            call_names[str(item["id"])] = name
    return calls


def _anthropic_calls(content: Any, call_names: dict[str, str]) -> list[dict[str, str]]:
    calls: list[dict[str, str]] = []
    for part in content if isinstance(content, list) else []:
        if _part_type(part) in ("tool_use", "toolCall"):
            name = str(part.get("name", ""))
            calls.append({"name": name, "arguments": _args_str(part.get("input", part.get("arguments")))})
            if part.get("id"):
                call_names[str(part["id"])] = name
    return calls


def _anthropic_results(content: Any, call_names: dict[str, str]) -> list[tuple[str | None, str, bool]]:
    out: list[tuple[str | None, str, bool]] = []
    for part in content if isinstance(content, list) else []:
        if _part_type(part) == "tool_result":
            text = _text(part.get("content"))
            name = call_names.get(str(part.get("tool_use_id")))
            out.append((name, text, bool(part.get("is_error")) or looks_like_error(text)))
    return out


def _first_text(steps: list[dict[str, Any]], role: str, last: bool = False) -> str | None:
    seq = reversed(steps) if last else iter(steps)
    for s in seq:
        text = _THINKING_RE.sub("", s["content"]).strip()
        if s["role"] == role and text:
            return text
    return None


def _last_answer(steps: list[dict[str, Any]]) -> str | None:
    """The last assistant text, without its thinking blocks (they are not the answer)."""
    return _first_text(steps, "assistant", last=True)


def _norm_messages(data: Any) -> dict[str, Any]:
    wrapper = data if isinstance(data, dict) else {}
    messages = wrapper.get("messages", []) if wrapper else data
    steps = _messages_steps(messages)
    extra = {k: v for k, v in wrapper.items() if k != "messages" and isinstance(v, (str, int, float, bool))}
    return _run_view(
        "messages",
        data,
        steps,
        question=_opt_str(wrapper.get("question") or wrapper.get("task")) or _first_text(steps, "user"),
        ground_truth=_opt_str(wrapper.get("ground_truth")),
        feedback=_opt_str(wrapper.get("feedback")),
        final_answer=_opt_str(wrapper.get("final_answer")) or _last_answer(steps),
        reward=_opt_float(wrapper.get("reward")),
        metadata={"roles": dict(Counter(s["role"] for s in steps)), **extra},
    )


def _norm_ace(data: Any) -> dict[str, Any]:
    if isinstance(data, list):
        return _batch_view("ace", data, [_norm_ace_run(x) for x in data])
    return _norm_ace_run(data)


def _norm_ace_run(d: dict[str, Any]) -> dict[str, Any]:
    """ACE reflector inputs: question, generator output (reasoning/final answer), truth, feedback."""
    out = d.get("agent_output") or d.get("generator_output")
    out_d = out if isinstance(out, dict) else {}
    steps = _ace_base_steps(d)
    trace = d.get("trace")
    if isinstance(trace, (str, dict)) and trace:
        steps.append(_step(len(steps), "assistant", trace if isinstance(trace, str) else _args_str(trace)))
    reasoning = d.get("reasoning") or out_d.get("reasoning")
    if reasoning:
        steps.append(_step(len(steps), "assistant", _text(reasoning)))
    if isinstance(out, str) and out.strip():
        steps.append(_step(len(steps), "assistant", out))
    final = d.get("final_answer") or out_d.get("final_answer") or (out if isinstance(out, str) else None)
    skill_ids = d.get("skill_ids") or out_d.get("skill_ids") or []
    meta: dict[str, Any] = {
        k: v
        for k, v in d.items()
        if k not in _ACE_KEYS | {"steps", "messages", "reward"} and isinstance(v, (str, int, float, bool))
    }
    if skill_ids:
        meta["skill_ids"] = list(skill_ids)
    return _run_view(
        "ace",
        d,
        steps,
        question=_opt_str(d.get("question") or d.get("task")),
        ground_truth=_opt_str(d.get("ground_truth")),
        feedback=_opt_str(d.get("feedback")),
        final_answer=_opt_str(final) or _last_answer(steps),
        reward=_opt_float(d.get("reward")),
        metadata=meta,
    )


def _ace_base_steps(d: dict[str, Any]) -> list[dict[str, Any]]:
    """Structured steps of an ACE dict: `messages`, else `steps`, else a list-valued `trace`."""
    if isinstance(d.get("messages"), list):
        return _messages_steps(d["messages"])
    for key in ("steps", "trace"):
        if isinstance(d.get(key), list):
            return [_ace_step(i, s) for i, s in enumerate(d[key])]
    return []


def _ace_step(index: int, raw: Any) -> dict[str, Any]:
    """A free-form ACE step: a string, or a dict with thought/action/observation-like keys."""
    if not isinstance(raw, dict):
        return _step(index, "assistant", _text(raw))
    if "role" in raw:
        sub = _messages_steps([raw])
        base = sub[0] if sub else _step(index, str(raw["role"]), "")
        return {**base, "index": index}
    tool = raw.get("tool") or raw.get("tool_name") or raw.get("action")
    tool = tool if isinstance(tool, str) else None
    parts = [
        f"{k}: {_text(v) if not isinstance(v, dict) else _args_str(v)}"
        for k, v in raw.items()
        if k not in ("tool", "tool_name", "is_error", "error") and v not in (None, "")
    ]
    content = "\n".join(parts)
    observation = _text(raw.get("observation") or raw.get("result") or raw.get("output") or "")
    err = bool(raw.get("is_error") or raw.get("error")) or (bool(tool) and looks_like_error(observation))
    if raw.get("error"):
        content += f"\nerror: {_text(raw['error'])}"
    calls = (
        [{"name": tool, "arguments": _args_str(raw.get("args") or raw.get("arguments") or raw.get("input"))}]
        if tool
        else []
    )
    return _step(index, "tool" if tool else "assistant", content, calls, tool, err)


def _norm_openclaw(events: list[Any]) -> dict[str, Any]:
    """OpenClaw session JSONL: session/message/custom events; message content is a part list."""
    steps: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"event_types": dict(Counter(str(e.get("type")) for e in events))}
    custom: list[Any] = []
    for ev in events:
        etype = ev.get("type")
        if etype == "session":
            meta.update(
                {f"session_{k}": v for k, v in ev.items() if k in ("id", "cwd", "timestamp", "version")}
            )
        elif etype == "custom":
            custom.append({"customType": ev.get("customType"), "data": ev.get("data")})
        elif etype == "message" and isinstance(ev.get("message"), dict):
            steps.append(_openclaw_step(len(steps), ev["message"]))
    if custom:
        meta["custom"] = custom
    models = sorted(
        {
            str(e["message"]["model"])
            for e in events
            if isinstance(e.get("message"), dict) and e["message"].get("model")
        }
    )
    meta["models"] = models
    meta["user_turns"] = sum(1 for s in steps if s["role"] == "user")
    return _run_view(
        "openclaw",
        events,
        steps,
        question=_first_text(steps, "user"),
        final_answer=_last_answer(steps),
        metadata=meta,
    )


def _openclaw_step(index: int, msg: dict[str, Any]) -> dict[str, Any]:
    role = str(msg.get("role", "unknown"))
    parts = msg.get("content")
    content = (
        _text([p for p in parts if _part_type(p) != "toolCall"]) if isinstance(parts, list) else _text(parts)
    )
    calls = [
        {"name": str(p.get("name", "")), "arguments": _args_str(p.get("arguments"))}
        for p in (parts if isinstance(parts, list) else [])
        if _part_type(p) == "toolCall"
    ]
    if role == "toolResult":
        err = bool(msg.get("isError")) or looks_like_error(content)
        return _step(index, "tool", content, calls, msg.get("toolName"), err)
    return _step(index, role, content, calls)


def _norm_tau(data: Any) -> dict[str, Any]:
    if isinstance(data, list):
        return _batch_view("tau-bench", data, [_norm_tau_run(r) for r in data])
    return _norm_tau_run(data)


def render_call(name: str, kwargs: Any) -> str:
    """`name(k=v, ...)` with sorted keys and compact JSON values: comparable across sources."""
    if isinstance(kwargs, str):
        parsed = _loads_embedded(kwargs)
        if parsed is _FAIL:
            return f"{name}({kwargs})"
        kwargs = parsed
    if not isinstance(kwargs, dict):
        return f"{name}({_args_str(kwargs)})"
    args = ", ".join(f"{k}={_compact(kwargs[k])}" for k in sorted(kwargs))
    return f"{name}({args})"


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(_canon(value), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _canon(value: Any) -> Any:
    """Integral floats become ints so that 250.0 and 250 render the same."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_canon(v) for v in value]
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    return value


def _norm_tau_run(run: dict[str, Any]) -> dict[str, Any]:
    """One tau-bench trajectory. What the agent said and what it did are kept apart, both as recorded:
    `final_answer` is the text of its last message, verbatim; `actions` are its tool calls and
    `expected_actions` / `expected_outputs` the task's ground truth, compared with them (actions with
    actions) by `reflector.answers`. There is no text ground truth to compare the answer with."""
    info = _as_dict(run.get("info"))
    task = _as_dict(info.get("task"))
    traj = _as_list(run.get("traj"))
    steps = _messages_steps(traj)
    expected: list[dict[str, Any]] = [
        {"name": str(a.get("name")), "arguments": a.get("kwargs") if a.get("kwargs") is not None else {}}
        for a in _as_list(task.get("actions"))
        if isinstance(a, dict)
    ]
    actions = _tau_actions(steps)
    reward = _opt_float(run.get("reward"))
    view = _run_view(
        "tau-bench",
        run,
        steps,
        question=_opt_str(task.get("instruction")),
        feedback=_tau_feedback(info.get("reward_info"), reward),
        final_answer=_last_message_text(traj),
        reward=reward,
        metadata={
            "id": f"task{run.get('task_id')}-trial{run.get('trial')}",
            "task_id": run.get("task_id"),
            "trial": run.get("trial"),
            "user_id": task.get("user_id"),
            "n_expected_actions": len(expected),
            "n_agent_actions": len(actions),
        },
    )
    view["actions"] = actions
    view["expected_actions"] = expected
    view["expected_outputs"] = [str(o) for o in _as_list(task.get("outputs"))]
    return view


def _last_message_text(messages: list[Any]) -> str | None:
    """The text of the agent's last message that has any, exactly as recorded (None if it never wrote)."""
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            text = _text(msg.get("content"))
            if text.strip():
                return text
    return None


def _tau_actions(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool call of the agent, in order: name, arguments (parsed when they are JSON), the step
    that made it, and whether its result reads like an error (None: no result recorded)."""
    actions: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for s in steps:
        if s["role"] == "assistant":
            for c in s["tool_calls"]:
                args = _loads_embedded(c["arguments"]) if c["arguments"].strip() else {}
                action = {"name": c["name"], "arguments": c["arguments"] if args is _FAIL else args,
                          "step": s["index"], "is_error": None}
                actions.append(action)
                pending.append(action)
        elif s["role"] == "tool" and s["tool_name"]:
            match = next((a for a in pending if a["name"] == s["tool_name"]), None)
            if match is not None:
                pending.remove(match)
                match["is_error"] = bool(s["is_error"])
    return actions


def _tau_feedback(reward_info: Any, reward: float | None) -> str:
    if not isinstance(reward_info, dict):
        return f"reward={reward}; no reward_info recorded"
    parts = [f"reward={reward_info.get('reward', reward)}"]
    detail = _as_dict(reward_info.get("info"))
    for key in ("r_actions", "r_outputs"):
        if key in detail:
            parts.append(f"{key}={detail[key]}")
    outs = detail.get("outputs")
    if isinstance(outs, dict):
        missing = [str(k) for k, ok in outs.items() if not ok]
        if missing:
            parts.append("expected outputs the agent never stated: " + ", ".join(missing))
    if detail.get("r_actions") == 0:
        parts.append("the database state after the agent's actions differs from the expected one")
    return "; ".join(parts)


def _norm_otel(data: Any) -> dict[str, Any]:
    """Best effort for OTel/OpenInference spans (flat span JSONL or OTLP resourceSpans JSON)."""
    spans = sorted(_flatten_spans(data), key=lambda s: str(_span_start(s)).zfill(32))
    steps = [_span_step(i, s) for i, s in enumerate(spans)]
    roots = [s for s in spans if not (s.get("parent_id") or s.get("parentSpanId"))]
    root_attrs = _span_attrs(roots[0]) if roots else {}
    return _run_view(
        "otel",
        data,
        steps,
        question=_opt_str(root_attrs.get("input.value")) or _first_text(steps, "user"),
        final_answer=_opt_str(root_attrs.get("output.value")),
        metadata={
            "n_spans": len(spans),
            "span_kinds": dict(Counter(s["role"] for s in steps)),
            "trace_ids": sorted({str(_span_trace_id(s)) for s in spans})[:10],
        },
    )


def _flatten_spans(data: Any) -> list[dict[str, Any]]:
    items = data if isinstance(data, list) else [data]
    spans: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "resourceSpans" in item:
            for rs in item["resourceSpans"] or []:
                for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
                    spans.extend(x for x in ss.get("spans") or [] if isinstance(x, dict))
        elif isinstance(item.get("spans"), list):
            spans.extend(x for x in item["spans"] if isinstance(x, dict))
        else:
            spans.append(item)
    return spans


def _span_start(span: dict[str, Any]) -> Any:
    return span.get("start_time") or span.get("startTimeUnixNano") or span.get("start") or ""


def _span_trace_id(span: dict[str, Any]) -> Any:
    ctx = _as_dict(span.get("context"))
    return ctx.get("trace_id") or span.get("trace_id") or span.get("traceId")


def _span_attrs(span: dict[str, Any]) -> dict[str, Any]:
    attrs = span.get("attributes")
    if isinstance(attrs, dict):
        return attrs
    if isinstance(attrs, list):  # OTLP: [{"key": k, "value": {"stringValue": v}}]
        out: dict[str, Any] = {}
        for a in attrs:
            if isinstance(a, dict) and "key" in a:
                val = a.get("value")
                out[str(a["key"])] = next(iter(val.values()), None) if isinstance(val, dict) and val else val
        return out
    return {}


def _span_step(index: int, span: dict[str, Any]) -> dict[str, Any]:
    attrs = _span_attrs(span)
    kind = str(attrs.get("openinference.span.kind") or span.get("span_kind") or "span").lower()
    name = str(span.get("name", ""))
    out = _text(attrs.get("output.value"))
    inp = _text(attrs.get("input.value"))
    content = "\n".join(
        x for x in (f"span: {name}", f"input: {inp}" if inp else "", f"output: {out}" if out else "") if x
    )
    status = _as_dict(span.get("status"))
    code = str(status.get("status_code") or status.get("code") or "")
    events = _as_list(span.get("events"))
    err = code.upper() in ("ERROR", "STATUS_CODE_ERROR", "2") or any(
        isinstance(e, dict) and e.get("name") == "exception" for e in events
    )
    if err and (status.get("message") or status.get("description")):
        content += f"\nstatus: {status.get('message') or status.get('description')}"
    tool = attrs.get("tool.name") or (name if kind == "tool" else None)
    calls = [{"name": str(tool), "arguments": _args_str(attrs.get("tool.parameters") or inp)}] if tool else []
    return _step(index, kind, content, calls, str(tool) if tool else None, err)


def _norm_unknown(data: Any) -> dict[str, Any]:
    keys = sorted(data)[:50] if isinstance(data, dict) else []
    return _run_view(
        "unknown", data, [], metadata={"note": "unrecognised shape: explore raw", "raw_keys": keys}
    )


_ADAPTERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "ace": _norm_ace,
    "messages": _norm_messages,
    "openclaw": _norm_openclaw,
    "tau-bench": _norm_tau,
    "otel": _norm_otel,
    "unknown": _norm_unknown,
}


def normalize(data: Any, fmt: str | None = None) -> dict[str, Any]:
    """The canonical view of `data` (format detected when `fmt` is None or "unknown").

    A forced `fmt` that does not fit the data raises TraceError rather than producing a
    silently empty view.
    """
    if fmt is None or fmt == "unknown":
        fmt = detect_format(data)
    adapter = _ADAPTERS.get(fmt)
    if adapter is None:
        raise TraceError(f"unknown trace format {fmt!r}; expected one of: {', '.join(_ADAPTERS)}")
    try:
        return adapter(data)
    except (AttributeError, TypeError, KeyError) as exc:
        raise TraceError(f"trace does not look like format {fmt!r}: {type(exc).__name__}: {exc}") from None
    except RecursionError:  # data built in Python, not read by `parse_trace_bytes` (which bounds nesting)
        raise TraceError(f"trace nests too deeply to normalise (traces read from files are limited to "
                         f"{MAX_NESTING} levels)") from None


def load_normalized(path: str | Path, fmt: str | None = None) -> dict[str, Any]:
    """Read `path` without a size limit (the caller already checked it) and normalise it."""
    data, _ = read_trace_file(path, None)
    return normalize(data, fmt)


def load_normalized_bytes(raw: bytes, name: str | Path, fmt: str | None = None) -> dict[str, Any]:
    """`load_normalized` of a trace already read (the sandbox host reads it from an fd)."""
    if not raw:
        raise TraceError(f"trace file is empty: {name}")
    data, _ = parse_trace_bytes(raw, name)
    return normalize(data, fmt)


def iter_runs(view: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """The single-run views of a normalised view (itself when it is not a batch)."""
    runs = view.get("runs")
    return runs if isinstance(runs, list) else [view]
