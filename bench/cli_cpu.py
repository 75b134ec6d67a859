"""CPU and wall time of one `rr` command that reads a finished reflection (status, result, list, cancel, export),
and of one run of a script that reflects through the Python API on the embedded default (`--scripts`).

A dev server and one finished heuristic reflection are made first; then each command runs as a fresh
`python -m reflector.cli` process against that server (TEMPORAL_ADDRESS, so no embedded server is leased),
`--repeat` times. With `--base DIR` (another checkout of rr, e.g. `git worktree add /tmp/rr-base main`) each
run of this checkout alternates with a run of the same command from DIR (PYTHONPATH=DIR), so both see the
same load. CPU is the process's own user + system time (rusage from `wait4`): steadier than wall time on
a shared machine. `--scripts` adds `tests/support/ace_script.py` (ACE's Pipeline with rr's RRStep: `areflect` on
a loop that goes on) and `tests/support/api_script.py` (`reflect()`), each run with a fresh RR_HOME and no
TEMPORAL_ADDRESS (so its own embedded server and in-process worker; the keeper and server are not in its CPU).
`--starts` adds what starting the embedded default costs: a home's keeper starting its server, waiting until
it is ready and stopping it (no lease is taken, so it stops at its first look; the server, its child, is in
the keeper's CPU), and `rr reflect` of the shipped example on a fresh home (its own process: imports, worker
start, the reflection; the keeper and server it leases are in their own session and not in its CPU).

    python -m bench.cli_cpu [--repeat 5] [--base DIR] [--scripts] [--starts]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import median, start_bench_env, table

HERE = Path(__file__).resolve().parent.parent


def commands(wf_id: str, out_dir: Path) -> list[tuple[str, list[str]]]:
    return [
        ("status", ["status", wf_id]),
        ("result", ["result", wf_id]),
        ("result --json", ["result", wf_id, "--json"]),
        ("list", ["list"]),
        ("cancel (finished)", ["cancel", wf_id]),
        ("export -o", ["export", wf_id, "-o", str(out_dir / "export.json")]),
        ("status (unknown id)", ["status", "no-such-reflection"]),
    ]


SCRIPTS = [
    ("ace_script (RRStep in ACE's Pipeline)", ["-m", "tests.support.ace_script", "1"]),
    ("api_script (reflect())", ["-m", "tests.support.api_script"]),
]


def run_once(
    tree: Path, argv: list[str], env: dict[str, str], module: list[str] | None = None
) -> tuple[float, float, int]:
    """(CPU s, wall s, exit code) of `python -m reflector.cli ARGV` (or `python MODULE`) with `tree` first on the
    path."""
    e = {**env, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *(module or ["-m", "reflector.cli", *argv])],
        cwd=tree,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, wall, proc.returncode


def script_rows(repeat: int, trees: list[tuple[str, Path]], scratch: Path) -> list[list[object]]:
    from reflector.runtime.devserver import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    rows: list[list[object]] = []
    for name, module in SCRIPTS:
        cpu: dict[str, list[float]] = {t: [] for t, _ in trees}
        wall: dict[str, list[float]] = {t: [] for t, _ in trees}
        codes: dict[str, set[int]] = {t: set() for t, _ in trees}
        for i in range(repeat):
            for label, tree in trees:
                home = scratch / f"script-{label}-{len(cpu[label])}-{i}"
                e = {
                    **env,
                    "RR_HOME": str(home),
                    "RR_EMBEDDED_PORT": str(free_port()),
                    "RR_EMBEDDED_LINGER_S": "0",
                }
                c, w, code = run_once(tree, [], e, module=module)
                cpu[label].append(c)
                wall[label].append(w)
                codes[label].add(code)
        row: list[object] = [name]
        for label, _ in trees:
            row += [
                median(cpu[label]),
                max(cpu[label]),
                median(wall[label]),
                max(wall[label]),
                ",".join(map(str, sorted(codes[label]))),
            ]
        rows.append(row)
    return rows


def start_rows(repeat: int, trees: list[tuple[str, Path]], scratch: Path) -> list[list[object]]:
    from reflector.runtime.devserver import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    kinds: list[tuple[str, Callable[[Path], list[str]]]] = [
        (
            "keeper + its server: start, ready, stop",
            lambda home: ["-m", "reflector.runtime.homeserver", str(home), "0", "0"],  # port, linger
        ),
        (
            "rr reflect, embedded default, fresh home (own process)",
            lambda home: [
                "-m",
                "reflector.cli",
                "reflect",
                str(HERE / "reflector/examples/failed_math.json"),
            ],
        ),
    ]
    rows: list[list[object]] = []
    for name, argv in kinds:
        cpu: dict[str, list[float]] = {t: [] for t, _ in trees}
        wall: dict[str, list[float]] = {t: [] for t, _ in trees}
        codes: dict[str, set[int]] = {t: set() for t, _ in trees}
        for i in range(repeat):
            for label, tree in trees:
                home = scratch / f"start-{label}-{len(rows)}-{i}"
                home.mkdir(parents=True)
                e = {
                    **env,
                    "RR_HOME": str(home),
                    "RR_EMBEDDED_PORT": str(free_port()),
                    "RR_EMBEDDED_LINGER_S": "0",
                }
                c, w, code = run_once(tree, [], e, module=argv(home))
                cpu[label].append(c)
                wall[label].append(w)
                codes[label].add(code)
                time.sleep(1.5)  # the home's server stops after the last lease: not during the next run
        row: list[object] = [name]
        for label, _ in trees:
            row += [median(cpu[label]), median(wall[label]), ",".join(map(str, sorted(codes[label])))]
        if len(trees) > 1:
            row.append(median(cpu["this"]) / median(cpu["base"]))
        rows.append(row)
    return rows


async def main(repeat: int, base: Path | None, scripts: bool, starts: bool = False) -> None:
    env_ = await start_bench_env()
    try:
        env = {**os.environ, "TEMPORAL_ADDRESS": env_.address, "RR_HOME": str(env_.home)}
        trace_file = env_.home / "bench-trace.json"
        made = subprocess.run(
            [sys.executable, "-m", "reflector.cli", "reflect", str(trace_file), "--id", "bench-cli-cpu"],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"rr reflect failed ({made.returncode}): {made.stderr}")
        trees = [("base", base)] if base is not None else []
        trees.append(("this", HERE))
        rows = []
        for name, argv in commands("bench-cli-cpu", env_.home):
            cpu: dict[str, list[float]] = {t: [] for t, _ in trees}
            wall: dict[str, list[float]] = {t: [] for t, _ in trees}
            codes: dict[str, set[int]] = {t: set() for t, _ in trees}
            for _ in range(repeat):
                for label, tree in trees:
                    c, w, code = run_once(tree, argv, env)
                    cpu[label].append(c)
                    wall[label].append(w)
                    codes[label].add(code)
            row: list[object] = [name]
            for label, _ in trees:
                row += [median(cpu[label]), median(wall[label]), ",".join(map(str, sorted(codes[label])))]
            if base is not None:
                row.append(median(cpu["this"]) / median(cpu["base"]))
            rows.append(row)
        srows = script_rows(repeat, trees, env_.home) if scripts else []
        strows = start_rows(repeat, trees, env_.home) if starts else []
        headers = ["command"]
        for label, _ in trees:
            headers += [f"{label} CPU s", f"{label} wall s", f"{label} exit"]
        if base is not None:
            headers.append("CPU this/base")
        print(f"median of {repeat} runs each (alternated); load average {os.getloadavg()[0]:.1f}")
        print(table(headers, rows))
        if srows:
            sheaders = ["script"]
            for label, _ in trees:
                sheaders += [f"{label} CPU s", "max", f"{label} wall s", "max", f"{label} exit"]
            print(f"\none run of a script on the embedded default: median and max of {repeat} (alternated)")
            print(table(sheaders, srows))
        if strows:
            print(f"\nstarting the embedded default: median of {repeat} (alternated)")
            print(table(headers, strows))
    finally:
        await env_.server.astop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--base", type=Path, default=None, help="another rr checkout to compare with")
    ap.add_argument("--scripts", action="store_true", help="also the Python API scripts (embedded default)")
    ap.add_argument(
        "--starts", action="store_true", help="also a keeper's server start and `rr reflect` on a fresh home"
    )
    a = ap.parse_args()
    asyncio.run(main(a.repeat, a.base.resolve() if a.base else None, a.scripts, a.starts))
