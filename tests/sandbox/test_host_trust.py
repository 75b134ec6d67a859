"""Issue 25, points 5, 7 and 9: the worker trusts nothing a sandbox host asks for or can touch.

Assume the breach (the host's test-only unguarded op: real builtins, `os`, `ctypes`) and show that
  * a host cannot learn other sessions' blob names (inotify/fanotify/dnotify denied, the store's
    directories not traversable by the host's uid) nor get their bytes (`ARCHIVE` answers only for
    blobs the session, or an ancestor, archived: a capability list the worker keeps);
  * a host cannot pin memory outside its rlimits (memfds, SysV/POSIX IPC, grown pipe buffers, many fds)
    and its cgroup is detected, reported and required in `strict`;
  * a host, even one keeping a non-root worker's uid, cannot chmod, chown, back-date or tag the
    worker's files, and `rr gc` does not trust a modification time anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import cgroups, confinement, isolation
from sandbox.confinement import landlock_abi, seccomp_program
from sandbox.executor import SubprocessExecutor
from sandbox.sessions import SessionManager
from tests.sandbox.conftest import SECRET_VALUE, TEST_LIMITS

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        sys.platform != "linux" or landlock_abi() < 1,
        reason="needs Linux with Landlock (the OS sandbox layer)",
    ),
]


async def _breach(ex: SubprocessExecutor, code: str) -> str:
    """Run `code` in the breached host; its stdout (the code prints what it got)."""
    result = await ex.run_unguarded(
        "import os, ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n" + code
    )
    assert result.ok, result
    return result.stdout


def _syscall_probe(name: str, nr: int, *args: int) -> str:
    """A line of breach code printing `name <return> <errno name>` for a raw syscall."""
    return (
        f"r = libc.syscall({nr}, *{args!r}); e = ctypes.get_errno()\n"
        f"print({name!r}, r, errno.errorcode.get(e, e) if r < 0 else 'OK')\n"
    )


def _results(out: str) -> dict[str, str]:
    return {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.strip()}


# -- point 5 (b): no watching the file system ------------------------------------------------------------------------
WATCH_CALLS = {  # x86_64 numbers; the aarch64 table is checked by test_both_tables_deny_the_same_calls
    "inotify_init": (253,),
    "inotify_init1": (294, 0),
    "inotify_add_watch": (254, 0, 0, 0xFFF),
    "fanotify_init": (300, 0, 0),
    "fanotify_mark": (301, 0, 1, 0x3F, -100, 0),
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="raw x86_64 syscall numbers")
async def test_breach_cannot_watch_the_blob_store(breached: SubprocessExecutor, tmp_path: Path) -> None:
    """inotify on the store's fan-out dirs told a host the names of other sessions' blobs; dnotify too."""
    code = "".join(_syscall_probe(name, *args) for name, args in WATCH_CALLS.items())
    code += (
        "try:\n"
        "    fd = os.open('/', os.O_RDONLY)\n"
        "    import fcntl\n"
        "    fcntl.fcntl(fd, fcntl.F_NOTIFY, fcntl.DN_CREATE | fcntl.DN_MULTISHOT)\n"
        "    print('dnotify OK')\n"
        "except OSError as e:\n"
        "    print('dnotify', -1, errno.errorcode.get(e.errno, e.errno))\n"
    )
    got = _results(await _breach(breached, code))
    for name in (*WATCH_CALLS, "dnotify"):
        assert got.get(name, "").split()[-1] in ("EPERM", "EACCES"), (name, got)
    follow = await breached.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n"


def test_both_tables_deny_the_same_calls() -> None:
    """Every call point 5/7/9 denies is in the deny list and numbered for both architectures (where the
    architecture has it), so a filter assembled for either denies it."""
    wanted = set(WATCH_CALLS) | {
        "memfd_create",
        "shmget",
        "shmat",
        "semget",
        "msgget",
        "mq_open",
        "chmod",
        "fchmod",
        "fchmodat",
        "fchmodat2",
        "chown",
        "fchown",
        "lchown",
        "fchownat",
        "utime",
        "utimes",
        "futimesat",
        "utimensat",
        "setxattr",
        "lsetxattr",
        "fsetxattr",
        "setxattrat",
        "removexattr",
        "lremovexattr",
        "fremovexattr",
        "removexattrat",
    }
    assert wanted <= set(confinement._DENIED)
    generic_lacks = {"inotify_init", "chmod", "chown", "lchown", "utime", "utimes", "futimesat"}
    for arch, table in confinement._SYSCALLS.items():
        assert wanted - generic_lacks <= set(table), (arch, sorted(wanted - set(table)))
        program = seccomp_program(arch, 2)
        ks = {int.from_bytes(program[i + 4 : i + 8], "little") for i in range(0, len(program), 8)}
        assert {table[n] for n in wanted if n in table} <= ks, arch
    assert {"inotify_init", "chmod", "utime"} <= set(confinement._SYSCALLS["x86_64"])


# -- point 7: memory outside the rlimits --------------------------------------------------------------------------------
PIN_CODE = """
import fcntl, resource
def probe(name, fn):
    try:
        fn()
        print(name, 'OK')
    except OSError as e:
        print(name, -1, errno.errorcode.get(e.errno, e.errno))
