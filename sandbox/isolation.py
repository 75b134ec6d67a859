"""The OS layer of the sandbox: what holds when the language guards are bypassed.

Why: the guards in `sandbox.host.guards` / `sandbox.host.safe_modules` are a language-level filter, and an
attacker who reads them finds gadgets (14 were found in one afternoon, each giving code execution in
the host and, from there, the worker's secrets through `/proc/<ppid>/environ`). So every host runs,
before any model code, under layers that do not depend on Python at all:

  * **namespaces** (`enter_namespaces`, at host start): new PID, mount, network, IPC and UTS
    namespaces (and a user namespace when the worker is not root, which is what lets an unprivileged
    process create the others). The host is PID 2 of its own PID namespace under a tiny reaper (PID 1),
    so it cannot name the worker or another host; `/proc` is remounted for that namespace; the network
    namespace has no interface but a down loopback.
  * **uid drop**: a root worker's host becomes `nobody` (65534) with no supplementary groups, then
    enters a user namespace of its own, so file permissions apply to it as to any other user. A non-root
    worker's host becomes a subordinate uid of the worker's (`/etc/subuid` and `newuidmap`, see
    `subordinate_ids`): a host with the worker's own uid would own the worker's files (chmod, utime and
    xattrs are not Landlock's); without a range it keeps the worker's uid, reported as the missing `uid`.
  * **capabilities and no-new-privs**: every capability is dropped (also those a new user namespace
    grants) and `PR_SET_NO_NEW_PRIVS` is set, so nothing can be regained through exec.
  * **Landlock** (default deny): read-only access to the Python installation and this project's own
    packages (code, no secrets); nothing else can be opened, created, removed or executed; TCP bind
    and connect are denied (ABI >= 4), and signals and abstract unix sockets are scoped to the host's
    own domain (ABI >= 6). The trace is opened *before* the lockdown and kept as an fd: no rule names
    the blob store. Archived transcripts are read by the worker and sent over the protocol.
  * **seccomp** (a raw BPF filter, no library needed): no sockets, no exec, no fork/clone, no ptrace or
    `process_vm_*`, no signals to other processes, no mount / namespace / keyring / bpf / io_uring /
    module / perf syscalls, no uid/gid/capability changes; no inotify / fanotify / dnotify (Landlock
    denies listing the blob store, not watching it); no memory outside RLIMIT_AS (memfds, SysV and
    POSIX IPC, pipes grown with F_SETPIPE_SZ); no metadata changes (chmod, chown, utime, xattrs,
    inode flags: Landlock does not cover them, and a non-root worker's host owns the worker's files);
    other architectures and the x32 ABI are killed outright.
  * **fds and a cgroup**: RLIMIT_NOFILE is `HOST_MAX_FDS` (what fds pin stays small); where the
    worker has a delegated cgroup v2 (`RR_SANDBOX_CGROUP`, or the parent of its own cgroup), each host
    runs in a cgroup of its own with `memory.max` (its RLIMIT_AS and a little) and `pids.max` (`enter_cgroup`).

Required vs best effort (`IsolationPolicy`): in the default mode `auto`, no-new-privs, Landlock and
seccomp are required (they need no privileges on any Linux >= 5.13): a host that cannot apply one of
them refuses to run cells. Namespaces, the uid drop and the cgroup are applied wherever the kernel (and
the worker's cgroup) allows and reported. `strict` requires them too; `language-only` skips the OS layer
(an explicit opt-out for machines without it, e.g. macOS; the worker then warns loudly).

Everything here runs in the host process, single-threaded, before the first cell. The functions use
only `ctypes` and raw syscall numbers, so nothing is downloaded or compiled.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "CGROUP_ENV",
    "HOST_MAX_FDS",
    "ISOLATION_ENV",
    "IsolationMode",
    "IsolationReport",
    "IsolationUnavailable",
    "NOBODY",
    "enter_cgroup",
    "enter_namespaces",
    "find_cgroup_base",
    "lockdown",
    "parse_mode",
    "seccomp_program",
]

ISOLATION_ENV = "RR_SANDBOX_ISOLATION"
IsolationMode = Literal["auto", "strict", "language-only"]
DEFAULT_MODE: IsolationMode = "auto"
"""The mode of hosts whose creator names none (the worker always names its `RR_SANDBOX_ISOLATION`; the test
suite sets this from the same variable, so that `RR_SANDBOX_ISOLATION=language-only pytest` reaches every
host it starts)."""
MODES: tuple[IsolationMode, ...] = ("auto", "strict", "language-only")
NOBODY = 65534
CGROUP_ENV = "RR_SANDBOX_CGROUP"
"""A delegated cgroup v2 directory (writable by the worker, `memory` and `pids` enabled in its
`cgroup.subtree_control`) under which each host gets a cgroup of its own. Unset: the parent of the
worker's own cgroup, when it is such a directory (systemd `Delegate=yes` with the worker in a leaf)."""
HOST_MAX_FDS = 64
"""RLIMIT_NOFILE of a locked-down host. It holds about ten (stdio, its two protocol fds, the trace and its
index, an import in flight); the cap bounds what fds pin outside RLIMIT_AS (pipe buffers, epoll, ...)."""
HOST_PIDS_MAX = 8  # the supervisor, the reaper and the host (seccomp allows no fork): slack for the kernel's view
CGROUP_MEMORY_SLACK = 64 * 1024**2  # memory.max over RLIMIT_AS: the supervisor, the reaper, kernel memory
CGROUP_PREFIX = "rr-host-"

