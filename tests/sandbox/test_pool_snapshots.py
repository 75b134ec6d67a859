"""Host pool (fast first cell) and snapshots (bounded recovery): both must leave isolation and the
exact-state guarantee of the journal untouched."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from sandbox.executor import SubprocessExecutor
from sandbox.pool import HostPool
from sandbox.sessions import SessionManager
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = pytest.mark.timeout(60)


def _kw(trace_file: str, **changes: Any) -> dict[str, Any]:
    return {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {"task": {"id": 1}},
        "limits": dataclasses.replace(TEST_LIMITS, **changes),
    }


def _kill(sessions: SessionManager, sid: str) -> None:
    ex = sessions.executor_for(sid)
    assert isinstance(ex, SubprocessExecutor) and ex.pid is not None
    os.killpg(ex.pid, signal.SIGKILL)


# -- pool ------------------------------------------------------------------------------------------
async def test_pooled_hosts_are_fresh_limited_and_deterministic(tmp_path: Path, trace_file: str) -> None:
    sessions = SessionManager(tmp_path / "j", pool_size=2)
    await sessions.prewarm()
    assert sessions.pool is not None and sessions.pool.idle == 2
    kw = _kw(trace_file)
    r = await sessions.run_cell("a", 1, "describe_traces()\nsecret = 41\nprint(hash('k'))", **kw)
    assert r.ok and "traces: dict" in r.stdout
    ex_a = sessions.executor_for("a")
    assert isinstance(ex_a, SubprocessExecutor) and ex_a.pooled
    r_b = await sessions.run_cell(
        "b", 1, "print(hash('k'))\nprint('secret' in SHOW_VARS.__name__ or 1)", **kw
    )
    ex_b = sessions.executor_for("b")
    assert isinstance(ex_b, SubprocessExecutor) and ex_b.pooled and ex_b.pid != ex_a.pid
    assert r_b.stdout.splitlines()[0] == r.stdout.splitlines()[-1]  # same hash seed in every host
    r = await sessions.run_cell("b", 2, "print(secret)", **kw)  # never sees another session's state
    assert r.error_kind == "runtime" and "NameError" in (r.error or "")
    # The limits of the session reach the pooled host before its first cell.
    limits = Path(f"/proc/{ex_b.host_pid}/limits").read_text()
    assert str(TEST_LIMITS.memory_bytes) in next(ln for ln in limits.splitlines() if "address space" in ln)
    r = await sessions.run_cell("b", 3, "big = 'x' * 10**10", **kw)
    assert r.error_kind == "memory"
    # A plain (non-pooled) host hashes the same way.
    plain = SubprocessExecutor(TEST_LIMITS)
    await plain.start(None, "auto", {})
    assert (await plain.run_cell("print(hash('k'))")).stdout == r_b.stdout.splitlines()[0] + "\n"
    await plain.close()
    await sessions.prewarm()
    assert sessions.pool.idle == 2 and sessions.pool.hits >= 2
    idle_pids = [h.proc.pid for h in sessions.pool._idle]
    await sessions.close_all()
    assert sessions.pool.idle == 0
    for pid in idle_pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


async def test_pool_size_zero_and_rebuild_uses_pool(tmp_path: Path, trace_file: str) -> None:
    no_pool = SessionManager(tmp_path / "j0", pool_size=0)
    assert no_pool.pool is None
    r = await no_pool.run_cell("a", 1, "x = 1", **_kw(trace_file))
    assert r.ok
    await no_pool.close_all()
    sessions = SessionManager(tmp_path / "j1", pool_size=1)
    await sessions.prewarm()
    await sessions.run_cell("a", 1, "x = 1", **_kw(trace_file))
    await sessions.prewarm()
    _kill(sessions, "a")
    r = await sessions.run_cell("a", 2, "print(x)", **_kw(trace_file))
    assert r.stdout == "1\n" and r.host_restarted
    ex = sessions.executor_for("a")
    assert isinstance(ex, SubprocessExecutor) and ex.pooled
    await sessions.close_all()


async def test_pool_take_waits_for_warming_host() -> None:
    pool = HostPool(1)
    pool.fill()
    host = await pool.take()  # nothing idle yet, but one is warming: wait for it
    assert host is not None and pool.hits == 1
    await pool.close()
    os.killpg(host.proc.pid, signal.SIGKILL)
    await host.proc.wait()


# -- snapshots -------------------------------------------------------------------------------------
PLAIN_CELLS = [
    "steps = traces['steps']\nroles = collections.Counter(s['role'] for s in steps)",
    'register_helper(\'longest\', \'def longest(items):\\n    """Longest item."""\\n    return max(items, key=len)\')',
    "derived = {r: n * 10 for r, n in roles.items()}\ncounter = 0\nimport itertools\nit = itertools.count(3)\n"
    "from collections import defaultdict, OrderedDict\ndd = defaultdict(list)\ndd['a'].append(steps[0])\n"
    "f = longest\nd = datetime.datetime(2020, 1, 2) + datetime.timedelta(days=1)\nod = OrderedDict(b=1, a=2)",
    "counter += 1\nseen = {'x', 'y'}\nnums = [1.5, -0.0, float('nan')]\nalias = [nums, nums]",
    "counter += 1\nnext(it)\ntask['note'] = 'kept'",
    "counter += 1\nsteps[0]['tag'] = 'mutated in place'",
]
PROBE = (
    "print(sorted(roles.items()), derived, counter, longest(['a', 'abc']), it, dd['a'][0] is steps[0],\n"
    "      steps is traces['steps'], len(traces['steps']), traces['steps'][0].get('tag'), task, seen, f is longest,\n"
    "      d, od, nums, alias[0] is alias[1], hash('k'))\nSHOW_VARS()\nlist_helpers()"
)


async def _run_all(sessions: SessionManager, sid: str, cells: list[str], trace_file: str) -> str:
    for seq, code in enumerate(cells, start=1):
        r = await sessions.run_cell(sid, seq, code, **_kw(trace_file))
        assert r.ok, (seq, r)
    probe = await sessions.run_cell(sid, len(cells) + 1, PROBE, **_kw(trace_file))
    assert probe.ok, probe
    return probe.stdout


@pytest.mark.parametrize("every", [1, 2, 4])
async def test_snapshot_restore_equals_uncrashed_state(tmp_path: Path, trace_file: str, every: int) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=every)
    before = await _run_all(sessions, "s", PLAIN_CELLS, trace_file)
    assert sessions.stats.snapshots_written >= 1 and sessions.stats.snapshots_refused == 0
    _kill(sessions, "s")
    n = len(PLAIN_CELLS) + 1
    r = await sessions.run_cell("s", n + 1, PROBE, **_kw(trace_file))
    assert r.ok and r.stdout == before
    last_snap = (n // every) * every
    assert r.meta["snapshot_seq"] == last_snap and r.meta["cells_replayed"] == n - last_snap
    assert sessions.stats.snapshots_restored == 1
    # and the session continues normally from there
    r = await sessions.run_cell("s", n + 2, "counter += 1\nprint(counter, next(it))", **_kw(trace_file))
    assert r.stdout == "4 4\n"
    await sessions.close_all()


async def test_new_manager_restores_from_snapshot(tmp_path: Path, trace_file: str) -> None:
    first = SessionManager(tmp_path / "j", snapshot_every=3)
    before = await _run_all(first, "s", PLAIN_CELLS, trace_file)
    _kill(first, "s")
    second = SessionManager(tmp_path / "j", snapshot_every=3)
    r = await second.run_cell("s", len(PLAIN_CELLS) + 2, PROBE, **_kw(trace_file))
    assert r.stdout == before and r.meta["snapshot_seq"] == 6
    await first.close_all()
    await second.close_all()


@pytest.mark.parametrize(
    "blocker",
    [
        "def double(x):\n    return 2 * x",  # a function defined in a cell
        "class Box:\n    pass\nbox = Box()",  # an instance of a cell-defined class
        "gen = (i for i in range(3))\nnext(gen)",  # a generator
        "shrunk = set(range(100))\nfor i in range(98):\n    shrunk.discard(i)",  # set with a big table
        "register_helper('tally', 'def tally(x, acc=[]):\\n    acc.append(x)\\n    return len(acc)')\ntally(1)",
    ],
    ids=["function", "instance", "generator", "shrunk-set", "stateful-helper"],
)
async def test_unsnapshottable_state_falls_back_to_full_replay(
    tmp_path: Path, trace_file: str, blocker: str
) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=1)
    cells = [PLAIN_CELLS[0], PLAIN_CELLS[1], blocker, PLAIN_CELLS[2], PLAIN_CELLS[3]]
    for seq, code in enumerate(cells, start=1):
        assert (await sessions.run_cell("s", seq, code, **_kw(trace_file))).ok
    assert sessions.stats.snapshots_written == 2 and sessions.stats.snapshots_refused == 3
    probe = "SHOW_VARS()\nprint(counter, derived, sorted(seen), longest(['a', 'abc']))"
    before = await sessions.run_cell("s", 6, probe, **_kw(trace_file))
    assert before.ok, before
    _kill(sessions, "s")
    r = await sessions.run_cell("s", 7, probe, **_kw(trace_file))
    # Only the snapshot taken before the blocker (seq 2) is usable: replay 3..6 on top of it.
    assert r.ok and r.stdout == before.stdout
    assert r.meta["snapshot_seq"] == 2 and r.meta["cells_replayed"] == 4
    await sessions.close_all()


async def test_retry_and_changed_start_ignore_stale_snapshots(tmp_path: Path, trace_file: str) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=1)
    kw = _kw(trace_file)
    await sessions.run_cell("c", 1, "counter = 0", **kw)
    await sessions.run_cell("c", 2, "counter += 1", **kw)
    assert (tmp_path / "j" / "c" / "snapshot-00000002.pkl").exists()
    # Retrying seq 2 on the live host removes the snapshot of its earlier attempt.
    await sessions.run_cell("c", 2, "counter += 10", **kw)
    _kill(sessions, "c")
    r = await sessions.run_cell("c", 3, "print(counter)", **kw)
    assert r.stdout == "10\n" and r.meta["snapshot_seq"] == 2
    # A different starting point (other extra variables) never uses these snapshots.
    other = {**kw, "extra_vars": {"task": {"id": 2}}}
    r = await sessions.run_cell("c", 4, "print(counter, task)", **other)
    assert r.stdout == "10 {'id': 2}\n" and "snapshot_seq" not in r.meta and r.meta["cells_replayed"] == 3
    await sessions.close_all()


async def test_corrupt_snapshot_falls_back_to_full_replay(tmp_path: Path, trace_file: str) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=2)
    kw = _kw(trace_file)
    for seq, code in enumerate(["a = [1]", "a.append(2)", "a.append(3)"], start=1):
        await sessions.run_cell("k", seq, code, **kw)
    (tmp_path / "j" / "k" / "snapshot-00000002.pkl").write_bytes(b"\x80\x05garbage")
    _kill(sessions, "k")
    r = await sessions.run_cell("k", 4, "print(a)", **kw)
    assert r.stdout == "[1, 2, 3]\n" and r.meta["cells_replayed"] == 3
    assert sessions.stats.snapshot_restore_failures == 1
    await sessions.close_all()
