"""One embedded Temporal dev server per `RR_HOME`, shared by every process of that home.

Why: the embedded default is shared state (one SQLite file per home, one port). When every `rr` call
started and stopped its own server, two calls at once on one home collided ("address already in use",
SQLite "database is locked", one call's end stopping the server the other still used), a call of
another home connected to whatever answered on port 7233, and a `rr reflect` ended by SIGTERM left its
server running. So a home owns its server:

* `RR_HOME/server.json` records the server (address, Web UI, pids); it is trusted only while the
  server's **keeper** holds an exclusive lock on `RR_HOME/server.keeper` (the kernel drops it when the
  keeper dies, so a stale file can never send a client to a dead or foreign server).
* A process that uses the server holds a **lease**: a shared lock on `RR_HOME/server.users`, also
  dropped by the kernel when the process dies, SIGKILL included. Nothing has to be cleaned up.
* The keeper (`python -m reflector.runtime.homeserver HOME`, started by the first user, in its own session)
  runs the server as its child, with `PR_SET_PDEATHSIG` so the server dies with the keeper, and checks
  every `POLL_S` whether any lease is left; when none has been for its **linger** (`RR_EMBEDDED_LINGER_S`,
  default `DEFAULT_LINGER_S`, of the process that started it), it stops the server and exits. Why linger:
  a server start costs ~1.4 s of wall time and ~1 s of CPU, an idle server ~0.2 % of a core, so without
  it every `rr` command of a session and every `reflect()` of a loop with a pause between calls (ACE's
  generator between reflections) paid a start. A lease's release touches `server.users`, so the linger
  counts from the last use even when a lease lived shorter than one look. The keeper also stops when
  its home's record no longer names it (RR_HOME removed), and `rr server` stops an idle one
  (`stop_idle`) to run in the foreground.
* Decisions (is it live? start one?) are taken under `RR_HOME/server.lock`, so two processes starting
  at once start one server. The keeper takes that lock too before it stops, so a user never leases a
  server that is about to stop.
* `rr server` (the foreground server) registers itself the same way, so the home's clients use it.

Port: `RR_EMBEDDED_PORT` (default 7233) when it is free, else any free loopback port (the Web UI on
the port + 1000 when free); clients find the address in the state file, never by guessing a port.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

__all__ = [
    "HomeServer",
    "Lease",
    "HomeServerError",
    "acquire",
    "live_server",
    "register_foreground",
    "POLL_S",
    "DEFAULT_LINGER_S",
    "stop_idle",
]

STATE_FILE = "server.json"
LOCK_FILE = "server.lock"
USERS_FILE = "server.users"
KEEPER_FILE = "server.keeper"
LOG_FILE = "server.log"
STOP_FILE = "server.stop"  # `stop_idle`'s request to the keeper
POLL_S = 0.2  # how often the keeper looks for leases (a server outlives its linger by at most this)
DEFAULT_LINGER_S = 300.0  # how long an unused server waits for its next user before it stops
START_TIMEOUT_S = 60.0


class HomeServerError(RuntimeError):
    """The home's embedded server could not be started or found; the message says why."""


@dataclass(frozen=True)
class HomeServer:
    """What `server.json` records: where the home's server listens and who keeps it."""

    address: str
    ui_url: str | None
    keeper_pid: int
    server_pid: int
    managed: bool  # True: a keeper stops it with its last lease; False: `rr server` in the foreground


class Lease:
    """A user's hold on the home's server (a shared lock the kernel releases if the process dies)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.utime(fd)  # the last use: the keeper's linger counts from here
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops its lock

    @property
    def held(self) -> bool:
        return self._fd is not None


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _lock(path: Path, flags: int) -> int | None:
    """`flock(flags)` on a new descriptor of `path`; None if `LOCK_NB` and it is held elsewhere."""
    fd = _open(path)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _take_keeper_lock(home: Path, patience_s: float = 2.0) -> int | None:
    """The keeper's exclusive lock, or None if another keeper holds it. A reader's probe (`_keeper_alive`
    takes a shared lock for an instant, without `server.lock`) is waited out rather than taken for a keeper."""
    deadline = time.monotonic() + patience_s
    while True:
        fd = _lock(home / KEEPER_FILE, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is not None or time.monotonic() >= deadline:
            return fd
        time.sleep(0.01)


def _keeper_alive(home: Path) -> bool:
    fd = _lock(home / KEEPER_FILE, fcntl.LOCK_SH | fcntl.LOCK_NB)
    if fd is None:
        return True  # someone holds it exclusively: the keeper (or `rr server`) is alive
    os.close(fd)
    return False


def _read_state(home: Path) -> HomeServer | None:
    try:
        raw = json.loads((home / STATE_FILE).read_text())
        return HomeServer(
            address=str(raw["address"]),
            ui_url=raw.get("ui_url") or None,
            keeper_pid=int(raw["keeper_pid"]),
            server_pid=int(raw["server_pid"]),
            managed=bool(raw.get("managed", True)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_state(home: Path, state: HomeServer) -> None:
    tmp = home / f".{STATE_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(state)) + "\n")
    os.replace(tmp, home / STATE_FILE)


def live_server(home: Path) -> HomeServer | None:
    """The home's server if its keeper is alive (no lease taken)."""
    if not (home / STATE_FILE).exists() or not _keeper_alive(home):
        return None
    return _read_state(home)