# clone/unshare flags
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
# mount flags
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
# prctl
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_SET_SECCOMP = 22
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class IsolationUnavailable(RuntimeError):
    """A required layer could not be applied: the host must not run model code."""


@dataclass
class IsolationReport:
    """What one host achieved; `layers` in the order applied, `missing` maps a layer to why not."""

    mode: IsolationMode = "auto"
    layers: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    landlock_abi: int = 0
    uid: int = -1

    def summary(self) -> str:
        """One line for logs: `namespaces+uid+landlock+seccomp` (plus what is missing and why)."""
        if self.mode == "language-only":
            return "language-only (no OS isolation: RR_SANDBOX_ISOLATION=language-only)"
        text = "+".join(self.layers) or "none"
        if self.missing:
            text += " (not available: " + "; ".join(f"{k}: {v}" for k, v in self.missing.items()) + ")"
        return text

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> IsolationReport:
        """The report a host sent (`as_dict`), e.g. for `summary()` on the worker side."""
        mode = data.get("mode")
        layers = data.get("layers")
        missing = data.get("missing")
        abi = data.get("landlock_abi")
        uid = data.get("uid")
        return cls(
            mode=mode if mode in MODES else "auto",
            layers=[str(x) for x in layers] if isinstance(layers, list) else [],
            missing={str(k): str(v) for k, v in missing.items()} if isinstance(missing, dict) else {},
            landlock_abi=abi if isinstance(abi, int) else 0,
            uid=uid if isinstance(uid, int) else -1,
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "layers": list(self.layers),
            "missing": dict(self.missing),
            "landlock_abi": self.landlock_abi,
            "uid": self.uid,
        }


def parse_mode(raw: str | None) -> IsolationMode:
    """The isolation mode from `RR_SANDBOX_ISOLATION` (unset: `auto`); raises ValueError if unknown."""
    value = (raw or "auto").strip().lower()
    for mode in MODES:
        if value == mode:
            return mode
    raise ValueError(f"{ISOLATION_ENV} must be one of {', '.join(MODES)}, got {raw!r}")


# ---------------------------------------------------------------------------------------------------
# libc access
# ---------------------------------------------------------------------------------------------------

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
        _libc.prctl.restype = ctypes.c_int
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _err(what: str) -> str:
    code = ctypes.get_errno()
    return f"{what}: {errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    return int(_lib().prctl(option, arg2, arg3, 0, 0))


def _unshare(flags: int) -> str | None:
    if _lib().unshare(ctypes.c_int(flags)) != 0:
        return _err("unshare")
    return None


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> str | None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    if _lib().mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), None) != 0:
        return _err(f"mount {target}")
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _map_ids(uid: int, gid: int) -> None:
    """Map `uid`/`gid` to themselves in a just-created user namespace (the only mapping allowed)."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


# A non-root worker's host must not keep the worker's uid: it would own the worker's files (chmod, utime,
# xattrs are not Landlock's). The only unprivileged way to another uid is a subordinate id range
# (`/etc/subuid`, `/etc/subgid`) and the setuid `newuidmap`/`newgidmap`: the spawned process's user
# namespace then maps 0 to the worker (what it opens before the lockdown: the trace) and 1 to a
# subordinate uid, which the host becomes at the lockdown (`_drop_uid`).
_ID_MAPPERS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
_subordinate: tuple[int, int] | None = None  # (uid, gid) this host becomes at the lockdown, when mapped


def _subordinate_start(path: str, names: tuple[str, ...]) -> int | None:
    """The first id of the range `path` (`/etc/subuid` format: name:start:count) gives one of `names`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in names and parts[1].isdigit() and parts[2].isdigit() and int(parts[2]) >= 1:
            return int(parts[1])
    return None


