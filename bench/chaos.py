"""Chaos: many reflections while workers are SIGKILLed and the Temporal server restarts (issue 10).

Two setups, each with its own embedded dev server (127.0.0.1, a free port, a temp SQLite file), its
own blob store shared by all its workers, its own task queue, its own local OpenAI-protocol server
(`reflector/testing/openai_server.py`, in this process, loopback only) and worker subprocesses
(`python -m reflector.cli worker`, i.e. `rr worker`, stdout/stderr in a log file per worker):

1. **uncrashed**: the N reflections, nothing killed, started one after the other over about as long as
   the chaos lasts (`--burst`: all at once);
2. **chaos**: the same N reflections, started in batches (one at the start, one right after each chaos
   event, so every event finds reflections running), while the process group (the worker and its
   sandbox hosts) of a random polling worker is SIGKILLed K times and the Temporal server is stopped
   and started again on the same port and SQLite file (`--server-restarts`, default 1) among the kills.
   A kill waits until two workers poll (so one always does; a victim is never a worker still starting)
   and a replacement is started at once. A worker that exits on its own is replaced too (reported).

Half the reflections use the built-in `heuristic` model on `reflector/examples/*.json`, the other half
`openai-chat:chaos-<i>` served by the local OpenAI server: `--cells` `execute_code` calls, then the
answer, every reply held `--latency-ms` (a provider round trip a kill can land in). The server counts
every request it *answered* (status 200, the whole reply written to a client still connected) by
its content (endpoint + canonical JSON body; the model name makes each reflection's requests distinct);
a request answered twice is a completed model request paid twice. Each worker uses its own base URL
prefix (`/wNN/v1`), so every answer names the worker it went to. A request whose client was killed
while it waited is not answered ("abandoned": the one in flight at the kill, sent again, paid once).
A watcher thread notes when each response file appears in the workers' response cache: "answer ->
response cached" is how long a response is paid for but not yet safe from a kill.

Outputs: both setups use the same workflow ids (two separate servers), so the complete
`ReflectorOutput` (`model_dump(mode="json")`) is compared, nothing excluded: it holds no timestamps,
durations or provider response ids (`raw.rr_trace` is counters, `raw.usage` and `raw.usage_records`
are the tokens the provider reported or the heuristic counted, plus kind/model/depth/workflow id;
`raw.thoughts`, `raw.model`, `raw.answer_correct` are data). Equal workflow ids are what removes the
usual exclusions (`raw.workflow_id`, `raw.usage_records[].workflow_id`).

Invariants (exit status 1 if any fails): every reflection completes in both setups within
`--timeout`; every chaos output equals the uncrashed one; 0 duplicated completed model requests; 0
task-slot / deadlock warnings in the worker logs (`TMPRL1101`, `Potential deadlock`, `slot may remain
forever used`, `Task not found when completing`); the planned kills and server restarts happened.
Nothing is exempted, but two causes are shown next to the counts: a duplicate whose first answer went
to a worker SIGKILLed less than `KILL_WINDOW_S` later (the answer died with the worker before it reached
the response cache), and a warning logged while the server was down or within `RESTART_ATTRIBUTION_S`
after it was back (a workflow task held across the outage cannot be completed: it timed out).

    python -m bench.chaos [--reflections 24] [--kills 8] [--server-restarts 1] [--seed 0] [--workers 2]
                          [--cells 16] [--latency-ms 300] [--gap 2 5] [--timeout 300] [--burst]
                          [--worker-models SPEC] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from bench.common import table
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig, ReflectorOutput
from reflector.runtime.devserver import DevServer, free_port
from reflector.runtime.settings import Settings
from reflector.testing.openai_server import OpenAIServer, request_key

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = (
    REPO / "reflector" / "examples" / "failed_math.json",
    REPO / "reflector" / "examples" / "tool_error.json",
)
WARNING_PATTERNS = (
    "TMPRL1101",
    "Potential deadlock",
    "slot may remain forever used",
    "Task not found when completing",
)
API_KEY = "chaos-key"
READY_MARK = "rr worker pid="
# A request answered to a worker that is SIGKILLed this soon after is the one "in flight at the kill": the
# answer had not reached the response cache yet (reported, still counted against the invariant).
KILL_WINDOW_S = 0.1
# A workflow task held across a server outage cannot be completed or renewed; it times out 4 s after it
# was last renewed (the workflow-task timeout), so warnings up to this long after the server is back
# are attributed to the restart (reported, still counted against the invariant).
RESTART_ATTRIBUTION_S = 5.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Job:
    wid: str
    model: str
    trace: Path

    @property
    def kind(self) -> str:
        return "heuristic" if self.model == "heuristic" else "scripted"


def plan_jobs(n: int) -> list[Job]:
    """Even indices: heuristic, odd: a scripted model of their own; traces alternate."""
    jobs = []
    for i in range(n):
        trace = EXAMPLES[(i // 2) % len(EXAMPLES)]
        model = "heuristic" if i % 2 == 0 else f"openai-chat:chaos-{i:02d}"
        jobs.append(Job(f"chaos-{i:02d}-{'h' if i % 2 == 0 else 's'}", model, trace))
    return jobs


def comparable(out: ReflectorOutput) -> dict[str, Any]:
    """The whole output: see the module docstring for why nothing is excluded."""
    return out.model_dump(mode="json")


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}" if path else str(k))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:120]!r} != {str(b)[:120]!r}"]


@dataclass
class RunStats:
    label: str
    reflections: int
    kills: int = 0
    kills_in_flight: int = 0  # kills made while some reflection was still running
    running_at_kills: int = 0  # reflections running at the kills, summed over the kills
    server_restarts: int = 0
    completed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests_answered: int = 0
    requests_abandoned: int = 0
    duplicates: int = 0  # extra answers to already-answered requests
    duplicates_at_kill: int = 0  # of them: the first answer went to a worker SIGKILLed < KILL_WINDOW_S later
    duplicate_details: list[str] = field(default_factory=list)
    cache_lag_ms: list[float] = field(default_factory=list)  # server's answer -> response file in the cache
    warnings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WARNING_PATTERNS, 0))
    warning_lines: list[str] = field(default_factory=list)
    warnings_after_restart: int = 0  # of all warning lines: logged while the server was down or just after
    restart_windows: list[tuple[float, float]] = field(default_factory=list)  # (stopped at, back at), epoch s
    workers_started: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    root: Path | None = None


@dataclass
class ChaosReport:
    chaos: RunStats
    uncrashed: RunStats
    planned_kills: int
    planned_restarts: int
    equal: int = 0
    differing: dict[str, list[str]] = field(default_factory=dict)

    def failures(self) -> list[str]:
        out = []
        for s in (self.uncrashed, self.chaos):
            if s.completed != s.reflections:
                out.append(
                    f"{s.label}: {s.completed}/{s.reflections} completed (failed {sorted(s.failed)}, "
                    f"stuck {s.stuck})"
                )
            if s.duplicates:
                out.append(f"{s.label}: {s.duplicates} duplicated completed model request(s)")
            if sum(s.warnings.values()):
                out.append(
                    f"{s.label}: task-slot/deadlock warnings in worker logs: "
                    + ", ".join(f"{k}={v}" for k, v in s.warnings.items() if v)
                )
        if self.equal != self.chaos.reflections:
            out.append(
                f"{self.equal}/{self.chaos.reflections} chaos outputs equal the uncrashed ones "
                f"(differing: {sorted(self.differing)})"
            )
        if self.chaos.kills != self.planned_kills:
            out.append(f"{self.chaos.kills}/{self.planned_kills} planned kills happened")
        if self.chaos.server_restarts != self.planned_restarts:
            out.append(
                f"{self.chaos.server_restarts}/{self.planned_restarts} planned server restarts happened"
            )
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()


# -- environment of this process --------------------------------------------------------------------


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """Set variables for this process (the client's blob store, model-name checks), restore after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- workers --------------------------------------------------------------------------------------


@dataclass
class _Worker:
    idx: int
    proc: subprocess.Popen[bytes]
    log: Path
    out: IO[bytes]
    killed: bool = False
    offset: int = 0  # of the log, read so far
    lines: list[tuple[float, str]] = field(default_factory=list)  # (when first seen, line)

    @property
    def ready(self) -> bool:
        return any(READY_MARK in line for _, line in self.lines)


class WorkerPool:
    """Worker subprocesses started by this process; ended only by their PID (their process group).

    Worker `i` reaches the OpenAI server at `<oai_root>/wNN/v1`, so every answer names its worker."""

    def __init__(self, root: Path, env: dict[str, str], oai_root: str, say: Callable[[str], None]) -> None:
        self.root, self.env, self.oai_root, self.say = root, env, oai_root, say
        self.live: list[_Worker] = []
        self.all: list[_Worker] = []
        self.unexpected_exits: list[str] = []

    def spawn(self) -> _Worker:
        idx = len(self.all)
        log = self.root / f"worker-{idx:02d}.log"
        out = open(log, "wb")  # closed in stop_all(
        env = {**os.environ, **self.env, "OPENAI_BASE_URL": f"{self.oai_root}/w{idx:02d}/v1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "reflector.cli", "worker", "--processes", "1"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        w = _Worker(idx, proc, log, out)
        self.live.append(w)
        self.all.append(w)
        return w

    async def ready(self, w: _Worker, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.read_logs()
            if w.ready:
                return True
            if w.proc.poll() is not None:
                return False
            await asyncio.sleep(0.05)
        return False

    def kill(self, w: _Worker) -> None:
        """SIGKILL the worker's process group (the worker and its sandbox hosts), like a machine loss."""
        w.killed = True
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(10)
        with contextlib.suppress(ValueError):
            self.live.remove(w)

    def polling(self) -> list[_Worker]:
        """Live workers that said they are ready (they poll the task queue)."""
        self.read_logs()
        return [w for w in self.live if w.proc.poll() is None and w.ready]

    def read_logs(self) -> None:
        """Stamp new complete log lines with the time they were first seen (log formats vary; ±0.1 s)."""
        now = time.time()
        for w in self.all:
            with contextlib.suppress(OSError), open(w.log, "rb") as f:
                f.seek(w.offset)
                data = f.read()
                end = data.rfind(b"\n") + 1
                w.offset += end
                w.lines += [(now, line) for line in data[:end].decode(errors="replace").splitlines()]

    async def supervise(self, target: int, stop: asyncio.Event) -> None:
        """Replace workers that exited on their own (e.g. started while the server was down)."""
        while not stop.is_set():
            self.read_logs()
            for w in list(self.live):
                code = w.proc.poll()
                if code is not None and not w.killed:
                    tail = w.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                    self.unexpected_exits.append(f"{w.log.name}: exit {code}: {tail[0][:200]}")
                    self.say(f"worker {w.proc.pid} exited by itself ({code}); replacing it")
                    self.live.remove(w)
            while len(self.live) < target and not stop.is_set():
                self.spawn()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def stop_all(self) -> None:
        for w in self.live:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for w in list(self.live):
            while w.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if w.proc.poll() is None:
                self.kill(w)
        self.live.clear()
        for w in self.all:
            with contextlib.suppress(OSError):
                w.out.close()

    def scan_logs(self, stats: RunStats) -> None:
        self.read_logs()
        for w in self.all:
            with contextlib.suppress(OSError), open(w.log, "rb") as f:  # a last line without a newline
                f.seek(w.offset)
                w.lines += [(time.time(), line) for line in f.read().decode(errors="replace").splitlines()]
            for n, (t, raw) in enumerate(w.lines, 1):
                line = _ANSI.sub("", raw).strip()
                hits = [pat for pat in WARNING_PATTERNS if pat in line]
                if not hits:
                    continue
                for pat in hits:
                    stats.warnings[pat] += 1
                near = any(a <= t <= b + RESTART_ATTRIBUTION_S for a, b in stats.restart_windows)
                stats.warnings_after_restart += near
                if len(stats.warning_lines) < 12:
                    where = "during/just after a server restart" if near else "not near a server restart"
                    stats.warning_lines.append(f"{w.log.name}:{n} ({where}): {line[:260]}")


class CacheWatcher:
    """When each model response first appeared in `<blob dir>/responses/<session>/` (polled every 3 ms):
    with the server's answer times, how long a response is paid for but not yet safe from a kill."""

    def __init__(self, root: Path, every_s: float = 0.003) -> None:
        self.root, self.every_s = root, every_s
        self.seen: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cache-watcher", daemon=True)

    def start(self) -> CacheWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            now = time.time()
            with contextlib.suppress(OSError):
                for d in os.scandir(self.root):
                    files = self.seen.setdefault(d.name, {})
                    with contextlib.suppress(OSError):
                        for f in os.scandir(d.path):
                            if not f.name.startswith("."):
                                files.setdefault(f.name, now)


# -- reflections ------------------------------------------------------------------------------------


async def _start(
    client: Client, job: Job, trace_refs: dict[Path, Any], tq: str, deadline: float
) -> WorkflowHandle[Any, ReflectorOutput]:
    inp = rr.build_input(trace_refs[job.trace], config=ReflectionConfig(model=job.model))
    while True:
        try:
            return await rr.start_reflection(client, inp, tq, job.wid)
        except WorkflowAlreadyStartedError:  # an earlier attempt reached the server before it went away
            return client.get_workflow_handle(job.wid, result_type=ReflectorOutput)
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _result(handle: WorkflowHandle[Any, ReflectorOutput], deadline: float) -> ReflectorOutput | str:
    while True:
        try:
            return await handle.result()
        except WorkflowFailureError as exc:
            return f"failed: {exc.cause!r}"[:500]
        except RPCError:  # the server is restarting
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


@dataclass(frozen=True)
class Chaos:
    kills: int
    server_restarts: int
    seed: int
    gap_s: tuple[float, float]
    downtime_s: tuple[float, float] = (1.0, 3.0)

    @property
    def n_events(self) -> int:
        return self.kills + self.server_restarts

    def events(self) -> list[tuple[float, str]]:
        """(sleep before, "kill" | "restart"), seeded; restarts spread evenly among the kills."""
        rng = random.Random(self.seed)
        names = ["kill"] * self.kills
        for r in range(self.server_restarts):
            names.insert(round((r + 1) * self.kills / (self.server_restarts + 1)) + r, "restart")
        return [(rng.uniform(*self.gap_s), name) for name in names]

    @property
    def window_s(self) -> float:
        """About how long the events take (a restart: ~1 s to stop, the downtime, ~1 s to start)."""
        return (self.kills + self.server_restarts) * sum(self.gap_s) / 2 + self.server_restarts * (
            2.0 + sum(self.downtime_s) / 2
        )


async def run_setup(
    label: str,
    root: Path,
    jobs: list[Job],
    *,
    workers: int,
    cells: int,
    latency_ms: int,
    timeout_s: float,
    spread_s: float,
    chaos: Chaos | None,
    say: Callable[[str], None],
    worker_env: dict[str, str] | None = None,
    derived_queue: bool = False,
) -> RunStats:
    """One setup from scratch (server, OpenAI server, workers), the jobs on it, everything stopped after.

    `derived_queue`: nothing but RR_HOME names the store and no RR_TASK_QUEUE is set: workers and client
    derive the queue from the store's id, as a user's setup does (`reflector.runtime.storage.identity`)."""
    root.mkdir(parents=True, exist_ok=True)
    home = root / "home"
    stats = RunStats(label, len(jobs), root=root)
    t_begin = time.monotonic()
    deadline = t_begin + timeout_s
    server = DevServer(root / "temporal.sqlite", port=free_port(), ui=False, log_file=root / "server.log")
    oai = OpenAIServer(cells=cells, latency_s=latency_ms / 1000, nodelay=True).start()
    tq = f"chaos-{label}-{os.getpid()}"
    placement = {} if derived_queue else {"RR_BLOB_DIR": str(home / "blobs"), "RR_TASK_QUEUE": tq}
    env = {
        "RR_HOME": str(home),
        **placement,
        "OPENAI_BASE_URL": oai.base_url,
        "OPENAI_API_KEY": API_KEY,
        "RR_STICKY_TIMEOUT_S": "1",
        **(worker_env or {}),
    }
    pool: WorkerPool | None = None
    kill_times: list[tuple[float, int]] = []  # (time.time(), worker index)
    stop_supervisor = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    watcher = CacheWatcher(home / "blobs" / "responses").start()
    try:
        with _env(env):
            address = await server.astart(timeout=30)
            env["TEMPORAL_ADDRESS"] = address
            pool = WorkerPool(root, env, oai.base_url.removesuffix("/v1"), say)
            settings = dataclasses.replace(
                Settings.from_env(),
                home=home,
                address=address,
                task_queue_setting="" if derived_queue else tq,
            )
            tq = (
                settings.task_queue
            )  # derived: rr-<store id>, the queue the workers derive from the same store
            client = await connect(address, settings=settings)
            trace_refs = {p: rr.upload_trace(p, settings) for p in {j.trace for j in jobs}}
            first = [pool.spawn() for _ in range(workers)]
            if not all(await asyncio.gather(*(pool.ready(w) for w in first))):
                raise RuntimeError(f"{label}: a worker did not start; see {root}/worker-*.log")
            supervisor = asyncio.create_task(pool.supervise(workers, stop_supervisor))
            tasks.append(supervisor)
            done: set[str] = set()
            started: set[str] = set()
            # chaos: batch b of the reflections starts right after event b - 1 (batch 0 at once), so every
            # event finds a batch running; uncrashed: one every `spread_s`
            gates = [asyncio.Event() for _ in range(chaos.n_events if chaos else 0)]

            async def one(i: int, job: Job) -> tuple[Job, ReflectorOutput | str]:
                if gates:
                    await gates[i * len(gates) // len(jobs)].wait()
                else:
                    await asyncio.sleep(i * spread_s)
                started.add(job.wid)
                handle = await _start(client, job, trace_refs, tq, deadline)
                res = await _result(handle, deadline)
                done.add(job.wid)
                return job, res

            runs = [asyncio.create_task(one(i, j)) for i, j in enumerate(jobs)]
            tasks += runs
            if chaos is not None:
                tasks.append(
                    asyncio.create_task(
                        _chaos(chaos, server, pool, stats, started, done, gates, kill_times, deadline, say)
                    )
                )
            finished, pending = await asyncio.wait(runs, timeout=max(0.0, deadline - time.monotonic()))
            for t in finished:
                if t.exception() is not None:
                    stats.failed[f"task-{runs.index(t)}"] = repr(t.exception())[:300]
                    continue
                job, res = t.result()
                if isinstance(res, str):
                    stats.failed[job.wid] = res
                else:
                    stats.completed += 1
                    stats.outputs[job.wid] = comparable(res)
            stats.stuck = sorted(j.wid for j in jobs if j.wid not in done)
            if chaos is not None:
                try:  # the planned chaos finishes (bounded by the deadline) before the counts
                    await tasks[-1]
                except Exception as exc:
                    stats.failed["chaos"] = f"the chaos task failed: {exc!r}"[:500]
            stats.wall_s = time.monotonic() - t_begin
    finally:
        stop_supervisor.set()
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pool is not None:
            await pool.stop_all()
            pool.scan_logs(stats)
            stats.workers_started = len(pool.all)
            stats.unexpected_exits = pool.unexpected_exits
        await server.astop()
        oai.stop()
        watcher.stop()
    _count_requests(oai, stats, kill_times)
    _cache_lags(oai, watcher, jobs, stats)
    return stats


def _cache_lags(oai: OpenAIServer, watcher: CacheWatcher, jobs: list[Job], stats: RunStats) -> None:
    """Pair each scripted reflection's answers with its cached responses in order (only when their numbers
    match, i.e. nothing was sent again or lost)."""
    model_of = {request_key(r.path, r.body): str(r.body.get("model")) for r in oai.requests}
    answered: dict[str, list[float]] = {}
    for key, answers in oai.answers.items():
        answered.setdefault(model_of.get(key, "?"), []).extend(t for t, _ in answers)
    for job in jobs:
        if job.kind != "scripted":
            continue
        times = sorted(answered.get(job.model.split(":", 1)[1], []))
        files = sorted(watcher.seen.get(job.wid, {}).values())
        if times and len(times) == len(files):
            stats.cache_lag_ms += [(f - t) * 1000 for t, f in zip(times, files, strict=True)]


async def _chaos(
    chaos: Chaos,
    server: DevServer,
    pool: WorkerPool,
    stats: RunStats,
    started: set[str],
    done: set[str],
    gates: list[asyncio.Event],
    kill_times: list[tuple[float, int]],
    deadline: float,
    say: Callable[[str], None],
) -> None:
    """The planned events. Before a kill, wait (bounded) until two workers poll: one always does, and the
    victim is never a worker still starting. Then batch j of the reflections starts, the gap passes (the
    batch runs) and event j happens. Every gate is opened at the end, whatever happened, so no reflection
    waits for an event that will not come."""
    rng = random.Random(chaos.seed + 1)
    try:
        for j, (sleep_s, what) in enumerate(chaos.events()):
            if what == "kill":
                want = min(2, len(pool.live)) or 1
                while len(pool.polling()) < want and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            gates[j].set()
            await asyncio.sleep(sleep_s)
            if time.monotonic() > deadline:
                return
            if what == "kill":
                _kill_one(pool, stats, rng, started, done, kill_times, chaos.kills, say)
            else:
                await _restart(server, stats, rng, chaos.downtime_s, say)
    finally:
        for g in gates:
            g.set()


def _kill_one(
    pool: WorkerPool,
    stats: RunStats,
    rng: random.Random,
    started: set[str],
    done: set[str],
    kill_times: list[tuple[float, int]],
    planned: int,
    say: Callable[[str], None],
) -> None:
    candidates = pool.polling() or pool.live
    if not candidates:
        return
    victim = rng.choice(candidates)
    running = len(started - done)
    pool.kill(victim)
    kill_times.append((time.time(), victim.idx))
    stats.kills += 1
    stats.kills_in_flight += running > 0
    stats.running_at_kills += running
    pool.spawn()  # the replacement starts at once
    say(
        f"[{stats.label}] SIGKILL worker w{victim.idx:02d} pid {victim.proc.pid} ({stats.kills}/{planned}), "
        f"{running} reflection(s) running"
    )


async def _restart(
    server: DevServer,
    stats: RunStats,
    rng: random.Random,
    downtime_s: tuple[float, float],
    say: Callable[[str], None],
) -> None:
    say(f"[{stats.label}] stopping the Temporal server (pid {server.pid})")
    t_down = time.time()
    await server.astop()
    await asyncio.sleep(rng.uniform(*downtime_s))
    await server.astart(timeout=30)
    stats.restart_windows.append((t_down, time.time()))
    stats.server_restarts += 1
    say(f"[{stats.label}] Temporal server back on {server.address} (pid {server.pid})")


_WORKER_TAG = re.compile(r"/w(\d+)/v1/")


def _count_requests(oai: OpenAIServer, stats: RunStats, kill_times: list[tuple[float, int]]) -> None:
    """Duplicates, each with who got the answers and when the worker that got the first one was killed."""
    stats.requests_answered = sum(oai.completed.values())
    stats.requests_abandoned = oai.abandoned
    bodies = {request_key(r.path, r.body): r.body for r in oai.requests}
    for key, n in oai.duplicated_completions().items():
        stats.duplicates += n - 1
        answers = oai.answers.get(key, [])
        t0, path0 = answers[0]

        def tag(path: str) -> int:
            m = _WORKER_TAG.search(path)
            return int(m.group(1)) if m else -1

        first_worker = tag(path0)
        killed = [t - t0 for t, idx in kill_times if idx == first_worker and t >= t0]
        at_kill = bool(killed) and min(killed) <= KILL_WINDOW_S
        stats.duplicates_at_kill += (n - 1) if at_kill else 0
        body = bodies.get(key, {})
        n_msgs = len(body.get("messages") or body.get("input") or [])
        shown = ", ".join(f"w{tag(p):02d} at +{t - t0:.3f} s" for t, p in answers)
        stats.duplicate_details.append(
            f"{body.get('model', '?')} request {key[:10]} ({n_msgs} messages) answered {n}x: {shown}; "
            + (
                f"w{first_worker:02d} was SIGKILLed {min(killed) * 1000:.0f} ms after the first answer"
                if killed
                else f"w{first_worker:02d} was not killed after the first answer"
            )
        )


# -- the whole run ----------------------------------------------------------------------------------


async def run_chaos(
    reflections: int = 24,
    kills: int = 8,
    server_restarts: int = 1,
    seed: int = 0,
    workers: int = 2,
    cells: int = 16,
    latency_ms: int = 300,
    gap_s: tuple[float, float] = (2.0, 5.0),
    timeout_s: float = 300.0,
    workdir: Path | None = None,
    say: Callable[[str], None] | None = None,
    burst: bool = False,
    worker_env: dict[str, str] | None = None,
    two_homes_at_once: bool = False,
) -> ChaosReport:
    """The uncrashed setup, then the chaos setup, then the comparison (see the module docstring).

    `two_homes_at_once`: both setups run at the same time on this machine, each on its own home whose
    queue is derived from its store (no RR_TASK_QUEUE, no RR_BLOB_DIR: issue 26).

    `burst`: the uncrashed setup starts every reflection at once (default: one after the other).
    `worker_env`: more environment for the workers (e.g. `RR_WORKER_MODELS`)."""
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    root = workdir or Path(tempfile.mkdtemp(prefix="rr-chaos-"))
    jobs = plan_jobs(reflections)
    plan = Chaos(kills, server_restarts, seed, gap_s)
    # reflections start one after the other over the chaos window, so the events find some running
    spread = plan.window_s / max(1, reflections)
    say(
        f"chaos: {reflections} reflections, {kills} kills, {server_restarts} server restart(s), seed {seed}; "
        f"logs in {root}"
    )
    common: dict[str, Any] = dict(
        workers=workers,
        cells=cells,
        latency_ms=latency_ms,
        timeout_s=timeout_s,
        say=say,
        worker_env=worker_env,
        derived_queue=two_homes_at_once,
    )
    uncrashed = run_setup(
        "uncrashed", root / "uncrashed", jobs, spread_s=0.0 if burst else spread, chaos=None, **common
    )
    chaotic = run_setup("chaos", root / "chaos", jobs, spread_s=spread, chaos=plan, **common)
    if two_homes_at_once:
        base, wild = await asyncio.gather(uncrashed, chaotic)
    else:
        base = await uncrashed
        say(f"uncrashed: {base.completed}/{base.reflections} in {base.wall_s:.1f} s")
        wild = await chaotic
    if two_homes_at_once:
        say(f"uncrashed: {base.completed}/{base.reflections} in {base.wall_s:.1f} s")
    say(f"chaos: {wild.completed}/{wild.reflections} in {wild.wall_s:.1f} s")
    report = ChaosReport(wild, base, kills, server_restarts)
    for wid, out in wild.outputs.items():
        ref = base.outputs.get(wid)
        if ref is not None and ref == out:
            report.equal += 1
        else:
            report.differing[wid] = _diff(ref, out)[:10] if ref is not None else ["no uncrashed output"]
    return report


def _q(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    v = max(xs) if q >= 1 else statistics.quantiles(xs, n=100, method="inclusive")[round(q * 100) - 1]
    return f"{v:.0f}"


def render(report: ChaosReport) -> str:
    c, u = report.chaos, report.uncrashed
    n = c.reflections
    rows: list[list[object]] = [
        ["reflections", n, u.reflections, ""],
        ["worker SIGKILLs", c.kills, u.kills, f"= {report.planned_kills}"],
        ["  of them while reflections were running", c.kills_in_flight, "", ""],
        ["  reflections running at the kills (sum)", c.running_at_kills, "", ""],
        ["Temporal server restarts", c.server_restarts, u.server_restarts, f"= {report.planned_restarts}"],
        ["worker processes started", c.workers_started, u.workers_started, ""],
        ["workers that exited by themselves", len(c.unexpected_exits), len(u.unexpected_exits), ""],
        ["completions", c.completed, u.completed, f"= {n}"],
        ["outputs equal to the uncrashed run", report.equal, "", f"= {n}"],
        ["model requests answered (OpenAI server)", c.requests_answered, u.requests_answered, ""],
        ["requests abandoned by a killed worker", c.requests_abandoned, u.requests_abandoned, ""],
        ["duplicated completed model requests", c.duplicates, u.duplicates, "= 0"],
        [
            f"  of them answered to a worker SIGKILLed < {KILL_WINDOW_S * 1000:.0f} ms later",
            c.duplicates_at_kill,
            "",
            "",
        ],
        *[[f"worker-log lines '{p}'", c.warnings[p], u.warnings[p], "= 0"] for p in WARNING_PATTERNS],
        [
            f"  of them during or < {RESTART_ATTRIBUTION_S:.0f} s after a server restart",
            c.warnings_after_restart,
            "",
            "",
        ],
        ["answer -> response cached ms, median", _q(c.cache_lag_ms, 0.5), _q(u.cache_lag_ms, 0.5), ""],
        ["answer -> response cached ms, p90", _q(c.cache_lag_ms, 0.9), _q(u.cache_lag_ms, 0.9), ""],
        ["answer -> response cached ms, max", _q(c.cache_lag_ms, 1.0), _q(u.cache_lag_ms, 1.0), ""],
        ["wall time s", c.wall_s, u.wall_s, ""],
    ]
    lines = [table(["", "chaos", "uncrashed", "invariant"], rows)]
    for s in (c, u):
        lines += [f"{s.label}: duplicate: {d}" for d in s.duplicate_details]
        lines += [f"{s.label}: warning: {w}" for w in s.warning_lines]
        lines += [f"{s.label}: worker exit: {e}" for e in s.unexpected_exits]
        lines += [
            f"{s.label}: server restart {i + 1}: down {b - a:.2f} s"
            for i, (a, b) in enumerate(s.restart_windows)
        ]
        lines += [f"{s.label}: failed {wid}: {why}" for wid, why in s.failed.items()]
    for wid, diffs in report.differing.items():
        lines += [f"differs {wid}: {d}" for d in diffs]
    failures = report.failures()
    lines.append("invariants: " + ("all hold" if not failures else "FAILED:\n  " + "\n  ".join(failures)))
    return "\n".join(lines)


def _quiet_client_logs() -> None:
    """This process's Temporal client retries while the server restarts and its core logs each retry as a
    WARN on stdout; keep the table readable (the workers' logs, which are scanned, are not affected)."""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    with contextlib.suppress(RuntimeError):
        Runtime.set_default(
            Runtime(
                telemetry=TelemetryConfig(
                    logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
                )
            )
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reflections", type=int, default=24)
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--server-restarts", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cells", type=int, default=16, help="execute_code calls per scripted reflection")
    ap.add_argument("--latency-ms", type=int, default=300, help="the OpenAI server's reply latency")
    ap.add_argument(
        "--gap",
        type=float,
        nargs=2,
        default=(2.0, 5.0),
        metavar=("MIN_S", "MAX_S"),
        help="seconds between two chaos events (uniform)",
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="per setup, for everything")
    ap.add_argument(
        "--two-homes-at-once",
        action="store_true",
        help="run both setups at the same time, each on its own home, queues derived from the stores",
    )
    ap.add_argument(
        "--burst",
        action="store_true",
        help="start the uncrashed setup's reflections all at once (default: on the chaos run's schedule)",
    )
    ap.add_argument(
        "--worker-models",
        default=None,
        metavar="SPEC",
        help="RR_WORKER_MODELS for the workers (the model families they prepare before polling)",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="work directory to keep (default: a temp dir, removed when every invariant holds)",
    )
    a = ap.parse_args(argv)
    _quiet_client_logs()
    root = a.keep or Path(tempfile.mkdtemp(prefix="rr-chaos-"))
    report = asyncio.run(
        run_chaos(
            a.reflections,
            a.kills,
            a.server_restarts,
            a.seed,
            a.workers,
            a.cells,
            a.latency_ms,
            (a.gap[0], a.gap[1]),
            a.timeout,
            root,
            burst=a.burst,
            worker_env={"RR_WORKER_MODELS": a.worker_models} if a.worker_models else None,
            two_homes_at_once=a.two_homes_at_once,
        )
    )
    print(
        f"{a.reflections} reflections (half heuristic, half openai-chat with {a.cells} cells at "
        f"{a.latency_ms} ms), {a.workers} workers, {a.kills} kills, {a.server_restarts} server restart(s), "
        f"seed {a.seed}, uncrashed setup {'started at once' if a.burst else 'started one after the other'}"
        + (f", RR_WORKER_MODELS={a.worker_models}" if a.worker_models else "")
    )
    print(render(report))
    if report.ok and a.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"logs: {root}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
