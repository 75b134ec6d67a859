"""The worker's end of the host fork server (`sandbox.zygote`): one zygote per event loop and python.

`sandbox.executor` launches hosts through it (`_zygote(python)`, then `_Zygote.spawn`); a host it forked
is a `_ForkedProcess`, the parts of `asyncio.subprocess.Process` the executor uses. Whether hosts are
forked at all is the caller's choice (`SubprocessExecutor(zygote=...)`; the worker's
`RR_SANDBOX_ZYGOTE`, read in `reflector.runtime.settings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import tempfile

from sandbox.wire import WORKDIR_PREFIX, host_env

__all__ = ["close_zygotes"]

log = logging.getLogger(__name__)


class _PipeEnd:
    """The file object a loop's pipe transport gets for our end of a host's stdin or stdout pipe.

    A transport closes its pipe when it is closed; how differs by loop. asyncio's calls `pipe.close()`, which must
    close the fd. uvloop's (0.23) gives the fd to libuv, which closes it, and then calls `pipe.close()` too: with an
    `os.fdopen` file object that closed the fd number a second time (MagicStack/uvloop#763), and in a worker whose
    other threads open files all the time that number was often already someone else's: a blob read failed with
    EBADF, and once the worker died of SIGABRT (libuv aborting on an fd it was polling closed under it).

    So `close()` closes the fd only if it is still this pipe end: closed already (EBADF), or reused for another file
    (another inode), it is not ours any more. Nothing else in this process holds either end of a host's pipes (the
    other ends went to the zygote), so an fd that is this pipe's inode is this one, whichever loop closed or not."""

    def __init__(self, fd: int) -> None:
        st = os.fstat(fd)
        self._fd, self._inode = fd, (st.st_dev, st.st_ino)

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("I/O operation on a closed pipe end")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            st = os.fstat(fd)
        except OSError:
            return  # the transport's loop closed it
        if (st.st_dev, st.st_ino) == self._inode:
            os.close(fd)

    def __repr__(self) -> str:
        return f"<host pipe end fd={self._fd}>"


