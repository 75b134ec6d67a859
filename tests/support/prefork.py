"""`Popen` and `run` as in `subprocess`, for the suite's Python processes that import rr's worker stack: the
process is forked from a fork server that imported it once (`tests.support.prefork_server`) instead of a new
interpreter paying ~1.6 s of CPU for the same imports. Everything else is a process of its own as before: its
own pid (signals and `os.kill`/`os.killpg` reach it), session (`start_new_session`), streams, working
directory, environment and argv, and the same interpreter exit (atexit, thread joins, finalization).

Only plain command lines are forked: `[python, "-m", MODULE, ...]`, `[python, "-c", CODE, ...]`,
`[python, SCRIPT.py, ...]` and `[.../rr, ...]` (the console script), with no interpreter options and no `PYTHON*` variable the server cannot
honour after start. Anything else, and every command when `RR_TESTS_EXEC=1` is set, runs through
`subprocess` as usual. Tests whose subject is the interpreter's start itself (what a fresh process imports,
the installed wheel) call `subprocess` directly.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct("!I")
# what the forked child can honour (prefork_server._stdio, become); any other PYTHON* variable means exec
_HONOURED = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE"}


class _Server:
    """One fork server per test process, started on first use and ended with it."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="rr-prefork-")
        self.path = os.path.join(self._dir, "s")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_", "PYTHON"))}
        self._log = open(os.path.join(self._dir, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.prefork_server", self.path],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self._log.seek(0)
            raise RuntimeError(f"the fork server did not start: {line!r}\n{self._log.read()[-3000:]}")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        for name in ("s", "server.log"):
            try:
                os.unlink(os.path.join(self._dir, name))
            except FileNotFoundError:
                pass
        os.rmdir(self._dir)


_server: _Server | None = None
_server_lock = threading.Lock()
_unavailable: str | None = None  # why the fork server cannot run here (then every command is exec'd)


def _the_server() -> _Server | None:
    """This process's fork server (started on first use, again if it died); None where it cannot start (a
    kernel without pidfds, say), once warned: the commands then run as fresh interpreters."""
    global _server, _unavailable
    with _server_lock:
        if _unavailable is None and (_server is None or _server.proc.poll() is not None):
            try:
                _server = _Server()
            except (OSError, RuntimeError) as e:
                _unavailable = str(e)[-2000:]
                warnings.warn(f"no fork server, every process is exec'd: {_unavailable}", stacklevel=3)
        return None if _unavailable is not None else _server


def available() -> bool:
    """Whether commands are forked here (not RR_TESTS_EXEC=1, and the fork server runs)."""
    return os.environ.get("RR_TESTS_EXEC") != "1" and _the_server() is not None


def _plan(args: Sequence[str], env: dict[str, str] | None) -> tuple[str, str, list[str]] | None:
    """(kind, target, rest) when `args` can be forked, else None."""
    if os.environ.get("RR_TESTS_EXEC") == "1" or isinstance(args, (str, bytes)):
        return None
    args = [os.fspath(a) for a in args]
    if any(k.startswith("PYTHON") and k not in _HONOURED for k in (os.environ if env is None else env)):
        return None
    if not args:
        return None
    exe = Path(args[0])
    if exe.name == "rr" and exe.parent == Path(sys.executable).parent:
        return ("script", str(exe), args[1:])
    if os.path.realpath(args[0]) != os.path.realpath(sys.executable) or len(args) < 2:
        return None
    if args[1] in ("-m", "-c") and len(args) >= 3:
        return ("module" if args[1] == "-m" else "code", args[2], args[3:])
    if not args[1].startswith("-") and args[1].endswith(".py"):
        return ("script", args[1], args[2:])
    return None


class Popen(subprocess.Popen[Any]):
    """`subprocess.Popen` whose child is forked by the fork server when the command line allows it."""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        self._plan = None
        if (
            not rest
            and not kwargs.get("shell")
            and not kwargs.get("preexec_fn")
            and not kwargs.get("pass_fds")
        ):
            self._plan = _plan(args, kwargs.get("env"))
        self._server = _the_server() if self._plan is not None else None
        if self._server is None:
            self._plan = None
        self._status: socket.socket | None = None
        self.forked = (
            False  # True once the fork server forked the child (its CPU is then `cpu_s`, not wait4's)
        )
        self.cpu_s: float | None = None  # a forked child's user + system CPU, once it has ended
        self._pending = b""
        super().__init__(args, *rest, **kwargs)

    def _execute_child(
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: Any,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: Any,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: Any,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: Any,
        start_new_session: bool,
        process_group: Any,
    ) -> None:
        if self._plan is None:
            super()._execute_child(  # type: ignore[misc]
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids,
                uid, umask, start_new_session, process_group,
            )  # fmt: skip
            return
        kind, target, rest = self._plan
        if gid is not None or gids is not None or uid is not None or umask not in (None, -1):
            raise ValueError("the fork server cannot change ids or umask; use subprocess")
        child_env = dict(os.environ if env is None else env)
        child_env = {os.fsdecode(k): os.fsdecode(v) for k, v in child_env.items()}
        request = {
            "kind": kind,
            "target": target,
            "args": rest,
            "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
            "env": child_env,
            "new_session": bool(start_new_session or process_group == 0),
        }
        body = json.dumps(request).encode()
        fds = [
            p2cread if p2cread != -1 else 0,
            c2pwrite if c2pwrite != -1 else 1,
            errwrite if errwrite != -1 else 2,
        ]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            assert self._server is not None
            conn.connect(self._server.path)
            socket.send_fds(conn, [_HEADER.pack(len(body)) + body[: 65536 - _HEADER.size]], fds)
            if len(body) > 65536 - _HEADER.size:
                conn.sendall(body[65536 - _HEADER.size :])
            started = self._read_message(conn, block=True)
            assert started is not None
            self.pid = int(started["pid"])
        except BaseException:
            conn.close()
            raise
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
        self._child_created = True
        self._status = conn
        self.forked = True

    def _read_message(self, conn: socket.socket, *, block: bool) -> dict[str, float] | None:
        while b"\n" not in self._pending:
            if not block:
                conn.setblocking(False)
                try:
                    part = conn.recv(4096)
                except BlockingIOError:
                    return None
                finally:
                    conn.setblocking(True)
            else:
                part = conn.recv(4096)
            if not part:
                raise ChildProcessError("the fork server ended before reporting the child's end")
            self._pending += part
        line, _, self._pending = self._pending.partition(b"\n")
        message: dict[str, float] = json.loads(line)
        return message

    def _forked_wait(self, wait_flags: int) -> tuple[int, int]:
        assert self._status is not None
        message = self._read_message(self._status, block=not wait_flags & os.WNOHANG)
        if message is None:
            return (0, 0)
        self._status.close()
        self.cpu_s = float(message["cpu_s"])
        return (self.pid, int(message["status"]))

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._status is None:
            return super()._try_wait(wait_flags)  # type: ignore[misc]
        return self._forked_wait(wait_flags)

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        if self._status is None:
            return super()._internal_poll(_deadstate)  # type: ignore[misc]
        if self.returncode is None and self._waitpid_lock.acquire(False):  # type: ignore[attr-defined]
            try:
                if self.returncode is None and self._status.fileno() != -1:
                    pid, sts = self._forked_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(sts)  # type: ignore[attr-defined]
            except ChildProcessError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()  # type: ignore[attr-defined]
        return self.returncode


def run(
    args: Any,
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` over this module's `Popen`."""
    if input is not None:
        if kwargs.get("stdin") is not None:
            raise ValueError("stdin and input arguments may not both be used.")
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        retcode = process.poll()
        if check and retcode:
            raise subprocess.CalledProcessError(retcode, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, retcode if retcode is not None else -1, stdout, stderr)


_SHIM = """#!{python} -IS
# `rr` forked by the suite's fork server (tests/support/prefork.py): written for the docs blocks, whose shell
# commands call `rr` from PATH. It passes its argv, environment, directory and streams to the server, forwards
# the signals a shell or a test sends it to the forked `rr`, and ends as that `rr` ended. Where the server
# cannot honour the environment (a PYTHON* variable) or is gone, it execs the real `rr`.
import json, os, signal, socket, struct, sys

RR = {rr!r}
SOCKET = {socket!r}
HONOURED = {honoured!r}


def exec_real():
    os.execv(RR, [RR, *sys.argv[1:]])


if any(k.startswith("PYTHON") and k not in HONOURED for k in os.environ):
    exec_real()
body = json.dumps({{"kind": "script", "target": RR, "args": sys.argv[1:], "cwd": os.getcwd(),
                   "env": dict(os.environ), "new_session": False}}).encode()
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(SOCKET)
except OSError:
    exec_real()
head = 65536 - 4
socket.send_fds(conn, [struct.pack("!I", len(body)) + body[:head]], [0, 1, 2])
if len(body) > head:
    conn.sendall(body[head:])
replies = conn.makefile("rb")
pid = json.loads(replies.readline())["pid"]
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, lambda s, _frame: os.kill(pid, s))
line = replies.readline()
if not line:
    sys.exit("rr (fork-server shim): the fork server ended before the forked rr did")
status = json.loads(line)["status"]
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
"""


def write_rr_shim(directory: Path) -> Path:
    """An executable `rr` in `directory` that runs this venv's `rr` forked by this process's fork server (for
    commands a shell runs, as the docs blocks are); put `directory` first on PATH. Returns the shim's path."""
    server = _the_server()
    if server is None:
        raise RuntimeError(f"no fork server here: {_unavailable}")
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "rr"
    shim.write_text(
        _SHIM.format(
            python=sys.executable,
            rr=str(Path(sys.executable).parent / "rr"),
            socket=server.path,
            honoured=sorted(_HONOURED),
        )
    )
    shim.chmod(0o755)
    return shim