probe('memfd', lambda: os.memfd_create('pin'))
r = libc.syscall(319, b'pin', 0); e = ctypes.get_errno()
print('memfd_raw', r, errno.errorcode.get(e, e) if r < 0 else 'OK')
rd, wr = os.pipe()
probe('pipe_size', lambda: fcntl.fcntl(wr, 1031, 1 << 20))
r = libc.syscall(29, 0, 1 << 26, 0o1600); e = ctypes.get_errno()  # shmget(IPC_PRIVATE, 64 MiB, IPC_CREAT)
print('shmget', r, errno.errorcode.get(e, e) if r < 0 else 'OK')
r = libc.syscall(68, 0, 0o1600); e = ctypes.get_errno()  # msgget(IPC_PRIVATE, IPC_CREAT)
print('msgget', r, errno.errorcode.get(e, e) if r < 0 else 'OK')
r = libc.syscall(240, b'pin', 0o102, 0o600, 0); e = ctypes.get_errno()  # mq_open(O_CREAT | O_RDWR)
print('mq_open', r, errno.errorcode.get(e, e) if r < 0 else 'OK')
fds = []
try:
    while len(fds) < 10000:
        fds.extend(os.pipe())
except OSError as e:
    print('fds', len(fds), errno.errorcode.get(e.errno, e.errno))
print('nofile', resource.getrlimit(resource.RLIMIT_NOFILE)[1])
for fd in fds:
    os.close(fd)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="raw x86_64 syscall numbers")
async def test_breach_pins_no_memory_outside_the_rlimits(breached: SubprocessExecutor) -> None:
    """memfds held 1.5 GiB in a host capped at 512 MiB; IPC objects, grown pipes and 20,000 fds pin more."""
    got = _results(await _breach(breached, PIN_CODE))
    for name in ("memfd", "memfd_raw", "pipe_size", "shmget", "msgget", "mq_open"):
        assert got.get(name, "").split()[-1] == "EPERM", (name, got)
    count, why = got["fds"].split()
    assert why == "EMFILE" and int(count) < isolation.HOST_MAX_FDS, got
    assert int(got["nofile"]) == isolation.HOST_MAX_FDS, got
    follow = await breached.run_cell("print(len(traces['steps']))")
    assert follow.ok and follow.stdout == "3\n"


def _fake_cgroup(root: Path) -> Path:
    """A directory shaped like a delegated cgroup v2 (the kernel's files are plain files here)."""
    base = root / "delegated"
    base.mkdir()
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.subtree_control").write_text("memory pids\n")
    (base / "cgroup.procs").write_text("")
    return base


def test_cgroup_detection_says_why_not(tmp_path: Path) -> None:
    base = _fake_cgroup(tmp_path)
    assert cgroups.find_cgroup_base(str(base)) == (str(base), "")
    (base / "cgroup.subtree_control").write_text("cpu\n")
    found, why = cgroups.find_cgroup_base(str(base))
    assert found is None and "does not enable memory and pids" in why
    (base / "cgroup.controllers").write_text("cpu hugetlb\n")
    found, why = cgroups.find_cgroup_base(str(base))
    assert found is None and "no memory or pids controller" in why
    found, why = cgroups.find_cgroup_base(str(tmp_path))
    assert found is None and "not a cgroup v2 directory" in why
    found, why = cgroups.find_cgroup_base(None)  # this machine: said precisely, never silently
    assert (found is None) == bool(why)


