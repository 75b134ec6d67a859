"""The OS layer, proven by assuming the breach: code runs in the host with the language guards off
(real `open`, `os`, `socket`, `ctypes`), and everything a real attacker would try must still fail.

The language layer will always have one more gadget; these tests are the ones that matter. They need
Linux with Landlock and seccomp (every supported kernel); they skip with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.confinement import landlock_abi, seccomp_program
from sandbox.executor import SubprocessExecutor
from sandbox.isolation import IsolationReport, parse_mode
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager
from tests.sandbox.conftest import SECRET_NAME, SECRET_VALUE, TEST_LIMITS

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        sys.platform != "linux" or landlock_abi() < 1,
        reason="needs Linux with Landlock (the OS sandbox layer)",
    ),
]


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file of the worker's that the host must not read (stands in for credentials, other blobs)."""
    path = tmp_path / "worker-secret.txt"
    path.write_text(SECRET_VALUE)
    return path


async def _try(ex: SubprocessExecutor, expr: str) -> str:
    """Evaluate `expr` in the breached host: "ALLOWED <repr>" or "DENIED <exception>"."""
    code = (
        "import os, socket, ctypes, subprocess, signal\n"
        "try:\n"
        f"    r = ({expr})\n"
        "    print('ALLOWED', repr(r)[:300])\n"
        "except BaseException as e:\n"
        "    print('DENIED', type(e).__name__, e)\n"
    )
    result = await ex.run_unguarded(code)
    assert result.ok, result
    return result.stdout.strip()


def _denied(outcome: str) -> None:
    assert outcome.startswith("DENIED"), outcome
    assert SECRET_VALUE not in outcome


async def test_the_host_reports_every_layer(breached: SubprocessExecutor) -> None:
    iso = breached.isolation
    layers = " ".join(iso["layers"])
    for layer in ("namespaces", "no-new-privs", "landlock", "seccomp"):
        assert layer in layers, iso
    if os.geteuid() == 0:
        assert iso["uid"] == 65534 and "uid 65534" in layers, iso
    # a cgroup needs a delegated cgroup v2 (not on every machine): reported, required only in `strict`
    assert set(iso["missing"]) <= {"cgroup"}, iso
    assert "fds 64" in layers, iso


async def test_breach_reads_no_file_outside_the_python_installation(
    breached: SubprocessExecutor, trace_file: str, secret_file: Path
) -> None:
    _denied(await _try(breached, "open('/etc/passwd').read()"))
    _denied(await _try(breached, f"open({str(secret_file)!r}).read()"))
    _denied(await _try(breached, f"os.listdir({str(secret_file.parent)!r})"))
    _denied(await _try(breached, f"open({trace_file!r}).read()"))  # only through the fd opened before
    _denied(await _try(breached, f"open({os.getcwd() + '/README.md'!r}).read()"))  # the worker's cwd
    _denied(await _try(breached, "open(os.path.expanduser('~root/.bashrc')).read()"))


