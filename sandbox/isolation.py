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

import ctypes
import errno
import os
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
    "parse_mode",
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
HOST_PIDS_MAX = (
    8  # the supervisor, the reaper and the host (seccomp allows no fork): slack for the kernel's view
)
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


def _subordinate_start(path: str, names: tuple[str, ...]) -> int | None:
    """The first id of the range `path` (`/etc/subuid` format: name:start:count) gives one of `names`."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if (
            len(parts) == 3
            and parts[0] in names
            and parts[1].isdigit()
            and parts[2].isdigit()
            and int(parts[2]) >= 1
        ):
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
                run = subprocess.run(
                    [tool, str(target), "0", str(own), "1", "1", str(first), "1"],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=10,
                    env={},
                )
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
        _map_ids(
            uid, gid
        )  # the uid map is still unwritten (newuidmap failed) or the gid map (then this raises)
        return answer
    return None
