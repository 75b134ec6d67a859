"""A fork server for sandbox hosts: one process imports the host's code once, every host is a fork of it.

This module is the fork server itself (run as `python -m sandbox.zygote <fd>`, it imports nothing of
the worker side); the worker's end of it is `sandbox.zygote_client`.

Why: a host started with `python -m sandbox.host` spends ~190 ms of CPU before it can run a cell
(interpreter start, the host's modules, the allowlisted modules it preloads); with 10-step
reflections that was 17 ms per step, a third of everything the worker side spent per step
(bench/throughput.py, BENCHMARKS.md issue 11). A fork of a process that already did it costs a few
ms, and the forks share its pages until they write them.

What a fork changes, and why it is safe:
- The zygote is started like a host (`-S -s -B`, the scrubbed host environment, no secret of the
  worker, its own session) and runs no model code. It is single-threaded, so forking it is sound.
- Each child runs exactly what `python -m sandbox.host` runs after its imports: `sandbox.host.main.main`,
  which enters the namespaces, applies the rlimits and locks itself down (Landlock, seccomp, uid)
  before the first cell. The child gets its own session (`setsid`: the executor kills hosts by
  process group), its stdin/stdout/stderr from the worker (passed over a unix socket), the host's
  environment and working directory, and no other fd of the zygote.
- Every host forked from one zygote has the same memory layout (ASLR is per exec) and the same
  fixed hash seed (as before: PYTHONHASHSEED=0). The OS layer is what keeps hosts apart: they
  cannot see, signal or trace one another (PID namespaces, seccomp).

Protocol (SOCK_SEQPACKET, one JSON object per message): the worker sends
`{"spawn": id, "argv": [...], "env": {...}, "cwd": ...}` with three fds (the host's stdin, stdout,
stderr); the zygote answers `{"spawned": id, "pid": pid}` or `{"failed": id, "error": ...}`, and
`{"exited": pid, "returncode": rc}` (asyncio's convention: -N for signal N) when it reaps a host.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import traceback

__all__ = ["serve", "MAX_MESSAGE"]

MAX_MESSAGE = 1 << 20


def _child(fds: list[int], req: dict[str, object], sock: socket.socket) -> int:
    import sandbox.host.main as host

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    sock.close()
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
    cwd, env, argv = req["cwd"], req["env"], req["argv"]
    assert isinstance(cwd, str) and isinstance(env, dict) and isinstance(argv, list)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    sys.argv = [str(a) for a in argv]
    return host.main(sys.argv)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        rc = os.waitstatus_to_exitcode(status)
        sock.send(json.dumps({"exited": pid, "returncode": rc}).encode())


def serve(sock: socket.socket) -> None:
    """Preload the host's code, then fork a host for every request until the worker closes `sock`."""
    import sandbox.host.main as host

    host._preload()
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([sock.fileno(), r], [], [])
        if r in ready:
            os.read(r, 4096)
            _reap(sock)
        if sock.fileno() not in ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 3)
        except OSError:
            return
        if not msg:
            return  # the worker is gone: hosts already started keep running until it kills them
        req = json.loads(msg)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            sock.send(
                json.dumps({"failed": req.get("spawn"), "error": f"expected 3 fds, got {len(fds)}"}).encode()
            )
            continue
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = _child(fds, req, sock)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                with open(2, "w", closefd=False) as err:
                    traceback.print_exc(file=err)
            os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"spawned": req.get("spawn"), "pid": pid}).encode())
        _reap(sock)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
