"""`rr audit ID` for a terminal: the header, the timeline (children indented under their `recurse` call),
the budget and the reflection with each learning's cited cells. Plain text, no colour codes."""

from __future__ import annotations

import json

from reflector.client.audit.timeline import (
    Audit,
    CellItem,
    ChildItem,
    CompactionItem,
    IncidentItem,
    Item,
    ModelRequestItem,
    RunItem,
    Session,
)
from reflector.contract import EXECUTE_CODE_TOOL

__all__ = ["render_text", "short"]

CODE_LINES = 12
OUTPUT_LINES = 8
LINE_CHARS = 160


def short(text: str, limit: int = LINE_CHARS) -> str:
    """One line: control characters shown escaped, cut to `limit`."""
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text.replace("\n", " | "))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _block(text: str, lines: int, pad: str) -> list[str]:
    rows = text.rstrip("\n").splitlines() or [""]
    shown = [pad + short(r, LINE_CHARS) for r in rows[:lines]]
    if len(rows) > lines:
        shown.append(f"{pad}... ({len(rows) - lines} more lines)")
    return shown


def _args(args: dict[str, object] | str) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False)


def _request(item: ModelRequestItem, pad: str) -> list[str]:
    head = (
        f"{pad}request {item.step} [{item.agent}, {item.model or '?'}, {item.path}"
        + (f", {item.attempts} attempts" if item.attempts > 1 else "")
        + f"] tokens in {item.input_tokens} out {item.output_tokens}"
    )
    out = [head]
    g = item.given
    if g is None:
        out.append(f"{pad}  given: (not rebuilt: the replay failed)")
    else:
        out.append(
            f"{pad}  given ({g.source}): {g.messages} messages, {g.chars} chars, tools {', '.join(g.tools_offered) or '-'}"
        )
        for r in g.last_tool_results:
            out.append(
                f"{pad}    saw {r.tool}{' ' + r.call_id if r.call_id else ''} ({r.chars} chars): {short(r.excerpt, 100)}"
            )
    if item.failed:
        out.append(f"{pad}  FAILED: {short(item.failed)}")
    for call in item.tool_calls:
        if call.tool == EXECUTE_CODE_TOOL:
            out.append(f"{pad}  decided: {EXECUTE_CODE_TOOL} ({call.call_id})")
        else:
            out.append(f"{pad}  decided: {call.tool}({short(_args(call.args), 120)})")
    if item.text.strip():
        out.append(f"{pad}  text: {short(item.text)}")
    return out


def _cell(item: CellItem, pad: str) -> list[str]:
    flags: list[str] = [item.origin] if item.origin != "model" else []
    if not item.ok:
        flags.append("FAILED")
    if item.attempts > 1:
        flags.append(f"{item.attempts} attempts")
    if item.host_restarted:
        flags.append(f"rebuilt after a crash ({item.cells_replayed} cells replayed)")
    if item.truncated:
        flags.append("output truncated")
    if item.submitted:
        flags.append("final answer submitted")
    if item.reused:
        flags.append("reused from the rerun's origin")
    out = [f"{pad}[cell {item.seq}] {item.duration_ms:.0f} ms" + (f" ({'; '.join(flags)})" if flags else "")]
    out += _block(item.code or "(code not in the history)", CODE_LINES, pad + "  > ")
    out += _block(item.output or "(no output)", OUTPUT_LINES, pad + "  | ")
    if item.error:
        out.append(f"{pad}  error: {short(item.error)}")
    return out


