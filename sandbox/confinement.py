"""The host's lockdown after it has loaded what it needs: another uid, few fds, no capabilities, Landlock
(read-only: the Python installation and the project), seccomp (`sandbox.isolation` has the modes)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
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
    PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER,
    IsolationMode,
    IsolationReport,
    IsolationUnavailable,
    _err,
    _lib,
    _map_ids,
    _prctl,
    _unshare,
)

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
        "socket": 41,
        "connect": 42,
        "accept": 43,
        "sendto": 44,
        "recvfrom": 45,
        "sendmsg": 46,
        "recvmsg": 47,
        "shutdown": 48,
        "bind": 49,
        "listen": 50,
        "getsockname": 51,
        "getpeername": 52,
        "socketpair": 53,
        "setsockopt": 54,
        "getsockopt": 55,
        "clone": 56,
        "fork": 57,
        "vfork": 58,
        "execve": 59,
        "kill": 62,
        "ptrace": 101,
        "syslog": 103,
        "setuid": 105,
        "setgid": 106,
        "setpgid": 109,
        "setsid": 112,
        "setreuid": 113,
        "setregid": 114,
        "setgroups": 116,
        "setresuid": 117,
        "setresgid": 119,
        "setfsuid": 122,
        "setfsgid": 123,
        "capset": 126,
        "rt_sigqueueinfo": 129,
        "uselib": 134,
        "personality": 135,
        "vhangup": 153,
        "modify_ldt": 154,
        "pivot_root": 155,
        "chroot": 161,
        "acct": 163,
        "mount": 165,
        "umount2": 166,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "sethostname": 170,
        "setdomainname": 171,
        "iopl": 172,
        "ioperm": 173,
        "init_module": 175,
        "delete_module": 176,
        "quotactl": 179,
        "tkill": 200,
        "lookup_dcookie": 212,
        "tgkill": 234,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "migrate_pages": 256,
        "unshare": 272,
        "move_pages": 279,
        "accept4": 288,
        "rt_tgsigqueueinfo": 297,
        "perf_event_open": 298,
        "recvmmsg": 299,
        "fanotify_init": 300,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "sendmmsg": 307,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "execveat": 322,
        "userfaultfd": 323,
        "pidfd_send_signal": 424,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "pidfd_open": 434,
        "clone3": 435,
        "pidfd_getfd": 438,
        "process_madvise": 440,
        "mount_setattr": 442,
        "quotactl_fd": 443,
        "memfd_secret": 447,
        "ioctl": 16,
        "fcntl": 72,
        "inotify_init": 253,
        "inotify_add_watch": 254,
        "inotify_init1": 294,
        "fanotify_mark": 301,
        "memfd_create": 319,
        "shmget": 29,
        "shmat": 30,
        "shmctl": 31,
        "shmdt": 67,
        "semget": 64,
        "semop": 65,
        "semctl": 66,
        "semtimedop": 220,
        "msgget": 68,
        "msgsnd": 69,
        "msgrcv": 70,
        "msgctl": 71,
        "mq_open": 240,
        "mq_unlink": 241,
        "mq_timedsend": 242,
        "mq_timedreceive": 243,
        "mq_notify": 244,
        "mq_getsetattr": 245,
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "fchmodat2": 452,
        "chown": 92,
        "fchown": 93,
        "lchown": 94,
        "fchownat": 260,
        "utime": 132,
        "utimes": 235,
        "futimesat": 261,
        "utimensat": 280,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
        "setxattrat": 463,
        "removexattr": 197,
        "lremovexattr": 198,
        "fremovexattr": 199,
        "removexattrat": 466,
    },
    # The generic table (asm-generic/unistd.h): no fork/vfork/iopl/ioperm/modify_ldt/uselib there.
    "aarch64": {
        "lookup_dcookie": 18,
        "ioctl": 29,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "chroot": 51,
        "quotactl": 60,
        "vhangup": 58,
        "acct": 89,
        "capset": 91,
        "personality": 92,
        "unshare": 97,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "syslog": 116,
        "ptrace": 117,
        "kill": 129,
        "tkill": 130,
        "tgkill": 131,
        "rt_sigqueueinfo": 138,
        "reboot": 142,
        "setregid": 143,
        "setgid": 144,
        "setreuid": 145,
        "setuid": 146,
        "setresuid": 147,
        "setresgid": 149,
        "setfsuid": 151,
        "setfsgid": 152,
        "setpgid": 154,
        "setsid": 157,
        "setgroups": 159,
        "sethostname": 161,
        "setdomainname": 162,
        "socket": 198,
        "socketpair": 199,
        "bind": 200,
        "listen": 201,
        "accept": 202,
        "connect": 203,
        "getsockname": 204,
        "getpeername": 205,
        "sendto": 206,
        "recvfrom": 207,
        "setsockopt": 208,
        "getsockopt": 209,
        "shutdown": 210,
        "sendmsg": 211,
        "recvmsg": 212,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "execve": 221,
        "swapon": 224,
        "swapoff": 225,
        "migrate_pages": 238,
        "move_pages": 239,
        "rt_tgsigqueueinfo": 240,
        "perf_event_open": 241,
        "accept4": 242,
        "recvmmsg": 243,
        "fanotify_init": 262,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "setns": 268,
        "sendmmsg": 269,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "finit_module": 273,
        "bpf": 280,
        "execveat": 281,
        "userfaultfd": 282,
        "kexec_file_load": 294,
        "pidfd_send_signal": 424,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "pidfd_open": 434,
        "clone3": 435,
        "pidfd_getfd": 438,
        "process_madvise": 440,
        "mount_setattr": 442,
        "quotactl_fd": 443,
        "memfd_secret": 447,
        "fcntl": 25,
        # no inotify_init, chmod, chown, lchown, utime, utimes, futimesat in the generic table
        "inotify_init1": 26,
        "inotify_add_watch": 27,
        "fanotify_mark": 263,
        "memfd_create": 279,
        "shmget": 194,
        "shmat": 196,
        "shmctl": 195,
        "shmdt": 197,
        "semget": 190,
        "semop": 193,
        "semctl": 191,
        "semtimedop": 192,
        "msgget": 186,
        "msgsnd": 189,
        "msgrcv": 188,
        "msgctl": 187,
        "mq_open": 180,
        "mq_unlink": 181,
        "mq_timedsend": 182,
        "mq_timedreceive": 183,
        "mq_notify": 184,
        "mq_getsetattr": 185,
        "fchmod": 52,
        "fchmodat": 53,
        "fchmodat2": 452,
        "fchown": 55,
        "fchownat": 54,
        "utimensat": 88,
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "setxattrat": 463,
        "removexattr": 14,
        "lremovexattr": 15,
        "fremovexattr": 16,
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