def subordinate_ids(uid: int) -> tuple[tuple[int, int, str, str] | None, str]:
    """((subuid, subgid, newuidmap, newgidmap), "") for a worker that has them, else (None, why not)."""
    import pwd

    tools = []
    for tool in ("newuidmap", "newgidmap"):
        found = next((f"{d}/{tool}" for d in _ID_MAPPERS if os.access(f"{d}/{tool}", os.X_OK)), None)
        if found is None:
            return None, f"no {tool} (the uidmap package) to map a subordinate uid"
        tools.append(found)
    try:
        names: tuple[str, ...] = (pwd.getpwuid(uid).pw_name, str(uid))
    except KeyError:
        names = (str(uid),)
    sub_uid, sub_gid = _subordinate_start("/etc/subuid", names), _subordinate_start("/etc/subgid", names)
    if sub_uid is None or sub_gid is None:
        return None, f"no subordinate uid/gid range for uid {uid} in /etc/subuid and /etc/subgid"
    return (sub_uid, sub_gid, tools[0], tools[1]), ""


def _unshare_subordinate(uid: int, gid: int, sub: tuple[int, int, str, str]) -> str | None:
    """A user namespace mapping 0 -> the worker and 1 -> its subordinate ids (written by a helper child:
    `newuidmap` acts on another process). None on success; on failure, why (the namespace is then
    mapped like `_map_ids`, if it still can be)."""
    import subprocess

    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    target = os.getpid()
    helper = os.fork()
    if helper == 0:  # the helper: waits for the unshare, maps, reports, exits
        try:
            os.close(ready_w)
            os.close(done_r)
            os.read(ready_r, 1)
            result = b"ok"
            for tool, own, first in ((sub[2], uid, sub[0]), (sub[3], gid, sub[1])):
                run = subprocess.run([tool, str(target), "0", str(own), "1", "1", str(first), "1"],
                                     stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env={})
                if run.returncode != 0:
                    result = f"{os.path.basename(tool)}: {run.stderr.decode(errors='replace').strip()[:200]}".encode()
                    break
            os.write(done_w, result)
        finally:
            os._exit(0)
    os.close(ready_r)
    os.close(done_w)
    why = _unshare(CLONE_NEWUSER)
    os.write(ready_w, b"x")
    os.close(ready_w)
    answer = os.read(done_r, 300).decode(errors="replace") or "the id-mapping helper died"
    os.close(done_r)
    os.waitpid(helper, 0)
    if why:
        return why
    if answer != "ok":
        _map_ids(uid, gid)  # the uid map is still unwritten (newuidmap failed) or the gid map (then this raises)
        return answer
    return None


# ---------------------------------------------------------------------------------------------------
# cgroup v2 (at host start, in the spawned process, before the namespaces)
# ---------------------------------------------------------------------------------------------------

_cgroup_dir: str | None = None  # this host's own cgroup (the reaper and the host inherit it through fork)
_cgroup_home: str | None = None  # the cgroup the spawned process came from (the supervisor goes back there)