def acquire(
    home: Path, *, port: int = 7233, timeout: float = START_TIMEOUT_S, linger_s: float = DEFAULT_LINGER_S
) -> tuple[HomeServer, Lease, bool]:
    """Lease the home's server, starting it (through a keeper that lingers `linger_s` after its last lease)
    when it is not running.

    Returns (the server, the lease, whether this call started it). Blocking: call it off the event loop.
    """
    home.mkdir(parents=True, exist_ok=True)
    guard = _lock(home / LOCK_FILE, fcntl.LOCK_EX)
    assert guard is not None
    try:
        state = live_server(home)
        # Never blocks: the keeper takes `server.users` exclusively only while it holds `server.lock`.
        lease_fd = _lock(home / USERS_FILE, fcntl.LOCK_SH)
        assert lease_fd is not None
        lease = Lease(lease_fd)
        if state is not None:
            return state, lease, False
        try:
            return _start_keeper(home, port, timeout, linger_s), lease, True
        except BaseException:
            lease.release()
            raise
    finally:
        os.close(guard)


def _start_keeper(home: Path, port: int, timeout: float, linger_s: float) -> HomeServer:
    with contextlib.suppress(OSError):
        (home / STATE_FILE).unlink()  # a dead keeper's record
    log = home / LOG_FILE
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reflector.runtime.homeserver", str(home), str(port), f"{linger_s:g}"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _read_state(home)
        if state is not None and state.keeper_pid == proc.pid:
            return state
        code = proc.poll()
        if code is not None:
            raise HomeServerError(f"the embedded Temporal server did not start (exit {code}){_log_tail(log)}")
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    raise HomeServerError(f"the embedded Temporal server was not ready after {timeout:.0f} s{_log_tail(log)}")


def _log_tail(log: Path, lines: int = 8) -> str:
    try:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-lines:]
    except OSError:
        return ""
    return f"; log {log}:\n" + "\n".join(tail) if tail else f"; log: {log}"


def register_foreground(home: Path, address: str, ui_url: str | None, server_pid: int) -> int | None:
    """`rr server`: record it as the home's server; returns the keeper lock's fd to hold (None: the home
    already has a live server)."""
    home.mkdir(parents=True, exist_ok=True)
    guard = _lock(home / LOCK_FILE, fcntl.LOCK_EX)
    assert guard is not None
    try:
        keeper = _take_keeper_lock(home)
        if keeper is None:
            return None
        _write_state(home, HomeServer(address, ui_url, os.getpid(), server_pid, managed=False))
        return keeper
    finally:
        os.close(guard)


def unregister_foreground(home: Path, keeper_fd: int) -> None:
    with contextlib.suppress(OSError):
        (home / STATE_FILE).unlink()
    os.close(keeper_fd)


