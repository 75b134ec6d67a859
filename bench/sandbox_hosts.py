"""Sandbox hosts under many sessions taking turns: the hosts' CPU per session, host starts and evictions.

Sessions go through `SessionManager` directly (no Temporal, no model): each runs the prefill cell, then
`--cells` trivial cells with `--pause` seconds between them (a model reply's wait), all at once, as a
worker holding that many reflections sees them. The hosts' CPU is the process tree's (the fork server and
every host it forked, reaped ones included) minus this process's own.

Rows: the cap (`max_live`) with rr's policy (`sandbox.eviction`: the host whose next cell is furthest off
goes first), the same cap with least-recently-used (the policy before it, patched in here for the
comparison), and no cap reached (every session keeps its host). Side by side in one run.

    python -m bench.sandbox_hosts [--sessions 300] [--cap 256] [--cells 10] [--pause 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.common import TRACE, table
from bench.throughput import own_cpu, tree_cpu
from reflector.contract import PREFILL_CODE
from sandbox import sessions as sessions_module
from sandbox.eviction import Rhythm, eviction_order
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager
from sandbox.zygote_client import close_zygotes


def _lru(hosts: Mapping[str, Rhythm], now: float) -> list[str]:
    return sorted(hosts, key=lambda sid: hosts[sid].idle_since)


async def _run(sessions: int, cap: int, cells: int, pause: float, policy: str) -> list[object]:
    home = Path(tempfile.mkdtemp(prefix="rr-bench-hosts-"))
    trace = home / "trace.json"
    trace.write_text(json.dumps(TRACE))
    kw: dict[str, Any] = {
        "trace_path": str(trace),
        "trace_format": "auto",
        "extra_vars": {"task": {}},
        "limits": SandboxLimits(),
    }
    sessions_module.eviction_order = _lru if policy == "lru" else eviction_order  # type: ignore[attr-defined]
    manager = SessionManager(home / "journal", max_live=cap)
    await manager.prewarm()
    await asyncio.sleep(0.5)
    me = os.getpid()
    tree0, own0, t0 = tree_cpu([me]), own_cpu([me]), time.perf_counter()

    async def reflection(i: int) -> None:
        sid = f"s{i}"
        await asyncio.sleep(pause * i / sessions)  # the replies reach the sessions spread over one pause
        assert (await manager.run_cell(sid, 1, PREFILL_CODE, **kw)).ok
        for k in range(cells):
            await asyncio.sleep(pause)
            assert (await manager.run_cell(sid, k + 2, f"v{k} = {k} * 2\nprint(v{k})", **kw)).ok
        await manager.close_session(sid, delete_journal=True)

    await asyncio.gather(*(reflection(i) for i in range(sessions)))
    wall = time.perf_counter() - t0
    await manager.close_all()
    await asyncio.sleep(0.5)  # the last hosts are reaped
    hosts = (tree_cpu([me]) - tree0) - (own_cpu([me]) - own0)
    await close_zygotes()
    sessions_module.eviction_order = eviction_order  # type: ignore[attr-defined]
    label = "no cap reached" if cap >= sessions else f"cap {cap}, {policy}"
    return [
        label,
        hosts / sessions * 1000,
        hosts / (sessions * (cells + 1)) * 1000,
        manager.stats.rebuilds,
        manager.stats.evictions,
        manager.stats.cells_replayed,
        wall,
    ]


async def main(sessions: int, cap: int, cells: int, pause: float) -> None:
    rows = [
        await _run(sessions, cap, cells, pause, "rr"),
        await _run(sessions, cap, cells, pause, "lru"),
        await _run(sessions, max(cap, sessions), cells, pause, "rr"),
    ]
    print(
        f"{sessions} sessions at once, prefill + {cells} cells each, {pause} s between cells, "
        f"cap {cap} live hosts"
    )
    print(
        table(
            [
                "hosts kept",
                "hosts CPU ms/session",
                "ms/cell",
                "host starts",
                "evictions",
                "cells replayed",
                "wall s",
            ],
            rows,
        )
    )
    print(
        f"command: python -m bench.sandbox_hosts --sessions {sessions} --cap {cap} --cells {cells} --pause {pause}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--cap", type=int, default=256)
    ap.add_argument("--cells", type=int, default=10)
    ap.add_argument("--pause", type=float, default=3.0)
    a = ap.parse_args()
    asyncio.run(main(a.sessions, a.cap, a.cells, a.pause))