def _read_words(path: str) -> set[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def _cgroup2_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points of the cgroup v2 file system, from `mountinfo` (field 5; fs type after ` - `)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split(" ")
        if sep and right.split(" ", 1)[0] == "cgroup2" and len(fields) > 4:
            found.append(fields[4].replace("\\040", " "))
    return found


def _own_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (the `0::` line), or None (cgroup v1 only)."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as fh:
            for line in fh.read().splitlines():
                if line.startswith("0::"):
                    return line[3:] or "/"
    except OSError:
        pass
    return None


def check_cgroup_base(base: str) -> str | None:
    """None when `base` can hold the hosts' cgroups (a delegated cgroup v2 directory), else why not."""
    if not os.path.isfile(os.path.join(base, "cgroup.controllers")):
        return f"{base} is not a cgroup v2 directory"
    missing = sorted({"memory", "pids"} - _read_words(os.path.join(base, "cgroup.controllers")))
    if missing:
        return (
            f"the cgroup v2 at {base} offers no {' or '.join(missing)} controller "
            "(on this machine they may be bound to cgroup v1 hierarchies)"
        )
    if {"memory", "pids"} - _read_words(os.path.join(base, "cgroup.subtree_control")):
        return f"{base}/cgroup.subtree_control does not enable memory and pids for its children"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable by the worker (not delegated to it)"
    return None


def find_cgroup_base(explicit: str | None = None) -> tuple[str | None, str]:
    """Where hosts' cgroups go: (directory, "") or (None, why there is none).

    `explicit` (`RR_SANDBOX_CGROUP`) must itself be usable; otherwise the parent of this process's own
    cgroup is used when it is delegated (a cgroup with processes cannot give controllers to children,
    so a delegating service manager puts the worker in a leaf: its parent is the delegated cgroup).
    """
    if explicit:
        why = check_cgroup_base(explicit)
        return (explicit, "") if why is None else (None, why)
    mounts = _cgroup2_mounts()
    if not mounts:
        return None, "no cgroup v2 file system is mounted"
    own = _own_cgroup()
    if own is None:
        return None, "this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)"
    reasons = []
    for mount in mounts:
        root = os.path.normpath(mount)
        mine = os.path.normpath(root + "/" + own.lstrip("/"))
        if not os.path.isdir(mine):
            continue  # a mount of another cgroup namespace
        unavailable = sorted({"memory", "pids"} - _read_words(os.path.join(root, "cgroup.controllers")))
        if unavailable:
            reasons.append(
                f"the cgroup v2 at {root} offers no {' or '.join(unavailable)} controller "
                "(on this machine they are bound to cgroup v1 hierarchies)"
            )
            continue
        if mine == root:
            reasons.append(f"the worker is in the root cgroup of {root}; set {CGROUP_ENV} to a delegated cgroup")
            continue
        why = check_cgroup_base(os.path.dirname(mine))
        if why is None:
            return os.path.dirname(mine), ""
        reasons.append(why)
    return None, "; ".join(reasons) or "no cgroup v2 mount holds this process's cgroup"


def _write_cgroup(directory: str, name: str, value: str) -> None:
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _sweep_cgroups(base: str) -> None:
    """Remove the cgroups of hosts whose spawned process is gone (a SIGKILL skips the supervisor's cleanup)."""
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(CGROUP_PREFIX) :]
        if entry.name.startswith(CGROUP_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)  # refused while a process is still in it


def enter_cgroup(mode: IsolationMode, report: IsolationReport, *, unavailable: Iterable[str] = ()) -> None:
    """Move this (the spawned) process into a cgroup of its own under the delegated base.

    Why: the rlimits bound one process's address space, not the kernel memory, page cache and processes
    it pins; the cgroup's `pids.max` (here) and `memory.max` (set at `lockdown` from RLIMIT_AS, which a
    pooled host only knows then) hold all three processes of a host together. Best effort and reported
    (`cgroup`, or why not in `missing`); `strict` requires it. The supervisor removes it at the end.
    """
    global _cgroup_dir, _cgroup_home
    if mode == "language-only" or _cgroup_dir is not None:
        return
    if sys.platform != "linux":
        report.missing["cgroup"] = f"not Linux ({sys.platform})"
        return
    if "cgroup" in unavailable:
        report.missing["cgroup"] = "unavailable (simulated by a test)"
        return
    base, why = find_cgroup_base(os.environ.get(CGROUP_ENV) or None)
    if base is None:
        report.missing["cgroup"] = why
        return
    _sweep_cgroups(base)
    mine = os.path.join(base, f"{CGROUP_PREFIX}{os.getpid()}")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(mine)  # left by an earlier process with this pid
        os.mkdir(mine, 0o755)
        _write_cgroup(mine, "pids.max", str(HOST_PIDS_MAX))
        _write_cgroup(mine, "cgroup.procs", str(os.getpid()))
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(mine)
        report.missing["cgroup"] = f"cannot use a cgroup under {base}: {exc.strerror or exc}"
        return
    own, mounts = _own_cgroup(), _cgroup2_mounts()
    _cgroup_dir = mine
    _cgroup_home = next((os.path.normpath(m + "/" + (own or "").lstrip("/")) for m in mounts), None)
    report.layers.append("cgroup")


def _cgroup_memory(report: IsolationReport) -> None:
    """The host's cgroup gets `memory.max` = its RLIMIT_AS (the host's resident memory never needs more)
    plus `CGROUP_MEMORY_SLACK` for the two small processes above it and the kernel's own memory."""
    if _cgroup_dir is None:
        return
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        if soft != resource.RLIM_INFINITY:
            _write_cgroup(_cgroup_dir, "memory.max", str(soft + CGROUP_MEMORY_SLACK))
        with contextlib.suppress(OSError):
            _write_cgroup(_cgroup_dir, "memory.swap.max", "0")
    except OSError as exc:
        report.missing["cgroup"] = f"cannot set memory.max: {exc.strerror or exc}"
        with contextlib.suppress(ValueError):
            report.layers.remove("cgroup")


