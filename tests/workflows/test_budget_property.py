"""Conservation of the budget over random recursion trees (hypothesis), checked two ways:
from the root's ledger and from the real histories of every workflow in the tree.

Invariant: over all sessions of a tree, requests <= the root's max_requests, and tokens <= the root's
max_tokens plus the overshoot of one request (the single in-flight request that crossed the limit:
a tree has one request in flight at a time, and limits are checked before each request).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from temporalio.api.history.v1 import HistoryEvent

from tests.support.fixtures import completed_activities
from tests.workflows.test_recursion import histories, run_plan

SUMMARISE = "rr.summarise"


def _tree(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    cells = st.lists(st.integers(0, 99).map(lambda i: f"v{i} = {i}\nprint(v{i})"), max_size=4)
    if depth == 0:
        return st.builds(lambda c: {"code": c, "children": [], "after": []}, cells)
    return st.builds(
        lambda c, kids, a: {"code": c, "children": kids, "after": a},
        cells,
        st.lists(_tree(depth - 1), max_size=2),
        st.lists(st.just("print('after')"), max_size=2),
    )


def _usage_from_history(events: list[HistoryEvent]) -> tuple[int, int, int]:
    """(requests, input tokens, output tokens) of the model requests and summaries recorded in a history."""
    requests = inp = out = 0
    for rec in completed_activities(events):
        if rec.name == SUMMARISE:
            data = rec.result_json()
            requests, inp, out = requests + 1, inp + data["input_tokens"], out + data["output_tokens"]
        elif rec.is_model_request:
            usage = rec.result_json()["usage"]
            requests, inp, out = requests + 1, inp + usage["input_tokens"], out + usage["output_tokens"]
    return requests, inp, out


# No shrinking: every example is a reflection tree on the real server, and a failure once spent five minutes
# of CI shrinking (on a cause unrelated to the tree's shape); the failing example is still printed.
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(root=_tree(2), max_requests=st.integers(2, 16), max_tokens=st.integers(1_500, 40_000))
async def test_tree_usage_never_exceeds_root_limits(
    client, task_queue, settings, tmp_path_factory, root, max_requests, max_tokens
) -> None:
    out, root_id = await run_plan(
        client,
        task_queue,
        settings,
        tmp_path_factory.mktemp("prop"),
        root,
        max_requests=max_requests,
        max_tokens=max_tokens,
    )
    usage, records = out.raw["usage"], out.raw["usage_records"]
    largest = max((r["input_tokens"] + r["output_tokens"] for r in records), default=0)
    assert usage["requests"] <= max_requests
    assert usage["total_tokens"] <= max_tokens + largest
    assert usage["requests"] == len(records)

    # the same totals from the recorded histories of every workflow in the tree
    tree = await histories(client, out, root_id)
    totals = [_usage_from_history(list(h.events)) for h in tree.values()]
    assert sum(t[0] for t in totals) == usage["requests"]
    assert sum(t[1] for t in totals) == usage["input_tokens"]
    assert sum(t[2] for t in totals) == usage["output_tokens"]
    # every session stayed within what it was allocated
    for call in out.raw["rr_trace"]["subagent_calls"]:
        assert call["usage"]["requests"] <= call["allocation"]["requests"]
