"""Sandbox recovery: time to rebuild a session's state after its host is SIGKILLed.

A session records N cells that work on the trace (10 / 50 cells on a 10 MB trace, 50 cells on a
100 MB trace), then the host is killed and the next `run_cell` is timed (fresh host from the pool,
trace load, snapshot restore if any, journal replay, the probe cell). Repeated by killing again and
retrying the same seq, so every run rebuilds the same state. With and without snapshots
(`snapshot_every`, default 25); the probe output must equal the uncrashed one.

    python -m bench.sandbox_recovery [--reps 3] [--every 25] [--big-mb 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from bench.common import median, table
from sandbox.executor import SubprocessExecutor
from sandbox.isolation import IsolationMode
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager

LIMITS = SandboxLimits(cell_timeout_s=120.0)
TEMPLATES = [
    "lens_{i} = [len(s['content']) for s in traces['steps']]",
    "roles_{i} = collections.Counter(s['role'] for s in traces['steps'])",
    "hits_{i} = [s['index'] for s in traces['steps'] if 'step {i}' in s['content']][:20]",
    "total_{i} = sum(lens_{j}) + len(hits_{k})",
    "summary_{i} = {{'n': {i}, 'top': roles_{m}.most_common(2), 'total': total_{t3}}}",
]


def make_trace(path: Path, mb: int) -> None:
    """Canonical shape {question, steps: [{role, content}]}, about `mb` MB of JSON."""
    target, size, steps, i = mb * 1024 * 1024, 0, [], 0
    roles = ("user", "assistant", "tool")
    while size < target:
        content = (f"step {i} " + "lorem ipsum dolor sit amet " * 40)[:1000]
        steps.append({"role": roles[i % 3], "content": content})
        size += len(content) + 40
        i += 1
    path.write_text(json.dumps({"question": "What is 17 * 24?", "ground_truth": "408", "steps": steps}))


def cells(n: int) -> list[str]:
    out = []
    for i in range(n):
        t = i % len(TEMPLATES)
        base = i - t
        out.append(TEMPLATES[t].format(i=i, j=base, k=base + 2, m=base + 1, t3=base + 3))
    return out


def probe(n: int) -> str:
    last_summary = max(i for i in range(n) if i % len(TEMPLATES) == 4)
    return f"print(summary_{last_summary}, len(lens_0), roles_1.most_common(1))"


async def measure(
    journal: Path, trace: Path, n: int, every: int, reps: int, isolation: IsolationMode | None = None
) -> tuple[float, int, int]:
    sessions = SessionManager(journal, snapshot_every=every, isolation=isolation)
    await sessions.prewarm()
    kw = {"trace_path": str(trace), "trace_format": "auto", "extra_vars": {"task": {}}, "limits": LIMITS}
    sid = f"n{n}-e{every}"
    for seq, code in enumerate(cells(n), start=1):
        r = await sessions.run_cell(sid, seq, code, **kw)
        assert r.ok, r
    p = probe(n)
    expected = await sessions.run_cell(sid, n + 1, p, **kw)
    assert expected.ok, expected
    times, replayed, snap = [], 0, 0
    for _ in range(reps):
        await sessions.prewarm()  # the worker has been idle since the host died: the pool is full
        ex = sessions.executor_for(sid)
        assert isinstance(ex, SubprocessExecutor) and ex.pid is not None
        os.killpg(ex.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        r = await sessions.run_cell(sid, n + 1, p, **kw)  # retry of the probe's seq: same rebuild each time
        times.append(time.perf_counter() - t0)
        assert r.ok and r.stdout == expected.stdout, (r, expected)
        replayed, snap = int(r.meta["cells_replayed"]), int(r.meta.get("snapshot_seq", 0))
    await sessions.close_all()
    return median(times), replayed, snap


async def main(reps: int, every: int, big_mb: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="rr-bench-recovery-"))
    traces = {10: home / "trace-10mb.json", big_mb: home / f"trace-{big_mb}mb.json"}
    for mb, path in traces.items():
        make_trace(path, mb)
    cases = [(10, 10), (10, 50), (big_mb, 50)]
    rows = []
    for mb, n in cases:
        for label, ev in (("journal replay only", 0), (f"snapshot every {every}", every)):
            t, replayed, snap = await measure(home / f"j-{mb}-{n}-{ev}", traces[mb], n, ev, reps)
            rows.append([f"{mb} MB", n, label, snap or "-", replayed, t])
    print(
        f"rebuild after SIGKILL of the host (next run_cell incl. trace load and probe cell), median of {reps}"
    )
    print(table(["trace", "recorded cells", "mode", "snapshot seq", "cells replayed", "rebuild s"], rows))
    print(f"\ncommand: python -m bench.sandbox_recovery --reps {reps} --every {every} --big-mb {big_mb}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--big-mb", type=int, default=100)
    a = ap.parse_args()
    asyncio.run(main(a.reps, a.every, a.big_mb))
