"""Throughput: N concurrent scripted reflections on one worker, rr against the anchor, side by side.

Each kind has its own worker process and task queue on one embedded dev server: rr's worker
(`bench.worker`, rr's defaults) and the anchor's (`bench.anchor_worker`: the plain pydantic-ai
`TemporalDurability` agent on a worker with temporalio's default settings, as a user would run it).
Per grid point the two kinds run one after the other (anchor, then rr), so a drift of the machine
shows in both. CPU comes from /proc (utime+stime of the worker and all its descendants, i.e. sandbox
hosts, and of the server); memory is sampled every second (RSS of the worker process and the sum over
its descendants).

The model: `--transport http` (default) is a scripted OpenAI-compatible server on loopback
(`openai-chat:` models, the reply held `--latency` ms), so model requests take the path they take for
a real provider; `--transport function` is an in-process `FunctionModel` that sleeps (`bench.scripts`).
Either way the script is `--steps` cells, then the answer (steps + 1 model requests per reflection).
This process shares the machine too: "provider stand-in CPU" is the scripted HTTP model's handler threads
(thread CPU time per request), "memory sampler CPU" the thread that samples the workers' memory (its
`/proc` reads grow with rr's host processes), "clients CPU" the rest of it (starting reflections,
awaiting results).
"worker+server CPU" is the figure issue 29 judges; "evicted early" counts runs evicted from a worker's
workflow cache before they ended (`bench.evictions`, from the workers' logs).

    python -m bench.throughput --grid                        # latency {200,1000,3000} x in flight {50,200,500}
    python -m bench.throughput --latency 3000 --concurrency 500
    python -m bench.throughput [--concurrency 50 200] [--steps 10] [--latency 200] [--kinds anchor rr]
                               [--transport http|function] [--worker-processes N]
    python -m bench.throughput --point 200:50 --point 3000:300 --repeat 3   # both ends, interleaved, medians

Columns: steps/s (model requests the reflections report, per second of wall time); CPU ms/step of the worker (hosts included)
and of the server; wall / latency bound (the bound is (steps+1) x latency: a reflection cannot be
faster); WFT timeouts (workflow tasks that timed out while a worker held them, from the histories;
"not found" counts the worker's "Task not found" warnings; "sticky fallbacks" are tasks that waited on
the worker's sticky queue past its schedule-to-start timeout and went back to the shared queue); paid twice (model requests answered beyond those the reflections report having
made; a point whose reflections stopped otherwise than "completed" says so above the table); peak RSS of the worker process and of its sandbox hosts (summed: RSS counts shared pages in
every process, an upper bound), the most host processes seen (three per live host: supervisor,
reaper, host), and the peak PSS of worker + hosts (shared pages split among their users) per
in-flight reflection.

`--worker-processes N` runs N rr worker processes on the task queue (CPU and memory summed).
Set RR_BENCH_PYSPY=<file> (with py-spy on PATH) to sample the rr worker (GIL-holding threads only), and
RR_BENCH_SERVER_RPCS=N to print the server's N largest request counters per step of each point (`bench.server_rpcs`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import Client, WorkflowHandle

import bench.scripts as scripts
from bench import server_rpcs
from bench.anchor import AnchorWorkflow
from bench.common import BenchEnv, start, start_bench_env, table
from bench.evictions import MARK as EVICTION
from reflector.client import connect
from reflector.testing.openai_server import OpenAIServer

REPO = Path(__file__).resolve().parents[1]
GRID_LATENCIES_MS = scripts.GRID_LATENCIES_MS
GRID_CONCURRENCY = (50, 200, 500)
HTTP_MODEL = "openai-chat:bench-scripted"
WFT_TIMED_OUT = EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
WFT_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
START_TO_CLOSE = TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE


def bench_code(k: int) -> str:
    """The k-th cell of the scripted reflection (runs in rr's sandbox and in the anchor's `exec`)."""
    return f"v{k} = {k} * 2\nprint(v{k})"


# ----------------------------------------------------------------------------- process accounting


def _proc_table() -> dict[int, tuple[int, float, int]]:
    """pid -> (ppid, cpu seconds incl. reaped children, rss bytes) for every live process."""
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    out: dict[int, tuple[int, float, int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            f = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = sum(int(f[i]) for i in (11, 12, 13, 14)) / ticks
        out[int(p.name)] = (int(f[1]), cpu, int(f[21]) * page)
    return out


def _tree(pid: int, procs: dict[int, tuple[int, float, int]]) -> list[int]:
    kids: dict[int, list[int]] = {}
    for child, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def tree_cpu(pids: list[int]) -> float:
    procs = _proc_table()
    return sum(procs[p][1] for root in pids for p in _tree(root, procs) if p in procs)


def own_cpu(pids: list[int]) -> float:
    """CPU of the processes themselves (utime+stime, not their children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(f[11]) + int(f[12])) / ticks
    return total


