"""`rr list`'s visibility queries and table, and the search-attribute builders (no server)."""

from __future__ import annotations

from reflector.client import ops
from reflector.contract import SEARCH_ATTRIBUTES, TraceRef
from reflector.runtime import search_attributes as sa
from reflector.runtime.devserver import search_attribute_args


def test_queries_per_status_with_and_without_the_attributes() -> None:
    base = "WorkflowType IN ('ReflectionWorkflow', 'BatchReflectionWorkflow') AND ExecutionStatus != 'ContinuedAsNew'"
    assert ops._query(None, False, True) == base + " AND ParentWorkflowId IS NULL"
    assert ops._query(None, True, True) == base
    assert ops._query("running", False, False).endswith(
        "ParentWorkflowId IS NULL AND ExecutionStatus = 'Running'"
    )
    assert "ExecutionStatus IN ('Failed', 'TimedOut', 'Terminated', 'Canceled')" in ops._query(
        "failed", False, True
    )
    assert ops._query("completed", False, True).endswith(
        "ExecutionStatus = 'Completed' AND RrStopReason = 'completed'"
    )
    assert ops._query("incomplete", False, True).endswith(
        "ExecutionStatus = 'Completed' AND RrStopReason != 'completed'"
    )
    # without the attributes the query must not name them (the server refuses unknown attributes)
    for status in ops.STATUSES:
        assert "Rr" not in ops._query(status, False, False)


def test_rows_render_as_a_table_children_indented() -> None:
    root = ops.Row(
        id="rr-1",
        kind="reflection",
        status="completed",
        started="2026-01-02T03:04:05+00:00",
        closed="2026-01-02T03:05:35+00:00",
        duration_s=90.0,
        trace="t.json",
        format="ace",
        size=2048,
        model="heuristic",
        stop_reason="completed",
        requests=4,
        tokens=12_345,
        children=1,
    )
    child = ops.Row(
        id="rr-1.r1",
        kind="reflection",
        status="running",
        started="2026-01-02T03:04:30+00:00",
        closed=None,
        duration_s=3.25,
        parent="rr-1",
    )
    header, first, second = ops.render_rows([root, child]).splitlines()
    assert header.split() == [
        "ID",
        "STARTED",
        "DURATION",
        "STATUS",
        "STOP",
        "TRACE",
        "MODEL",
        "REQUESTS",
        "TOKENS",
        "CHILDREN",
        "QUEUE",
        "STORE",
    ]
    assert first.startswith("rr-1 ") and "2026-01-02 03:04:05" in first and "1m30s" in first
    assert "t.json (ace, 2.0 KB)" in first and "12,345" in first
    assert second.startswith("  rr-1.r1") and "3.2s" in second and second.split()[-3:] == ["-", "-", "-"]
    assert root.to_json()["tokens"] == 12_345


def test_attribute_builders() -> None:
    attrs = sa.start_attributes("m", trace_sha256="ab", parent="p")
    assert (
        attrs.get(sa.MODEL),
        attrs.get(sa.TRACE_SHA256),
        attrs.get(sa.PARENT),
        attrs.get(sa.BATCH_ID),
    ) == ("m", "ab", "p", None)
    updates = sa.end_updates("cancelled", requests=3, tokens=40, children=1)
    assert [(u.key.name, u.value) for u in updates] == [
        ("RrStopReason", "cancelled"),
        ("RrRequests", 3),
        ("RrTokens", 40),
        ("RrChildren", 1),
    ]
    shown = sa.memo(TraceRef(uri="blob:sha256:ab", sha256="ab", size=7, format="ace"), "t.json")
    assert sa.memo_of(shown) == {"trace": "t.json", "format": "ace", "size": 7}
    assert sa.memo_of({}) == {}
    args = search_attribute_args()
    assert len(args) == 2 * len(SEARCH_ATTRIBUTES) and "RrTokens=Int" in args
    assert "rr setup" in sa.register_hint("ns") and "--name RrModel --type Keyword" in sa.register_hint("ns")
