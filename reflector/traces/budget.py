"""How much memory a sandbox host needs for a trace: the documented formula, one place.

A trace read whole (small traces, and shapes that are not indexed) is parsed into Python objects,
which take 3-5x the file's size (measured: a 153 MB ACE trace), plus the file's bytes while parsing:

    eager host memory = HOST_BASE_BYTES + EAGER_FACTOR x trace size

A lazy (indexed) trace holds only its index and one read block at a time:

    lazy host memory  = HOST_BASE_BYTES + 2 x index size + LAZY_BLOCK_BYTES

`HOST_BASE_BYTES` covers the interpreter, the allowlisted modules and what cells build themselves.
The host's address-space limit (RLIMIT_AS) is this, and never below `HOST_MIN_BYTES` (the limit every
host had before traces were sized). A trace whose host would need more than the worker's cap
(`RR_SANDBOX_MAX_MEMORY_BYTES`) is refused before any workflow starts.
"""

from __future__ import annotations

__all__ = [
    "HOST_BASE_BYTES",
    "HOST_MIN_BYTES",
    "EAGER_FACTOR",
    "LAZY_BLOCK_BYTES",
    "host_memory_bytes",
    "host_need_bytes",
    "explain_refusal",
]

HOST_BASE_BYTES = 1024**3
HOST_MIN_BYTES = 4 * 1024**3
EAGER_FACTOR = 6
LAZY_BLOCK_BYTES = 64 * 1024**2


def host_need_bytes(trace_size: int, index_size: int | None) -> int:
    """What a host needs for a trace of `trace_size` bytes (`index_size`: its index, or None when the
    trace is read whole): the formula above."""
    if index_size is None:
        return HOST_BASE_BYTES + EAGER_FACTOR * trace_size
    return HOST_BASE_BYTES + 2 * index_size + LAZY_BLOCK_BYTES


def host_memory_bytes(trace_size: int, index_size: int | None) -> int:
    """The host's address-space limit: what it needs, and never less than `HOST_MIN_BYTES`."""
    return max(HOST_MIN_BYTES, host_need_bytes(trace_size, index_size))


def explain_refusal(trace_size: int, index_size: int | None, cap: int, why_whole: str = "") -> str | None:
    """The one-line refusal for a trace whose host would not fit under `cap`, else None."""
    need = host_need_bytes(trace_size, index_size)
    if need <= cap:
        return None
    gib = 1024**3
    if index_size is None:
        how = (f"it is read whole{' (' + why_whole + ')' if why_whole else ''}: {HOST_BASE_BYTES / gib:.0f} GiB + "
               f"{EAGER_FACTOR} x {trace_size / gib:.2f} GiB")
        fix = ("convert it to JSON lines (one step, message or run per line), which is read lazily, "
               "or raise RR_SANDBOX_MAX_MEMORY_BYTES on the workers")
    else:
        how = f"its index alone is {index_size / gib:.2f} GiB"
        fix = "split it into several traces (a batch), or raise RR_SANDBOX_MAX_MEMORY_BYTES on the workers"
    return (f"trace of {trace_size:,} bytes needs a sandbox host of {need / gib:.1f} GiB ({how}), over the "
            f"limit of {cap / gib:.1f} GiB: {fix}")
