"""`rr audit ID --html OUT.html`: the timeline as ONE self-contained HTML file, readable by a person.

Inline CSS and JS only, no network (a Content-Security-Policy forbids any fetch and lets only this file's
own script run), no external fonts. Everything shown comes from the trace and the model, i.e. may be
attacker-written: every text goes through `html.escape`, so a `<script>` in a trace or a cell output is
shown, never run. Cells are collapsible (`<details id="cell-<workflow>-<seq>">`); a learning's citation
links to its cell (`<a href="#cell-<workflow>-<seq>">`), and following it opens and shows the cell.
"""

from __future__ import annotations

import hashlib
import json
from html import escape

from reflector.client.audit.timeline import (
    Audit,
    BudgetPoint,
    CellItem,
    ChildItem,
    CompactionItem,
    IncidentItem,
    Item,
    LearningAudit,
    ModelRequestItem,
    RunItem,
    Session,
)
from reflector.contract import EXECUTE_CODE_TOOL

__all__ = ["render_html"]

CSS = """
:root { --fg:#1d232b; --muted:#5d6876; --line:#d9dee5; --bg:#fbfcfd; --ok:#1f7a3d; --bad:#b3261e; --warn:#9a6700;
  --code:#f3f5f8; --accent:#2f5fb3; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg);
  margin: 0 auto; max-width: 1100px; padding: 24px; }
h1 { font-size: 20px; margin: 0 0 4px; word-break: break-all; } h2 { font-size: 16px; margin: 28px 0 8px; }
.meta { color: var(--muted); } .meta b { color: var(--fg); font-weight: 600; }
table.totals { border-collapse: collapse; margin: 10px 0; } table.totals td { padding: 2px 14px 2px 0; }
pre { background: var(--code); padding: 8px 10px; border-radius: 6px; overflow-x: auto; white-space: pre-wrap;
  word-break: break-word; margin: 6px 0; font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.item { border-left: 3px solid var(--line); padding: 4px 0 4px 12px; margin: 6px 0; }
.request { border-color: var(--accent); } .cell { border-color: #8a94a3; } .child { border-color: #7b4fb3; }
.compaction { border-color: var(--warn); } .incident { border-color: var(--bad); color: var(--bad); }
.run { border: none; color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
details > summary { cursor: pointer; } details.cell > summary { font-weight: 600; }
details.cell:target, details.cell.flash { outline: 2px solid var(--accent); outline-offset: 2px; }
.tag { display: inline-block; font-size: 11.5px; padding: 0 6px; border-radius: 9px; background: #e8ecf2;
  color: var(--muted); margin-left: 4px; font-weight: 500; }
.tag.bad { background: #fbe4e2; color: var(--bad); } .tag.ok { background: #e1f3e6; color: var(--ok); }
.tag.warn { background: #fff1d6; color: var(--warn); }
.session { margin-left: 8px; } .nested { margin: 8px 0 4px 6px; padding-left: 10px; border-left: 2px dashed #c8b8e0; }
.label { color: var(--muted); font-size: 12px; }
code.peek { font-weight: 400; color: var(--muted); font-size: 12px; margin-left: 6px; }
.learning { border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; margin: 8px 0; background: #fff; }
a.cite { text-decoration: none; border-bottom: 1px dotted; margin-right: 6px; }
a.cite.unsupported, span.cite.unsupported { color: var(--bad); font-weight: 600; }
svg.budget { background: #fff; border: 1px solid var(--line); border-radius: 6px; }
"""