@pytest.mark.parametrize("zygote", [False, True], ids=["started", "forked"])
async def test_each_host_gets_a_cgroup_with_memory_and_pids_limits(
    trace_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygote: bool
) -> None:
    """The mechanism against a delegated cgroup: the host's own cgroup, its limits and its process.

    Exercised against a directory shaped like one (this test machine's cgroup v2 has no memory or pids
    controller, see `test_cgroup_detection_says_why_not`): what the host writes is checked, not that the
    kernel then enforces it.
    """
    base = _fake_cgroup(tmp_path)
    monkeypatch.setenv(isolation.CGROUP_ENV, str(base))
    ex = SubprocessExecutor(TEST_LIMITS, isolation="strict", zygote=zygote)
    await ex.start(trace_file, "auto", {})
    try:
        assert "cgroup" in ex.isolation["layers"] and "cgroup" not in ex.isolation["missing"], ex.isolation
        (mine,) = [p for p in base.iterdir() if p.name.startswith(isolation.CGROUP_PREFIX)]
        assert mine.name == f"{isolation.CGROUP_PREFIX}{ex.pid}"
        assert (mine / "pids.max").read_text() == str(isolation.HOST_PIDS_MAX)
        assert (mine / "memory.max").read_text() == str(
            TEST_LIMITS.memory_bytes + isolation.CGROUP_MEMORY_SLACK
        )
        assert (mine / "cgroup.procs").read_text() == str(ex.pid)
        r = await ex.run_cell("print(1+1)")
        assert r.ok and r.stdout == "2\n"
    finally:
        await ex.close()


async def test_strict_refuses_a_host_without_a_cgroup(trace_file: str) -> None:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="strict", missing_for_tests=("cgroup",))
    with pytest.raises(RuntimeError, match="strict isolation: cgroup"):
        await ex.start(trace_file, "auto", {})
    await ex.close()
    auto = SubprocessExecutor(TEST_LIMITS, isolation="auto", missing_for_tests=("cgroup",))
    await auto.start(trace_file, "auto", {})
    try:
        assert "cgroup" in auto.isolation["missing"] and "seccomp" in auto.isolation["layers"]
    finally:
        await auto.close()


# -- point 9: the worker's files' metadata -------------------------------------------------------------------------
def _metadata_breach(path: str, inode: int) -> str:
    """Breach code: every way to change `path`'s metadata, by path and through the fd the host holds of it
    (found by its inode: the host may not even be able to stat the path)."""
    return (
        "import stat\n"
        "def probe(name, fn):\n"
        "    try:\n"
        "        fn()\n"
        "        print(name, 'OK')\n"
        "    except OSError as e:\n"
        "        print(name, -1, errno.errorcode.get(e.errno, e.errno))\n"
        f"path = {path!r}\n"
        "held = []\n"
        "for f in range(0, 64):\n"
        "    try:\n"
        f"        if os.fstat(f).st_ino == {inode}:\n"
        "            held.append(f)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('held', len(held), 'x')\n"
        "probe('chmod', lambda: os.chmod(path, 0o777))\n"
        "probe('chown', lambda: os.chown(path, os.getuid(), os.getgid()))\n"
        "probe('utime', lambda: os.utime(path, (0, 0)))\n"
        "probe('setxattr', lambda: os.setxattr(path, 'user.rr', b'x'))\n"
        "probe('removexattr', lambda: os.removexattr(path, 'user.keep'))\n"
        "for fd in held:\n"
        "    probe('fchmod', lambda: os.fchmod(fd, 0o777))\n"
        "    probe('fchown', lambda: os.fchown(fd, os.getuid(), os.getgid()))\n"
        "    probe('futime', lambda: os.utime(fd, (0, 0)))\n"
        "    probe('fsetxattr', lambda: os.setxattr(fd, 'user.rr', b'x'))\n"
    )


METADATA_CALLS = (
    "chmod",
    "fchmod",
    "chown",
    "fchown",
    "utime",
    "futime",
    "setxattr",
    "fsetxattr",
    "removexattr",
)


def _assert_denied(got: dict[str, str]) -> None:
    held = not got["held"].startswith("0")
    for name in METADATA_CALLS:
        if held or not name.startswith("f"):
            assert got.get(name, "").split()[-1] in ("EPERM", "EACCES"), (name, got)


