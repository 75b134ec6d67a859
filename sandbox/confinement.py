"""The host's lockdown after it has loaded what it needs: another uid, few fds, no capabilities, Landlock
(read-only: the Python installation and the project), seccomp (`sandbox.seccomp` has the filter,
`sandbox.isolation` the modes)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from collections.abc import Iterable

from sandbox import namespaces  # `_subordinate`: set there when the host's user namespace maps one
from sandbox.cgroups import _cgroup_memory
from sandbox.isolation import (
    _LINUX_CAPABILITY_VERSION_3,
    CLONE_NEWUSER,
    HOST_MAX_FDS,
    NOBODY,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_GET_NO_NEW_PRIVS,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    IsolationMode,
    IsolationReport,
    IsolationUnavailable,
    _err,
    _lib,
    _map_ids,
    _prctl,
    _unshare,
)
from sandbox.seccomp import _DENIED as _DENIED  # the tests read the filter's tables here too
from sandbox.seccomp import _SYSCALLS as _SYSCALLS
from sandbox.seccomp import _arch, _seccomp, seccomp_program

__all__ = ["landlock_abi", "lockdown", "seccomp_program"]


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
    if namespaces._subordinate is not None:
        try:
            os.setgroups([])
            os.setresgid(1, 1, 1)  # inside the host's user namespace: the worker's subordinate ids
            os.setresuid(1, 1, 1)
        except OSError as exc:
            report.missing["uid"] = (
                f"could not become the subordinate uid {namespaces._subordinate[0]}: {exc}"
            )
            return
        report.layers.append(f"uid {namespaces._subordinate[0]}")
        return
    if os.geteuid() != 0:
        why = report.missing.pop("subordinate uid", "no user namespace")
        report.missing["uid"] = (
            f"the host keeps the worker's uid {os.geteuid()} (it owns the worker's files): {why}"
        )
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
    abi = int(
        _lib().syscall(
            _SYS_LANDLOCK_CREATE_RULESET,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
        )
    )
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
    ruleset = int(
        lib.syscall(
            _SYS_LANDLOCK_CREATE_RULESET,
            ctypes.c_char_p(attr[:size]),
            ctypes.c_size_t(size),
            ctypes.c_uint32(0),
        )
    )
    if ruleset < 0:
        raise IsolationUnavailable(_err("landlock_create_ruleset"))
    try:
        for path in readable:
            is_dir = os.path.isdir(path)
            allowed = FS_READ_FILE | (FS_READ_DIR if is_dir else 0)
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", allowed, fd)
                if (
                    lib.syscall(
                        _SYS_LANDLOCK_ADD_RULE,
                        ruleset,
                        _LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.c_char_p(rule),
                        ctypes.c_uint32(0),
                    )
                    != 0
                ):
                    raise IsolationUnavailable(_err(f"landlock_add_rule {path}"))
            finally:
                os.close(fd)
        if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise IsolationUnavailable(_err("landlock_restrict_self"))
    finally:
        os.close(ruleset)
    return abi
