"""Child sessions inherit a copy of the parent's namespace; `history` holds archived transcripts
read with `ARCHIVE(sha256)`; the journal's fsync setting covers snapshots too."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import sandbox.journal as journal_mod
from sandbox.executor import SubprocessExecutor
from sandbox.host.namespace import SandboxNamespace
from sandbox.host.snapshot import restore_export, take_export
from sandbox.sessions import SandboxExportError, SessionManager
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = pytest.mark.timeout(60)


def _kw(trace_file: str | None, task: Any = 1, **changes: Any) -> dict[str, Any]:
    return {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {"task": {"id": task}},
        "limits": dataclasses.replace(TEST_LIMITS, **changes),
    }


def _kill(sessions: SessionManager, sid: str) -> None:
    ex = sessions.executor_for(sid)
    assert isinstance(ex, SubprocessExecutor) and ex.pid is not None
    os.killpg(ex.pid, signal.SIGKILL)


async def _ok(sessions: SessionManager, sid: str, seq: int, code: str, **kw: Any) -> str:
    r = await sessions.run_cell(sid, seq, code, **kw)
    assert r.ok, (seq, r)
    return r.stdout


def _put_blob(root: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = root / "sha256" / digest[:2] / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


# -- namespace export / inherit --------------------------------------------------------------------
PARENT_CELLS = [
    "n = 3\nd = {'k': 1}\nlst = [s['role'] for s in traces['steps']]\nsteps = traces['steps']\n"
    "pair = (d, d)\nwords = {'b', 'a'}",
    "register_helper('longest', 'def longest(items):\\n    return max(items, key=len)')",
    "def double(x):\n    return 2 * x\nimport itertools\nfs = {'f': longest}\ngen = (i for i in range(3))\n"
    "boxed = [double]\nalias = longest",
]
CHILD_PROBE = (
    "print(n, d, lst, len(steps), pair[0] is d, sorted(words), longest(['a', 'abc']), fs['f'] is longest,\n"
    "      alias is longest, task)\n"
    "for name in ['double', 'itertools', 'gen', 'boxed']:\n"
    "    try:\n"
    "        value = {'double': lambda: double, 'itertools': lambda: itertools, 'gen': lambda: gen,\n"
    "                   'boxed': lambda: boxed}[name]()\n"
    "        print(name, 'present')\n"
    "    except NameError:\n"
    "        print(name, 'absent')"
)


@pytest.mark.parametrize(
    ("snapshot_every", "as_path"), [(0, False), (2, True)], ids=["bytes", "path+snapshots"]
)
async def test_child_inherits_a_copy_of_the_parent(
    tmp_path: Path, trace_file: str, snapshot_every: int, as_path: bool
) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=snapshot_every)
    parent = _kw(trace_file)
    for seq, code in enumerate(PARENT_CELLS, start=1):
        await _ok(sessions, "p", seq, code, **parent)
    journal_before = sessions.journal_entries("p")
    blob, skipped = await sessions.export_namespace("p", 3, **parent)
    assert skipped == ["double", "itertools", "gen", "boxed"]
    assert sessions.journal_entries("p") == journal_before  # nothing run, nothing journaled
    inherit: Any = blob
    if as_path:
        inherit = tmp_path / "blobs" / hashlib.sha256(blob).hexdigest()
        inherit.parent.mkdir()
        inherit.write_bytes(blob)

    child = {**_kw(None, task=2), "inherit": inherit}  # its own traces / task
    out = await _ok(sessions, "c", 1, CHILD_PROBE + "\nprint(traces)", **child)
    lines = out.splitlines()
    assert lines[0] == "3 {'k': 1} ['user', 'user', 'user'] 3 True ['a', 'b'] abc True True {'id': 2}"
    assert lines[1:] == ["double absent", "itertools absent", "gen absent", "boxed absent", "None"]

    # The child mutates its copies: the parent is unaffected.
    await _ok(sessions, "c", 2, "d['k'] = 2\nlst.append('x')\nsteps.append({})\nn += 1", **child)
    out = await _ok(sessions, "p", 4, "print(n, d, lst, len(steps), len(traces['steps']))", **parent)
    assert out == "3 {'k': 1} ['user', 'user', 'user'] 3 3\n"

    # Kill the child's host: the rebuild has the inherited state plus the child's own cells.
    _kill(sessions, "c")
    r = await sessions.run_cell(
        "c", 3, "print(n, d, lst[-1], len(steps), longest(['a', 'abcd']), task)", **child
    )
    assert r.ok and r.host_restarted, r
    assert r.stdout == "4 {'k': 2} x 4 abcd {'id': 2}\n"
    if snapshot_every:
        assert r.meta["snapshot_seq"] == 2 and r.meta["cells_replayed"] == 0
    else:
        assert r.meta["cells_replayed"] == 2

    # A live host started with another inherited namespace is never reused.
    other, _ = await sessions.export_namespace("p", 1, **parent)
    r = await sessions.run_cell("c", 4, "print(n)", **{**child, "inherit": other})
    assert r.host_restarted and r.meta["cells_replayed"] == 3 and "snapshot_seq" not in r.meta
    await sessions.close_all()


async def test_export_rebuilds_without_touching_the_journal(tmp_path: Path, trace_file: str) -> None:
    sessions = SessionManager(tmp_path / "j", snapshot_every=0)
    kw = _kw(trace_file)
    for seq, code in enumerate(["a = [1]", "a.append(2)", "a.append(3)\nb = 1 / 0"], start=1):
        await sessions.run_cell("p", seq, code, **kw)
    entries = sessions.journal_entries("p")
    # An older seq: a rebuild from entries <= 2, later entries kept.
    blob, _ = await sessions.export_namespace("p", 2, **kw)
    assert sessions.journal_entries("p") == entries
    out = await _ok(sessions, "c1", 1, "print(a)", **_kw(None), inherit=blob)
    assert out == "[1, 2]\n"
    # The host died: rebuilt from the journal (the failed cell's partial effects are replayed too).
    _kill(sessions, "p")
    blob, skipped = await sessions.export_namespace("p", 3, **kw)
    assert skipped == []
    out = await _ok(sessions, "c2", 1, "print(a)", **_kw(None), inherit=blob)
    assert out == "[1, 2, 3]\n"
    # The parent continues on the fast path from the exported host.
    r = await sessions.run_cell("p", 4, "print(a)", **kw)
    assert r.stdout == "[1, 2, 3]\n" and not r.host_restarted
    assert sessions.journal_entries("p")[:3] == entries
    # Seq 0 is the starting state; a child of a child passes its own `inherit` to export.
    blob0, _ = await sessions.export_namespace("c2", 1, **_kw(None), inherit=blob)
    out = await _ok(sessions, "c3", 1, "print(a)", **_kw(None), inherit=blob0)
    assert out == "[1, 2, 3]\n"
    with pytest.raises(SandboxExportError):
        await sessions.export_namespace("p", 1, **{**kw, "trace_path": str(tmp_path / "missing.json")})
    await sessions.close_all()


async def test_corrupt_inherit_fails_the_cell_clearly(tmp_path: Path) -> None:
    sessions = SessionManager(tmp_path / "j", pool_size=0)
    r = await sessions.run_cell("c", 1, "print(1)", **_kw(None), inherit=b"not a pickle")
    assert not r.ok and r.error_kind == "crash" and "inherited namespace" in (r.error or "")
    await sessions.close_all()


def _exec(ns: SandboxNamespace, code: str) -> None:
    exec(ns.compile_cell(code), ns.ns)  # checked code, as the host does
    ns.restore()


def test_export_skips_what_it_cannot_carry_in_process() -> None:
    parent = SandboxNamespace(1000)
    parent.start({"steps": [1, 2]}, {"task": "p", "shared": 1})
    _exec(
        parent,
        "class Box:\n    pass\nkept = {'x': [1, 2]}\nbad = {'box': Box()}\nmixed = [1, Box]\n"
        "history.extend([{'role': 'user'}, Box])\nh = history\nbig = set(range(50))\nfor i in range(45):\n"
        "    big.discard(i)\ntask_copy = task\nstep_alias = traces['steps']",
    )
    blob, skipped = take_export(parent)
    assert skipped == ["Box", "bad", "mixed", "history"]
    child = SandboxNamespace(1000)
    child.start(None, {"task": "c", "kept": "child's own"})
    info = restore_export(child, blob)
    child.restore()
    assert info["shadowed"] == ["kept"] and child.ns["kept"] == "child's own"
    assert child.ns["history"] == [{"role": "user"}] and child.ns["h"] is child.ns["history"]
    assert child.ns["task"] == "c" and len(parent.ns["history"]) == 2
    assert child.ns["big"] == {45, 46, 47, 48, 49} and child.ns["task_copy"] == "p"
    assert child.ns["step_alias"] == [1, 2] and child.ns["step_alias"] is not parent.ns["traces"]["steps"]
    assert "Box" not in child.ns and "bad" not in child.ns
    with pytest.raises(Exception, match="pickle|export"):  # malformed bytes: the host is discarded
        restore_export(child, b"junk")


# -- history / ARCHIVE -----------------------------------------------------------------------------
MESSAGES = [{"role": "user", "content": "first question"}, {"role": "assistant", "content": "an answer"}]


@pytest.mark.parametrize("snapshot_every", [0, 1])
async def test_history_archive_persists_across_cells_and_kills(
    tmp_path: Path, trace_file: str, snapshot_every: int
) -> None:
    root = tmp_path / "blobs"
    sha = _put_blob(root, json.dumps(MESSAGES).encode())
    sessions = SessionManager(tmp_path / "j", archive_root=root, snapshot_every=snapshot_every)
    await sessions.grant_archive("s", sha)  # the session archived it (the summarise activity grants it)
    kw = _kw(trace_file)
    assert await _ok(sessions, "s", 1, "print(len(history), type(history).__name__)", **kw) == "0 list\n"
    await _ok(sessions, "s", 2, f"history.extend(ARCHIVE({sha!r}))\nh = history", **kw)
    await _ok(sessions, "s", 3, "history = 'rebound'", **kw)  # the scaffold list is put back
    probe = "print(len(history), history[0]['content'], h is history, history[-1]['role'])"
    assert await _ok(sessions, "s", 4, probe, **kw) == "2 first question True assistant\n"
    await _ok(sessions, "s", 5, "history.append({'role': 'note'})", **kw)
    if snapshot_every:
        assert sessions.stats.snapshots_refused == 0 and sessions.stats.snapshots_written == 5
    _kill(sessions, "s")
    r = await sessions.run_cell("s", 6, probe, **kw)
    assert r.ok and r.host_restarted and r.stdout == "3 first question True note\n", r
    if snapshot_every:
        assert r.meta["snapshot_seq"] == 5 and r.meta["cells_replayed"] == 0
    # A child inherits the history (a copy).
    blob, _ = await sessions.export_namespace("s", 6, **kw)
    child = await _ok(
        sessions, "c", 1, "print(len(history), h is history)\nhistory.clear()", **_kw(None), inherit=blob
    )
    assert child == "3 True\n"
    assert await _ok(sessions, "s", 7, "print(len(history))", **kw) == "3\n"
    await sessions.close_all()


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("'../../../../etc/passwd'", "64 lowercase hex"),
        ("'sha256/ab/' + 'a' * 54", "64 lowercase hex"),
        ("'A' * 64", "64 lowercase hex"),
        ("'a' * 64 + '\\n'", "64 lowercase hex"),
        ("123", "64 lowercase hex"),
        ("'0' * 64", "FileNotFoundError: ARCHIVE: no archived transcript"),
        ("LINK", "cannot be read"),
        ("CORRUPT", "corrupt"),
        ("NOT_LIST", "expected a list"),
        ("NOT_JSON", "not valid JSON"),
    ],
)
async def test_archive_errors_are_clear(tmp_path: Path, arg: str, expected: str) -> None:
    root = tmp_path / "blobs"
    good = _put_blob(root, json.dumps(MESSAGES).encode())
    not_list = _put_blob(root, b'{"role": "user"}')
    not_json = _put_blob(root, b"[not json")
    corrupt = hashlib.sha256(b"something else").hexdigest()
    (root / "sha256" / corrupt[:2]).mkdir(parents=True, exist_ok=True)
    (root / "sha256" / corrupt[:2] / corrupt).write_bytes(b"[]")
    outside = tmp_path / "secret.json"
    outside.write_text("[1]")
    link = hashlib.sha256(b"[1]").hexdigest()
    (root / "sha256" / link[:2]).mkdir(parents=True, exist_ok=True)
    (root / "sha256" / link[:2] / link).symlink_to(outside)
    names = {"LINK": link, "CORRUPT": corrupt, "NOT_LIST": not_list, "NOT_JSON": not_json}
    sessions = SessionManager(tmp_path / "j", archive_root=root, pool_size=0)
    for name in (good, *names.values()):
        await sessions.grant_archive("s", name)
    r = await sessions.run_cell(
        "s", 1, f"x = ARCHIVE({names.get(arg, arg)!r} if {arg in names} else {arg})", **_kw(None)
    )
    assert r.error_kind == "runtime" and expected in (r.error or ""), r
    assert str(root) not in (r.error or "")
    r = await sessions.run_cell("s", 2, f"print(len(ARCHIVE({good!r})))", **_kw(None))
    assert r.stdout == "2\n"
    await sessions.close_all()


async def test_archive_without_root_and_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = SessionManager(tmp_path / "j", pool_size=0)
    r = await sessions.run_cell("s", 1, "ARCHIVE('a' * 64)", **_kw(None))
    assert "no transcript archive is configured" in (r.error or "")
    await sessions.close_all()
    from sandbox.host.namespace import read_archive

    root = tmp_path / "blobs"
    sha = _put_blob(root, json.dumps(MESSAGES).encode())
    assert read_archive(str(root), sha) == MESSAGES
    with pytest.raises(ValueError, match="exceeds 10 bytes"):
        read_archive(str(root), sha, max_bytes=10)


# -- durability setting ----------------------------------------------------------------------------
class _OsWithFsync:
    """`os` for sandbox.journal with a counting fsync (the test process's `os` stays untouched)."""

    def __init__(self, fsync: Any) -> None:
        self.fsync = fsync

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


@pytest.mark.parametrize("fsync", [False, True])
async def test_fsync_flag_covers_journal_and_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(journal_mod, "os", _OsWithFsync(counting_fsync))
    sessions = SessionManager(tmp_path / "j", fsync=fsync, snapshot_every=1, pool_size=0)
    await _ok(sessions, "s", 1, "x = 1", **_kw(None))
    assert (tmp_path / "j" / "s" / "snapshot-00000001.pkl").exists()
    # entry, snapshot and sidecar: file + directory each (+ the new session directory)
    assert len(calls) == (7 if fsync else 0)
    await sessions.close_all()
