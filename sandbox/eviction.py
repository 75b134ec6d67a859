"""Which idle sandbox hosts to stop when a worker holds more than its cap (`SessionManager`'s `max_live`).

A stopped host costs its session a rebuild at its next cell (a fresh host, then the journal replayed or a
snapshot restored): the host to stop is the one whose next cell is furthest away (Belady's rule).
Least-recently-used is the opposite here. Reflections run a cell, wait for a model reply, run the next: each
session comes back after about one model latency, so the host idle the longest is the one whose reply is due
first. With more sessions than the cap, LRU stopped every host just before its next cell (300 sessions on a
256 cap: 70 % of the cells rebuilt a host, `bench/sandbox_hosts.py`); stopping the next-furthest rebuilds
about the sessions above the cap (14 %).

So each live host keeps when it went idle and an estimate of its session's pause between cells (a moving
average of the pauses seen; the median of the other sessions' estimates until it has one). A host idle for
much longer than its session's pause is waiting for something else (a child reflection, a run that ended
without closing its session): those go first, longest idle first. Then the rest, furthest predicted next
cell first.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "IdleHost",
    "OVERDUE_FACTOR",
    "OVERDUE_SLACK_S",
    "Parking",
    "Rhythm",
    "Sized",
    "eviction_order",
    "next_pause",
    "over_cap",
]

# A host is overdue (its session waits for something other than a model reply) once idle for more than
# OVERDUE_FACTOR x its session's usual pause + OVERDUE_SLACK_S.
OVERDUE_FACTOR = 2.0
OVERDUE_SLACK_S = 1.0
_WEIGHT = 0.5  # of the newest pause in the moving average


class Sized(Protocol):
    """A live host's memory in bytes, as the cap counts it (`sandbox.recovery._Live` measures it)."""

    memory: int


class Rhythm(Protocol):
    """A live host as the policy sees it: since when it is idle (monotonic seconds) and its session's usual
    pause between cells (None: not seen yet). `sandbox.recovery._Live` is one."""

    idle_since: float
    pause_s: float | None


@dataclass
class IdleHost:
    idle_since: float
    pause_s: float | None = None


def next_pause(estimate: float | None, observed_s: float) -> float:
    """The session's pause estimate after one more observed pause (an exponential moving average)."""
    observed_s = max(0.0, observed_s)
    return observed_s if estimate is None else (1 - _WEIGHT) * estimate + _WEIGHT * observed_s


def eviction_order(hosts: Mapping[str, Rhythm], now: float) -> list[str]:
    """Session ids, the first to stop first: overdue hosts (longest idle first), then the others by how far
    off their next cell is predicted to be (furthest first). Without any pause estimate this is LRU."""
    known = [h.pause_s for h in hosts.values() if h.pause_s is not None]
    typical = statistics.median(known) if known else None

    def key(session_id: str) -> tuple[int, float]:
        h = hosts[session_id]
        idle = now - h.idle_since
        pause = h.pause_s if h.pause_s is not None else typical
        if pause is None or idle > OVERDUE_FACTOR * pause + OVERDUE_SLACK_S:
            return (0, -idle)
        return (1, -(pause - idle))

    return sorted(hosts, key=key)


class Parking:
    """Evicted sessions' rhythm (idle since, pause estimate), given back to the host rebuilt for the session:
    the pause that ends at its next cell is then measured from when it really went idle. Bounded (the oldest
    entries go: sessions that never came back)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._parked: OrderedDict[str, tuple[float, float | None]] = OrderedDict()

    def park(self, session_id: str, host: Rhythm) -> None:
        self._parked[session_id] = (host.idle_since, host.pause_s)
        while len(self._parked) > self.limit:
            self._parked.popitem(last=False)

    def resume(self, session_id: str, host: Rhythm, now: float | None = None) -> bool:
        """Give a host rebuilt for a cell its session's parked rhythm, if there is one (True): the pause ending
        `now` (default: the monotonic clock) is the one since the session's last cell."""
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            idle_since, pause_s = parked
            host.pause_s = next_pause(pause_s, (time.monotonic() if now is None else now) - idle_since)
        return parked is not None

    def forget(self, session_id: str) -> None:
        self._parked.pop(session_id, None)


def over_cap(hosts: Mapping[str, Sized], max_live: int, max_memory: int | None) -> bool:
    """More live hosts than `max_live`, or (with `max_memory`) more of their memory (`.memory`, bytes)."""
    if len(hosts) > max_live:
        return True
    return max_memory is not None and sum(h.memory for h in hosts.values()) > max_memory
