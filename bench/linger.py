"""What the embedded server's linger saves: a session of `rr` commands, and a `reflect()` loop, on one RR_HOME.

Each scenario runs on a fresh RR_HOME with nothing configured (the embedded default, as a user's laptop), once
with `RR_EMBEDDED_LINGER_S=0` (the server stops with its last user, rr's behaviour before the linger) and
once with the default linger, alternating `--repeat` times so both see the same load:

- `cli`: `rr reflect EXAMPLE`, `rr list`, `rr reflect EXAMPLE`, `rr list`, `rr reflect EXAMPLE`, each a new
  process, with `--pause` seconds between them (a person reading the output);
- `api`: one Python process calling `reflect(EXAMPLE)` 5 times with `--pause` seconds between the calls (an
  ACE loop whose generator runs between reflections).

CPU is everything the scenario ran, the keeper and the server included: this process makes itself a child
subreaper (`PR_SET_CHILD_SUBREAPER`), so the keeper and server (which outlive the command that started them)
are reaped here and land in `RUSAGE_CHILDREN`; a lingering server is stopped at the end of its run
(`homeserver.stop_idle`) and counted too. Wall time is per command (what the user waits for).

    python -m bench.linger [--repeat 3] [--pause 1.0]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import median, table
from reflector.runtime.devserver import free_port
from reflector.runtime.homeserver import DEFAULT_LINGER_S, stop_idle

HERE = Path(__file__).resolve().parent.parent
EXAMPLE = HERE / "reflector" / "examples" / "failed_math.json"
PR_SET_CHILD_SUBREAPER = 36
CALLS = 5

API_LOOP = """
import sys, time
from reflector import reflect
pause, n = float(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    if i:
        time.sleep(pause)
    t = time.perf_counter()
    reflect(traces=sys.argv[3])
    print(f"call {time.perf_counter() - t:.3f}", flush=True)
"""


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _reap() -> None:
    """Reap every orphan handed to this subreaper (keepers and servers that have exited)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _settle(home: Path) -> None:
    """Stop the home's server if it lingers, and wait until its keeper and server are reaped."""
    stop_idle(home)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _env(home: Path, linger: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    env.update(RR_HOME=str(home), RR_EMBEDDED_PORT=str(free_port()), RR_EMBEDDED_LINGER_S=f"{linger:g}")
    return env


def run_cli(home: Path, linger: float, pause: float) -> tuple[list[float], int]:
    argvs = [
        ["reflect", str(EXAMPLE)],
        ["list"],
        ["reflect", str(EXAMPLE)],
        ["list"],
        ["reflect", str(EXAMPLE)],
    ]
    walls, starts = [], 0
    for i, argv in enumerate(argvs):
        if i:
            time.sleep(pause)
            _reap()
        t = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-m", "reflector.cli", *argv],
            env=_env(home, linger),
            cwd=HERE,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=300,
        )
        walls.append(time.perf_counter() - t)
        if p.returncode not in (0, 4):
            raise SystemExit(f"rr {' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
        starts += "started the embedded Temporal server" in p.stderr
    return walls, starts


def run_api(home: Path, linger: float, pause: float) -> tuple[list[float], int]:
    p = subprocess.run(
        [sys.executable, "-c", API_LOOP, f"{pause:g}", str(CALLS), str(EXAMPLE)],
        env=_env(home, linger),
        cwd=HERE,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    if p.returncode != 0:
        raise SystemExit(f"the reflect() loop failed ({p.returncode}):\n{p.stderr[-2000:]}")
    walls = [float(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("call ")]
    log = (home / "server.log").read_text() if (home / "server.log").exists() else ""
    return walls, log.count("rr keeper pid=")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between two commands / calls")
    args = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper: the keepers' and servers' CPU would be lost")
    lingers = [0.0, DEFAULT_LINGER_S]
    results: dict[tuple[str, float], list[tuple[float, float, float, int]]] = {}
    scenarios = {"cli": run_cli, "api": run_api}
    with tempfile.TemporaryDirectory(prefix="rr-bench-linger-") as tmp:
        for r in range(args.repeat):
            for name, fn in scenarios.items():
                for linger in lingers:
                    home = Path(tmp) / f"{name}-{linger:g}-{r}"
                    cpu0, t0 = _children_cpu(), time.perf_counter()
                    walls, starts = fn(home, linger, args.pause)
                    total = time.perf_counter() - t0
                    _settle(home)
                    cpu = _children_cpu() - cpu0
                    results.setdefault((name, linger), []).append((median(walls), total, cpu, starts))
                    print(
                        f"# {name} linger={linger:g} run {r + 1}: median call {median(walls):.2f} s, "
                        f"all {total:.1f} s, CPU {cpu:.1f} s, server starts {starts}",
                        file=sys.stderr,
                        flush=True,
                    )
    rows = []
    for (name, linger), runs in results.items():
        rows.append(
            [
                name,
                f"{linger:g}",
                len(runs),
                median([x[0] for x in runs]),
                median([x[1] for x in runs]),
                median([x[2] for x in runs]),
                f"{median([float(x[3]) for x in runs]):g}",
            ]
        )
    print(
        f"{CALLS} commands (cli) or reflect() calls (api) per run, {args.pause:g} s between them; medians of runs\n"
    )
    print(
        table(
            [
                "scenario",
                "RR_EMBEDDED_LINGER_S",
                "runs",
                "call wall s",
                "run wall s",
                "CPU s (all)",
                "server starts",
            ],
            rows,
        )
    )
    with contextlib.suppress(ChildProcessError):
        _reap()


if __name__ == "__main__":
    main()
