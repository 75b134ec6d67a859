"""Live progress on stderr while `rr reflect` or `rr status --follow` waits (formatting and pacing only).

On a terminal: a `rich` live view (elapsed time ticking, phase, budget bars, cells, children), redrawn
in place and removed at the end. Elsewhere (a pipe, a log file, CI): plain lines, one per change of what
they say, at most one every `min_interval_s`. Either way `finish` prints one summary line, also when the
run was too fast for any progress poll to see it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from reflector.client.render import cells_text, clock, used
from reflector.contract import BatchProgress, Progress

__all__ = ["ProgressDisplay", "reflection_view", "batch_view", "summary_line", "stop_all", "MIN_INTERVAL_S"]

MIN_INTERVAL_S = 2.0  # plain lines: at most one per this many seconds (a change seen meanwhile waits)
REFRESH_PER_SECOND = 4  # the live view's redraws (the elapsed time ticks between polls)


def _cells(p: Progress) -> Text:
    return Text(cells_text(p.cells, p.failed_cells, p.last_cell).removeprefix("cells "))


def _grid() -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    return t


def _row(t: Table, label: str, value: RenderableType | str) -> None:
    """A row whose text is shown as is (ids and "[cell N]" are not rich markup)."""
    t.add_row(Text(label), Text(value) if isinstance(value, str) else value)


def _budget(n: int, limit: int, *, spent: bool = True) -> RenderableType:
    """`n` of `limit` as a bar and numbers; a budget being `spent` turns yellow, then red, as it runs out."""
    if not limit:
        return Text(f"{n:,}")
    grid = Table.grid(padding=(0, 1))
    share = n / limit
    style = ("green" if share < 0.7 else "yellow" if share < 0.9 else "red") if spent else "cyan"
    bar = ProgressBar(
        total=limit,
        completed=min(n, limit),
        width=24,
        complete_style=style,
        finished_style="red" if spent else "green",
    )
    grid.add_row(bar, Text(used(n, limit)))
    return grid


def _children_text(p: Progress) -> str:
    if not p.children_started:
        return "none" if p.depth < p.max_depth else "none (at max depth)"
    running = f", 1 running ({p.child_running})" if p.child_running else ""
    return f"{p.children_done} done{running}"


def reflection_view(
    p: Progress, elapsed_s: float, running: Sequence[Progress] = (), title: str = ""
) -> RenderableType:
    """The live view of a reflection: its own numbers, the tree's budget, and each running child below."""
    requests = p.requests + sum(c.requests for c in running)
    tokens = p.total_tokens + sum(c.total_tokens for c in running)
    scope = " (tree)" if running else ""
    t = _grid()
    _row(t, "elapsed", clock(elapsed_s))
    _row(t, "phase", p.phase)
    _row(t, f"requests{scope}", _budget(requests, p.max_requests))
    _row(t, f"tokens{scope}", _budget(tokens, p.max_tokens))
    _row(t, "cells", _cells(p))
    _row(t, "children", _children_text(p))
    _row(t, "depth", f"{p.depth} (max {p.max_depth})")
    _row(
        t,
        "compactions",
        str(p.compactions) + (f" (+{p.microcompactions} micro)" if p.microcompactions else ""),
    )
    _row(t, "last tool", p.last_tool or "-")
    if p.continued_as_new:
        _row(t, "runs", f"continued as new {p.continued_as_new}x")
    parts: list[RenderableType] = [t]
    for child in running:
        c = _grid()
        _row(c, "phase", child.phase)
        _row(c, "requests", _budget(child.requests, child.max_requests))
        _row(c, "cells", _cells(child))
        _row(c, "last tool", child.last_tool or "-")
        parts.append(Panel(c, title=Text(f"child at depth {child.depth}"), title_align="left"))
    return Panel(Group(*parts), title=Text(title or "reflection"), title_align="left")


def batch_view(p: BatchProgress, elapsed_s: float, title: str = "") -> RenderableType:
    pending = max(0, p.total - p.done - p.failed - p.running)
    t = _grid()
    _row(t, "elapsed", clock(elapsed_s))
    _row(t, "phase", p.phase)
    _row(t, "runs", _budget(p.done + p.failed, p.total, spent=False))
    _row(t, "reflected", str(p.done))
    _row(t, "running", str(p.running))
    _row(t, "failed", str(p.failed))
    _row(t, "pending", str(pending))
    if p.continued_as_new:
        _row(t, "runs of the chain", f"continued as new {p.continued_as_new}x")
    if p.last_event:
        _row(t, "last", p.last_event)
    return Panel(t, title=Text(title or "batch"), title_align="left")