def _assert_unchanged(path: Path, before: os.stat_result, got: dict[str, str]) -> None:
    _assert_denied(got)
    after = os.stat(path)
    assert (after.st_mode, after.st_mtime_ns, after.st_uid) == (
        before.st_mode,
        before.st_mtime_ns,
        before.st_uid,
    )


async def test_breach_cannot_change_the_metadata_of_worker_files(
    breached: SubprocessExecutor, trace_file: str
) -> None:
    """By path (the trace) and through the fd the host holds (its stderr log, in the worker's work dir).
    A root worker's host is nobody (not the owner); seccomp denies the calls whoever the owner is."""
    assert breached._stderr_path is not None
    for path in (trace_file, breached._stderr_path):
        before = os.stat(path)
        got = _results(await _breach(breached, _metadata_breach(path, before.st_ino)))
        if path == breached._stderr_path:
            assert not got["held"].startswith("0"), got
        _assert_unchanged(Path(path), before, got)


_NON_ROOT_SCRIPT = """
import asyncio, json, os, sys
sys.path.insert(0, sys.argv[1])
from sandbox.executor import SubprocessExecutor
from sandbox.protocol import SandboxLimits
async def breach(missing):
    ex = SubprocessExecutor(SandboxLimits(cell_timeout_s=10), python=sys.executable, unguarded_for_tests=True,
                            missing_for_tests=missing)
    await ex.start(sys.argv[2], "auto", {})
    prelude = "import os, ctypes, errno\\nlibc = ctypes.CDLL(None, use_errno=True)\\n"
    log = ex._stderr_path
    out = {"isolation": ex.isolation, "log": [log, oct(os.stat(log).st_mode), os.stat(log).st_mtime_ns]}
    held = sys.argv[3].replace("@PATH@", log).replace("-424242", str(os.stat(log).st_ino))
    for name, code in (("held", held), ("other", sys.argv[4])):
        r = await ex.run_unguarded(prelude + code)
        out[name] = r.stdout if r.ok else r.error
    st = os.stat(log)
    out["log_after"] = [oct(st.st_mode), st.st_mtime_ns]
    with open(f"/proc/{ex.host_pid}/status") as fh:  # the host's uid as the kernel (and the files) see it
        out["host_uid"] = int(next(line for line in fh if line.startswith("Uid:")).split()[2])
    await ex.close()
    return out
async def main():
    # as configured, and with the uid layer simulated missing: seccomp alone must hold (the host owns the files)
    print(json.dumps({"layered": await breach(()), "seccomp only": await breach(("uid",))}))
asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a worker as another user")
def test_a_non_root_workers_host_cannot_chmod_utime_or_tag_its_files() -> None:
    """A non-root worker's host with the worker's uid owns the worker's files, and Landlock does not cover
    metadata. It runs as a subordinate uid where the machine gives the worker a range (checked by the
    host's kernel uid), and with the uid layer simulated missing (the host then owns the files) seccomp
    alone holds: through the fd it holds (its stderr log) and by the path of another worker file,
    chmod / chown / utime (to 1970) / setxattr / removexattr all fail, and nothing changed."""
    python, setpriv = "/usr/bin/python3", shutil.which("setpriv")
    if not (os.path.exists(python) and setpriv):
        pytest.skip("needs a system Python readable by an unprivileged user, and setpriv")
    repo = str(Path(__file__).resolve().parents[2])
    if not all(os.stat(p).st_mode & 0o005 == 0o005 for p in Path(repo).parents):
        pytest.skip("the checkout is not readable by other users")
    base = Path(tempfile.mkdtemp(prefix="rr-nonroot-meta-"))  # pytest's tmp dirs are root-only
    try:
        work = base / "w"
        work.mkdir()
        trace = work / "trace.json"
        trace.write_text(json.dumps({"question": "q", "steps": [{"role": "user", "content": "hi"}]}))
        other = work / "journal-entry.json"  # stands in for a journal entry or a blob of the worker's
        other.write_text(json.dumps({"seq": 1, "code": "x = 1"}))
        script = work / "run.py"
        script.write_text(_NON_ROOT_SCRIPT)
        for p in (base, work, script):
            p.chmod(0o755)
        subprocess.run(["chown", "-R", "1000:1000", str(work)], check=True)
        for p in (trace, other):
            p.chmod(0o640)
        before = {p: os.stat(p) for p in (trace, other)}
        proc = subprocess.run(
            [
                setpriv,
                "--reuid",
                "1000",
                "--regid",
                "1000",
                "--clear-groups",
                python,
                str(script),
                repo,
                str(trace),
                _metadata_breach("@PATH@", -424242),
                _metadata_breach(str(other), before[other].st_ino),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        )
        assert proc.returncode == 0, proc.stderr
        both = json.loads(proc.stdout.strip().splitlines()[-1])
        out = both["layered"]
        assert "seccomp" in out["isolation"]["layers"], out
        sub, why_not = isolation.subordinate_ids(1000)
        if sub is not None:  # the first layer: the host is not the files' owner at all
            assert out["host_uid"] == sub[0] and f"uid {sub[0]}" in out["isolation"]["layers"], out
        else:  # said precisely (and refused in strict); seccomp is what holds
            assert (
                out["host_uid"] == 1000 and "keeps the worker's uid" in out["isolation"]["missing"]["uid"]
            ), out
            assert why_not in out["isolation"]["missing"]["uid"]
        alone = both["seccomp only"]
        assert alone["host_uid"] == 1000 and "uid" in alone["isolation"]["missing"], alone  # it owns them
        for run in (out, alone):
            got_held, got_other = _results(run["held"]), _results(run["other"])
            assert not got_held["held"].startswith("0"), got_held  # its stderr log: through the fd it holds
            _assert_denied(got_held)
            assert run["log_after"] == run["log"][1:], run
            _assert_unchanged(other, before[other], got_other)  # another worker file, by its path
        assert SECRET_VALUE not in proc.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- point 5 (a): ARCHIVE answers only what the session (or an ancestor) archived ---------------------------------
MESSAGES = [{"role": "user", "content": "archived question"}, {"role": "assistant", "content": "an answer"}]


def _put_blob(root: Path, data: bytes) -> tuple[str, Path]:
    digest = hashlib.sha256(data).hexdigest()
    path = root / "sha256" / digest[:2] / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest, path


def _kw(trace_file: str | None) -> dict[str, Any]:
    return {"trace_path": trace_file, "trace_format": "auto", "extra_vars": {}, "limits": TEST_LIMITS}


ASK_CODE = """
import gc
host = [o for o in gc.get_objects() if type(o).__name__ == 'Host'][0]
for sha in {shas!r}:
    reply, data = host.ask({{'what': 'archive', 'sha256': sha}})
    print(sha[:8], reply.get('ok'), len(data), str(reply.get('error'))[:200])
"""


async def test_a_breached_host_cannot_read_another_sessions_archive(tmp_path: Path, trace_file: str) -> None:
    """It learnt the name (inotify on the store, a log, a guess) and asks the worker for the bytes directly."""
    root = tmp_path / "blobs"
    theirs, _ = _put_blob(
        root, json.dumps([{"role": "user", "content": "another reflection's secret"}]).encode()
    )
    missing = "c" * 64

    def factory(limits: Any) -> SubprocessExecutor:
        return SubprocessExecutor(limits, archive_root=root, isolation="auto", unguarded_for_tests=True)

    sessions = SessionManager(tmp_path / "j", executor_factory=factory, fsync=False)
    try:
        assert (await sessions.run_cell("attacker", 1, "x = 1", **_kw(trace_file))).ok
        ex = sessions.executor_for("attacker")
        assert isinstance(ex, SubprocessExecutor)
        out = await ex.run_unguarded(ASK_CODE.format(shas=[theirs, missing]))
        assert out.ok, out
        lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
        assert lines[theirs[:8]].startswith("False 0 "), out.stdout
        assert "secret" not in out.stdout
        # the same answer as for a blob that does not exist (nothing to learn from the difference)
        assert lines[theirs[:8]].replace(theirs, "X") == lines[missing[:8]].replace(missing, "X"), out.stdout
    finally:
        await sessions.close_all()


async def test_archive_reads_only_what_the_session_or_its_ancestors_archived(
    tmp_path: Path, trace_file: str
) -> None:
    """Guarded path: a model cell names another session's blob (even in the workflow's own cell form);
    the grants survive a rebuild on another worker and reach children and grandchildren."""
    from sandbox.archive import GRANTS_SUFFIX, grants_blob

    root = tmp_path / "blobs"
    mine, _ = _put_blob(root, json.dumps(MESSAGES).encode())
    theirs, _ = _put_blob(
        root, json.dumps([{"role": "user", "content": "another reflection's secret"}]).encode()
    )
    sessions = SessionManager(tmp_path / "j", archive_root=root, pool_size=0, fsync=False)
    kw = _kw(trace_file)
    try:
        await sessions.grant_archive("parent", mine)
        await sessions.grant_archive("other", theirs)
        r = await sessions.run_cell(
            "parent", 1, f'history.extend(ARCHIVE("{mine}"))\nprint(len(history))', **kw
        )
        assert r.ok and r.stdout == "2\n", r
        r = await sessions.run_cell("parent", 2, f'history.extend(ARCHIVE("{theirs}"))', **kw)
        assert not r.ok and "no archived transcript with sha256" in (r.error or ""), r
        assert "secret" not in r.stdout + (r.error or "")
        # another worker (a fresh manager on the same journal) rebuilds the session: the grant holds
        await sessions.close_all()
        sessions = SessionManager(tmp_path / "j", archive_root=root, pool_size=0, fsync=False)
        r = await sessions.run_cell("parent", 2, f'print(len(ARCHIVE("{mine}")), len(history))', **kw)
        assert r.ok and r.stdout == "2 2\n" and r.host_restarted, r
        # a child inherits the parent's export, stored content-addressed with its grants beside it
        export, _ = await sessions.export_namespace("parent", 2, **kw)
        export_sha, export_path = _put_blob(root, export)
        export_path.with_name(f"{export_sha}.{GRANTS_SUFFIX}").write_bytes(
            grants_blob(sessions.archive_grants("parent").all())
        )
        r = await sessions.run_cell(
            "child", 1, f'print(len(ARCHIVE("{mine}")), len(history))', **_kw(None), inherit=export_path
        )
        assert r.ok and r.stdout == "2 2\n", r
        r = await sessions.run_cell("child", 2, f'ARCHIVE("{theirs}")', **_kw(None), inherit=export_path)
        assert not r.ok and "no archived transcript" in (r.error or ""), r
        # a grandchild: the child's export passes on what it may read (its own and its ancestors')
        grand, _ = await sessions.export_namespace("child", 2, **_kw(None), inherit=export_path)
        grand_sha, grand_path = _put_blob(root, grand)
        grand_path.with_name(f"{grand_sha}.{GRANTS_SUFFIX}").write_bytes(
            grants_blob(sessions.archive_grants("child", export_path).all())
        )
        r = await sessions.run_cell(
            "grandchild", 1, f'print(len(ARCHIVE("{mine}")))', **_kw(None), inherit=grand_path
        )
        assert r.ok and r.stdout == "2\n", r
        # an export given as bytes carries no grants (fail closed)
        r = await sessions.run_cell("orphan", 1, f'ARCHIVE("{mine}")', **_kw(None), inherit=export)
        assert not r.ok and "no archived transcript" in (r.error or ""), r
    finally:
        await sessions.close_all()


@pytest.mark.skipif(
    os.geteuid() != 0, reason="a root worker's hosts run as nobody (a non-root one's keep its uid)"
)
async def test_the_blob_store_is_not_traversable_by_the_hosts_uid(trace_file: str) -> None:
    """Landlock denies reading and listing the store, not stat-ing a blob by its name: the host's uid must not
    traverse the store's directories at all."""
    from activities.sandbox import private_store_dirs

    base = Path(tempfile.mkdtemp(prefix="rr-store-"))  # world-traversable, like a store under /srv or /var
    try:
        base.chmod(0o755)
        sha, blob = _put_blob(base, json.dumps(MESSAGES).encode())
        for d in (base / "sha256", blob.parent):
            d.chmod(0o755)  # what mkdir with the default umask made
        ex = SubprocessExecutor(TEST_LIMITS, isolation="auto", unguarded_for_tests=True)
        await ex.start(trace_file, "auto", {})
        try:
            probe = (
                "for what, fn in (('stat', lambda: os.stat(path).st_size), ('list', lambda: os.listdir(fan))):\n"
                "    try:\n"
                "        print(what, 'ALLOWED', fn())\n"
                "    except OSError as e:\n"
                "        print(what, 'DENIED', errno.errorcode.get(e.errno, e.errno))\n"
            )
            code = f"path, fan = {str(blob)!r}, {str(blob.parent.parent)!r}\n" + probe
            before = _results(await _breach(ex, code))
            assert before["stat"].startswith("ALLOWED"), (
                before
            )  # the exposure: size and times of a named blob
            private_store_dirs(base)
            assert (base / "sha256").stat().st_mode & 0o777 == 0o700
            assert (base / "sessions").stat().st_mode & 0o777 == 0o700
            after = _results(await _breach(ex, code))
            assert after["stat"] == "DENIED EACCES" and after["list"].startswith("DENIED"), after
        finally:
            await ex.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- point 9: `rr gc` trusts no time a host could set ---------------------------------------------------------------
