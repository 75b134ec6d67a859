"""How many sandbox hosts a machine can keep live: the default of `RR_MAX_LIVE_SANDBOXES`.

A live host is three processes (the namespaces' init, its reaper and the host), two of the worker's open files
and its memory: ~6 MB (PSS) idle with a small trace, ~19 MB with a 2.3 MB trace parsed into it (more with
larger traces; their children get slices). Above the cap the worker stops the idle host whose next cell is
furthest off and rebuilds it from its journal when its cell comes (~20-25 ms of CPU, `sandbox.eviction`),
so a cap below the reflections a worker holds turns model waits into rebuilds. A fixed count is wrong on
both kinds of machine (a 4 GiB box cannot hold 256 hosts with traces; a 64 GiB one rebuilds hosts it has
room for), so the default is sized from the machine:

* **memory**: a quarter of the machine's memory (or of its cgroup's limit, whichever is less) at
  `HOST_MEMORY_BYTES` per host;
* **open files**: what the worker's hard `RLIMIT_NOFILE` allows at `FDS_PER_HOST`, after `RESERVE` for
  everything else (`raise_open_files` lifts the soft limit to what the hosts need: 1,024 soft is common);
* **processes**: `RLIMIT_NPROC` and the cgroup's `pids.max`, at `PROCESSES_PER_HOST`, after `RESERVE`;

clamped to [`FLOOR`, `CEILING`]. It is a machine budget: `rr worker --processes N` gives each process 1/N.

A count does not bound memory when hosts are larger than usual (a trace just under the lazy-reading
threshold parses into ~100 MB per host), so the worker also holds its hosts to the memory the count stands
for: `max_live` x `HOST_MEMORY_BYTES`, each host's memory read by the worker after every cell
(`host_memory`, ~10 us); above it, idle hosts are stopped as above the count (`SessionManager`'s
`host_memory`). Hosts with small traces count ~12 MB against the 16 MiB, so the count is what binds them.
"""

from __future__ import annotations

import functools
import math
import os
import resource
from dataclasses import dataclass

from sandbox.cgroups import cgroup2_mounts, own_cgroups

__all__ = [
    "HOST_MEMORY_BYTES",
    "MEMORY_SHARE",
    "FDS_PER_HOST",
    "PROCESSES_PER_HOST",
    "RESERVE",
    "FLOOR",
    "CEILING",
    "HostBudget",
    "machine_budget",
    "host_budget",
    "cgroup_limit",
    "raise_open_files",
    "open_files_needed",
    "describe",
    "host_memory",
]

HOST_MEMORY_BYTES = 16 * 1024**2
MEMORY_SHARE = 0.25
FDS_PER_HOST = 3  # two held per live host, and room for a spawn's and a journal write's
PROCESSES_PER_HOST = 3
RESERVE = 512  # open files / processes left for the worker's own (connections, journals, the fork server)
FLOOR = 16
CEILING = 4096
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNLIMITED = 1 << 60  # cgroup "max", RLIM_INFINITY and v1's "no limit" (a page-rounded 2**63) read as this


@dataclass(frozen=True)
class HostBudget:
    """The live hosts a machine can keep, and which of its limits decided it."""

    hosts: int
    bound: str  # "memory", "open files", "processes", "floor" or "ceiling"
    memory_bytes: int

    def summary(self) -> str:
        return f"bound by {self.bound}; memory {self.memory_bytes / 1024**3:.1f} GiB"


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    if raw == "max":
        return _UNLIMITED
    try:
        return int(raw)
    except ValueError:
        return None


def _ancestors(root: str, path: str) -> list[str]:
    """`root` + `path` and each of its parents up to `root` (a limit anywhere above applies)."""
    out = []
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), -1, -1):
        out.append(os.path.join(root, *parts[:i]))
    return out