async def test_breach_creates_no_file(breached: SubprocessExecutor, tmp_path: Path) -> None:
    target = tmp_path / "created-by-host"
    _denied(await _try(breached, f"open({str(target)!r}, 'w').write('x')"))
    _denied(await _try(breached, "open('in-cwd', 'w')"))
    _denied(await _try(breached, "open('/tmp/rr-breach-test', 'w')"))
    _denied(await _try(breached, "open('/dev/shm/rr-breach-test', 'w')"))
    _denied(await _try(breached, f"os.mkdir({str(tmp_path / 'd')!r})"))
    _denied(await _try(breached, f"os.symlink('/etc/passwd', {str(tmp_path / 'l')!r})"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    assert not Path("/tmp/rr-breach-test").exists() and not Path("/dev/shm/rr-breach-test").exists()


async def test_breach_sees_no_secret_of_the_worker(breached: SubprocessExecutor) -> None:
    assert os.environ[SECRET_NAME] == SECRET_VALUE
    worker = os.getpid()
    _denied(await _try(breached, f"open('/proc/{worker}/environ').read()"))
    _denied(await _try(breached, f"open('/proc/{os.getppid()}/environ').read()"))
    _denied(await _try(breached, "open('/proc/1/environ').read()"))
    _denied(await _try(breached, "open('/proc/self/environ').read()"))
    _denied(await _try(breached, "os.listdir('/proc')"))
    env = await _try(breached, "dict(os.environ)")
    assert env.startswith("ALLOWED") and SECRET_NAME not in env and SECRET_VALUE not in env
    # The worker is not even nameable: the host is PID 2 of its own PID namespace.
    assert await _try(breached, "(os.getpid(), os.getppid())") == "ALLOWED (2, 1)"


async def test_breach_has_no_network(breached: SubprocessExecutor) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        _denied(await _try(breached, f"socket.create_connection(('127.0.0.1', {port}), timeout=1)"))
        _denied(await _try(breached, "socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)"))
        _denied(await _try(breached, "socket.socketpair()"))
        # raw syscalls, in case the socket module were bypassed: socket(AF_INET, SOCK_STREAM, 0)
        out = await _try(
            breached, "ctypes.CDLL(None, use_errno=True).syscall(41, 2, 1, 0), ctypes.get_errno()"
        )
        assert out == "ALLOWED (-1, 1)", out  # EPERM
        await asyncio.sleep(0.2)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()


async def test_breach_cannot_signal_trace_or_spawn(breached: SubprocessExecutor) -> None:
    worker = os.getpid()
    _denied(await _try(breached, f"os.kill({worker}, signal.SIGTERM)"))
    _denied(await _try(breached, "os.kill(1, signal.SIGKILL)"))
    _denied(await _try(breached, "os.killpg(0, signal.SIGKILL)"))
    _denied(await _try(breached, "os.execv('/bin/sh', ['sh', '-c', 'id'])"))
    _denied(await _try(breached, "subprocess.run(['/bin/sh', '-c', 'id'])"))
    _denied(await _try(breached, "os.fork()"))
    _denied(await _try(breached, "os.setsid()"))
    for call, args in {
        "ptrace": (101, 16, worker, 0, 0),
        "process_vm_readv": (310, worker, 0, 0, 0, 0, 0),
        "unshare": (272, 0x10000000),
        "mount": (165, 0, 0, 0, 0, 0),
        "bpf": (321, 0, 0, 0),
    }.items():
        out = await _try(
            breached, f"ctypes.CDLL(None, use_errno=True).syscall(*{args!r}), ctypes.get_errno()"
        )
        assert out == "ALLOWED (-1, 1)", (call, out)  # EPERM from seccomp
    _denied(await _try(breached, "os.setuid(0)"))
    # The host can still signal itself (glibc's abort does) and is still alive and well.
    assert (await _try(breached, "os.kill(os.getpid(), 0)")) == "ALLOWED None"
    follow = await breached.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n"


async def test_other_architectures_and_x32_are_killed() -> None:
    """The filter's first instructions: a foreign audit arch or an x32 syscall number kills."""
    program = seccomp_program("x86_64", 2)
    first = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, 32, 8)]
    assert first[0] == (0x20, 0, 0, 4)  # load arch
    assert first[1][3] == 0xC000003E and first[1][1] == 0  # jump to kill on mismatch
    assert first[3][0] == 0x35 and first[3][3] == 0x40000000  # x32 bit -> kill
    assert struct.unpack("=I", program[-4:])[0] == 0x80000000  # last instruction: KILL_PROCESS


async def test_a_forged_frame_fails_only_that_cell(breached: SubprocessExecutor) -> None:
    """Garbage, and a well-formed reply the worker did not ask for, written on the protocol fd."""
    forge_garbage = "import os\nfor fd in range(3, 12):\n    try: os.write(fd, b'\\x00\\x00\\x00\\x05junk!')\n    except OSError: pass\n"
    result = await breached.run_unguarded(forge_garbage)
    assert not result.ok and result.error_kind == "crash" and "not valid JSON" in (result.error or ""), result
    assert not breached.alive
    follow = await breached.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n" and follow.host_restarted
    frame = json.dumps({"ok": True, "stdout": "FORGED", "n": -1}).encode()
    forge_reply = (
        f"import os, struct\nframe = {frame!r}\n"
        "for fd in range(3, 12):\n    try: os.write(fd, struct.pack('>I', len(frame)) + frame)\n"
        "    except OSError: pass\n"
    )
    result = await breached.run_unguarded(forge_reply)
    assert not result.ok and "does not answer the request" in (result.error or ""), result
    assert "FORGED" not in result.stdout
    follow = await breached.run_cell("print(3)")
    assert follow.ok and follow.stdout == "3\n"


