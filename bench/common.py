"""Shared benchmark plumbing: a dev server, a worker, starting reflections, CPU accounting, tables."""

from __future__ import annotations

import os
import statistics
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from reflector import client as rr
from reflector.contract import ReflectionConfig, TraceRef
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings

TRACE = {
    "question": "What is 17 * 24?",
    "ground_truth": "408",
    "steps": [{"role": "assistant", "content": "17 * 24 = 398"}],
    "final_answer": "398",
}


def bench_home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="rr-bench-"))
    os.environ["RR_HOME"] = str(home)
    os.environ.pop("RR_BLOB_DIR", None)
    return home


@dataclass
class BenchEnv:
    home: Path
    settings: Settings
    trace: TraceRef
    address: str
    server: DevServer
    metrics_url: str | None = None  # the server's Prometheus endpoint (bench.server_rpcs), when asked for


async def start_bench_env() -> BenchEnv:
    """A fresh rr home, the bench trace in its blob store, and a started embedded dev server
    (the caller stops `server`)."""
    home = bench_home()
    settings = Settings.from_env()
    trace = upload_bench_trace(settings)
    from bench.server_rpcs import top_n
    from reflector.runtime.devserver import LOOPBACK, free_port

    metrics_port = free_port() if top_n() else None
    extra = ["--metrics-port", str(metrics_port)] if metrics_port else []
    server = DevServer(home / "temporal.sqlite", ui=False, log_file=home / "server.log", extra_args=extra)
    address = await server.astart()
    url = f"http://{LOOPBACK}:{metrics_port}/metrics" if metrics_port else None
    return BenchEnv(home, settings, trace, address, server, url)


def upload_bench_trace(settings: Settings) -> TraceRef:
    import json

    path = settings.home / "bench-trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(TRACE))
    return rr.upload_trace(path, settings)


async def start(client, trace: TraceRef, model: str, tq: str, prefix: str = "bench"):  # type: ignore[no-untyped-def]
    inp = rr.build_input(trace, config=ReflectionConfig(model=model, max_requests=100))
    return await rr.start_reflection(client, inp, tq, f"{prefix}-{uuid.uuid4().hex[:10]}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its reaped children) from /proc, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) / ticks


def children_cpu(pid: int) -> float:
    """CPU of a process plus its live descendants (sandbox hosts)."""
    total = 0.0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            total += cpu_seconds(int(p.name))
    return cpu_seconds(pid) + total


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    return "\n".join(
        [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])]
    )