def _leave_cgroup() -> None:
    """The supervisor, after the host ended: back to where it came from, and remove the host's cgroup."""
    if _cgroup_dir is None:
        return
    with contextlib.suppress(OSError):
        if _cgroup_home is not None:
            _write_cgroup(_cgroup_home, "cgroup.procs", str(os.getpid()))
        os.rmdir(_cgroup_dir)


# ---------------------------------------------------------------------------------------------------
# Namespaces (at host start, before anything else)
# ---------------------------------------------------------------------------------------------------


def enter_namespaces(mode: IsolationMode, report: IsolationReport, *, unavailable: Iterable[str] = ()) -> None:
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
    int(s) for s in (
        signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
        signal.SIGFPE, signal.SIGILL, signal.SIGSYS, signal.SIGTRAP, signal.SIGTERM, signal.SIGINT,
        signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2,
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


# ---------------------------------------------------------------------------------------------------
# Lockdown (at `start`, after the trace is open and the allowlisted modules are imported)
# ---------------------------------------------------------------------------------------------------


def lockdown(
    mode: IsolationMode,
    report: IsolationReport,
    *,
    readable: Iterable[str],
    unavailable: Iterable[str] = (),
) -> None:
    """Drop the uid, capabilities and privileges, then apply Landlock and seccomp.

    `readable`: directories (or files) the host may still read: the Python installation and the
    project's packages. Raises `IsolationUnavailable` when a required layer fails (the host then
    refuses to run cells); best-effort layers are recorded in `report.missing`. `unavailable`
    (tests only) names layers to treat as missing from the kernel, to prove the refusal paths.
    """
    unavailable = frozenset(unavailable)
    if mode == "language-only":
        report.mode = mode
        return
    report.mode = mode
    if sys.platform != "linux":
        raise IsolationUnavailable(
            f"the OS sandbox needs Linux (Landlock and seccomp), this is {sys.platform}"
        )
    _cgroup_memory(report)  # while the host may still write its cgroup (root: before the uid drop)
    if "uid" in unavailable:
        report.missing["uid"] = "unavailable (simulated by a test)"
    else:
        _drop_uid(report)
    _drop_capabilities()
    _limit_fds(report)
    _prctl(PR_SET_DUMPABLE, 0)  # no core dumps, /proc/self owned by root, no ptrace by the same uid
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0 or _prctl(PR_GET_NO_NEW_PRIVS) != 1:
        raise IsolationUnavailable(_err("no-new-privs"))
    report.layers.append("no-new-privs")
    if "landlock" in unavailable:
        raise IsolationUnavailable("landlock: unavailable (simulated by a test)")
    abi = _landlock(sorted({os.path.realpath(p) for p in readable if p and os.path.exists(p)}))
    report.landlock_abi = abi
    report.layers.append(f"landlock(abi {abi})")
    if "seccomp" in unavailable:
        raise IsolationUnavailable("seccomp: unavailable (simulated by a test)")
    _seccomp(os.getpid())
    report.layers.append("seccomp")
    report.uid = os.geteuid()
    if mode == "strict":
        wanted = [k for k in ("namespaces", "uid", "cgroup") if k in report.missing]
        if wanted:
            raise IsolationUnavailable(
                "strict isolation: " + "; ".join(f"{k}: {report.missing[k]}" for k in wanted)
            )


def _drop_uid(report: IsolationReport) -> None:
    """Root worker: become nobody, then enter a user namespace of our own (best effort, reported).

    Non-root worker: become the subordinate uid its user namespace maps (`_enter_user_namespace`); without
    one the host keeps the worker's uid, which is reported as the missing `uid` layer (`strict` refuses).
    """
    if _subordinate is not None:
        try:
            os.setgroups([])
            os.setresgid(1, 1, 1)  # inside the host's user namespace: the worker's subordinate ids
            os.setresuid(1, 1, 1)
        except OSError as exc:
            report.missing["uid"] = f"could not become the subordinate uid {_subordinate[0]}: {exc}"
            return
        report.layers.append(f"uid {_subordinate[0]}")
        return
    if os.geteuid() != 0:
        why = report.missing.pop("subordinate uid", "no user namespace")
        report.missing["uid"] = f"the host keeps the worker's uid {os.geteuid()} (it owns the worker's files): {why}"
        return
    try:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    except OSError as exc:
        report.missing["uid"] = f"could not drop root: {exc}"
        return
    report.layers.append(f"uid {NOBODY}")
    if _unshare(CLONE_NEWUSER) is None:
        # Changing uid made the process non-dumpable, which makes /proc/self root's: writable again
        # for the maps only (`lockdown` makes it non-dumpable for good).
        _prctl(PR_SET_DUMPABLE, 1)
        try:
            _map_ids(NOBODY, NOBODY)
        except OSError as exc:  # the namespace stays unmapped: harmless, capabilities are dropped next
            report.missing["userns map"] = str(exc)
        report.layers.append("userns")


def _limit_fds(report: IsolationReport) -> None:
    """RLIMIT_NOFILE = `HOST_MAX_FDS` (soft and hard: without CAP_SYS_RESOURCE it cannot be raised again).

    Every fd can pin kernel memory outside RLIMIT_AS (a pipe's buffer, an epoll set); with memfds,
    SysV/POSIX IPC and pipe resizing denied by seccomp, a host holds at most 64 x 64 KiB that way.
    """
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = HOST_MAX_FDS if hard == resource.RLIM_INFINITY else min(HOST_MAX_FDS, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
    except (ValueError, OSError) as exc:
        raise IsolationUnavailable(f"RLIMIT_NOFILE: {exc}") from None
    report.layers.append(f"fds {cap}")


def _drop_capabilities() -> None:
    """Empty the bounding, ambient, effective, permitted and inheritable capability sets."""
    for cap in range(64):
        if _prctl(PR_CAPBSET_DROP, cap) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the last capability the kernel knows
                break
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable} u32 triples
    sys_capset = _SYSCALLS.get(_arch(), {}).get("capset")
    if sys_capset is None:
        raise IsolationUnavailable(f"unsupported architecture {_arch()!r}")
    if _lib().syscall(sys_capset, ctypes.c_char_p(header), data) != 0:
        raise IsolationUnavailable(_err("capset"))


# Landlock --------------------------------------------------------------------------------------------
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    if sys.platform != "linux":
        return 0
    abi = int(_lib().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                             ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION)))
    return max(abi, 0)


