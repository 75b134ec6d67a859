"""The worker's start-up heap kept out of the garbage collector's full collections (worker CPU per step).

A worker process holds the objects of everything it imported (temporalio, pydantic-ai, a provider SDK,
pydantic's schemas: hundreds of thousands of objects) and, while it runs, every cached reflection's. The
cyclic collector's full (generation 2) collection walks all of them, and it runs more often the more
reflections are cached: at 300 reflections in flight with a 3 s model, 22 full collections took 7.6 s of
the worker's CPU and all collections 11 s, about 11 % of the worker process (`RR_BENCH_GC=20 python -m
bench.throughput --point 3000:300 --kinds rr`). The start-up objects live as long as the process and never
become garbage, so `install()` moves them to the collector's permanent generation once the worker is built
(`gc.freeze()`, the documented use: the collector stops walking them; objects made later are collected as
before) and makes young collections rarer (`GEN0_THRESHOLD`): with both, that run's collections took 3.0 s
instead of 11. Only `rr worker` installs it, in a process of its own: an application that runs reflections
in its own process (the Python API) keeps its collector as it set it. Once per process.
"""

from __future__ import annotations

import gc

__all__ = ["install"]

_installed = False
# Allocations between young-generation collections (Python's default: 700). A worker allocates fast (every
# activation and request builds pydantic models and protobufs), and each tenth young collection is a middle
# one whose survivors move on and may start a full one: fewer, larger young collections mean fewer full ones.
GEN0_THRESHOLD = 20_000


def install() -> int:
    """Freeze the heap as it is now (call once everything the worker runs is imported); returns how many
    objects the collector will no longer walk (0 when already done)."""
    global _installed
    if _installed:
        return 0
    gc.collect()  # what is garbage already goes first: frozen objects are never freed by the collector
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gc.get_threshold()[0]), middle, old)
    _installed = True
    return gc.get_freeze_count()
