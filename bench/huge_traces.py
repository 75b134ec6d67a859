"""Huge traces end to end (issue 13): memory and time of client, worker and sandbox host, history and blob bytes.

For each (shape, size): a synthetic trace (`bench.gen_traces`, cached in the work dir), a fresh embedded
dev server (`DevServer`, temp SQLite in the run's home, loopback), `rr worker --processes 1` as a
subprocess (default settings: it prepares the shipped model providers too, part of its baseline RSS)
and `rr reflect TRACE --json` as another subprocess (the client), all with `RR_HOME` in the work dir.
Measured:

- client peak RSS: `ru_maxrss` of the `rr reflect` process (`os.wait4`);
- host / worker peak RSS: /proc is polled every 50 ms for the worker and its descendants (the fork
  server and, forked from it, each sandbox host: the forked process, its PID-namespace reaper and the
  host proper, one group per host), keeping the largest `VmHWM` seen (the kernel's high-water mark
  of the resident set; a host's includes the pages it shares with the fork server). The worker keeps
  a pool of idle pre-started hosts, so the hosts that served sessions are told from the idle ones by
  exiting before the reflection completed, and a child's from its parent's by exiting first;
- time to first model request: the first model-request local activity (a `core_local_activity`
  marker of type `*model_request_local`), its `original_schedule_time` minus the workflow's
  `WorkflowExecutionStarted` event time (what the session did first: take a host, load the trace or
  its index);
- prepare s, cells n / s: the session's `prepare_session` local activity (host start, trace or index
  load) and its `run_cell`s, each timed from its schedule to the next local activity's schedule;
- `rr reflect` wall, split into start+upload (process start -> the mtime of the trace's index, the last
  file the upload writes, or of the trace blob when it has none: interpreter start and imports, then
  hash, copy and index of the trace), connect+start
  (-> the workflow's `WorkflowExecutionStarted` event) and workflow (started -> closed, from the history);
- history bytes (the serialized `History` of the root workflow) and event count, and the same without
  the workflow-task events (scheduled/started/completed): with an in-process model the session holds
  its workflow task and the SDK completes it every 3.2 s (flushing the markers), so a long cell adds
  task events in proportion to its wall time, whatever the trace;
- blob-store bytes: the trace blob, its index (`<sha256>.index-vN` beside it) and everything else
  (payloads, journals, snapshots, exports, response caches).

`--child`: instead of the heuristic, the `scripted-plan` model runs one cell in the root
(`rows = traces['steps']; window = rows[1000:1010]`) and one `recurse` child that prints from `window`
and `len(rows)`; its rows add the child's host peak, the child's start (its `WorkflowExecutionStarted`
-> its first cell completed, taken as the schedule time of the local activity after that cell's
`run_cell`: the marker's own `complete_time` is not a wall-clock time) and the child's history.

    python -m bench.huge_traces --sizes 1MB,100MB,1GB --shapes ace-json,jsonl [--child] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client
from temporalio.service import RPCError

from bench.common import table
from bench.gen_traces import SHAPES, generate, parse_size
from reflector.analysis.traces.index import INDEX_SUFFIX
from reflector.client import has_pollers
from reflector.contract import LOCAL_MODEL_SUFFIX, PREPARE_ACTIVITY, RUN_CELL_ACTIVITY
from reflector.runtime.devserver import DevServer

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.05
MODEL_REQUEST_SUFFIX = (
    "model_request" + LOCAL_MODEL_SUFFIX
)  # pydantic-ai's model-request activity name + rr's
RUN_CELL = RUN_CELL_ACTIVITY
PREPARE = PREPARE_ACTIVITY
LA_MARKER = "core_local_activity"
CHILD_PLAN = {
    "code": [
        "rows = traces['steps']\nwindow = rows[1000:1010]\nprint('root', type(rows).__name__, len(rows))"
    ],
    "children": [
        {
            "code": ["print('child', len(window), window[0]['index'], window[0]['role'], len(rows))"],
            "children": [],
            "after": [],
        }
    ],
    "after": [],
}
_CLK = os.sysconf("SC_CLK_TCK")


# -- /proc ------------------------------------------------------------------------------------------
@dataclass
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks since boot (stat field 22)
    cmd: str
    hwm_kb: int = 0
    rss_kb: int = 0
    last_seen: float = 0.0  # time.monotonic() of the last sample that found it alive


def _stat(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def _status_kb(pid: int) -> tuple[int, int] | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    got = {}
    for line in text.splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            key, value = line.split(":", 1)
            got[key] = int(value.split()[0])
    if "VmHWM" not in got:  # a zombie (or a kernel thread): not alive for this poller
        return None
    return got["VmHWM"], got.get("VmRSS", 0)


class TreePoller(threading.Thread):
    """Polls /proc every `POLL_S` for `root` and its descendants; keeps each one's largest VmHWM/VmRSS."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.procs: dict[tuple[int, int], Proc] = {}
        self._halt = threading.Event()
        self.samples = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(POLL_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def sample(self) -> float:
        """One pass over /proc; returns its time (`time.monotonic()`)."""
        now = time.monotonic()
        kids: dict[int, list[int]] = {}
        info: dict[int, tuple[int, int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = _stat(int(entry.name))
                if st is not None:
                    info[int(entry.name)] = st
                    kids.setdefault(st[0], []).append(int(entry.name))
        if self.root not in info:
            return now
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo.extend(kids.get(pid, []))
            ppid, start = info[pid]
            mem = _status_kb(pid)
            if mem is None:
                continue
            proc = self.procs.get((pid, start))
            if proc is None:
                try:
                    cmd = (
                        Path(f"/proc/{pid}/cmdline")
                        .read_bytes()
                        .replace(b"\0", b" ")
                        .decode(errors="replace")
                    )
                except OSError:
                    cmd = ""
                proc = self.procs[(pid, start)] = Proc(pid, ppid, start, cmd.strip())
            proc.hwm_kb = max(proc.hwm_kb, mem[0])
            proc.rss_kb = max(proc.rss_kb, mem[1])
            proc.last_seen = now
        self.samples += 1
        return now

    def worker(self) -> Proc | None:
        return next((p for p in self.procs.values() if p.pid == self.root), None)

    def hosts(self) -> list[list[Proc]]:
        """Every sandbox host seen, each the group of processes of one host (see the module doc)."""
        by_pid = {p.pid: p for p in self.procs.values()}
        zygotes = {p.pid for p in self.procs.values() if p.ppid == self.root and "sandbox.zygote" in p.cmd}
        heads = [
            p
            for p in self.procs.values()
            if p.ppid in zygotes or (p.ppid == self.root and "sandbox.host" in p.cmd)
        ]
        groups: dict[int, list[Proc]] = {h.pid: [] for h in heads}
        for p in self.procs.values():
            q: Proc | None = p
            while q is not None and q.pid not in groups:
                q = by_pid.get(q.ppid)
            if q is not None:
                groups[q.pid].append(p)
        return [groups[h.pid] for h in sorted(heads, key=lambda h: h.start)]

    def session_hosts(self, final: float) -> tuple[list[list[Proc]], int]:
        """The hosts sessions used, in the order they exited, and how many hosts were seen in all.

        The worker keeps a pool of idle pre-started hosts (`sandbox.pool.HostPool`), refilled after
        each take, so start order does not say which host served a session. A session's host exits when
        its session closes, before the reflection completes; idle pooled hosts live until the worker
        stops. So the hosts gone at the sample taken after `rr reflect` exited (`final`) are the
        sessions' hosts; a child's session closes before its parent's.
        """
        groups = self.hosts()
        used = [g for g in groups if max(p.last_seen for p in g) < final]
        return sorted(used, key=lambda g: max(p.last_seen for p in g)), len(groups)


# -- history ----------------------------------------------------------------------------------------
_WFT_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    }
)


def _ts(t: Any) -> float:
    return float(t.seconds) + float(t.nanos) / 1e9


def _marker(ev: Any) -> dict[str, Any] | None:
    """The data of a local-activity marker (activity_type, complete_time, original_schedule_time...)."""
    attrs = ev.marker_recorded_event_attributes
    if attrs.marker_name != LA_MARKER or "data" not in attrs.details:
        return None
    data: dict[str, Any] = json.loads(attrs.details["data"].payloads[0].data)
    return data


def _iso(value: Any) -> float | None:
    if isinstance(value, dict):  # a protobuf Timestamp as JSON: {"seconds", "nanos"}
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


@dataclass
class Hist:
    events: int = 0
    nbytes: int = 0
    wft_events: int = 0  # workflow task scheduled/started/completed: one triple per flush of a held task
    wft_bytes: int = 0
    started: float = 0.0
    closed: float = 0.0
    first_model: float | None = None  # seconds after started (schedule time of the first model request)
    first_model_how: str = ""
    # seconds after started: the first run_cell's end, taken as the schedule time of the local activity
    # after it (the marker's own `complete_time` is "WFT start + runtime", not a wall-clock time)
    first_cell_done: float | None = None
    children: list[str] = field(default_factory=list)
    # local activities in order: (type, original_schedule_time); one's duration is taken as the time to
    # the next one's schedule (the workflow code between them takes microseconds)
    las: list[tuple[str, float]] = field(default_factory=list)

    def la_seconds(self, kind: str) -> tuple[int, float]:
        """(count, seconds) of the local activities of this type."""
        n, total = 0, 0.0
        for i, (k, t) in enumerate(self.las):
            if k == kind:
                n += 1
                total += (self.las[i + 1][1] if i + 1 < len(self.las) else self.closed) - t
        return n, total


async def read_history(client: Client, wf_id: str) -> Hist:
    history = await client.get_workflow_handle(wf_id).fetch_history()
    h = Hist(events=len(history.events), nbytes=History(events=history.events).ByteSize())
    wft = [ev for ev in history.events if ev.event_type in _WFT_EVENTS]
    h.wft_events, h.wft_bytes = len(wft), History(events=wft).ByteSize()
    cell_seen = False
    for ev in history.events:
        t = _ts(ev.event_time)
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            h.started = t
        elif ev.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
        ):
            h.closed = t
        elif ev.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            h.children.append(
                ev.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
            )
        elif ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            data = _marker(ev)
            if data is None:
                continue
            kind = str(data.get("activity_type", ""))
            sched = _iso(data.get("original_schedule_time"))
            if sched is not None:
                h.las.append((kind, sched))
            if h.first_model is None and kind.endswith(MODEL_REQUEST_SUFFIX):
                h.first_model = (sched if sched is not None else t) - h.started
                h.first_model_how = "schedule" if sched is not None else "marker"
            if h.first_cell_done is None and cell_seen and sched is not None:
                h.first_cell_done = sched - h.started
            cell_seen = cell_seen or kind == RUN_CELL
    if h.first_cell_done is None and cell_seen:
        h.first_cell_done = h.closed - h.started
    return h