def _landlock(readable: list[str]) -> int:
    abi = landlock_abi()
    if abi < 1:
        raise IsolationUnavailable(_err("landlock") + " (needs Linux >= 5.13 with Landlock enabled)")
    fs = _FS_ABI1
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    if abi >= 5:
        fs |= _FS_IOCTL_DEV
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("=QQQ", fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    lib = _lib()
    ruleset = int(lib.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.c_char_p(attr[:size]),
                              ctypes.c_size_t(size), ctypes.c_uint32(0)))
    if ruleset < 0:
        raise IsolationUnavailable(_err("landlock_create_ruleset"))
    try:
        for path in readable:
            is_dir = os.path.isdir(path)
            allowed = FS_READ_FILE | (FS_READ_DIR if is_dir else 0)
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", allowed, fd)
                if lib.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH,
                               ctypes.c_char_p(rule), ctypes.c_uint32(0)) != 0:
                    raise IsolationUnavailable(_err(f"landlock_add_rule {path}"))
            finally:
                os.close(fd)
        if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise IsolationUnavailable(_err("landlock_restrict_self"))
    finally:
        os.close(ruleset)
    return abi


# seccomp ---------------------------------------------------------------------------------------------
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_FS_IOC_SETFLAGS, _FS_IOC32_SETFLAGS, _FS_IOC_FSSETXATTR = 0x40086602, 0x40046602, 0x401C5820
_F_SETLEASE, _F_NOTIFY, _F_SETPIPE_SZ = 1024, 1026, 1031
# Syscalls allowed except for some values of one argument: (name, argument index, denied values).
# ioctl: faking terminal input, and inode flags / project ids of a file the host holds an fd of
# (chattr; Landlock's ioctl right covers devices only). fcntl: leases and dnotify on the worker's files,
# and pipe buffers grown past the 64 KiB default (kernel memory outside RLIMIT_AS, like memfds).
_ARG_DENIED: tuple[tuple[str, int, tuple[int, ...]], ...] = (
    ("ioctl", 1, (_TIOCSTI, _TIOCLINUX, _FS_IOC_SETFLAGS, _FS_IOC32_SETFLAGS, _FS_IOC_FSSETXATTR)),
    ("fcntl", 1, (_F_SETLEASE, _F_NOTIFY, _F_SETPIPE_SZ)),
)