JS = """
function rrOpen(id) {
  var el = document.getElementById(id);
  if (!el) return false;
  for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS') p.open = true; }
  el.scrollIntoView({block: 'start'});
  el.classList.add('flash');
  return true;
}
document.addEventListener('click', function (ev) {
  var a = ev.target.closest ? ev.target.closest('a.cite') : null;
  if (!a) return;
  var id = a.getAttribute('href').slice(1);  // the cell's id as written (the HTML parser unescaped it)
  if (rrOpen(id)) { ev.preventDefault(); history.replaceState(null, '', '#' + encodeURIComponent(id)); }
});
function rrHash() {
  var h = location.hash.slice(1);
  try { h = decodeURIComponent(h); } catch (e) { /* not percent-encoded: use as is */ }
  if (h) rrOpen(h);
}
window.addEventListener('hashchange', rrHash);
rrHash();
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _tag(text: str, kind: str = "") -> str:
    return f'<span class="tag {kind}">{_e(text)}</span>'


def _pre(text: str, cls: str) -> str:
    return f'<pre class="{cls}">{_e(text)}</pre>'


def _request(item: ModelRequestItem) -> str:
    tags = [_tag(item.agent), _tag(item.model or "?"), _tag(item.path)]
    if item.attempts > 1:
        tags.append(_tag(f"{item.attempts} attempts", "warn"))
    if item.failed:
        tags.append(_tag("failed", "bad"))
    out = [
        f'<div class="item request" id="request-{_e(item.event_id)}"><b>request {item.step}</b> {"".join(tags)} '
        f'<span class="label">tokens in {item.input_tokens}, out {item.output_tokens}</span>'
    ]
    g = item.given
    if g is None:
        out.append('<div class="label">given: not rebuilt (the replay failed)</div>')
    else:
        out.append(
            f'<div class="label">given ({_e(g.source)}): {g.messages} messages, {g.chars} chars; tools: '
            f"{_e(', '.join(g.tools_offered) or '-')}</div>"
        )
        if g.last_tool_results:
            rows = "".join(
                f"<li>{_e(r.tool)} {_e(r.call_id)} ({r.chars} chars): <code>{_e(r.excerpt[:200])}</code></li>"
                for r in g.last_tool_results
            )
            out.append(
                f'<details><summary class="label">last tool results it saw</summary><ul>{rows}</ul></details>'
            )
    for call in item.tool_calls:
        args = (
            call.args if isinstance(call.args, str) else json.dumps(call.args, indent=1, ensure_ascii=False)
        )
        if call.tool == EXECUTE_CODE_TOOL:
            out.append(
                f'<div>decided: <b>{EXECUTE_CODE_TOOL}</b> <span class="label">{_e(call.call_id)}</span></div>'
            )
        else:
            out.append(
                f'<details><summary>decided: <b>{_e(call.tool)}</b> <span class="label">{_e(call.call_id)}'
                f"</span></summary>{_pre(args, 'args')}</details>"
            )
    if item.text.strip():
        out.append(f"<div>text: {_e(item.text[:2000])}</div>")
    if item.failed:
        out.append(f'<div class="label">failure: {_e(item.failed)}</div>')
    out.append("</div>")
    return "".join(out)


def _cell(item: CellItem) -> str:
    tags = [_tag(f"{item.duration_ms:.0f} ms")]
    if item.origin != "model":
        tags.append(_tag(item.origin))
    tags.append(_tag("ok", "ok") if item.ok else _tag("failed", "bad"))
    if item.attempts > 1:
        tags.append(_tag(f"{item.attempts} attempts", "warn"))
    if item.host_restarted:
        tags.append(_tag(f"rebuilt after a crash ({item.cells_replayed} cells replayed)", "warn"))
    if item.truncated:
        tags.append(_tag("output truncated", "warn"))
    if item.submitted:
        tags.append(_tag("final answer submitted", "ok"))
    if item.reused:
        tags.append(_tag("reused from the origin"))
    body = [
        f'<div class="label">code</div>{_pre(item.code or "(code not in the history)", "code")}',
        f'<div class="label">output</div>{_pre(item.output or "(no output)", "output")}',
    ]
    if item.error:
        body.append(f'<div class="label">error</div>{_pre(item.error, "error")}')
    first = next((line for line in item.code.splitlines() if line.strip()), "")
    more = "&hellip;" if len(first) > 90 or "\n" in item.code.strip() else ""
    peek = f' <code class="peek">{_e(first[:90])}{more}</code>'
    return (
        f'<details class="item cell" id="{_e(item.anchor)}"><summary>[cell {item.seq}] {"".join(tags)}{peek}</summary>'
        f"{''.join(body)}</details>"
    )


def _child(item: ChildItem) -> str:
    head = (
        f'<div class="item child"><b>child</b> {_e(item.workflow_id)} {_tag(item.status)}'
        f'{_tag("stop " + (item.stop_reason or "-"))} <span class="label">requests {item.requests}, tokens '
        f'{item.tokens}</span><div class="label">prompt</div>{_pre(item.prompt, "prompt")}'
    )
    if item.context_code:
        head += f'<div class="label">context_code</div>{_pre(item.context_code, "code")}'
    inner = (
        f'<details class="nested" open><summary>its session</summary>{_session(item.session)}</details>'
        if item.session is not None
        else '<div class="label">(reused from the rerun\'s origin)</div>'
        if item.reused
        else '<div class="label">(its history is not in this audit)</div>'
    )
    return head + inner + "</div>"


def _item(item: Item) -> str:
    if isinstance(item, ModelRequestItem):
        return _request(item)
    if isinstance(item, CellItem):
        return _cell(item)
    if isinstance(item, ChildItem):
        return _child(item)
    if isinstance(item, CompactionItem):
        return (
            f'<details class="item compaction"><summary><b>compaction</b> {_tag(item.model or "?")}'
            f"{_tag('reused from the origin') if item.reused else ''} "
            f'<span class="label">tokens in {item.input_tokens}, out {item.output_tokens}</span></summary>'
            f'{_pre(item.summary, "summary")}<div class="label">archive {_e(item.archive_ref)}</div></details>'
        )
    if isinstance(item, IncidentItem):
        gap = f", {item.gap_s:.1f} s without progress" if item.gap_s is not None else ""
        return f'<div class="item incident">&#9888; <b>{_e(item.what)}</b>: {_e(item.detail)}{_e(gap)}</div>'
    if isinstance(item, RunItem):
        return f'<div class="item run">run {item.index} &middot; {_e(item.run_id)} {_e(item.reason)}</div>'
    return ""


def _citations(learning: LearningAudit) -> str:
    if learning.uncited:
        return _tag("uncited: the evidence names no cell", "warn")
    links = []
    for c in learning.citations:
        why = (
            ""
            if c.supported
            else (" (unsupported: no such cell)" if not c.exists else " (unsupported: quote not printed)")
        )
        quote = f" &ldquo;{_e(c.quote[:120])}&rdquo;" if c.quote else ""
        cls = "cite" + ("" if c.supported else " unsupported")
        if c.exists and c.anchor:
            links.append(f'<a class="{cls}" href="#{_e(c.anchor)}">cell {c.cell}{quote}{_e(why)}</a>')
        else:
            links.append(f'<span class="{cls}">cell {c.cell}{quote}{_e(why)}</span>')
    return "".join(links)


def _reflection(s: Session) -> str:
    r = s.reflection
    out = [
        f'<div class="reflection"><div>status {_tag(r.status)}'
        + (_tag("stop " + r.stop_reason) if r.stop_reason else "")
        + "</div>"
    ]
    if r.failure:
        out.append(f'<div class="label">failure</div>{_pre(r.failure, "error")}')
    for key in ("error_identification", "root_cause_analysis", "correct_approach", "key_insight"):
        text = getattr(r, key)
        if text:
            out.append(f'<div class="label">{_e(key.replace("_", " "))}</div><div>{_e(text)}</div>')
    for learning in r.learnings:
        out.append(
            f'<div class="learning" id="learning-{_e(s.workflow_id)}-{learning.index + 1}">'
            f"<b>learning {learning.index + 1}</b>: {_e(learning.learning)}"
            f'<div class="label">evidence: {_e(learning.evidence)}</div>'
            f"<div>cites: {_citations(learning)}</div></div>"
        )
    out.append("</div>")
    return "".join(out)


def _session(s: Session) -> str:
    head = (
        f'<div class="session" id="session-{_e(s.workflow_id)}"><div class="label">session {_e(s.workflow_id)} '
        f"&middot; depth {s.depth} &middot; {len(s.run_ids)} run(s) &middot; {s.events} events</div>"
    )
    if s.replay_failure:
        head += f'<div class="item incident">replay failed, model inputs not rebuilt: {_e(s.replay_failure)}</div>'
    items = "".join(_item(i) for i in s.items)
    return head + items + f"<h3>reflection of {_e(s.workflow_id)}</h3>" + _reflection(s) + "</div>"


def _budget_svg(points: list[BudgetPoint], max_requests: int) -> str:
    if not points:
        return '<div class="label">no model request was charged</div>'
    w, h, pad = 760, 170, 36
    n = len(points)
    top_t = max(p.tokens for p in points) or 1
    top_r = max(max(p.requests for p in points), max_requests) or 1

    def x(i: int) -> float:
        return pad + (w - 2 * pad) * (i / max(1, n - 1))

    tokens = " ".join(
        f"{x(i):.1f},{h - pad - (h - 2 * pad) * p.tokens / top_t:.1f}" for i, p in enumerate(points)
    )
    reqs = " ".join(
        f"{x(i):.1f},{h - pad - (h - 2 * pad) * p.requests / top_r:.1f}" for i, p in enumerate(points)
    )
    dots = "".join(
        f'<circle cx="{x(i):.1f}" cy="{h - pad - (h - 2 * pad) * p.tokens / top_t:.1f}" r="2.5" '
        f'fill="#2f5fb3"><title>{_e(p.label)}: {p.requests} requests, {p.tokens} tokens</title></circle>'
        for i, p in enumerate(points)
    )
    return (
        f'<svg class="budget" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="budget over time">'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#aab"/>'
        f'<polyline points="{tokens}" fill="none" stroke="#2f5fb3" stroke-width="2"/>'
        f'<polyline points="{reqs}" fill="none" stroke="#9a6700" stroke-width="1.5" stroke-dasharray="4 3"/>{dots}'
        f'<text x="{pad}" y="16" font-size="11" fill="#2f5fb3">tokens (max {top_t})</text>'
        f'<text x="{pad + 170}" y="16" font-size="11" fill="#9a6700">requests (scale {top_r})</text>'
        f'<text x="{pad}" y="{h - 10}" font-size="11" fill="#5d6876">{_e(points[0].label)}</text>'
        f'<text x="{w - pad}" y="{h - 10}" font-size="11" fill="#5d6876" text-anchor="end">'
        f"{_e(points[-1].label)}: {points[-1].requests} requests, {points[-1].tokens} tokens</text></svg>"
    )


def _header(a: Audit) -> str:
    t = a.trace
    rows = [
        ("model", a.model or "?"),
        ("trace", f"{t.get('format', '?')}, {t.get('size', '?')} bytes, sha256 {t.get('sha256', '?')}"),
        ("status", a.status),
        ("stop reason", a.stop_reason or "-"),
        ("requests / tokens", f"{a.requests} / {a.tokens}"),
        ("cells / children / compactions", f"{a.cells} / {a.children} / {a.compactions}"),
        (
            "incidents survived",
            f"{a.incidents} (retries, timeouts, worker changes); {a.cells_rebuilt} cell(s) "
            "rebuilt on a new sandbox host",
        ),
        ("source", a.source),
    ]
    if a.rerun:
        origin = a.rerun.get("origin") or a.rerun.get("workflow_id") or json.dumps(a.rerun)
        step = f" from step {a.rerun['from_step']}" if "from_step" in a.rerun else ""
        rows.append(("rerun of", f"{origin}{step}"))
    if not a.inputs_rebuilt:
        rows.append(("note", "some model inputs could not be rebuilt by replay"))
    body = "".join(f"<tr><td class='label'>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<header><h1>Audit of {_e(a.root_id)}</h1><table class="totals">{body}</table></header>'


def render_html(audit: Audit) -> str:
    body = (
        _header(audit)
        + "<h2>Budget over time</h2>"
        + _budget_svg(audit.session.budget, 0)
        + "<h2>Timeline</h2>"
        + _session(audit.session)
    )
    nonce = hashlib.sha256(body.encode()).hexdigest()[:32]
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; img-src data:"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>rr audit {_e(audit.root_id)}</title><style>{CSS}</style></head><body>"
        f'{body}<script nonce="{nonce}">{JS}</script></body></html>\n'
    )