def pss(pid: int) -> int:
    """Proportional set size (shared pages divided among the processes sharing them), bytes."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int] | None:
    """The pids `pid`'s threads started (`/proc/<pid>/task/<tid>/children`); None when the kernel has no
    such file (then the whole process table is read)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
        out.extend(int(x) for x in text.split())
    return out


def _stat_rss(pid: int, page: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[21]) * page
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class MemorySampler:
    """Peak memory of the worker processes themselves and of all their descendants (sandbox hosts):
    RSS every second, PSS (what the processes really add up to) every tenth sample.

    It reads only the workers' process trees (found through `/proc/<pid>/task/<tid>/children`), so what it
    costs grows with rr's host processes, not with everything on the machine; `cpu_s` is its own CPU
    (kernel time of the `/proc` reads included), reported apart from the clients' so that neither agent's
    figures carry it."""

    roots: list[int]
    worker_peak: int = 0
    hosts_peak: int = 0
    total_peak: int = 0
    total_pss_peak: int = 0
    hosts_peak_count: int = 0
    cpu_s: float = 0.0
    _n: int = 0
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def _tree(self) -> list[int]:
        """Every descendant of the roots (not the roots)."""
        out: list[int] = []
        todo = list(self.roots)
        while todo:
            kids = _children(todo.pop())
            if kids is None:  # no children files: the whole table
                procs = _proc_table()
                return [p for r in self.roots for p in _tree(r, procs)[1:] if p in procs]
            out.extend(kids)
            todo.extend(kids)
        return out

    def sample(self) -> None:
        t0 = time.thread_time()
        page = os.sysconf("SC_PAGE_SIZE")
        worker = sum(_stat_rss(r, page) or 0 for r in self.roots)
        tree = self._tree()
        rss = [_stat_rss(p, page) for p in tree]
        hosts = sum(r for r in rss if r is not None)
        self.worker_peak, self.hosts_peak = max(self.worker_peak, worker), max(self.hosts_peak, hosts)
        self.total_peak = max(self.total_peak, worker + hosts)
        self.hosts_peak_count = max(self.hosts_peak_count, sum(r is not None for r in rss))
        if self._n % 10 == 0:
            self.total_pss_peak = max(self.total_pss_peak, sum(pss(p) for p in [*self.roots, *tree]))
        self._n += 1
        self.cpu_s += time.thread_time() - t0

    async def _run(self) -> None:
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(1.0)

    def __enter__(self) -> MemorySampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.sample()


# ----------------------------------------------------------------------------------- the kinds


@dataclass
class Kind:
    name: str
    task_queue: str
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    client: Client

    def not_found_warnings(self) -> int:
        return sum(log.read_text(errors="replace").count("Task not found") for log in self.logs)

    def evictions(self) -> collections.Counter[str]:
        """Evictions from the workers' workflow caches so far, by the reason temporalio gives."""
        return collections.Counter(
            line[len(EVICTION) :].strip()
            for log in self.logs
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(EVICTION)
        )