async def test_a_breached_session_cannot_touch_another_sessions_journal(
    tmp_path: Path, trace_file: str
) -> None:
    journal_root = tmp_path / "journals"
    sessions = SessionManager(journal_root, pool_size=0, fsync=False, isolation="auto")
    kw: dict[str, Any] = {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {},
        "limits": TEST_LIMITS,
    }
    try:
        assert (await sessions.run_cell("victim", 1, "x = 41", **kw)).ok
        victim_entry = journal_root / "victim" / "00000001.json"
        before = victim_entry.read_bytes()
        attacker = SubprocessExecutor(TEST_LIMITS, isolation="auto", unguarded_for_tests=True)
        await attacker.start(trace_file, "auto", {})
        try:
            payload = json.dumps({"seq": 1, "code": "x = 'pwned'"})
            out = await _try(attacker, f"open({str(victim_entry)!r}, 'w').write({payload!r})")
            _denied(out)
            _denied(await _try(attacker, f"os.unlink({str(victim_entry)!r})"))
        finally:
            await attacker.close()
        assert victim_entry.read_bytes() == before
        await sessions.close_session("victim")  # its next cell rebuilds from the journal
        r = await sessions.run_cell("victim", 2, "print(x + 1)", **kw)
        assert r.ok and r.stdout == "42\n" and r.host_restarted
    finally:
        await sessions.close_all()


@pytest.mark.parametrize("layer", ["landlock", "seccomp"])
async def test_a_missing_required_layer_refuses_to_run_cells(layer: str, trace_file: str) -> None:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="auto", missing_for_tests=(layer,))
    with pytest.raises(
        RuntimeError, match=f"sandbox isolation unavailable: {layer}.*RR_SANDBOX_ISOLATION=language-only"
    ):
        await ex.start(trace_file, "auto", {})
    assert not ex.alive
    await ex.close()


async def test_missing_namespaces_are_reported_not_fatal_unless_strict(trace_file: str) -> None:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="auto", missing_for_tests=("namespaces",))
    await ex.start(trace_file, "auto", {})
    try:
        assert "namespaces" in ex.isolation["missing"] and "seccomp" in ex.isolation["layers"]
        r = await ex.run_cell("print(len(traces['steps']))")
        assert r.ok and r.stdout == "3\n"
    finally:
        await ex.close()
    strict = SubprocessExecutor(TEST_LIMITS, isolation="strict", missing_for_tests=("namespaces",))
    with pytest.raises(RuntimeError, match="strict isolation: namespaces"):
        await strict.start(trace_file, "auto", {})
    await strict.close()


async def test_language_only_is_an_explicit_opt_out(trace_file: str) -> None:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="language-only", unguarded_for_tests=True)
    await ex.start(trace_file, "auto", {})
    try:
        assert ex.isolation["mode"] == "language-only" and ex.isolation["layers"] == []
        r = await ex.run_cell("print(len(traces['steps']))")
        assert r.ok and r.stdout == "3\n"
        # Without the OS layer, a breach reads files: exactly why this mode must be chosen explicitly.
        assert (await _try(ex, "len(open('/etc/hostname').read()) >= 0")).startswith("ALLOWED")
    finally:
        await ex.close()
    assert IsolationReport(mode="language-only").summary().startswith("language-only")
    with pytest.raises(ValueError, match="RR_SANDBOX_ISOLATION must be one of"):
        parse_mode("off")


async def test_limits_and_the_cpu_budget_still_apply_inside_the_namespaces(trace_file: str) -> None:
    """The host is not PID 1 (a PID-namespace init ignores SIGXCPU): the CPU budget still kills."""
    limits = SandboxLimits(cell_timeout_s=20, cpu_seconds_per_cell=1, memory_bytes=512 * 1024**2)
    ex = SubprocessExecutor(limits, isolation="auto")
    await ex.start(trace_file, "auto", {})
    try:
        r = await ex.run_cell("n = 0\nwhile True:\n    n += 1")
        assert r.error_kind == "timeout" and "CPU budget" in (r.error or ""), r
        r = await ex.run_cell("x = 'a' * (1024**3)")
        assert r.error_kind == "memory", r
        r = await ex.run_cell("print('alive')")
        assert r.ok and r.stdout == "alive\n"
    finally:
        await ex.close()


async def test_archives_are_read_by_the_worker_never_by_the_host(tmp_path: Path, trace_file: str) -> None:
    import hashlib

    data = json.dumps([{"role": "user", "content": "archived"}]).encode()
    sha = hashlib.sha256(data).hexdigest()
    blob = tmp_path / "blobs" / "sha256" / sha[:2] / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    ex = SubprocessExecutor(
        TEST_LIMITS,
        archive_root=tmp_path / "blobs",
        archive_allowed={sha}.__contains__,
        isolation="auto",
        unguarded_for_tests=True,
    )
    await ex.start(trace_file, "auto", {})
    try:
        r = await ex.run_cell(f"history.extend(ARCHIVE({sha!r}))\nprint(history[0]['content'])")
        assert r.ok and r.stdout == "archived\n", r
        _denied(await _try(ex, f"open({str(blob)!r}).read()"))  # the host itself cannot reach the store
        # A breached host asking the worker for something else gets a refusal, never a file.
        ask = (
            "import json, struct\n"
            "host = [o for o in __import__('gc').get_objects() if type(o).__name__ == 'Host'][0]\n"
            "print(host.ask({'what': 'file', 'path': '/etc/passwd'})[0])\n"
            "print(host.ask({'what': 'archive', 'sha256': '../../etc/passwd'})[0])\n"
        )
        out = await ex.run_unguarded(ask)
        assert out.ok and "unknown question" in out.stdout and "64 lowercase hex" in out.stdout, out
        assert "root:" not in out.stdout
        follow = await ex.run_cell("print(len(history))")
        assert follow.ok and follow.stdout == "1\n"
    finally:
        await ex.close()


