"""OTel / OpenInference spans: flat span JSONL or OTLP `resourceSpans` JSON (best effort)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from reflector.analysis.traces.agents import span_agent
from reflector.analysis.traces.view import (
    _args_str,
    _as_dict,
    _as_list,
    _first_text,
    _opt_str,
    _run_view,
    _step,
    _text,
)


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
    actor, addressee = span_agent(attrs)
    return _step(
        index, kind, content, calls, str(tool) if tool else None, err, actor=actor, addressee=addressee
    )
