"""A large trace in a real sandbox host: read through its record index, never parsed whole.

The host opens the index beside the trace (`reflector.analysis.traces.index.index_path`) before the lockdown and
gives cells the lazy view; snapshots and child exports refer to it instead of copying it.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from reflector.analysis.traces import normalize
from reflector.analysis.traces.index import build_index, index_path
from sandbox.executor import SubprocessExecutor
from tests.sandbox.conftest import TEST_LIMITS

N_STEPS = 3_000


def _ace_trace(path: Path) -> dict[str, object]:
    data: dict[str, object] = {
        "question": "How many widgets?",
        "ground_truth": "42",
        "steps": [
            {
                "thought": f"step {i} é",
                "action": "count" if i % 7 else "lookup",
                "args": {"i": i},
                "observation": "error: no such widget" if i % 500 == 0 else f"ok {i}",
            }
            for i in range(N_STEPS)
        ],
        "final_answer": "41",
    }
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    return data


@pytest.fixture
def lazy_trace(tmp_path: Path) -> tuple[str, dict[str, object]]:
    path = tmp_path / "big.json"
    data = _ace_trace(path)
    with open(path, "rb") as fh:
        fmt, index = build_index(fh, str(path))
    assert fmt == "ace" and index is not None
    Path(index_path(str(path))).write_bytes(index.to_bytes())
    return str(path), data


async def _started(trace: str, inherit: bytes | None = None) -> SubprocessExecutor:
    ex = SubprocessExecutor(TEST_LIMITS, index_data=True)
    await ex.start(trace, "auto", {"task": {"question": "q"}}, inherit=inherit)
    return ex


async def test_cells_read_the_lazy_view_like_the_plain_one(lazy_trace: tuple[str, dict[str, object]]) -> None:
    path, data = lazy_trace
    eager = normalize(data)
    ex = await _started(path)
    try:
        r = await ex.run_cell(
            "s = traces['steps']\n"
            "print(type(s).__name__, len(s), traces['question'], traces['final_answer'], traces['metadata']['n_steps'])\n"
            "print(json.dumps(s[0]), json.dumps(s[-1]))\n"
            "errs = [x['index'] for x in s if x['is_error']]\n"
            "print(errs)\n"
            "part = s[100:110]\n"
            "print(type(part).__name__, len(part), part[0]['index'], [x['index'] for x in s[::1000]])\n"
            "print(s.grep('no such widget'))\n"
            "print(traces['raw']['question'], len(traces['raw']['steps']))"
        )
        assert r.ok, r
        lines = r.stdout.splitlines()
        assert lines[0] == f"Steps {N_STEPS} How many widgets? 41 {N_STEPS}"
        steps = eager["steps"]
        assert lines[1] == f"{json.dumps(steps[0])} {json.dumps(steps[-1])}"
        assert lines[2] == str([s["index"] for s in steps if s["is_error"]])
        assert lines[3] == "Steps 10 100 [0, 1000, 2000]"
        assert lines[4] == str([i for i in range(N_STEPS) if i % 500 == 0])
        assert lines[5] == f"How many widgets? {N_STEPS}"
        # It is a view: it cannot be changed, and a changed copy does not change it.
        r = await ex.run_cell("s[0] = 1")
        assert not r.ok and "does not support item assignment" in (r.error or "")
        r = await ex.run_cell("c = s[5]\nc['role'] = 'x'\nprint(s[5]['role'])")
        assert r.ok and r.stdout == "tool\n"
        r = await ex.run_cell("describe_traces()")
        # the lazy note and the toolkit come first; the schema line (Steps[3,000, lazy]) is past this
        # test's 2,000-character output limit
        assert r.ok and "lazy" in r.stdout and "first_divergence(run)" in r.stdout
    finally:
        await ex.close()


async def test_snapshots_and_exports_refer_to_the_trace(lazy_trace: tuple[str, dict[str, object]]) -> None:
    path, _data = lazy_trace
    ex = await _started(path)
    try:
        r = await ex.run_cell(
            "s = traces['steps']\nwindow = s[2000:2010]\npicked = [x['index'] for x in window]"
        )
        assert r.ok, r
        snap, meta = await ex.snapshot()
        assert snap is not None, meta
        assert len(snap) < 4_000  # references, not the 3,000 steps
        export, info = await ex.export_namespace()
        assert export is not None and info.get("skipped") == [], info
        assert len(export) < 4_000
    finally:
        await ex.close()
    fresh = await _started(path)
    try:
        assert await fresh.restore(snap)
        r = await fresh.run_cell(
            "print(type(window).__name__, len(window), window[0]['index'], picked[:2], s is traces['steps'])"
        )
        assert r.ok and r.stdout == "Steps 10 2000 [2000, 2001] True\n", r
    finally:
        await fresh.close()
    child = await _started(path, inherit=export)
    try:
        r = await child.run_cell("print(window[-1]['index'], len(s), picked[-1])")
        assert r.ok and r.stdout == "2009 3000 2009\n", r
    finally:
        await child.close()


def test_the_lazy_sequences_do_not_pickle_outside_the_host(lazy_trace: tuple[str, dict[str, object]]) -> None:
    """Only the host's pickler (persistent references) can write them: plain pickling refuses."""
    import os

    from reflector.analysis.traces.index import TraceIndex
    from reflector.analysis.traces.lazy import open_view

    path, _ = lazy_trace
    fd = os.open(path, os.O_RDONLY)
    try:
        view, _roots = open_view(fd, TraceIndex.from_bytes(Path(index_path(path)).read_bytes()))
        with pytest.raises(TypeError):
            pickle.dumps(view["steps"])
    finally:
        os.close(fd)
