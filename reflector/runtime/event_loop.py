"""The event loop of `rr worker`: uvloop where it is installed, else asyncio's.

A worker's event loop carries every activation, activity, provider request and sandbox cell of the
reflections it holds; with hundreds in flight on a slow model its turns lag by seconds, and that lag is what
delays their next workflow tasks. There uvloop (libuv) did more steps per second for a little less CPU than
asyncio's pure-Python loop; with few reflections it changes nothing measurable (BENCHMARKS.md, "The worker's
event loop").

`RR_EVENT_LOOP` (`Settings.event_loop`): `auto` (the default: uvloop when importable, else asyncio),
`uvloop` (refused with a clear error when it is not installed), `asyncio`. Only `rr worker` and the children
of `rr worker --processes N` choose it. The CLI's other commands keep asyncio's loop, and the Python API runs
on the caller's loop (`areflect`) or on asyncio's (`reflect()`, in the caller's process).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["EVENT_LOOP_ENV", "EventLoopSetting", "uvloop_installed", "run", "running"]

EVENT_LOOP_ENV = "RR_EVENT_LOOP"
EventLoopSetting = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def run(main: Coroutine[Any, Any, T], setting: EventLoopSetting = "auto") -> T:
    """`asyncio.run(main)` on the loop `setting` names (`auto`: uvloop when installed): the same runner and
    the same Ctrl-C handling either way (`asyncio.Runner`, with uvloop's loop factory)."""
    import asyncio

    if setting == "asyncio" or (setting == "auto" and not uvloop_installed()):
        return asyncio.run(main)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def running() -> str:
    """`uvloop` or `asyncio`: the loop this coroutine runs on (what `rr worker` prints at start)."""
    import asyncio

    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