# -- blobs ------------------------------------------------------------------------------------------
def blob_bytes(blob_dir: Path, sha: str) -> tuple[int, int, int]:
    """(trace blob, its index, everything else) in bytes."""
    trace = index = other = 0
    for path in blob_dir.rglob("*"):
        if not path.is_file():
            continue
        n = path.stat().st_size
        if path.name == sha:
            trace += n
        elif path.name == sha + INDEX_SUFFIX:
            index += n
        else:
            other += n
    return trace, index, other


# -- one run ----------------------------------------------------------------------------------------
@dataclass
class Run:
    shape: str
    size: str
    child: bool
    trace: Path
    row: list[object] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "reflector.cli", *args]


def _stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker (it stops its sandbox hosts), SIGKILL its process group after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def _wait_worker(proc: subprocess.Popen[bytes], log: Path, address: str, tq: str) -> None:
    deadline = time.monotonic() + 120
    client = await Client.connect(address)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rr worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if "rr worker pid=" in log.read_text() and await has_pollers(client, tq):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"rr worker did not poll {tq} within 120 s:\n{log.read_text()[-3000:]}")


def _read_lines(proc: subprocess.Popen[bytes], lines: list[tuple[float, str]]) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        lines.append((time.time(), raw.decode(errors="replace")))