def summary_line(noun: str, wf_id: str, outcome: str, elapsed_s: float, p: Progress | BatchProgress) -> str:
    """The line printed when a reflection or batch ends (its final numbers, from its result)."""
    head = f"rr: {noun} {wf_id} {outcome} after {clock(elapsed_s)}"
    if isinstance(p, BatchProgress):
        return f"{head}: {p.done}/{p.total} reflected, {p.failed} failed"
    parts = [
        f"requests {used(p.requests, p.max_requests)}",
        f"tokens {used(p.total_tokens, p.max_tokens)}",
        cells_text(p.cells, p.failed_cells, p.last_cell),
        f"children {p.children_done}",
        f"compactions {p.compactions}",
    ]
    return f"{head}: " + " · ".join(parts)


_live_displays: set[ProgressDisplay] = set()


def stop_all() -> None:
    """End every live view of this process (before an error or interruption message is printed under it)."""
    for display in list(_live_displays):
        display.stop()


class _LiveView:
    """What the live display redraws: the latest progress with the elapsed time as of the redraw."""

    def __init__(self, display: ProgressDisplay) -> None:
        self.display = display

    def __rich__(self) -> RenderableType:
        d = self.display
        if isinstance(d.latest, BatchProgress):
            return batch_view(d.latest, d.elapsed, d.title)
        if isinstance(d.latest, Progress):
            return reflection_view(d.latest, d.elapsed, d.running, d.title)
        return Text(f"{d.title}: starting ({clock(d.elapsed)})")


class ProgressDisplay:
    """Progress on `stream` (default stderr): a live view when it is a terminal, else plain lines.

    `plain(progress, elapsed_s)` (batch) or `plain(progress, elapsed_s, running)` (a reflection and its
    running children) renders one plain line: `reflector.client.render.render_progress`,
    `reflector.client.batch_render.render_batch_progress`.
    """

    def __init__(
        self,
        plain: Callable[..., str],
        *,
        title: str = "",
        stream: TextIO | None = None,
        tty: bool | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plain, self.title = plain, title
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.min_interval_s = min_interval_s
        self._now = clock_s
        self.started = clock_s()
        self.latest: Progress | BatchProgress | None = None
        self.running: Sequence[Progress] = ()
        self._live: Live | None = None
        self._console: Console | None = None
        self._last_said = ""  # the last plain line printed, without its elapsed time
        self._last_at: float | None = None
        self._pending: tuple[str, str] | None = None  # a change held back by the rate limit: (said, line)

    @property
    def elapsed(self) -> float:
        return max(0.0, self._now() - self.started)

    def start_clock(self, elapsed_s: float = 0.0) -> None:
        """Count the elapsed time from `elapsed_s` seconds ago (e.g. the workflow's start)."""
        self.started = self._now() - elapsed_s

    def console(self) -> Console:
        if self._console is None:
            self._console = Console(file=self.stream, force_terminal=self.tty or None, highlight=False)
        return self._console

    def update(self, p: Progress | BatchProgress, running: Sequence[Progress] = ()) -> None:
        self.latest, self.running = p, tuple(running)
        if self.tty:
            if self._live is None:
                self._live = Live(
                    _LiveView(self),
                    console=self.console(),
                    refresh_per_second=REFRESH_PER_SECOND,
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self._live.start()
                _live_displays.add(self)
            else:
                self._live.refresh()
            return
        args: tuple[Any, ...] = (running,) if isinstance(p, Progress) else ()
        said = self.plain(p, None, *args)
        # the latest change wins; back at what was printed last, there is nothing new to say
        self._pending = None if said == self._last_said else (said, self.plain(p, self.elapsed, *args))
        self.flush_pending()

    def flush_pending(self) -> None:
        """Print the change held back by the rate limit once the interval has passed."""
        now = self._now()
        if self._pending is None or (self._last_at is not None and now - self._last_at < self.min_interval_s):
            return
        (self._last_said, line), self._pending, self._last_at = self._pending, None, now
        print(line, file=self.stream, flush=True)

    def note(self, line: str) -> None:
        """A message (e.g. the no-worker notice) shown above the live view, or as a line of its own."""
        if self._live is not None:
            self._live.console.print(Text(line))
        else:
            print(line, file=self.stream, flush=True)

    def stop(self) -> None:
        """End the live view (idempotent); plain lines need no ending."""
        live, self._live = self._live, None
        _live_displays.discard(self)
        if live is not None:
            live.stop()

    def finish(self, summary: str) -> None:
        self.stop()
        print(summary, file=self.stream, flush=True)
