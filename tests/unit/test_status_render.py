"""`rr status`'s text never calls a partial sum the tree's total."""

from __future__ import annotations

from reflector.client.status import WorkflowStatus, render_status
from reflector.contract import Progress


def _root(*children: WorkflowStatus) -> WorkflowStatus:
    return WorkflowStatus(
        workflow_id="rr-root",
        kind="reflection",
        status="running",
        progress=Progress(requests=2, max_requests=20),
        tree_requests=2 + sum(c.progress.requests for c in children if c.progress),
        running_children=list(children),
    )


def test_the_tree_total_counts_every_running_child() -> None:
    child = WorkflowStatus(
        workflow_id="rr-root.r1",
        kind="reflection",
        status="running",
        progress=Progress(requests=1, max_requests=10),
    )
    assert "requests: 3/20 (tree total)" in render_status(_root(child))


def test_a_child_that_did_not_answer_is_not_counted_as_if_it_had() -> None:
    silent = WorkflowStatus(
        workflow_id="rr-root.r1",
        kind="reflection",
        status="running",
        note="its progress query was not answered: RPCError: busy",
    )
    text = render_status(_root(silent))
    assert "(tree total)" not in text
    assert "requests: 2/20 (this session and its answered children: 1 running child did not answer)" in text
