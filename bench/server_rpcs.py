"""What the Temporal server does per step: its own request counters, read from its Prometheus endpoint.

`RR_BENCH_SERVER_RPCS=N python -m bench.throughput ...` starts the bench's dev server with a metrics port
and prints, after each point, the N largest counters per step (model request) of that point: frontend
RPCs (`service_requests`, by operation), history/matching internal requests, persistence and visibility
writes. Both agents run on the same server one after the other, so each point's figures are the
difference of two scrapes around it.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections import Counter

ENV = "RR_BENCH_SERVER_RPCS"
_COUNTERS = ("service_requests", "persistence_requests", "visibility_persistence_requests")
_LINE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def top_n() -> int:
    """How many counters to print per point (0: off)."""
    raw = os.environ.get(ENV, "").strip()
    return int(raw) if raw else 0


def scrape(url: str) -> Counter[str]:
    """The server's request counters, summed per (counter, service, operation)."""
    counts: Counter[str] = Counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or m.group(1) not in _COUNTERS:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        key = f"{m.group(1)} {labels.get('service_name', '?')} {labels.get('operation', '?')}"
        counts[key] += int(float(m.group(3)))
    return counts


def report(name: str, before: Counter[str], after: Counter[str], steps: int, n: int) -> None:
    """Print the `n` largest per-step differences between two scrapes."""
    diff = Counter({k: after[k] - before[k] for k in after if after[k] - before[k] > 0})
    total = sum(v for k, v in diff.items() if k.startswith("service_requests frontend"))
    print(f"  {name}: frontend requests per step {total / steps:.2f}; largest counters per step:", flush=True)
    for key, count in diff.most_common(n):
        print(f"    {count / steps:8.2f}  {key}", flush=True)
