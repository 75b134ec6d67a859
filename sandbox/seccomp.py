"""The host's seccomp filter: the syscalls it may never make (per architecture), the few it may make only on
itself or with some argument values, and the BPF program that says so (`sandbox.confinement` installs it last)."""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

from sandbox.isolation import PR_SET_SECCOMP, SECCOMP_MODE_FILTER, IsolationUnavailable, _err, _lib

__all__ = ["seccomp_program"]

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