async def test_a_breached_host_cannot_make_the_worker_read_unbounded_bytes(
    breached: SubprocessExecutor,
) -> None:
    """A snapshot reply claiming more bytes than the host could ever hold stops that host."""
    lie = (
        "import gc\n"
        "host = [o for o in gc.get_objects() if type(o).__name__ == 'Host'][0]\n"
        "host.snapshot = lambda: ({'ok': True, 'size': 10**12}, None)\n"
    )
    assert (await breached.run_unguarded(lie)).ok
    blob, resp = await breached.snapshot()
    assert blob is None and not resp.get("ok") and not breached.alive
    follow = await breached.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n" and follow.host_restarted


_NON_ROOT_SCRIPT = """
import asyncio, json, os, sys
sys.path.insert(0, sys.argv[1])
from sandbox.executor import SubprocessExecutor
from sandbox.protocol import SandboxLimits
async def main():
    ex = SubprocessExecutor(SandboxLimits(cell_timeout_s=5), python=sys.executable, unguarded_for_tests=True)
    await ex.start(sys.argv[2], "auto", {})
    cell = await ex.run_cell("print(len(traces['steps']))")
    breach = await ex.run_unguarded(
        "import os\\ntry:\\n    print(open(%r).read())\\nexcept OSError as e:\\n    print('denied', e.errno)" % sys.argv[3])
    print(json.dumps({"isolation": ex.isolation, "cell": cell.stdout, "breach": breach.stdout}))
    await ex.close()
asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a worker as another user")
def test_a_non_root_worker_gets_user_namespaces_and_the_same_lockdown() -> None:
    """The unprivileged path: the host creates a user namespace first, then the others."""
    import shutil
    import tempfile

    python, setpriv = "/usr/bin/python3", shutil.which("setpriv")
    if not (os.path.exists(python) and setpriv):
        pytest.skip("needs a system Python readable by an unprivileged user, and setpriv")
    repo = str(Path(__file__).resolve().parents[2])
    if not all(os.stat(p).st_mode & 0o005 == 0o005 for p in Path(repo).parents):
        pytest.skip("the checkout is not readable by other users")
    base = Path(tempfile.mkdtemp(prefix="rr-nonroot-"))  # pytest's tmp dirs are root-only
    try:
        _run_as_non_root(base, python, setpriv, repo)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run_as_non_root(base: Path, python: str, setpriv: str, repo: str) -> None:
    import subprocess

    work = base / "nonroot"
    work.mkdir()
    trace = work / "trace.json"
    trace.write_text(json.dumps({"question": "q", "steps": [{"role": "user", "content": "hi"}] * 2}))
    trace.chmod(0o600)
    secret = work / "secret"
    secret.write_text(SECRET_VALUE)
    script = work / "run.py"
    script.write_text(_NON_ROOT_SCRIPT)
    for path in (base, work, script):
        path.chmod(0o755)
    subprocess.run(["chown", "-R", "1000:1000", str(work)], check=True)
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
            str(secret),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    layers = out["isolation"]["layers"]
    assert [x for x in layers if x != "cgroup"][:2] == ["userns", "namespaces"] and "seccomp" in layers, out
    # the host's uid inside its namespace: a subordinate one where the machine gives the worker a range
    # (tests/sandbox/test_host_trust.py), else the worker's own (reported missing)
    assert out["isolation"]["uid"] in (1, 1000), out
    assert out["cell"] == "2\n"
    assert out["breach"].startswith("denied") and SECRET_VALUE not in out["breach"], out


async def test_a_host_choosing_its_exit_status_cannot_stall_the_worker(breached: SubprocessExecutor) -> None:
    """Exit status 128+SIGSTOP must not make the supervisor stop itself (the worker would wait forever)."""
    import signal
    import time

    t0 = time.monotonic()
    result = await breached.run_unguarded(f"import os\nos._exit(128 + {int(signal.SIGSTOP)})")
    assert not result.ok and result.error_kind == "crash", result
    assert time.monotonic() - t0 < 10
    follow = await breached.run_cell("print(1+1)")
    assert follow.ok and follow.stdout == "2\n"
