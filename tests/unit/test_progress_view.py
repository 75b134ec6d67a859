"""The progress renderers: the rich live view (rendered to a string), the plain lines and their pacing."""

from __future__ import annotations

import io

from rich.console import Console

from reflector.client.batch_render import render_batch_progress
from reflector.client.progress_view import (
    ProgressDisplay,
    batch_view,
    reflection_view,
    stop_all,
    summary_line,
)
from reflector.client.render import clock, render_progress
from reflector.contract import BatchProgress, ChildProgress, Progress

ROOT = Progress(
    phase="waiting for child",
    iterations=3,
    cells=2,
    failed_cells=1,
    requests=3,
    total_tokens=1_234,
    model="scripted-plan",
    depth=0,
    max_depth=2,
    max_requests=50,
    max_tokens=500_000,
    last_cell=4,
    last_tool="recurse",
    compactions=1,
    children_started=2,
    children_done=1,
    child_running="rr-x.r2",
    children=[
        ChildProgress(
            workflow_id="rr-x.r1", done=True, requests=2, total_tokens=300, stop_reason="completed"
        ),
        ChildProgress(workflow_id="rr-x.r2"),
    ],
)
CHILD = Progress(
    phase="waiting for the model",
    iterations=1,
    cells=1,
    requests=2,
    total_tokens=766,
    depth=1,
    max_depth=2,
    max_requests=23,
    max_tokens=249_000,
    last_cell=2,
    last_tool="execute_code",
)


def _text(renderable: object, width: int = 120) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=width, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_rich_view_shows_phase_budget_cells_children_and_the_running_child() -> None:
    text = _text(reflection_view(ROOT, 75.0, [CHILD], title="reflection rr-x"))
    assert "reflection rr-x" in text
    assert "1:15" in text  # elapsed
    assert "waiting for child" in text
    # the tree's total: the root's ledger plus its running child's
    assert "requests (tree)" in text and "5/50" in text
    assert "tokens (tree)" in text and "2,000/500,000" in text
    assert "2 by the model (1 failed), latest [cell 4]" in text
    assert "1 done, 1 running (rr-x.r2)" in text
    assert "0 (max 2)" in text and "last tool" in text and "recurse" in text
    # the running child, with its own numbers and allocation
    assert "child at depth 1" in text and "waiting for the model" in text
    assert "2/23" in text and "1 by the model (0 failed), latest [cell 2]" in text and "execute_code" in text


def test_the_rich_view_of_a_session_without_children_or_known_limits() -> None:
    old_worker = Progress(
        phase="thinking", cells=1, requests=4, total_tokens=99
    )  # no max_*: a worker before them
    text = _text(reflection_view(old_worker, 3.25))
    assert "3.2s" in text and "thinking" in text and "none" in text
    assert "4" in text and "/" not in text.split("tokens")[1].splitlines()[0]


def test_the_batch_view() -> None:
    p = BatchProgress(
        phase="reflecting", total=10, done=4, running=2, failed=1, last_event="run 3 (a) reflected"
    )
    text = _text(batch_view(p, 12.0, title="batch b1"))
    assert "batch b1" in text and "reflecting" in text and "5/10" in text
    assert "pending" in text and "3" in text and "run 3 (a) reflected" in text


def test_plain_lines_name_the_latest_cell_id_apart_from_the_count() -> None:
    line = render_progress(ROOT, 4.0, [CHILD])
    assert line.startswith("  … [4.0s] waiting for child · ")
    assert "requests 5/50 (tree)" in line and "tokens 2,000/500,000 (tree)" in line
    assert "cells 2 by the model (1 failed), latest [cell 4]" in line
    assert "children 1 done, 1 running: rr-x.r2 (depth 1, waiting for the model" in line
    assert "compactions 1" in line and "last tool recurse" in line
    alone = render_progress(Progress(phase="thinking", cells=1, last_cell=3, requests=2, max_requests=50))
    assert (
        alone == "  … thinking · requests 2/50 · tokens 0 · cells 1 by the model (0 failed), latest [cell 3]"
    )
    assert render_batch_progress(BatchProgress(phase="reflecting", total=3, done=1), 61.0).startswith(
        "  … [1:01] reflecting: 1/3 done"
    )