def _spawn(module: str, home: Path, tag: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    log = home / f"{tag}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=REPO,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    return proc, log


async def _ready(kind: Kind) -> None:
    for proc, log in zip(kind.procs, kind.logs, strict=True):
        while "ready" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"{kind.name} worker exited: {log.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.1)


async def _start_batch(kind: Kind, n: int, model: str, env: BenchEnv) -> list[WorkflowHandle[Any, Any]]:
    sem = asyncio.Semaphore(50)

    async def one() -> WorkflowHandle[Any, Any]:
        async with sem:
            if kind.name == "rr":
                return await start(kind.client, env.trace, model, kind.task_queue, prefix=f"tp{n}")  # type: ignore[no-any-return]
            return await kind.client.start_workflow(
                AnchorWorkflow.run, model, id=f"anchor{n}-{uuid.uuid4().hex[:8]}", task_queue=kind.task_queue
            )

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def _history_counts(handles: list[WorkflowHandle[Any, Any]]) -> tuple[int, int, int]:
    """Workflow tasks that timed out while a worker held them (start-to-close), sticky tasks that waited
    past the sticky timeout and went back to the shared queue (schedule-to-start), failed tasks."""
    sem = asyncio.Semaphore(20)

    async def one(h: WorkflowHandle[Any, Any]) -> tuple[int, int, int]:
        async with sem:
            hist = await h.fetch_history()
        timed_out = [
            e.workflow_task_timed_out_event_attributes.timeout_type
            for e in hist.events
            if e.event_type == WFT_TIMED_OUT
        ]
        return (
            sum(t == START_TO_CLOSE for t in timed_out),
            sum(t != START_TO_CLOSE for t in timed_out),
            sum(e.event_type == WFT_FAILED for e in hist.events),
        )

    counts = await asyncio.gather(*(one(h) for h in handles))
    return tuple(sum(c[i] for c in counts) for i in range(3))  # type: ignore[return-value]


@dataclass
class Calls:
    """Model calls answered so far (the HTTP server's count, or the scripted models' call file)."""

    server: OpenAIServer | None

    def count(self) -> int:
        if self.server is not None:
            return sum(self.server.completed.values())
        return scripts.calls_so_far()

    def cpu(self) -> float:
        """CPU seconds the scripted HTTP model spent on requests so far (0 for in-process models)."""
        return self.server.cpu_s if self.server is not None else 0.0


def _finished(why: str) -> bool:
    """An eviction of a run that has ended (temporalio evicts every run from the cache once it completes)."""
    return "complet" in why.lower()


def _requests_used(results: list[Any]) -> tuple[int, collections.Counter[str]]:
    """Model requests the reflections report having made, and their stop reasons."""
    used, stops = 0, collections.Counter[str]()
    for r in results:
        if isinstance(r, int):  # the anchor returns its request count
            used += r
            stops["completed"] += 1
        else:
            used += int(r.raw.get("usage", {}).get("requests", 0))
            stops[str(r.raw.get("rr_trace", {}).get("stop_reason"))] += 1
    return used, stops


async def _results_while_alive(kind: Kind, handles: list[WorkflowHandle[Any, Any]]) -> list[Any]:
    """The runs' results, or an error naming the worker that died meanwhile (its exit status and last log
    lines) instead of waiting for reflections no worker will run."""
    gathered = asyncio.ensure_future(asyncio.gather(*(h.result() for h in handles), return_exceptions=True))
    while not gathered.done():
        await asyncio.wait([gathered], timeout=1.0)
        for proc, log in zip(kind.procs, kind.logs, strict=True):
            if (code := proc.poll()) is not None and not gathered.done():
                gathered.cancel()
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{kind.name} worker pid {proc.pid} died ({how}); log {log}:\n{tail}")
    return gathered.result()


async def run_point(
    kind: Kind, n: int, steps: int, latency: int, model: str, env: BenchEnv, calls: Calls
) -> list[object]:
    pids = [p.pid for p in kind.procs]
    o0 = own_cpu(pids)
    w0, s0, calls0, nf0 = (
        tree_cpu(pids),
        tree_cpu([env.server.pid or 0]),
        calls.count(),
        kind.not_found_warnings(),
    )
    ev0, p0 = kind.evictions(), calls.cpu()
    d0 = time.process_time()  # this process: the client and the scripted HTTP model
    rpcs0 = server_rpcs.scrape(env.metrics_url) if env.metrics_url else None
    with MemorySampler(pids) as mem:
        t = time.perf_counter()
        handles = await _start_batch(kind, n, model, env)
        results = await _results_while_alive(kind, handles)
        wall = time.perf_counter() - t
    o1 = own_cpu(pids)
    w1, s1, d1, p1 = tree_cpu(pids), tree_cpu([env.server.pid or 0]), time.process_time(), calls.cpu()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(
            f"{len(failed)}/{n} {kind.name} runs failed; first: {failed[0]!r} / "
            f"{getattr(failed[0], 'cause', None)!r}"
        )
    total_steps = n * (steps + 1)
    used, stops = _requests_used(results)
    if rpcs0 is not None and env.metrics_url:
        server_rpcs.report(kind.name, rpcs0, server_rpcs.scrape(env.metrics_url), used, server_rpcs.top_n())
    if set(stops) != {"completed"} or used != total_steps:
        print(
            f"  {kind.name}: stop reasons {dict(stops)}, {used} requests used, {total_steps} scripted",
            flush=True,
        )
    paid_twice = calls.count() - calls0 - used
    timeouts, sticky_fallbacks, wft_failed = await _history_counts(handles)
    evicted = kind.evictions() - ev0
    early = {why: k for why, k in evicted.items() if not _finished(why)}
    if early:
        print(f"  {kind.name}: evicted before finishing: {early}", flush=True)
    mb = 1024 * 1024
    worker_ms, server_ms = (w1 - w0) / used * 1000, (s1 - s0) / used * 1000
    return [
        kind.name,
        latency,
        n,
        wall,
        used / wall,
        worker_ms,
        (o1 - o0) / used * 1000,
        server_ms,
        worker_ms + server_ms,
        (p1 - p0) / used * 1000,
        (d1 - d0 - (p1 - p0) - mem.cpu_s) / used * 1000,
        mem.cpu_s / used * 1000,
        wall / ((steps + 1) * latency / 1000) if latency else "-",
        timeouts,  # 0 ms: no latency bound
        kind.not_found_warnings() - nf0,
        sticky_fallbacks,
        sum(early.values()),
        wft_failed,
        paid_twice,
        mem.worker_peak / mb,
        mem.hosts_peak / mb,
        mem.hosts_peak_count,
        mem.total_pss_peak / mb / n,
    ]


HEADERS = [
    "agent",
    "latency ms",
    "in flight",
    "wall s",
    "steps/s",
    "worker CPU ms/step",
    "of which worker process",
    "server CPU ms/step",
    "worker+server CPU ms/step",
    "provider stand-in CPU ms/step",
    "clients CPU ms/step",
    "memory sampler CPU ms/step",
    "wall / latency bound",
    "WFT timeouts",
    "not found",
    "sticky fallbacks",
    "evicted early",
    "WFT failed",
    "paid twice",
    "worker peak MB",
    "hosts peak MB",
    "host procs",
    "PSS MB per reflection",
]
# the columns of the summary (medians over the repeats), by header
SUMMARY = [
    "steps/s",
    "worker CPU ms/step",
    "server CPU ms/step",
    "worker+server CPU ms/step",
    "provider stand-in CPU ms/step",
    "sticky fallbacks",
    "evicted early",
    "WFT timeouts",
    "paid twice",
    "worker peak MB",
    "PSS MB per reflection",
]


def summary(rows: list[list[object]]) -> str:
    """Medians over the repeats of each point and agent, and rr / anchor of each median."""
    cols = [HEADERS.index(h) for h in SUMMARY]
    groups: dict[tuple[object, object, object], list[list[object]]] = {}
    for row in rows:
        groups.setdefault((row[1], row[2], row[0]), []).append(row)
    out: list[list[object]] = []
    for (lat, n, name), rs in groups.items():
        med = [statistics.median(float(r[c]) for r in rs) for c in cols]  # type: ignore[arg-type]
        out.append([name, lat, n, len(rs), *med])
        anchor = groups.get((lat, n, "anchor"))
        if name == "rr" and anchor:
            ref = [statistics.median(float(r[c]) for r in anchor) for c in cols]  # type: ignore[arg-type]
            out.append(
                ["rr / anchor", lat, n, "", *[m / a if a else "-" for m, a in zip(med, ref, strict=True)]]
            )
    return table(["agent", "latency ms", "in flight", "runs", *(f"median {h}" for h in SUMMARY)], out)


async def main(
    points: list[tuple[int, int]],
    steps: int,
    kinds: list[str],
    transport: str,
    procs: int = 1,
    repeat: int = 1,
) -> None:
    env = await start_bench_env()
    home, address = env.home, env.address
    os.environ[scripts.CALLS_FILE_ENV] = str(home / "model-calls")
    server = None
    extra: dict[str, str] = {"TEMPORAL_ADDRESS": address}
    if transport == "http":
        # latency is set per point; replies are decided from the request alone, like a real provider's
        server = OpenAIServer(cells=steps, code=bench_code, nodelay=True, record=False).start()
        extra |= {
            "OPENAI_BASE_URL": server.base_url,
            "OPENAI_API_KEY": "bench",
            "RR_WORKER_MODELS": HTTP_MODEL,
        }
        os.environ.update(extra)  # the client checks the model name too (today it builds the model)
    calls = Calls(server)
    started: dict[str, Kind] = {}
    try:
        for name in kinds:
            tq = f"tp-{name}-{uuid.uuid4().hex[:6]}"
            module, count = ("bench.worker", procs) if name == "rr" else ("bench.anchor_worker", 1)
            spawned = [
                _spawn(module, home, f"{name}{i}", {**extra, "RR_TASK_QUEUE": tq}) for i in range(count)
            ]
            client = (
                await connect(address)
                if name == "rr"
                else await Client.connect(address, plugins=[PydanticAIPlugin()])
            )
            started[name] = Kind(name, tq, [p for p, _ in spawned], [log for _, log in spawned], client)
        for kind in started.values():
            await _ready(kind)
        spy = None
        if os.environ.get("RR_BENCH_PYSPY") and "rr" in started:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "-p",
                    str(started["rr"].procs[0].pid),
                    "-r",
                    "100",
                    "-f",
                    "raw",
                    "--threads",
                    "--gil",
                    "-o",
                    os.environ["RR_BENCH_PYSPY"],
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        rows: list[list[object]] = []
        for rep in range(repeat):  # the points again and again, the kinds one after the other at each
            for latency, n in points:
                model = HTTP_MODEL if server is not None else scripts.model_name(steps, latency)
                if server is not None:
                    server.latency_s = latency / 1000
                if rep == 0:
                    for kind in started.values():
                        await run_point(kind, 2, steps, latency, model, env, calls)  # warm-up (not reported)
                for kind in started.values():
                    load = os.getloadavg()[0]
                    row = await run_point(kind, n, steps, latency, model, env, calls)
                    rows.append(row)
                    print(
                        f"[run {rep + 1}/{repeat}, load average before {load:.1f}, after {os.getloadavg()[0]:.1f}] "
                        + table(HEADERS, [row]).splitlines()[-1],
                        flush=True,
                    )
        print(
            f"\n{steps}-step scripted reflections ({transport} model), one worker process per agent + the "
            f"embedded dev server, {os.cpu_count()} cores"
        )
        print(table(HEADERS, rows))
        if repeat > 1 or len(started) > 1:
            print()
            print(summary(rows))
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
    finally:
        for kind in started.values():
            for p in kind.procs:
                p.terminate()
        for kind in started.values():
            for p in kind.procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if server is not None:
            server.stop()
        env.server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", action="store_true", help="latency {200,1000,3000} ms x in flight {50,200,500}")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[50, 200])
    ap.add_argument("--latency", type=int, nargs="+", default=[200])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kinds", nargs="+", default=["anchor", "rr"], choices=["anchor", "rr"])
    ap.add_argument("--transport", default="http", choices=["http", "function"])
    ap.add_argument("--worker-processes", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="run the points this many times (medians reported)")
    ap.add_argument(
        "--point",
        action="append",
        default=[],
        metavar="LATENCY_MS:IN_FLIGHT",
        help="a grid point (repeatable), instead of --latency x --concurrency",
    )
    a = ap.parse_args()
    if a.transport == "function" and any(
        (a.steps, lat)
        not in {(s, x) for s in scripts.STEPS for x in (*scripts.LATENCIES_MS, *GRID_LATENCIES_MS)}
        for lat in a.latency
    ):
        ap.error(
            f"--transport function has scripted models for steps {scripts.STEPS} and latencies "
            f"{sorted({*scripts.LATENCIES_MS, *GRID_LATENCIES_MS})} ms only"
        )
    lats, concs = (GRID_LATENCIES_MS, GRID_CONCURRENCY) if a.grid else (a.latency, a.concurrency)
    points = (
        [(int(p.split(":")[0]), int(p.split(":")[1])) for p in a.point]
        if a.point
        else [(lat, n) for lat in lats for n in concs]
    )
    # `timeout` or `kill` ends the bench like Ctrl-C: its workers and its dev server are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    asyncio.run(main(points, a.steps, a.kinds, a.transport, a.worker_processes, a.repeat))