def _wait4(pid: int) -> tuple[int, int, float]:
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.time()


async def run_one(run: Run, workdir: Path, keep: bool) -> None:
    name = f"{run.shape}-{run.size}{'-child' if run.child else ''}"
    home = workdir / "homes" / f"{name}-{uuid.uuid4().hex[:6]}"
    home.mkdir(parents=True)
    server = DevServer(home / "temporal.sqlite", ui=False, log_file=home / "server.log")
    address = await server.astart()
    tq = f"huge-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in ("RR_BLOB_DIR", "TEMPORAL_NAMESPACE")}
    env.update(RR_HOME=str(home), TEMPORAL_ADDRESS=address, RR_TASK_QUEUE=tq)
    if run.child:
        env["RR_PLUGINS"] = "reflector.testing.scripted"
    wlog = home / "worker.log"
    worker: subprocess.Popen[bytes] | None = None
    poller: TreePoller | None = None
    try:
        with open(wlog, "wb") as out:
            worker = subprocess.Popen(
                _cli("worker", "--processes", "1"),
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        await _wait_worker(worker, wlog, address, tq)
        poller = TreePoller(worker.pid)
        poller.start()
        wf_id = f"huge-{name}-{uuid.uuid4().hex[:6]}"
        args = ["reflect", str(run.trace), "--json", "--id", wf_id]
        args += (
            ["--model", "scripted-plan", "--question", "PLAN:" + json.dumps(CHILD_PLAN)]
            if run.child
            else ["--model", "heuristic"]
        )
        print(
            f"[{name}] rr {shlex.join(args[:2])} ... (worker pid {worker.pid}, {address})",
            file=sys.stderr,
            flush=True,
        )
        lines: list[tuple[float, str]] = []
        with open(home / "reflect.out", "wb") as out:
            t0 = time.time()
            client_proc = subprocess.Popen(
                _cli(*args), cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE, start_new_session=True
            )
            reader = threading.Thread(target=_read_lines, args=(client_proc, lines), daemon=True)
            reader.start()
            code, maxrss_kb, t_end = await asyncio.to_thread(_wait4, client_proc.pid)
            client_proc.returncode = code
            reader.join(10)
        (home / "reflect.err").write_text("".join(f"{t - t0:8.2f} {line}" for t, line in lines))
        wall = t_end - t0
        poller.stop()
        await asyncio.sleep(0.2)  # the fork server reaps the sessions' hosts
        final = poller.sample()  # also the worker's high-water mark after the reflection
        err_text = (home / "reflect.err").read_text(errors="replace")
        if "in-process worker" in err_text:
            run.notes.append(
                f"{name}: the client ran an in-process worker (its RSS then includes the workflow)"
            )
        stop = "?"
        with contextlib.suppress(ValueError, KeyError, json.JSONDecodeError):
            stop = json.loads((home / "reflect.out").read_text())["raw"]["rr_trace"]["stop_reason"]
        if code not in (0, 4):
            run.notes.append(f"{name}: rr reflect exited {code}: {err_text.strip().splitlines()[-1:]}")
        client = await Client.connect(address)
        try:
            h = await read_history(client, wf_id)
        except RPCError as e:  # the client failed before starting the workflow
            last = [line.strip() for _t, line in lines][-1:]
            run.notes.append(f"{name}: no workflow ({e}); rr reflect exited {code}: {last}")
            failed: list[object] = [
                run.shape,
                run.size,
                f"{run.trace.stat().st_size / 1e6:.1f}",
                "-",
                f"exit {code}",
                f"{maxrss_kb / 1024:.0f}",
            ]
            run.row = failed + ["-"] * (len(HEADERS) - len(failed))
            return
        if h.first_model_how == "marker":
            run.notes.append(
                f"{name}: no original_schedule_time in the marker: first model request = marker event time"
            )
        used, n_hosts = poller.session_hosts(final)
        for i, g in enumerate(poller.hosts()):
            print(
                f"[{name}] host {i}: "
                + "; ".join(
                    f"pid {p.pid} ppid {p.ppid} start {p.start / _CLK:.2f} "
                    f"hwm {p.hwm_kb / 1024:.0f} MB rss {p.rss_kb / 1024:.0f} MB"
                    f"{' (exited)' if p.last_seen < final else ''}"
                    for p in g
                ),
                file=sys.stderr,
            )
        host_mb = [max(p.hwm_kb for p in g) / 1024 for g in used]  # child run: [child, root]
        expected = 2 if run.child else 1
        if len(used) != expected:
            run.notes.append(f"{name}: {len(used)} hosts served sessions, expected {expected}")
        root_mb = host_mb[-1] if host_mb else None
        child_mb = host_mb[0] if run.child and len(host_mb) > 1 else None
        w = poller.worker()
        sha = ""
        with contextlib.suppress(StopIteration):
            sha = next(
                p.name
                for p in (home / "blobs" / "sha256").rglob("*")
                if p.is_file() and len(p.name) == 64 and p.stat().st_size == run.trace.stat().st_size
            )
        tb, ib, ob = blob_bytes(home / "blobs", sha)
        # the upload ends with writing the index beside the trace blob (or with the blob, when none)
        written = [p.stat().st_mtime for p in (home / "blobs" / "sha256").rglob(f"{sha}*")] if sha else []
        uploaded = max(written) if written else h.started
        row: list[object] = [
            run.shape,
            run.size,
            f"{run.trace.stat().st_size / 1e6:.1f}",
            "scripted-plan+child" if run.child else "heuristic",
            stop,
            f"{maxrss_kb / 1024:.0f}",
            f"{root_mb:.0f}" if root_mb is not None else "-",
            f"{w.hwm_kb / 1024:.0f}" if w else "-",
            f"{len(used)}/{n_hosts}",
            f"{h.first_model:.2f}" if h.first_model is not None else "-",
            f"{h.la_seconds(PREPARE)[1]:.2f}",
            "{} / {:.1f}".format(*h.la_seconds(RUN_CELL)),
            f"{wall:.1f}",
            f"{uploaded - t0:.1f}",
            f"{h.started - uploaded:.1f}",
            f"{h.closed - h.started:.1f}",
            f"{h.nbytes / 1024:.1f}",
            h.events,
            f"{(h.nbytes - h.wft_bytes) / 1024:.1f} / {h.events - h.wft_events}",
            f"{tb / 1e6:.1f}",
            f"{ib / 1e6:.2f}",
            f"{ob / 1024:.0f}",
        ]
        if run.child:
            if h.children:
                ch = await read_history(client, h.children[0])
                row += [
                    f"{child_mb:.0f}" if child_mb is not None else "-",
                    f"{ch.first_cell_done:.2f}" if ch.first_cell_done is not None else "-",
                    f"{ch.nbytes / 1024:.1f}",
                    ch.events,
                ]
                with contextlib.suppress(ValueError, KeyError, json.JSONDecodeError):
                    out_json = json.loads((home / "reflect.out").read_text())
                    run.notes.append(f"{name}: root saw: {out_json['error_identification'][:300]!r}")
            else:
                row += ["-", "-", "-", "-"]
                run.notes.append(f"{name}: no child workflow in the root's history")
        else:
            row += ["", "", "", ""]
        run.row = row
        print(f"[{name}] done: {row}", file=sys.stderr, flush=True)
    finally:  # the worker first: nothing below may leave it running
        try:
            if worker is not None:
                _stop_worker(worker)
        finally:
            if poller is not None and poller.is_alive():
                poller.stop()
            await server.astop()
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


HEADERS = [
    "shape",
    "size",
    "trace MB",
    "model",
    "stop",
    "client peak MB",
    "host peak MB (VmHWM)",
    "worker peak MB (VmHWM)",
    "hosts used/seen",
    "first model req s",
    "prepare s",
    "cells n / s",
    "rr reflect wall s",
    "start+upload s",
    "connect+start s",
    "workflow s",
    "history KB",
    "events",
    "w/o WFT events: KB / events",
    "blob: trace MB",
    "blob: index MB",
    "blob: other KB",
    "child host peak MB",
    "child start s",
    "child history KB",
    "child events",
]


async def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.huge_traces", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MB,100MB,1GB", help="comma-separated sizes (1MB, 100MB, 1GB, 16MiB)")
    ap.add_argument(
        "--shapes", default="ace-json,jsonl", help=f"comma-separated shapes ({', '.join(SHAPES)})"
    )
    ap.add_argument(
        "--child",
        action="store_true",
        help="a scripted-plan reflection with one recurse child instead of the heuristic",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        help="traces (cached there) and rr homes (default: a temp dir, removed at the end)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--keep", action="store_true", help="keep each run's rr home (server, worker and client logs)"
    )
    args = ap.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s!r} (one of {', '.join(SHAPES)})")
    try:
        nbytes = {s: parse_size(s) for s in sizes}
    except ValueError as e:
        ap.error(str(e))
    own_workdir = args.workdir is None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rr-huge-"))
    try:
        await _runs(args, sizes, shapes, nbytes, workdir)
    finally:
        if own_workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