def cgroup_limit(
    v2_file: str,
    v1_controller: str,
    v1_file: str,
    *,
    proc_cgroup: str = "/proc/self/cgroup",
    v2_mounts: list[str] | None = None,
    v1_root: str = "/sys/fs/cgroup",
) -> int:
    """The tightest limit of this process's cgroups and their ancestors (v2 `v2_file`, v1
    `v1_controller/v1_file`), or _UNLIMITED where none is set."""
    own = own_cgroups(proc_cgroup)
    found = [_UNLIMITED]
    if "" in own:
        for mount in cgroup2_mounts() if v2_mounts is None else v2_mounts:
            for d in _ancestors(mount, own[""]):
                found.append(_read_int(os.path.join(d, v2_file)) or _UNLIMITED)
    if v1_controller in own:
        for d in _ancestors(os.path.join(v1_root, v1_controller), own[v1_controller]):
            found.append(_read_int(os.path.join(d, v1_file)) or _UNLIMITED)
    return min(found)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * 1024**3  # cannot tell: size for a small machine


def _rlimit(which: int, hard: bool) -> int:
    soft_value, hard_value = resource.getrlimit(which)
    value = hard_value if hard else soft_value
    return _UNLIMITED if value == resource.RLIM_INFINITY else value


def machine_budget(
    memory_bytes: int, open_files: int = _UNLIMITED, processes: int = _UNLIMITED
) -> HostBudget:
    """The budget for a machine with these limits (pure: `host_budget` reads them from this one)."""
    candidates = [
        (math.floor(memory_bytes * MEMORY_SHARE / HOST_MEMORY_BYTES), "memory"),
        ((open_files - RESERVE) // FDS_PER_HOST, "open files"),
        ((processes - RESERVE) // PROCESSES_PER_HOST, "processes"),
        (CEILING, "ceiling"),
    ]
    hosts, bound = min(candidates)
    if hosts < FLOOR:
        hosts, bound = FLOOR, "floor"
    return HostBudget(hosts=hosts, bound=bound, memory_bytes=memory_bytes)


@functools.cache
def host_budget() -> HostBudget:
    """This machine's budget (read once per process: memory, cgroup limits, the hard open-file and process
    limits)."""
    memory = min(_physical_memory(), cgroup_limit("memory.max", "memory", "memory.limit_in_bytes"))
    processes = min(_rlimit(resource.RLIMIT_NPROC, hard=False), cgroup_limit("pids.max", "pids", "pids.max"))
    return machine_budget(memory, _rlimit(resource.RLIMIT_NOFILE, hard=True), processes)


def open_files_needed(hosts: int) -> int:
    """The open files a worker process keeping `hosts` live hosts needs (theirs and its own reserve)."""
    return hosts * FDS_PER_HOST + RESERVE


def raise_open_files(hosts: int) -> int:
    """Lift this process's soft `RLIMIT_NOFILE` to what `hosts` live hosts need (never above the hard limit,
    never lowered); return how many hosts the limit now allows (less than `hosts`: the caller says so)."""
    need = open_files_needed(hosts)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    soft = _rlimit(resource.RLIMIT_NOFILE, hard=False)
    return max(1, min(hosts, (soft - RESERVE) // FDS_PER_HOST))


def describe(hosts: int, *, set_explicitly: bool) -> str:
    """The worker's start line for its live-host cap (`RR_MAX_LIVE_SANDBOXES`, or the machine's budget)."""
    if set_explicitly:
        return f"up to {hosts} live (RR_MAX_LIVE_SANDBOXES)"
    return (
        f"up to {hosts} live (RR_MAX_LIVE_SANDBOXES unset: this machine's budget, {host_budget().summary()})"
    )


def host_memory(pid: int | None) -> int:
    """A host's anonymous resident memory in bytes (`/proc/<pid>/statm`: resident minus file-backed and shared
    pages; 0 when it cannot be read). It counts the pages still shared with the fork server (~8 MB), so it
    overstates what the host alone holds: ~12 MB for an idle host with a small trace, ~24 MB with a 2.3 MB
    trace parsed (private: 4 and 16 MB). Read by the worker, never taken from the host's word."""
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            fields = fh.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0
