"""The fork server behind `tests.support.prefork`: a Python process that imports rr's worker stack once and
then forks one child per request, which runs `python -m MODULE`, `python SCRIPT` or the `rr` console script as
a fresh interpreter would (`python -c CODE` too), with the requester's argv, environment, working directory and standard streams.

Why: about 300 processes of the suite import the worker stack (pydantic-ai's Temporal integration, temporalio,
rr), ~1.6 s of CPU each before they do anything; forked from here they start with it imported.

`python -m tests.support.prefork_server SOCKET_PATH`. A request is one message on the Unix socket: a 4-byte
length, a JSON header and the child's stdin, stdout and stderr as passed file descriptors. The server answers
`{"pid": N}` once the child is forked and `{"status": S, "cpu_s": C}` (the `wait4` status and the child's user +
system CPU) once it has ended, on the same connection. It ends with the process that started it.

A child differs from an exec'd interpreter in what it cannot change after start: the modules already imported,
`sys.flags` (so `tests.support.prefork` forks only for plain `python -m`/script/`rr` command lines with no
interpreter options and no `PYTHON*` variable other than the ones handled below), and the hash seed.
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import types
from typing import Any

PRELOAD = (
    "reflector",
    "reflector.cli",
    "reflector.client",
    "reflector.testing.scripted",
    "worker",
    "activities",
    "workflows",
    "sandbox",
)
_HEADER = struct.Struct("!I")
_MAX_HEADER = 16 * 1024 * 1024


def _recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if len(data) < _HEADER.size:
        raise ConnectionError("short request")
    (size,) = _HEADER.unpack_from(data)
    if size > _MAX_HEADER:
        raise ConnectionError("request too large")
    body = bytearray(data[_HEADER.size :])
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("request cut short")
        body += more
    return json.loads(body), list(fds)


def _send(conn: socket.socket, message: dict[str, float]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the requester is gone; its child runs on regardless
        pass


def serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Accept requests until the parent ends (then exit); return only in a forked child, with its request."""
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    parent = os.pidfd_open(os.getppid())
    sel.register(parent, selectors.EVENT_READ, "parent")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                sys.exit(0)
            if key.data == "accept":
                conn, _addr = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, ValueError) as e:
                    print(f"bad request: {e}", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    os.close(parent)
                    for pidfd, (_pid, other) in children.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    return request, fds
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, "child")
                _send(conn, {"pid": pid})
                continue
            pidfd = key.fd
            pid, conn = children.pop(pidfd)
            sel.unregister(pidfd)
            os.close(pidfd)
            _, status, usage = os.wait4(pid, 0)
            _send(conn, {"status": status, "cpu_s": usage.ru_utime + usage.ru_stime})
            conn.close()


def _stdio(env: dict[str, str]) -> None:
    """New standard streams on fds 0-2, made as CPython makes them at start (the server's were made for its own
    streams): UTF-8 unless PYTHONIOENCODING says otherwise, stdout buffered unless a tty or PYTHONUNBUFFERED,
    stderr line-buffered with backslashreplace."""
    encoding, _, errors = env.get("PYTHONIOENCODING", "utf-8").partition(":")
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))

    def stream(fd: int, write: bool, errors_default: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
        buffered: Any = raw
        if not (write and unbuffered):
            buffered = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
        return io.TextIOWrapper(
            buffered,
            encoding=encoding or "utf-8",
            errors=errors or errors_default,
            line_buffering=line or raw.isatty(),
            write_through=write and unbuffered,
        )

    for name, stream_ in (
        ("stdin", stream(0, False, "strict", False)),
        ("stdout", stream(1, True, "strict", False)),
        ("stderr", stream(2, True, "backslashreplace", True)),
    ):
        setattr(sys, name, stream_)
        setattr(sys, f"__{name}__", stream_)


def become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the requester's session, streams, directory, environment and argv."""
    if request.get("new_session"):
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _stdio(env)
    kind, target = request["kind"], request["target"]
    if kind == "module":
        first = os.getcwd()
    elif kind == "code":
        first = ""  # as `python -c` puts it: the working directory, whatever it becomes
    else:
        first = os.path.dirname(os.path.abspath(target))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *(os.path.abspath(p) for p in extra), *sys.path[1:]]
    sys.argv[:] = ["-c" if kind == "code" else target, *request["args"]]


def run(request: dict[str, Any]) -> None:
    if request["kind"] == "module":
        sys.argv[0] = "-m"  # runpy sets the module's file
        runpy.run_module(request["target"], run_name="__main__", alter_sys=True)
    elif (
        request["kind"] == "code"
    ):  # `python -c CODE`: a new __main__ module, the code compiled as "<string>"
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        exec(compile(request["target"], "<string>", "exec"), main.__dict__)
    else:
        runpy.run_path(request["target"], run_name="__main__")


if __name__ == "__main__":
    child_request, child_fds = serve(sys.argv[1])
    become(child_request, child_fds)
    run(child_request)
