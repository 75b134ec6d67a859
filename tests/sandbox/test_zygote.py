"""Hosts forked from the worker's zygote (`sandbox/zygote.py`): they are the zygote's children, hold
exactly the fds a directly started host holds, and a dead zygote costs nothing but its speed-up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from sandbox import zygote_client
from sandbox.confinement import landlock_abi
from sandbox.executor import SubprocessExecutor
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform != "linux" or landlock_abi() < 1, reason="needs Linux with Landlock"),
]

OPEN_FDS = (
    "import os\n"
    "fds = []\n"
    "for fd in range(256):\n"
    "    try:\n"
    "        os.fstat(fd)\n"
    "        fds.append(fd)\n"
    "    except OSError:\n"
    "        pass\n"
    "print(fds)\n"
)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _ancestors(pid: int) -> list[int]:
    """pid's parent, grandparent, ... up to this test process (the host runs under its supervisor)."""
    out = []
    while pid > 1 and pid != os.getpid():
        pid = _ppid(pid)
        out.append(pid)
    return out


def _zygote_pid() -> int:
    z = zygote_client.running_zygote(sys.executable)
    assert z is not None and z._proc is not None
    return z._proc.pid


async def _started(trace_file: str, **kw: object) -> SubprocessExecutor:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="auto", **kw)  # type: ignore[arg-type]
    await ex.start(trace_file, "auto", {"task": {"question": "q"}})
    return ex


async def test_hosts_are_forks_of_one_zygote(trace_file: str) -> None:
    a, b = await _started(trace_file), await _started(trace_file)
    try:
        zygote = _zygote_pid()
        assert a.host_pid is not None and b.host_pid is not None
        assert zygote in _ancestors(a.host_pid) and zygote in _ancestors(b.host_pid)
        assert _ppid(zygote) == os.getpid()
        assert b"sandbox.zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes()
        assert (await a.run_cell("x = 6 * 7\nprint(x)")).stdout.strip() == "42"
    finally:
        await a.close()
        await b.close()


async def test_a_forked_host_holds_the_fds_of_a_directly_started_one(trace_file: str) -> None:
    """Assuming the breach (guards off): nothing of the zygote (its socket to the worker, its pipes)
    leaks into a host."""
    seen = {}
    for zygote in ("1", "0"):
        ex = await _started(trace_file, unguarded_for_tests=True, zygote=zygote == "1")
        try:
            assert ex.host_pid is not None
            forked = zygote_client.running_zygote(sys.executable) is not None and _zygote_pid() in _ancestors(
                ex.host_pid
            )
            assert forked == (zygote == "1")
            result = await ex.run_unguarded(OPEN_FDS)
            assert result.ok, result
            seen[zygote] = result.stdout.strip()
        finally:
            await ex.close()
    assert seen["1"] == seen["0"], seen


async def test_a_dead_zygote_stops_no_host_and_the_next_host_still_starts(trace_file: str) -> None:
    ex = await _started(trace_file)
    try:
        old = _zygote_pid()
        os.kill(old, signal.SIGKILL)
        for _ in range(100):  # the worker notices the zygote's socket closing
            z = zygote_client.running_zygote(sys.executable)
            if z is None or not z.alive:
                break
            await asyncio.sleep(0.02)
        assert (await ex.run_cell("print('still here')")).stdout.strip() == "still here"
    finally:
        await asyncio.wait_for(ex.close(), 10)  # its exit is seen through a pidfd now
    again = await _started(trace_file)
    try:
        assert (await again.run_cell("print(1 + 1)")).stdout.strip() == "2"
        assert again.host_pid is not None and _zygote_pid() != old
        assert _zygote_pid() in _ancestors(again.host_pid)
    finally:
        await again.close()