class _NoExecutions:
    """A server with no executions: every blob is unreferenced, so only its age can keep it."""

    namespace = "test"

    async def executions(self) -> AsyncIterator[Any]:
        for _ in ():
            yield _

    async def events(self, execution: Any) -> AsyncIterator[Any]:
        for _ in ():
            yield _


async def test_gc_ages_blobs_by_a_time_no_host_can_set(tmp_path: Path) -> None:
    """A breached host with the worker's uid back-dated (utime to 1970) a blob written a moment ago, before the
    history names it: gc must not take it for old. And a forward-dated one (utime to 2100) must still age."""
    from reflector.runtime import gc
    from reflector.runtime.storage.blobs import BlobStore

    store = BlobStore(tmp_path)
    fresh = store.path_for(store.put_bytes(b"a payload stored before its history event"))
    os.utime(fresh, (0, 0))  # what the host did (it held the worker's uid)
    report = await gc.run_gc(_NoExecutions(), tmp_path)
    assert fresh.exists() and report.removed_paths == [], report.removed_paths
    future = store.path_for(store.put_bytes(b"an orphan that claims to be written in 2100"))
    os.utime(future, (4102444800, 4102444800))
    later = await gc.run_gc(_NoExecutions(), tmp_path, clock=lambda: time.time() + 2 * 3600)
    assert not future.exists() and not fresh.exists(), later.removed_paths  # two hours on, both are garbage


