"""`rr worker --processes N`: N single-process workers under one supervisor.

One worker process is bound by the GIL (about one core: BENCHMARKS.md), so a many-core machine runs
several. The supervisor only starts, watches, restarts and stops them; it never connects to Temporal.

- Each child is `rr worker --processes 1` (the command the CLI gives, `reflector/cli/worker_child.py`,
  which first arranges to get SIGTERM if the supervisor dies: `die_with_parent`) with the supervisor's environment plus its share of the machine's
  slot budgets (`split_budgets`).
- The children's output passes through, line by line; an `rr: error:` line of a child is held back
  and reported once by the supervisor.
- A child that dies is restarted after a backoff (0.5 s, doubling, at most 8 s, for each death of
  that child within `CRASH_WINDOW_S`); `CRASH_LIMIT` deaths of one child within the window stop
  everything with one `rr: error:` line (exit 1).
- A child of the first start that exits with code 2 before it is ready (a bad setting, an unreachable
  server: its one-line error) stops everything: the supervisor exits 2 with that line.
- SIGINT/SIGTERM: SIGTERM to every child (a stopping worker hands its reflections over), wait up to
  `STOP_GRACE_S`, then SIGKILL what is left; exit 0. A second signal kills at once.

Every signal goes to a process this supervisor started, by its PID.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO

from reflector.runtime.settings import SettingError, env_number
from sandbox.capacity import host_budget

__all__ = [
    "PROCESSES_ENV",
    "BUDGETS",
    "default_processes",
    "worker_processes",
    "split_budgets",
    "Supervisor",
    "run_supervisor",
]

PROCESSES_ENV = "RR_WORKER_PROCESSES"
# per-machine budgets split among the children: (variable, default); the defaults are the worker's (the live
# hosts': the machine's budget, sandbox.capacity). No default: split only when set (unset, each child's
# admission control finds its own number of slots)
BUDGETS: tuple[tuple[str, Callable[[], int] | None], ...] = (
    ("RR_MAX_CONCURRENT_WORKFLOW_TASKS", None),
    ("RR_MAX_CONCURRENT_ACTIVITIES", None),
    ("RR_MAX_LIVE_SANDBOXES", lambda: host_budget().hosts),
)
CRASH_LIMIT = 5
CRASH_WINDOW_S = 30.0
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 8.0
STOP_GRACE_S = 30.0
READY_MARK = "rr worker pid="
_ERROR_MARK = "rr: error:"
# set in a child's environment: the supervisor's pid (the child exits if its parent is already gone)
_PARENT_ENV = "RR_SUPERVISOR_PID"


def default_processes() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def worker_processes(arg: int | None) -> int:
    """`--processes` if given, else `RR_WORKER_PROCESSES`, else `default_processes()`."""
    if arg is not None:
        if arg < 1:
            raise SettingError(f"--processes must be at least 1, got {arg}")
        return arg
    return int(env_number(PROCESSES_ENV, default_processes()))


def split_budgets(n: int) -> dict[str, str]:
    """Each child's share of the per-machine budgets: ceil(total / n), at least 1 (budgets without a
    default only when set)."""
    out = {}
    for name, default in BUDGETS:
        if default is None and not os.environ.get(name, "").strip():
            continue
        total = int(env_number(name, 1)) if os.environ.get(name, "").strip() or default is None else default()
        out[name] = str(max(1, math.ceil(total / n)))
    return out


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    generation: int = 0
    ready: bool = False
    error: str | None = None
    restart_at: float | None = None
    deaths: deque[float] = field(default_factory=deque)
    threads: list[threading.Thread] = field(default_factory=list)


class Supervisor:
    """Start `n` worker children and keep them running until `stop()` (or a fatal child)."""

    def __init__(
        self,
        n: int,
        *,
        cmd: list[str],
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.n = n
        self.cmd = cmd
        shares = split_budgets(n)  # a bad budget setting: a SettingError before any child starts
        self.env = {**os.environ, **shares, PROCESSES_ENV: "1", _PARENT_ENV: str(os.getpid())}
        self.shares = shares
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.clock = clock
        self.children = [_Child(i + 1) for i in range(n)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._signals = 0

    # -- output -------------------------------------------------------------------------------

    def _say(self, msg: str, *, error: bool = False) -> None:
        stream = self.err if error else self.out
        with self._lock:
            print(msg, file=stream, flush=True)

    def _pump(self, child: _Child, src: IO[str], dst: IO[str]) -> None:
        for line in src:
            if line.startswith(_ERROR_MARK):
                child.error = line.rstrip("\n")[len(_ERROR_MARK) :].strip()
                continue
            if line.startswith(READY_MARK):
                child.ready = True
            with self._lock:
                dst.write(line)
                dst.flush()
        src.close()

    # -- children -----------------------------------------------------------------------------

    def _start(self, child: _Child) -> None:
        child.generation += 1
        child.ready, child.error, child.restart_at = False, None, None
        proc = subprocess.Popen(
            self.cmd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            errors="replace",
            # the supervisor's process group (not a session of its own): whoever kills the group kills
            # every worker; a Ctrl-C reaches each child too, which stops it the same graceful way
        )
        child.proc, child.started = proc, self.clock()
        assert proc.stdout is not None and proc.stderr is not None
        child.threads = [
            threading.Thread(target=self._pump, args=(child, proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(child, proc.stderr, self.err), daemon=True),
        ]
        for t in child.threads:
            t.start()
        self._say(f"rr worker: child {child.index}/{self.n} pid={proc.pid} started")

    def _reap(self, child: _Child) -> int:
        """The exit code of `child`, after its output was passed through."""
        assert child.proc is not None
        code = child.proc.wait()
        for t in child.threads:
            t.join(5)
        return code

    def _describe(self, code: int) -> str:
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def _died(self, child: _Child, code: int) -> int | None:
        """Handle a child's unexpected exit; an exit code for the supervisor if it must stop."""
        assert child.proc is not None
        pid, now = child.proc.pid, self.clock()
        what = self._describe(code) + (f": {child.error}" if child.error else "")
        if code == 2 and child.generation == 1 and not child.ready:
            self._say(
                f"{_ERROR_MARK} {child.error or f'worker child {child.index}/{self.n} exited with code 2 at start'}",
                error=True,
            )
            return 2
        child.deaths.append(now)
        while child.deaths and now - child.deaths[0] > CRASH_WINDOW_S:
            child.deaths.popleft()
        if len(child.deaths) >= CRASH_LIMIT:
            self._say(
                f"{_ERROR_MARK} worker child {child.index}/{self.n} died {len(child.deaths)} times within "
                f"{CRASH_WINDOW_S:g} s (last pid={pid}, {what}): stopping every worker",
                error=True,
            )
            return 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (len(child.deaths) - 1))
        child.restart_at = now + delay
        self._say(
            f"rr worker: child {child.index}/{self.n} pid={pid} died ({what}); restarting in {delay:g} s"
        )
        child.proc = None
        return None

    def _terminate_all(self, grace: float) -> None:
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = self.clock() + grace
        for proc in live:
            while proc.poll() is None and self.clock() < deadline and self._signals < 2:
                time.sleep(0.05)
        for proc in live:
            if proc.poll() is None:
                self._say(f"rr worker: child pid={proc.pid} still running after SIGTERM: SIGKILL")
                proc.kill()
        for c in self.children:
            if c.proc is not None:
                self._reap(c)

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the supervisor to stop its children and return (safe from a signal handler)."""
        self._signals += 1
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (0) or a fatal child (2: a bad setting at start; 1: a crash loop)."""
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self._on_signal)
        code = 0
        try:
            for child in self.children:
                if self._stop.is_set():
                    break
                self._start(child)
            while not self._stop.is_set():
                fatal = self._tick()
                if fatal is not None:
                    code = fatal
                    break
                self._stop.wait(0.1)
        finally:
            if code == 0:
                self._say(f"rr worker: stopping {self.n} workers (SIGTERM)")
            self._terminate_all(STOP_GRACE_S)
        return code

    def _tick(self) -> int | None:
        now = self.clock()
        for child in self.children:
            if child.proc is not None:
                if child.proc.poll() is None:
                    continue
                if self._stop.is_set():
                    return None
                fatal = self._died(child, self._reap(child))
                if fatal is not None:
                    return fatal
            if child.proc is None and child.restart_at is not None and now >= child.restart_at:
                self._start(child)
        return None


def run_supervisor(n: int, cmd: list[str]) -> int:
    """`rr worker --processes N` (N > 1), each child started by `cmd`: the supervisor's exit code."""
    sup = Supervisor(n, cmd=cmd)
    shares = ", ".join(f"{name}={value}" for name, value in sup.shares.items())
    sup._say(f"rr worker: supervisor pid={os.getpid()} starting {n} worker processes, each with {shares}")
    return sup.run()


def die_with_parent() -> None:
    """In a child: get SIGTERM when the supervisor dies (Linux), and exit if it is gone already."""
    parent = os.environ.get(_PARENT_ENV, "")
    if sys.platform == "linux":
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(0)