async def test_a_burst_of_hosts_waits_for_the_zygote_instead_of_losing_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hundreds of reflections reach their first cell together: spawn requests beyond what the zygote's
    socket buffers are back pressure, and every host is still forked by the one zygote (none started
    directly at ~10x the CPU, the zygote not dropped). The buffer is made small here so that a few
    requests fill it (a default one holds ~100 of them)."""
    from sandbox.hostproc import _kill_host, _launch

    await _started_zygote()
    z = zygote_client.running_zygote(sys.executable)
    assert z is not None and z._sock is not None
    sock = z._sock
    default = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)  # the kernel doubles what is set
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    zygote = _zygote_pid()
    os.kill(zygote, signal.SIGSTOP)  # busy forking: it reads nothing while the burst arrives
    try:
        with caplog.at_level("WARNING"):
            burst = asyncio.gather(*(_launch(sys.executable, None) for _ in range(12)))
            await asyncio.sleep(0.3)
            os.kill(zygote, signal.SIGCONT)
            hosts = await burst
    finally:
        os.kill(zygote, signal.SIGCONT)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, default // 2
        )  # the loop's zygote serves other tests
    try:
        assert [r.getMessage() for r in caplog.records if "fork server" in r.getMessage()] == []
        assert all(isinstance(h.proc, zygote_client._ForkedProcess) for h in hosts)
        assert _zygote_pid() == zygote
        assert all(_ppid(h.proc.pid) == zygote for h in hosts)
    finally:
        await asyncio.gather(*(_kill_host(h) for h in hosts))


async def test_hosts_asked_for_together_after_the_zygote_died_start_one_new_zygote() -> None:
    """Every spawn of the burst finds the zygote dead: one new zygote is started and forks them all (not one
    zygote each, all but the last left running unreferenced with their work dirs)."""
    from sandbox.hostproc import _kill_host, _launch

    await _started_zygote()
    before = set(_child_zygotes())  # this process may hold other loops' zygotes (other tests' runtimes)
    os.kill(_zygote_pid(), signal.SIGKILL)
    for _ in range(100):  # the worker notices the zygote's socket closing
        z = zygote_client.running_zygote(sys.executable)
        if z is None or not z.alive:
            break
        await asyncio.sleep(0.02)
    hosts = await asyncio.gather(*(_launch(sys.executable, None) for _ in range(6)))
    try:
        zygote = _zygote_pid()
        assert [_ppid(h.proc.pid) for h in hosts] == [zygote] * len(hosts)
        started = [pid for pid in _child_zygotes() if pid not in before]
        assert started == [zygote], started
    finally:
        await asyncio.gather(*(_kill_host(h) for h in hosts))


def _child_zygotes() -> list[int]:
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _is_child_zygote(pid)]


def _is_child_zygote(pid: int) -> bool:
    try:
        return _ppid(pid) == os.getpid() and b"sandbox.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):
        return False


async def _started_zygote() -> None:
    from sandbox.zygote_client import _zygote

    assert await _zygote(sys.executable) is not None


async def test_another_event_loop_never_touches_this_loops_zygote(trace_file: str) -> None:
    """A sync `reflect()` runs its own event loop (in `asyncio.run`) beside a program's long-lived one.
    Its zygote is its own: before zygotes were kept per loop, the second loop closed the first one's
    socket, the first loop never heard of its hosts' exits again, and closing them hung (seen in CI as
    a session teardown timing out)."""
    ex = await _started(trace_file)
    try:
        mine = _zygote_pid()

        async def elsewhere() -> int:
            other = await _started(trace_file)
            try:
                assert (await other.run_cell("print(2 * 3)")).stdout.strip() == "6"
                return _zygote_pid()
            finally:
                await other.close()
                await zygote_client.close_zygotes()

        theirs = await asyncio.to_thread(asyncio.run, elsewhere())
        assert theirs != mine
        z = zygote_client.running_zygote(sys.executable)
        assert z is not None and z.alive and _zygote_pid() == mine
        assert (await ex.run_cell("print('still mine')")).stdout.strip() == "still mine"
    finally:
        await asyncio.wait_for(ex.close(), 10)  # its exit is reported by its own zygote


async def test_closing_this_loops_zygote_leaves_its_running_hosts_closable(trace_file: str) -> None:
    """`activities.sandbox.release` closes the loop's zygotes when the last held runtime ends (an `areflect`
    call), while a worker's runtime on the same loop, which it does not hold, may still have live hosts.
    Those hosts keep running and their exits are still seen: before, their exit was never reported, and
    closing their session waited for ever (seen as a test session's teardown timing out)."""
    ex = await _started(trace_file)
    try:
        old = _zygote_pid()
        await zygote_client.close_zygotes()
        assert zygote_client.running_zygote(sys.executable) is None
        assert ex.host_pid is not None and old not in _ancestors(ex.host_pid)  # the zygote is gone
        assert (await ex.run_cell("print('still here')")).stdout.strip() == "still here"
    finally:
        await asyncio.wait_for(ex.close(), 10)  # its exit is seen through a pidfd now


def _open_inodes() -> set[tuple[int, int]]:
    """The files this process has open, as (device, inode)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, or one closed meanwhile
            st = os.stat(f"/proc/self/fd/{name}")
            out.add((st.st_dev, st.st_ino))
    return out


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_hosts_pipes_are_closed_once_on_either_event_loop(
    trace_file: str, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker runs on uvloop, whose pipe transports close the fd themselves and then close the file object
    they were given as well (MagicStack/uvloop#763): a host's pipes were closed twice, the second time often
    another thread's file by then (a blob read failed with EBADF; a worker died of SIGABRT). Each pipe end's
    close here first opens a pipe, as another thread would, whose fds take the lowest free numbers (the pipe
    end's own number, if the loop has closed it already): those must survive, and no pipe end may stay open."""
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
    probes: list[int] = []
    ends: list[tuple[int, int]] = []

    class Probe(zygote_client._PipeEnd):
        def __init__(self, fd: int) -> None:
            super().__init__(fd)
            ends.append(self._inode)

        def close(self) -> None:
            probes.extend(os.pipe())  # another thread opening a file at this moment
            super().close()

    monkeypatch.setattr(zygote_client, "_PipeEnd", Probe)

    async def host_lifecycle() -> None:
        ex = await _started(trace_file)
        try:
            assert (await ex.run_cell("print(6 * 7)")).stdout.strip() == "42"
            assert ex.host_pid is not None and _zygote_pid() in _ancestors(
                ex.host_pid
            )  # forked: its pipes are ours
        finally:
            await ex.close()
            await zygote_client.close_zygotes()

    if loop == "uvloop":
        uvloop.run(host_lifecycle())
    else:
        asyncio.run(host_lifecycle())
    assert len(ends) == 2 and len(probes) == 4  # the host's stdin and stdout pipe ends, a probe pipe each
    stolen = []
    for fd in probes:
        try:
            os.fstat(fd)
        except OSError:
            stolen.append(fd)
    for fd in set(probes) - set(stolen):
        os.close(fd)
    assert not stolen, f"closing the host's pipes closed fds {stolen} that were another file's by then"
    assert not set(ends) & _open_inodes(), "a pipe end of the host was never closed"