def test_clock() -> None:
    assert [clock(s) for s in (0, 9.94, 59.9, 60, 3599, 3600, 3725)] == [
        "0.0s",
        "9.9s",
        "59.9s",
        "1:00",
        "59:59",
        "1:00:00",
        "1:02:05",
    ]


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_one_per_change_rate_limited_then_a_summary() -> None:
    out, now = io.StringIO(), FakeClock()
    d = ProgressDisplay(render_progress, stream=out, tty=False, min_interval_s=2.0, clock_s=now)
    p = Progress(phase="thinking", requests=1, max_requests=50)
    d.update(p)  # the first state: shown at once
    now.t += 0.5
    d.update(p)  # unchanged: nothing
    now.t += 0.5
    d.update(p.model_copy(update={"requests": 2}))  # a change within the interval: held back
    assert out.getvalue().splitlines() == [
        "  … [0.0s] thinking · requests 1/50 · tokens 0 · cells 0 by the model (0 failed)"
    ]
    now.t += 0.5
    d.update(p.model_copy(update={"requests": 3}))  # a newer change replaces the held one
    now.t += 1.0
    d.update(p.model_copy(update={"requests": 3}))  # the interval has passed: the latest change is shown
    now.t += 3.0
    d.update(p.model_copy(update={"requests": 3}))  # no change: nothing more
    d.update(p.model_copy(update={"requests": 1}))  # back to what was shown before the last line: a change
    d.finish("rr: reflection x completed after 5.5s: requests 3/50")
    lines = out.getvalue().splitlines()
    assert lines[1] == "  … [2.5s] thinking · requests 3/50 · tokens 0 · cells 0 by the model (0 failed)"
    assert lines[2].startswith("  … [5.5s] thinking · requests 1/50")
    assert lines[3] == "rr: reflection x completed after 5.5s: requests 3/50"
    assert len(lines) == 4


def test_a_run_too_fast_for_any_poll_still_gets_its_summary_line() -> None:
    out = io.StringIO()
    d = ProgressDisplay(render_progress, stream=out, tty=False)
    final = Progress(
        phase="done",
        cells=2,
        requests=3,
        total_tokens=1_000,
        max_requests=50,
        max_tokens=9_000,
        children_done=1,
    )
    d.finish(summary_line("reflection", "rr-1", "completed", 0.42, final))
    assert out.getvalue() == (
        "rr: reflection rr-1 completed after 0.4s: requests 3/50 · tokens 1,000/9,000 · "
        "cells 2 by the model (0 failed) · children 1 · compactions 0\n"
    )
    b = summary_line("batch", "b", "INCOMPLETE", 3.0, BatchProgress(total=4, done=3, failed=1))
    assert b == "rr: batch b INCOMPLETE after 3.0s: 3/4 reflected, 1 failed"


def test_the_live_view_on_a_terminal_draws_notes_above_and_ends_with_the_summary() -> None:
    out, now = io.StringIO(), FakeClock()
    d = ProgressDisplay(render_progress, title="reflection rr-live", stream=out, tty=True, clock_s=now)
    d.update(ROOT, [CHILD])
    now.t += 2.0
    d.update(ROOT.model_copy(update={"cells": 3, "last_cell": 5}), [CHILD])
    d.note("rr: no worker is polling task queue 'q'")
    d.finish("rr: reflection rr-live completed after 2.0s")
    drawn = out.getvalue()
    assert "\x1b[" in drawn  # drawn in place with terminal control sequences, not plain lines
    assert "reflection rr-live" in drawn and "3 by the model (1 failed), latest [cell 5]" in drawn
    assert "rr: no worker is polling task queue 'q'" in drawn
    assert drawn.rstrip().endswith("rr: reflection rr-live completed after 2.0s")
    assert "  … " not in drawn  # no plain progress line on a terminal


def test_stop_all_ends_a_live_view_before_an_error_is_printed() -> None:
    out = io.StringIO()
    d = ProgressDisplay(render_progress, stream=out, tty=True)
    d.update(ROOT)
    assert d._live is not None
    stop_all()
    assert d._live is None
    d.stop()  # idempotent
