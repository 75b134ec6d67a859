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


def _size(n: int) -> str:
    gib, mib = 1024**3, 1024**2
    return f"{n / gib:.2f} GiB" if n >= gib else f"{n / mib:.1f} MiB"


def explain_refusal(
    trace_size: int, index_size: int | None, cap: int, why_whole: str = "", fmt: str = ""
) -> str | None:
    """The one-line refusal for a trace whose host would not fit under `cap`, else None."""
    need = host_need_bytes(trace_size, index_size)
    if need <= cap:
        return None
    if index_size is None:
        how = (
            f"it is read whole{' (' + why_whole + ')' if why_whole else ''}: {_size(HOST_BASE_BYTES)} + "
            f"{EAGER_FACTOR} x {_size(trace_size)}"
        )
        if fmt == "otel":
            fix = "OTel spans are read whole in any container: split the trace (e.g. one file per trace id)"
        else:
            fix = (
                "store it as JSON lines (one step, message or run per line) or as a JSON object whose "
                "`steps` array holds the steps, which are read lazily"
            )
        fix += ", or raise RR_SANDBOX_MAX_MEMORY_BYTES on the workers"
    else:
        how = f"lazy, but its index alone is {_size(index_size)}"
        fix = "split it into several traces (a batch), or raise RR_SANDBOX_MAX_MEMORY_BYTES on the workers"
    return (
        f"trace of {trace_size:,} bytes needs a sandbox host of {_size(need)} ({how}), over the "
        f"limit of {_size(cap)}: {fix}"
    )
