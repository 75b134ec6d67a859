"""Which sandbox hosts a worker stops above its cap (`sandbox.eviction`): the one whose next cell is furthest
off, hosts whose session waits for something else first, LRU when nothing is known yet."""

from __future__ import annotations

from collections import OrderedDict

from sandbox.eviction import IdleHost, Parking, eviction_order, next_pause, over_cap


def test_without_pause_estimates_the_longest_idle_goes_first() -> None:
    hosts = {"a": IdleHost(5.0), "b": IdleHost(1.0), "c": IdleHost(3.0)}
    assert eviction_order(hosts, now=6.0) == ["b", "c", "a"]


def test_the_host_whose_next_cell_is_furthest_goes_first() -> None:
    # all pause ~3 s between cells: "a" just finished a cell, "c" is about to run its next one
    hosts = {"c": IdleHost(7.2, 3.0), "a": IdleHost(9.9, 3.0), "b": IdleHost(8.5, 3.0)}
    assert eviction_order(hosts, now=10.0) == ["a", "b", "c"]


def test_a_host_idle_far_past_its_sessions_pause_goes_before_all_others() -> None:
    # "w" pauses ~3 s but has been idle 60 s (waiting for a child reflection, or its run is gone)
    hosts = {"w": IdleHost(40.0, 3.0), "x": IdleHost(99.0, 3.0), "y": IdleHost(98.0, 30.0)}
    assert eviction_order(hosts, now=100.0)[0] == "w"
    # a session with no estimate yet is judged by the others' median
    hosts = {"new": IdleHost(99.9), "old": IdleHost(98.0, 3.0), "stuck": IdleHost(10.0)}
    assert eviction_order(hosts, now=100.0) == ["stuck", "new", "old"]


def test_the_pause_estimate_follows_the_session() -> None:
    est = None
    for observed in (3.0, 3.2, 2.8, 3.1):
        est = next_pause(est, observed)
    assert est is not None and 2.8 <= est <= 3.2
    assert next_pause(3.0, -1.0) < 3.0  # a clock step never yields a negative pause


def _misses(sessions: int, cap: int, rounds: int, *, informed: bool) -> int:
    """A worker's hosts under reflections that each run a cell every `sessions` ticks (one model latency),
    round-robin; the cap is below the sessions. Returns the cells that found their host stopped."""
    live: OrderedDict[str, tuple[float, float | None]] = OrderedDict()  # id -> (idle since, pause)
    last_end: dict[str, float] = {}
    misses, now = 0, 0.0
    for _ in range(rounds):
        for i in range(sessions):
            sid = f"s{i}"
            now += 1.0
            if sid not in live:
                misses += 1
                pause = float(sessions) if informed and sid in last_end else None
                live[sid] = (now, pause)
                idle = {k: IdleHost(*v) for k, v in live.items() if k != sid}
                for victim in eviction_order(idle, now)[: max(0, len(live) - cap)]:
                    del live[victim]
            else:
                live[sid] = (now, float(sessions) if informed else None)
            last_end[sid] = now
    return misses


def test_a_round_robin_above_the_cap_rebuilds_only_the_excess_not_every_cell() -> None:
    sessions, cap, rounds = 300, 256, 10
    informed = _misses(sessions, cap, rounds, informed=True)
    lru = _misses(sessions, cap, rounds, informed=False)
    assert lru == sessions * rounds  # LRU: every cell's host had just been stopped
    # the first round starts every host; then about (sessions - cap) per round
    assert informed <= sessions + (rounds - 1) * (sessions - cap + 1), informed


def test_an_evicted_sessions_rhythm_comes_back_with_its_rebuilt_host_and_parking_is_bounded() -> None:
    parking = Parking(limit=2)
    parking.park("a", IdleHost(10.0, 3.0))
    rebuilt = IdleHost(50.0)
    assert parking.resume("a", rebuilt, now=15.0) and rebuilt.pause_s == next_pause(3.0, 5.0)
    assert not parking.resume("a", IdleHost(60.0))  # given back once
    for sid in ("b", "c", "d"):
        parking.park(sid, IdleHost(1.0, 1.0))
    assert not parking.resume("b", IdleHost(0.0))  # the oldest went when the limit was passed
    parking.forget("c")
    assert not parking.resume("c", IdleHost(0.0)) and parking.resume("d", IdleHost(0.0))


def test_over_the_cap_by_count_or_by_memory() -> None:
    class Host:
        def __init__(self, memory: int) -> None:
            self.memory = memory

    hosts = {f"s{i}": Host(10) for i in range(3)}
    assert not over_cap(hosts, 3, None) and over_cap(hosts, 2, None)
    assert not over_cap(hosts, 3, 30) and over_cap(hosts, 3, 29)  # the sum of their memory
    assert not over_cap({}, 0, 0)
