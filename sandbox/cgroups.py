"""The host's cgroup v2 (under a delegated base: `RR_SANDBOX_CGROUP` or the worker's own): its memory and
pids limits, entered before the host runs and swept when it has ended (`sandbox.isolation` has the modes)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable

from sandbox.isolation import (
    CGROUP_ENV,
    CGROUP_MEMORY_SLACK,
    CGROUP_PREFIX,
    HOST_PIDS_MAX,
    IsolationMode,
    IsolationReport,
)

__all__ = ["check_cgroup_base", "cgroup2_mounts", "enter_cgroup", "find_cgroup_base", "own_cgroups"]

_cgroup_dir: str | None = None  # this host's own cgroup (the reaper and the host inherit it through fork)


_cgroup_home: str | None = None  # the cgroup the spawned process came from (the supervisor goes back there)


def _read_words(path: str) -> set[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def cgroup2_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
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


def own_cgroups(proc_cgroup: str = "/proc/self/cgroup") -> dict[str, str]:
    """This process's cgroup path per hierarchy: "" for v2 (the `0::` line), else each v1 controller's name."""
    out: dict[str, str] = {}
    try:
        with open(proc_cgroup, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                out[name] = parts[2] or "/"
    return out


def _own_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup v2 path (the `0::` line), or None (cgroup v1 only)."""
    return own_cgroups(proc_cgroup).get("")


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
    mounts = cgroup2_mounts()
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
            reasons.append(
                f"the worker is in the root cgroup of {root}; set {CGROUP_ENV} to a delegated cgroup"
            )
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
    own, mounts = _own_cgroup(), cgroup2_mounts()
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