async def _runs(
    args: argparse.Namespace, sizes: list[str], shapes: list[str], nbytes: dict[str, int], workdir: Path
) -> None:
    (workdir / "traces").mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load0 = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    runs: list[Run] = []
    for shape in shapes:
        for size in sizes:
            ext = "json" if shape == "ace-json" else "jsonl"
            trace = workdir / "traces" / f"{shape}-{size}-seed{args.seed}.{ext}"
            if not trace.exists():
                t0 = time.perf_counter()
                generate(trace, nbytes[size], shape, args.seed)
                print(
                    f"generated {trace.name} ({trace.stat().st_size:,} bytes) in {time.perf_counter() - t0:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
            run = Run(shape, size, args.child, trace)
            await run_one(run, workdir, args.keep)
            runs.append(run)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"`python -m bench.huge_traces {shlex.join(sys.argv[1:])}` ({started}; {os.cpu_count()} cores, load "
        f"average at the start {load0}, at the end {load}; host/worker peaks: largest VmHWM polled every "
        f"{POLL_S * 1000:.0f} ms)"
    )
    print()
    headers = HEADERS if args.child else HEADERS[:-4]
    print(table(headers, [r.row if args.child else r.row[:-4] for r in runs]))
    notes = [n for r in runs for n in r.notes]
    if notes:
        print()
        for n in notes:
            print(f"- {n}")


if __name__ == "__main__":
    asyncio.run(main())