def _item(item: Item, pad: str) -> list[str]:
    if isinstance(item, ModelRequestItem):
        return _request(item, pad)
    if isinstance(item, CellItem):
        return _cell(item, pad)
    if isinstance(item, ChildItem):
        head = (
            f"{pad}child {item.workflow_id} ({item.status}, stop {item.stop_reason or '-'}, "
            f"requests {item.requests}, tokens {item.tokens})"
        )
        out = [head, f"{pad}  prompt: {short(item.prompt)}"]
        if item.context_code:
            out.append(f"{pad}  context_code: {short(item.context_code)}")
        if item.session is not None:
            out += _session(item.session, pad + "    ")
        elif item.reused:
            out.append(f"{pad}  (reused from the rerun's origin: its history is the origin's)")
        else:
            out.append(f"{pad}  (its history is not in this audit)")
        if item.key_insight:
            out.append(f"{pad}  child's key insight: {short(item.key_insight)}")
        return out
    if isinstance(item, CompactionItem):
        return [
            f"{pad}COMPACTION{' (reused)' if item.reused else ''}: summary by {item.model or '?'} (tokens in {item.input_tokens} out "
            f"{item.output_tokens}, archive {item.archive_ref[:24]})"
        ] + _block(item.summary, OUTPUT_LINES, pad + "  | ")
    if isinstance(item, IncidentItem):
        gap = f", {item.gap_s:.1f} s without progress" if item.gap_s is not None else ""
        return [f"{pad}! {item.what}: {short(item.detail)}{gap} (event {item.event_id})"]
    if isinstance(item, RunItem):
        if not item.reason:
            return [f"{pad}-- run {item.index} ({item.run_id})"]
        return [f"{pad}-- run {item.index} ({item.run_id}, {item.reason})"]
    return []


def _session(s: Session, pad: str) -> list[str]:
    out = [f"{pad}session {s.workflow_id} (depth {s.depth}, {len(s.run_ids)} run(s), {s.events} events)"]
    if s.replay_failure:
        out.append(f"{pad}  replay failed, model inputs not rebuilt: {short(s.replay_failure)}")
    for item in s.items:
        out += _item(item, pad + "  ")
    out += _reflection(s, pad + "  ")
    return out


def _reflection(s: Session, pad: str) -> list[str]:
    r = s.reflection
    out = [f"{pad}reflection: {r.status}" + (f", stop reason {r.stop_reason}" if r.stop_reason else "")]
    if r.failure:
        out.append(f"{pad}  failure: {short(r.failure)}")
    if r.key_insight:
        out.append(f"{pad}  key insight: {short(r.key_insight)}")
    for learning in r.learnings:
        out.append(f"{pad}  learning {learning.index + 1}: {short(learning.learning)}")
        if learning.uncited:
            out.append(f"{pad}    UNCITED (the evidence names no cell)")
        for c in learning.citations:
            mark = (
                "ok"
                if c.supported
                else ("UNSUPPORTED: no such cell" if not c.exists else "UNSUPPORTED: not printed")
            )
            quote = f' "{short(c.quote, 80)}"' if c.quote else ""
            out.append(f"{pad}    cites cell {c.cell}{quote}: {mark}")
    return out


def _budget(s: Session) -> list[str]:
    if not s.budget:
        return []
    points = s.budget
    keep = points if len(points) <= 12 else [points[i * (len(points) - 1) // 11] for i in range(12)]
    return [
        "budget over time (requests / tokens): "
        + ", ".join(f"{p.label}: {p.requests}/{p.tokens}" for p in keep)
    ]


def render_text(audit: Audit) -> str:
    trace = audit.trace
    lines = [
        f"audit of {audit.root_id} ({audit.source})",
        f"model {audit.model or '?'}; trace {trace.get('format', '?')} {trace.get('size', '?')} bytes "
        f"sha256:{str(trace.get('sha256', ''))[:16]}",
        f"status {audit.status}; stop reason {audit.stop_reason or '-'}; requests {audit.requests}; tokens "
        f"{audit.tokens}; cells {audit.cells}; children {audit.children}; compactions {audit.compactions}; "
        f"incidents {audit.incidents}; cells rebuilt on a new sandbox host {audit.cells_rebuilt}",
    ]
    if audit.rerun:
        lines.append(
            f"rerun of {audit.rerun.get('origin') or audit.rerun.get('workflow_id') or audit.rerun}"
            + (f" from step {audit.rerun['from_step']}" if "from_step" in audit.rerun else "")
        )
    if not audit.inputs_rebuilt:
        lines.append("note: some model inputs could not be rebuilt by replay (shown as not rebuilt)")
    lines += _budget(audit.session)
    lines.append("")
    lines += _session(audit.session, "")
    return "\n".join(lines) + "\n"