# Denied outright (EPERM). Grouped by what they would give an attacker who runs native code.
_DENIED = (
    # network (the network namespace has no route anyway; Landlock denies TCP too)
    "socket socketpair connect bind listen accept accept4 sendto recvfrom sendmsg recvmsg sendmmsg "
    "recvmmsg shutdown getsockname getpeername setsockopt getsockopt "
    # new programs and processes (the host is single-threaded: no clone at all)
    "execve execveat fork vfork clone clone3 "
    # other processes' memory and signals
    "ptrace process_vm_readv process_vm_writev kcmp pidfd_open pidfd_getfd pidfd_send_signal tkill "
    "rt_sigqueueinfo rt_tgsigqueueinfo process_madvise "
    # leaving the process group / session the executor kills
    "setsid setpgid "
    # namespaces, mounts, root
    "unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick "
    "mount_setattr "
    # identity
    "setuid setgid setreuid setregid setresuid setresgid setfsuid setfsgid setgroups capset personality "
    # kernel attack surface a trace analyser never needs
    "bpf keyctl add_key request_key perf_event_open userfaultfd io_uring_setup io_uring_enter "
    "io_uring_register kexec_load kexec_file_load init_module finit_module delete_module reboot swapon "
    "swapoff acct quotactl quotactl_fd syslog iopl ioperm modify_ldt uselib lookup_dcookie "
    "name_to_handle_at open_by_handle_at migrate_pages move_pages sethostname "
    "setdomainname vhangup memfd_secret "
    # watching the file system: inotify/fanotify watch directories Landlock lets no one list (the blob
    # store's fan-out dirs would tell a host the names of other sessions' blobs)
    "inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark "
    # memory outside RLIMIT_AS: memfds (each up to RLIMIT_FSIZE), System V shared memory, semaphores and
    # message queues, POSIX message queues (the host's IPC namespace would hold them until it dies)
    "memfd_create shmget shmat shmctl shmdt semget semop semctl semtimedop msgget msgsnd msgrcv msgctl "
    "mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr "
    # metadata of files the host can name or holds an fd of (Landlock does not cover it): a host with the
    # worker's uid would chmod, chown, back-date (what `rr gc` read) or tag the worker's files
    "chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat utime utimes futimesat utimensat "
    "setxattr lsetxattr fsetxattr setxattrat removexattr lremovexattr fremovexattr removexattrat"
).split()
# Allowed only on the host itself (glibc's abort() signals itself).
_SELF_ONLY = ("kill", "tgkill")

_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "socket": 41, "connect": 42, "accept": 43, "sendto": 44, "recvfrom": 45, "sendmsg": 46,
        "recvmsg": 47, "shutdown": 48, "bind": 49, "listen": 50, "getsockname": 51, "getpeername": 52,
        "socketpair": 53, "setsockopt": 54, "getsockopt": 55, "clone": 56, "fork": 57, "vfork": 58,
        "execve": 59, "kill": 62, "ptrace": 101, "syslog": 103, "setuid": 105, "setgid": 106,
        "setpgid": 109, "setsid": 112, "setreuid": 113, "setregid": 114, "setgroups": 116,
        "setresuid": 117, "setresgid": 119, "setfsuid": 122, "setfsgid": 123, "capset": 126,
        "rt_sigqueueinfo": 129, "uselib": 134, "personality": 135, "vhangup": 153, "modify_ldt": 154,
        "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172,
        "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "tkill": 200,
        "lookup_dcookie": 212, "tgkill": 234, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "migrate_pages": 256, "unshare": 272, "move_pages": 279, "accept4": 288,
        "rt_tgsigqueueinfo": 297, "perf_event_open": 298, "recvmmsg": 299, "fanotify_init": 300,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "sendmmsg": 307, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "execveat": 322, "userfaultfd": 323,
        "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
        "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443, "memfd_secret": 447,
        "ioctl": 16, "fcntl": 72,
        "inotify_init": 253, "inotify_add_watch": 254, "inotify_init1": 294, "fanotify_mark": 301,
        "memfd_create": 319, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64,
        "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70,
        "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
        "mq_notify": 244, "mq_getsetattr": 245, "chmod": 90, "fchmod": 91, "fchmodat": 268,
        "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260, "utime": 132,
        "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188, "lsetxattr": 189,
        "fsetxattr": 190, "setxattrat": 463, "removexattr": 197, "lremovexattr": 198,
        "fremovexattr": 199, "removexattrat": 466,
    },
    # The generic table (asm-generic/unistd.h): no fork/vfork/iopl/ioperm/modify_ldt/uselib there.
    "aarch64": {
        "lookup_dcookie": 18, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51,
        "quotactl": 60, "vhangup": 58, "acct": 89, "capset": 91, "personality": 92, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "syslog": 116, "ptrace": 117,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "reboot": 142,
        "setregid": 143, "setgid": 144, "setreuid": 145, "setuid": 146, "setresuid": 147,
        "setresgid": 149, "setfsuid": 151, "setfsgid": 152, "setpgid": 154, "setsid": 157,
        "setgroups": 159, "sethostname": 161, "setdomainname": 162, "socket": 198, "socketpair": 199,
        "bind": 200, "listen": 201, "accept": 202, "connect": 203, "getsockname": 204,
        "getpeername": 205, "sendto": 206, "recvfrom": 207, "setsockopt": 208, "getsockopt": 209,
        "shutdown": 210, "sendmsg": 211, "recvmsg": 212, "add_key": 217, "request_key": 218,
        "keyctl": 219, "clone": 220, "execve": 221, "swapon": 224, "swapoff": 225,
        "migrate_pages": 238, "move_pages": 239, "rt_tgsigqueueinfo": 240, "perf_event_open": 241,
        "accept4": 242, "recvmmsg": 243, "fanotify_init": 262, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "setns": 268, "sendmmsg": 269, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280, "execveat": 281,
        "userfaultfd": 282, "kexec_file_load": 294, "pidfd_send_signal": 424, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434,
        "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
        "quotactl_fd": 443, "memfd_secret": 447, "fcntl": 25,
        # no inotify_init, chmod, chown, lchown, utime, utimes, futimesat in the generic table
        "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_mark": 263, "memfd_create": 279,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193,
        "semctl": 191, "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187,
        "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
        "mq_notify": 184, "mq_getsetattr": 185, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452,
        "fchown": 55, "fchownat": 54, "utimensat": 88, "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7,
        "setxattrat": 463, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16,
        "removexattrat": 466,
    },
}