def test_subordinate_ranges_are_read_by_name_or_number(tmp_path: Path) -> None:
    """`/etc/subuid` lines are name:start:count; a worker without a range is told why (the host keeps its uid)."""
    table = tmp_path / "subuid"
    table.write_text("alice:100000:65536\n1001:200000:65536\nbroken\nbob:5:0\n")
    assert isolation._subordinate_start(str(table), ("alice", "1000")) == 100000
    assert isolation._subordinate_start(str(table), ("nobody-here", "1001")) == 200000
    assert isolation._subordinate_start(str(table), ("bob", "7")) is None  # an empty range
    assert isolation._subordinate_start(str(tmp_path / "missing"), ("alice",)) is None
    found, why = isolation.subordinate_ids(4242)  # a uid no machine gives a range
    assert found is None and ("no subordinate uid/gid range for uid 4242" in why or "uidmap" in why)


def test_a_grant_made_on_another_worker_is_pulled_from_the_replica_on_a_miss(tmp_path: Path) -> None:
    """S3: the summarise activity may run on another worker; its grant file is fetched (one file, not the
    journal), at most once a second however often a host asks for names it was not granted."""
    from sandbox.archive import ArchiveGrants

    granted, other = "a" * 64, "b" * 64
    remote = {ArchiveGrants.grant_name(granted): b"{}"}
    pulls: list[str] = []

    def pull(path: Path) -> bool:
        pulls.append(path.name)
        data = remote.get(path.name)
        if data is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return data is not None

    grants = ArchiveGrants(tmp_path / "sessions" / "s", pull=pull)
    assert grants.allows(granted) and pulls == [ArchiveGrants.grant_name(granted)]
    assert grants.allows(granted) and len(pulls) == 1  # local now
    assert not grants.allows(other) and not grants.allows(other) and len(pulls) == 1  # rate-limited
    with pytest.raises(ValueError, match="64 lowercase hex"):
        grants.allows("../" + "a" * 61)
