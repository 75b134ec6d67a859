"""Entering the host's namespaces (user, mount, PID, network, IPC, UTS) and its cgroup, and the supervisor
and reaper processes that stay outside the host (`sandbox.isolation` has the modes)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterable

from sandbox.cgroups import _leave_cgroup, enter_cgroup
from sandbox.isolation import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_PDEATHSIG,
    IsolationMode,
    IsolationReport,
    _map_ids,
    _mount,
    _prctl,
    _unshare,
    _unshare_subordinate,
    subordinate_ids,
)

__all__ = ["enter_namespaces"]


def enter_namespaces(
    mode: IsolationMode, report: IsolationReport, *, unavailable: Iterable[str] = ()
) -> None:
    """Move this process into new namespaces; returns in the host, the parents never return.

    The process that was spawned (the executor's `proc`, call it P) stays in the worker's PID
    namespace and waits; it forks the reaper R (PID 1 of the new PID namespace: a PID-namespace init
    ignores signals it has no handler for, which would disarm the CPU-time limit), and R forks the
    host H (PID 2). When H ends, R exits with H's status and P passes it on (re-raising H's signal),
    so the executor sees exactly what it would see without namespaces (e.g. -SIGXCPU). All three
    share the executor's process group (its SIGKILL reaches them) and die with their parent.
    """
    if mode == "language-only":
        return
    enter_cgroup(mode, report, unavailable=unavailable)  # first: the reaper and the host inherit it
    if sys.platform != "linux":
        report.missing["namespaces"] = f"not Linux ({sys.platform})"
        return
    if "namespaces" in unavailable:
        report.missing["namespaces"] = "unavailable (simulated by a test)"
        return
    try:
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
        if os.geteuid() != 0:
            # Unprivileged: a user namespace first, in which this process may create the others.
            if not _enter_user_namespace(report):
                return
        why = _unshare(flags)
        if why:
            report.missing["namespaces"] = why
            return
    except OSError as exc:
        report.missing["namespaces"] = f"{type(exc).__name__}: {exc}"
        return
    sys.stdout.flush()
    sys.stderr.flush()
    reaper = os.fork()
    if reaper:
        _supervise(reaper)  # P: never returns
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # R (PID 1): a private mount tree and a /proc that shows this PID namespace only.
    proc_note = _mount(None, "/", None, MS_REC | MS_PRIVATE) or _mount(
        "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC
    )
    host = os.fork()
    if host:
        _reap(host)  # R: never returns
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    report.layers.append("namespaces")
    if proc_note:
        report.missing["private /proc"] = proc_note


_subordinate: tuple[int, int] | None = None  # (uid, gid) this host becomes at the lockdown, when mapped


def _enter_user_namespace(report: IsolationReport) -> bool:
    """A non-root worker's user namespace: with a subordinate uid to become at the lockdown when the
    worker has one (`subordinate_ids`), else mapping the worker's own uid (reported at the lockdown)."""
    global _subordinate
    uid, gid = os.geteuid(), os.getegid()
    sub, why_not = subordinate_ids(uid)
    if sub is not None:
        failed = _unshare_subordinate(uid, gid, sub)
        if failed is None:
            _subordinate = (sub[0], sub[1])
            report.layers.append("userns")
            return True
        report.missing["subordinate uid"] = failed
        if "unshare" in failed:
            report.missing["namespaces"] = failed
            return False
        report.layers.append("userns")
        return True
    why = _unshare(CLONE_NEWUSER)
    if why:
        report.missing["namespaces"] = why
        return False
    _map_ids(uid, gid)
    report.missing["subordinate uid"] = why_not
    report.layers.append("userns")
    return True


def _detach_stdio() -> None:
    """The waiting parents must not hold the protocol pipes (EOF must reach the executor)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


def _supervise(child: int) -> None:
    """P: wait for R, then end like the host did (same exit code, or the same signal)."""
    _detach_stdio()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the executor ends hosts with SIGKILL or EOF
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(1)
    _leave_cgroup()
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    if code > 128 and (code - 128) in _PASSED_ON_SIGNALS:  # never SIGSTOP & co: that would hang P
        sig = code - 128
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(code & 0xFF)


# Signals whose default action ends a process: P re-raises only these on itself (a breached host
# choosing its own exit status must not be able to stop P or make it ignore the signal).
_PASSED_ON_SIGNALS = frozenset(
    int(s)
    for s in (
        signal.SIGKILL,
        signal.SIGXCPU,
        signal.SIGXFSZ,
        signal.SIGSEGV,
        signal.SIGABRT,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGSYS,
        signal.SIGTRAP,
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGPIPE,
        signal.SIGQUIT,
        signal.SIGALRM,
        signal.SIGUSR1,
        signal.SIGUSR2,
    )
)


def _reap(host: int) -> None:
    """R (PID 1): reap every orphan; when the host ends, exit with its status encoded as 128+signal."""
    _detach_stdio()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == host:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code & 0xFF)