class _ForkedProcess:
    """The parts of `asyncio.subprocess.Process` the executor uses, for a host forked by the zygote
    (`sandbox.zygote`): the zygote is its parent and reports its exit status."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._transport: asyncio.BaseTransport | None = None  # the stdin pipe's (closed by _close_pipes)
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _set_exit(self, rc: int) -> None:
        if self.returncode is None:
            self.returncode = rc
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class _Zygote:
    """The worker's end of the fork server: started on first use, one per event loop.

    If it cannot be started or dies, hosts are started with `python -m sandbox.host` as before (and a
    new zygote is tried for the next one). Hosts it started whose exit it can no longer report (it
    died) are watched through a pidfd, their status then unknown (reported as -SIGKILL)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._children: dict[int, _ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before the spawn reply was handled
        self._send_lock = asyncio.Lock()  # requests leave in the order they were made
        self._write_wait: asyncio.Future[None] | None = None  # a sender waiting for room (`_writable`)
        self._workdir = ""

    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        try:
            with open(os.path.join(workdir, "zygote.stderr"), "wb") as log_fh:
                self._proc = await asyncio.create_subprocess_exec(
                    self.python,
                    "-S",
                    "-s",
                    "-B",
                    "-m",
                    "sandbox.zygote",
                    str(child.fileno()),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log_fh,
                    cwd=workdir,
                    env=host_env(workdir),
                    pass_fds=[child.fileno()],
                    start_new_session=True,
                )
        finally:
            child.close()
        self._workdir = workdir
        parent.setblocking(False)
        self._sock = parent
        self.loop.add_reader(parent.fileno(), self._on_readable)

    @property
    def alive(self) -> bool:
        return self._sock is not None and asyncio.get_running_loop() is self.loop

    def _on_readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                msg = self._sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                self._lost()
                return
            try:
                obj = json.loads(msg)
            except ValueError:
                continue
            if "spawned" in obj or "failed" in obj:
                fut = self._pending.pop(int(obj.get("spawned") or obj.get("failed") or 0), None)
                if fut is not None and not fut.done():
                    if "spawned" in obj:
                        fut.set_result(int(obj["pid"]))
                    else:
                        fut.set_exception(
                            RuntimeError(f"the zygote could not fork a host: {obj.get('error')}")
                        )
            elif "exited" in obj:
                pid, rc = int(obj["exited"]), int(obj["returncode"])
                child = self._children.pop(pid, None)
                if child is not None:
                    child._set_exit(rc)
                else:
                    self._early[pid] = rc

    def _lost(self) -> None:
        """The zygote is gone: fail what waits on it, watch its orphans through pidfds."""
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self._sock.fileno())
            if self._write_wait is not None:
                with contextlib.suppress(Exception):
                    self.loop.remove_writer(self._sock.fileno())
                if not self._write_wait.done():
                    self._write_wait.set_result(None)  # the sender sees the socket gone
            self._sock.close()
            self._sock = None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RuntimeError("the zygote exited"))
        self._pending.clear()
        for pid, child in list(self._children.items()):
            self._watch_orphan(pid, child)
        self._children.clear()

    def _watch_orphan(self, pid: int, child: _ForkedProcess) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            child._set_exit(-signal.SIGKILL)
            return

        def done() -> None:
            self.loop.remove_reader(fd)
            os.close(fd)
            child._set_exit(-signal.SIGKILL)

        self.loop.add_reader(fd, done)

    async def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, stderr_path: str, timeout_s: float
    ) -> _ForkedProcess:
        assert self._sock is not None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        spawn_id = next(self._ids)
        fut: asyncio.Future[int] = self.loop.create_future()
        self._pending[spawn_id] = fut
        msg = json.dumps({"spawn": spawn_id, "argv": argv, "env": env, "cwd": cwd}).encode()
        try:
            async with asyncio.timeout(timeout_s):
                await self._send(msg, [in_r, out_w, err])
        except BaseException as exc:
            self._pending.pop(spawn_id, None)
            for fd in (in_r, in_w, out_r, out_w, err):
                os.close(fd)
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                self._lost()
            raise
        for fd in (in_r, out_w, err):
            os.close(fd)
        try:
            pid = await asyncio.wait_for(fut, timeout_s)
        except BaseException:
            os.close(in_w)
            os.close(out_r)
            raise
        reader = asyncio.StreamReader(limit=2**16, loop=self.loop)
        await self.loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), _PipeEnd(out_r))
        transport, protocol = await self.loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, _PipeEnd(in_w)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, self.loop)
        proc = _ForkedProcess(pid, writer, reader)
        proc._transport = transport
        if pid in self._early:
            proc._set_exit(self._early.pop(pid))
        elif self._sock is None:
            self._watch_orphan(pid, proc)
        else:
            self._children[pid] = proc
        return proc

    async def _send(self, msg: bytes, fds: list[int]) -> None:
        """Send one request, in the order callers asked, waiting while the zygote's queue is full.

        The socket is non-blocking and its send buffer holds ~100 requests the zygote has not read yet:
        a burst of spawns (hundreds of reflections reaching their first cell together) fills it while
        the zygote forks, and the next send fails with EAGAIN. That is back pressure, not a dead
        zygote (taking it for one made every host of the burst start directly, at ~10x the CPU, and
        restarted the zygote): wait until the socket is writable again and send then."""
        async with self._send_lock:
            while True:
                if self._sock is None:
                    raise RuntimeError("the zygote exited")
                try:
                    socket.send_fds(self._sock, [msg], fds)
                    return
                except BlockingIOError:
                    await self._writable()

    async def _writable(self) -> None:
        """Until the socket can take a message, or the zygote is lost (`_lost` wakes this)."""
        assert self._sock is not None
        fd = self._sock.fileno()
        ready: asyncio.Future[None] = self.loop.create_future()
        self._write_wait = ready

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self.loop.add_writer(fd, wake)
        try:
            await ready
        finally:
            self._write_wait = None
            if self._sock is not None:
                self.loop.remove_writer(fd)

    def abandon(self) -> None:
        """Let go without awaiting anything (its loop is closed, or it died): closing the socket ends the fork
        server (EOF); its dir goes."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    async def close(self) -> None:
        """Stop the fork server. Hosts it started that still run (another runtime's on this loop: a worker's,
        when an `areflect` call beside it ends) keep running, their exits watched through pidfds from now
        on: left in `_children`, nothing would ever report them and closing their sessions would hang."""
        self._lost()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(Exception):
                await self._proc.wait()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)


# one per (python, event loop): a zygote's socket reader and its hosts' pipes belong to the loop that
# started it, and another loop must never touch them (a sync `reflect()` runs its own loop beside a
# program's, or a test session's, long-lived one)
_zygotes: dict[tuple[str, asyncio.AbstractEventLoop], _Zygote] = {}
_starting: dict[tuple[str, asyncio.AbstractEventLoop], asyncio.Lock] = {}


def _forget_closed_loops() -> None:
    """Drop the zygotes of event loops that have closed (an `asyncio.run` that ended without
    `close_zygotes`): closing the socket ends the fork server (EOF); nothing of theirs can be awaited."""
    for key, z in list(_zygotes.items()):
        if z.loop.is_closed():
            del _zygotes[key]
            z.abandon()
    for key in [k for k in _starting if k[1].is_closed()]:
        del _starting[key]


def running_zygote(python: str) -> _Zygote | None:
    """This event loop's zygote for `python`, if it has one (for tests and diagnostics)."""
    return _zygotes.get((python, asyncio.get_running_loop()))


async def close_zygotes() -> None:
    """Stop this event loop's host fork servers (the hosts they started are stopped by their sessions)."""
    loop = asyncio.get_running_loop()
    for key, z in list(_zygotes.items()):
        if z.loop is loop:
            del _zygotes[key]
            await z.close()
    _forget_closed_loops()


async def _zygote(python: str) -> _Zygote | None:
    """The running zygote of this event loop for `python`, started if needed; None if it cannot be."""
    if not hasattr(socket, "send_fds"):
        return None
    _forget_closed_loops()
    key = (python, asyncio.get_running_loop())
    z = _zygotes.get(key)
    if z is not None and z.alive:
        return z
    # One start at a time: hosts asked for together (a burst after the zygote died) would each start a
    # zygote, and all but the last stored would run on unreferenced, their work dirs left behind.
    async with _starting.setdefault(key, asyncio.Lock()):
        z = _zygotes.get(key)
        if z is not None and z.alive:
            return z
        if z is not None:  # this loop's zygote died
            z.abandon()
        z = _Zygote(python)
        try:
            await z.start()
        except OSError as exc:
            log.warning("sandbox: cannot start the host fork server (%s); starting hosts one by one", exc)
            return None
        _zygotes[key] = z
        return z