# ------------------------------------------------------------------------------------------ the keeper
def _keep(home: Path, port: int, linger_s: float = DEFAULT_LINGER_S) -> int:
    """The keeper's main: run the home's server until no lease has been left for `linger_s` (or a stop is
    requested while none is, or SIGTERM/SIGINT/SIGHUP, or the home's record no longer names this keeper)."""
    import asyncio

    from reflector.runtime.devserver import DevServer, DevServerError, free_port, is_reachable

    # patience: a keeper whose record was removed (RR_HOME deleted and made again) stops within a look and
    # the time its server takes to stop; this one then takes over the home
    keeper_fd = _take_keeper_lock(home, patience_s=15.0)
    if keeper_fd is None:
        print("rr keeper: this home's server already has a keeper", flush=True)
        return 3
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    _clear_stop_request(home)  # a request no keeper answered (its caller died) is not for this one
    db_file = home / "temporal.sqlite"
    preferred = port if not is_reachable(f"127.0.0.1:{port}", timeout=0.2) else None
    server: DevServer | None = None
    for chosen in [preferred, None] if preferred else [None]:
        ui_port = (
            chosen + 1000
            if chosen
            and chosen + 1000 < 65536
            and not is_reachable(f"127.0.0.1:{chosen + 1000}", timeout=0.2)
            else free_port()
        )
        candidate = DevServer(
            db_file=db_file,
            port=chosen,
            ui_port=ui_port if chosen else None,
            ui=True,
            log_file=home / "temporal.log",
            die_with_parent=True,
        )
        try:
            asyncio.run(candidate.astart())
        except DevServerError as exc:
            print(f"rr keeper: {exc}", flush=True)
            continue
        server = candidate
        break
    if server is None:
        return 1
    assert server.pid is not None
    _write_state(home, HomeServer(server.address, server.ui_url, os.getpid(), server.pid, managed=True))
    print(f"rr keeper pid={os.getpid()}: server pid={server.pid} on {server.address}", flush=True)
    idle_since: float | None = None  # when a look first found no lease (since the last one that found one)
    try:
        while not stopping and server.running:
            time.sleep(POLL_S)
            state = _read_state(home)
            if state is None or state.keeper_pid != os.getpid():
                # RR_HOME (or its record) was removed: nobody can find this server any more
                print("rr keeper: the home's record is gone; stopping", flush=True)
                server.stop()
                return 0
            guard = _lock(home / LOCK_FILE, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if guard is None:
                continue  # a user is deciding: look again next time
            try:
                unused = _lock(home / USERS_FILE, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if unused is None:
                    idle_since = None
                    _clear_stop_request(home)  # in use: `stop_idle` is refused
                    continue
                try:
                    now = time.time()  # noqa: TID251  (the keeper process: compared with a file mtime)
                    idle_since = now if idle_since is None else idle_since
                    if now - max(idle_since, _last_use(home)) >= linger_s or _stop_requested(home):
                        # stop while holding both locks, so nobody leases a stopping server or starts a
                        # second one on the same SQLite file
                        _stop(home, server)
                        return 0
                finally:
                    os.close(unused)
            finally:
                os.close(guard)
        guard = _lock(home / LOCK_FILE, fcntl.LOCK_EX)
        try:
            _stop(home, server)
        finally:
            if guard is not None:
                os.close(guard)
        return 0 if stopping or not server.running else 1
    finally:
        os.close(keeper_fd)


def _last_use(home: Path) -> float:
    """When a lease was last released (`Lease.release` touches the file); 0 if unknown."""
    try:
        return (home / USERS_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _stop_requested(home: Path) -> bool:
    return (home / STOP_FILE).exists()


def _clear_stop_request(home: Path) -> None:
    with contextlib.suppress(OSError):
        (home / STOP_FILE).unlink()


def stop_idle(home: Path, timeout: float = 15.0) -> bool:
    """Stop the home's embedded server if no process uses it (e.g. one lingering after its last user).

    True: no server of the home runs now (it stopped, or none ran); False: it is in use (or it is a
    foreground `rr server`), and it goes on. The keeper decides under `server.lock`, as for its linger, so
    a process that leases the server meanwhile keeps it (the request is then withdrawn).
    """
    guard = _lock(home / LOCK_FILE, fcntl.LOCK_EX)
    assert guard is not None
    try:
        state = live_server(home)
        if state is None:
            return True
        if not state.managed:
            return False
        unused = _lock(home / USERS_FILE, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if unused is None:
            return False
        os.close(unused)
        (home / STOP_FILE).touch()
    finally:
        os.close(guard)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _keeper_alive(home):
            _clear_stop_request(home)
            return True
        if not _stop_requested(home):
            return False  # withdrawn: a user leased it first
        time.sleep(0.05)
    _clear_stop_request(home)
    return False


def _stop(home: Path, server: object) -> None:
    from reflector.runtime.devserver import DevServer

    assert isinstance(server, DevServer)
    state = _read_state(home)
    if state is not None and state.keeper_pid == os.getpid():
        with contextlib.suppress(OSError):
            (home / STATE_FILE).unlink()
    server.stop()


if __name__ == "__main__":
    sys.exit(
        _keep(
            Path(sys.argv[1]),
            int(sys.argv[2]) if len(sys.argv) > 2 else 7233,
            float(sys.argv[3]) if len(sys.argv) > 3 else DEFAULT_LINGER_S,
        )
    )