def _arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def seccomp_program(arch: str, own_pid: int) -> bytes:
    """The BPF filter (struct sock_filter[]) for `arch`; `own_pid` is the only signal target allowed."""
    table = _SYSCALLS.get(arch)
    if table is None:
        raise IsolationUnavailable(f"seccomp: unsupported architecture {arch!r}")
    denied = sorted({table[name] for name in _DENIED if name in table})
    # Assemble with symbolic targets, then resolve the relative jumps (each must fit in a u8).
    prog: list[tuple[int, str | int, str | int, int]] = []
    prog.append((_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
    prog.append((_JEQ_K, 0, "kill", _AUDIT_ARCH[arch]))
    prog.append((_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    if arch == "x86_64":
        prog.append((_JGE_K, "kill", 0, _X32_SYSCALL_BIT))
    for nr in denied:
        prog.append((_JEQ_K, "deny", 0, nr))
    for name in _SELF_ONLY:
        prog.append((_JEQ_K, "self", 0, table[name]))
    for name, _arg, _values in _ARG_DENIED:
        prog.append((_JEQ_K, f"arg:{name}", 0, table[name]))
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    labels = {"self": len(prog)}
    prog.append((_LD_W_ABS, 0, 0, 16))  # args[0], low 32 bits (the kernel reads a pid_t)
    prog.append((_JEQ_K, "allow", "deny", own_pid))
    for name, arg, values in _ARG_DENIED:
        # the low 32 bits of the argument (both an ioctl request and an fcntl command are an int)
        labels[f"arg:{name}"] = len(prog)
        prog.append((_LD_W_ABS, 0, 0, 16 + 8 * arg))
        for i, value in enumerate(values):
            prog.append((_JEQ_K, "deny", "allow" if i == len(values) - 1 else 0, value))
    labels["allow"] = len(prog)
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    labels["deny"] = len(prog)
    prog.append((_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    labels["kill"] = len(prog)
    prog.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(prog):
        jumps = []
        for target in (jt, jf):
            offset = labels[target] - pc - 1 if isinstance(target, str) else target
            if not 0 <= offset <= 255:
                raise AssertionError("seccomp program: jump out of range")
            jumps.append(offset)
        out += struct.pack("=HBBI", code, jumps[0], jumps[1], k)
    return bytes(out)


def _seccomp(own_pid: int) -> None:
    program = seccomp_program(_arch(), own_pid)
    buf = ctypes.create_string_buffer(program, len(program))
    count = len(program) // 8

    class _SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _SockFprog(count, ctypes.addressof(buf))
    if _lib().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise IsolationUnavailable(_err("seccomp"))
