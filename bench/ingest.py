"""Trace ingest (issue 29, point 4): candidate JSON parsers and the upload path, MB/s and peak RSS.

Three tables, every figure from a fresh process (peak RSS is its `VmHWM`, CPU its user + system time):

1. `--hostile`: what each candidate parser returns for inputs where parsers differ (NaN, numbers beyond a
   double or 64 bits, lone surrogates, invalid UTF-8, BOM, duplicate keys, ...), beside `json.loads`.
2. parsers: each candidate (stdlib `json`, msgspec, orjson, pysimdjson; the ones installed) decodes every
   record of each trace from its bytes, read in 4 MiB blocks (the records' byte ranges come from rr's
   index, written once beforehand into an offsets file), and, for traces under 64 MiB, the whole file at
   once (what the client does below `RR_LAZY_TRACE_BYTES`). This is the parse alone, no normalisation.
3. upload: `reflector.client.upload_trace` (sha256, copy into a temporary blob store, scan, index) of
   each trace, for this tree and, with `--baseline DIR`, for another tree (`git archive COMMIT | tar -x
   -C DIR`), interleaved, `--reps` times; medians. `--lazy-all` indexes traces of every size (small
   traces are otherwise parsed whole). A directory counts as one trace kind: its files uploaded in turn.

    python -m bench.ingest TRACE_OR_DIR... [--baseline DIR] [--reps 3] [--lazy-all] [--hostile]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PARSERS = ("json", "msgspec", "orjson", "simdjson")
BLOCK = 4 * 1024**2
WHOLE_MAX = 64 * 1024**2
HOSTILE: dict[str, bytes] = {
    "NaN": b"[NaN]",
    "Infinity": b"[Infinity, -Infinity]",
    "1e400": b"[1e400]",
    "2**100": b"[1267650600228229401496703205376]",
    "-2**63-1": b"[-9223372036854775809]",
    "5000 digits": b"[" + b"7" * 5000 + b"]",
    "lone surrogate": b'["\\ud800"]',
    "invalid UTF-8": b'["\xff"]',
    "BOM": b"\xef\xbb\xbf[1]",
    "duplicate keys": b'{"a": 1, "b": 2, "a": 3}',
    "depth 1000": b"[" * 1000 + b"]" * 1000,
    "control char": b'["a\x01b"]',
}


def _decoder(name: str) -> Callable[[bytes], Any]:
    if name == "json":
        return lambda b: json.loads(b.decode("utf-8", errors="replace"))
    if name == "msgspec":
        import msgspec

        return msgspec.json.Decoder().decode
    if name == "orjson":
        import orjson

        return orjson.loads
    if name == "simdjson":
        import simdjson

        parser = simdjson.Parser()
        return lambda b: parser.parse(b, recursive=True)
    raise ValueError(name)


def _installed(name: str) -> bool:
    try:
        _decoder(name)
    except ImportError:
        return False
    return True


# -- children ----------------------------------------------------------------------------------------
def _usage() -> dict[str, float]:
    """CPU seconds so far and peak RSS: `VmHWM`, this process's own high-water mark (`ru_maxrss` keeps the
    parent's resident size at the fork that started it, through the exec)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return {"cpu": ru.ru_utime + ru.ru_stime, "rss_mb": hwm / 1024}


def _child_parse(parser: str, plan: str, whole: bool) -> dict[str, Any]:
    """Parse the traces of `plan` (a JSON list of [trace, offsets file or ""]): each record (from its
    offsets; a file without them, or every file when `whole`, at once; JSON lines line by line)."""
    decode = _decoder(parser)
    jobs = json.loads(Path(plan).read_text())
    before = _usage()
    t = time.perf_counter()
    n = refused = 0

    def one(data: bytes) -> None:
        nonlocal n, refused
        n += 1
        try:
            decode(data)
        except Exception:
            refused += 1

    pair = struct.Struct("<qq")
    for trace, offsets in jobs:
        if whole or not offsets:
            data = Path(trace).read_bytes()
            if trace.endswith(".jsonl"):
                for line in data.splitlines():
                    if line.strip():
                        one(line)
            else:
                one(data)
            del data
            continue
        with open(trace, "rb") as fh, open(offsets, "rb") as offs:
            base, block = 0, b""
            while chunk := offs.read(pair.size * 65_536):
                for start, end in pair.iter_unpack(chunk):
                    if end > base + len(block):
                        fh.seek(start)
                        base, block = start, fh.read(max(BLOCK, end - start))
                    one(block[start - base : end - base])
    after = _usage()
    return {
        "wall": time.perf_counter() - t,
        "cpu": after["cpu"] - before["cpu"],
        "rss_mb": after["rss_mb"],
        "n": n,
        "refused": refused,
    }


def _child_upload(paths: list[str]) -> dict[str, Any]:
    from reflector.client import upload_trace
    from reflector.runtime.settings import Settings

    settings = Settings.from_env()
    before = _usage()
    t = time.perf_counter()
    fmts = set()
    for p in paths:
        fmts.add(upload_trace(p, settings).format)
    after = _usage()
    import reflector

    return {
        "wall": time.perf_counter() - t,
        "cpu": after["cpu"] - before["cpu"],
        "rss_mb": after["rss_mb"],
        "format": ",".join(sorted(fmts)),
        "code": str(Path(reflector.__file__).resolve().parents[1]),
    }


def _child_hostile() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for parser in PARSERS:
        if not _installed(parser):
            continue
        decode = _decoder(parser)
        for case, data in HOSTILE.items():
            try:
                text = repr(decode(data))
                text = text if len(text) < 40 else text[:37] + "..."
            except Exception as exc:
                text = f"error ({type(exc).__name__})"
            out.setdefault(case, {})[parser] = text
    return out


def _spawn(args: list[str], env: dict[str, str] | None = None, tree: Path = REPO) -> dict[str, Any]:
    """Run this file as a script in `tree` (`python -m` would put the working directory first on the path,
    before PYTHONPATH: a baseline tree's child would import this tree's code)."""
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode:
        raise RuntimeError(f"child {args} failed: {res.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return result


# -- parent ------------------------------------------------------------------------------------------
def _files(target: Path) -> list[Path]:
    return (
        sorted(p for p in target.iterdir() if p.suffix in (".json", ".jsonl"))
        if target.is_dir()
        else [target]
    )


def _offsets(paths: list[Path], work: Path) -> Iterator[tuple[Path, Path | None]]:
    """(trace, its records' offsets file) for each file; None when rr reads it as one record."""
    from reflector.analysis.fastscan import FastScanner
    from reflector.analysis.traces.index import build_index

    for p in paths:
        with open(p, "rb") as fh:
            _fmt, idx = build_index(fh, str(p), scanner=FastScanner)
        if idx is None:
            yield p, None
            continue
        out = work / (p.name + ".offsets")
        with open(out, "wb") as fh:
            for s, e in zip(idx.starts, idx.ends, strict=True):
                fh.write(struct.pack("<qq", s, e))
        yield p, out


def _mb_s(size: int, seconds: float) -> str:
    return f"{size / 1e6 / seconds:.1f}" if seconds > 0 else "-"


def parsers_table(targets: list[Path], work: Path) -> None:
    from bench.common import table  # not in the children: their peak RSS is the parser's

    rows = []
    for target in targets:
        files = _files(target)
        size = sum(p.stat().st_size for p in files)
        plan = work / (target.name + ".plan.json")
        plan.write_text(json.dumps([[str(t), str(o or "")] for t, o in _offsets(files, work)]))
        for parser in PARSERS:
            if not _installed(parser):
                rows.append([target.name, parser, "not installed", "", "", "", ""])
                continue
            r = _spawn(["parse", parser, str(plan), "records"])
            whole = "-"
            if size <= WHOLE_MAX:
                w = _spawn(["parse", parser, str(plan), "whole"])
                whole = f"{_mb_s(size, w['cpu'])} / {w['rss_mb']:.0f}"
            rows.append(
                [
                    target.name,
                    parser,
                    f"{size / 1e6:.1f} MB, {r['n']:,}",
                    f"{r['refused']:,}",
                    _mb_s(size, r["cpu"]),
                    f"{r['rss_mb']:.0f}",
                    whole,
                ]
            )
    print(
        table(
            [
                "trace",
                "parser",
                "size, records",
                "refused",
                "records: CPU MB/s",
                "records: peak RSS MB",
                "whole file: CPU MB/s / peak RSS MB",
            ],
            rows,
        )
    )


def upload_table(targets: list[Path], trees: dict[str, Path], reps: int, lazy_all: bool) -> None:
    from bench.common import table

    rows = []
    for target in targets:
        files = _files(target)
        size = sum(p.stat().st_size for p in files)
        got: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for _ in range(reps):
            for name, tree in trees.items():  # interleaved
                home = tempfile.mkdtemp(prefix="rr-ingest-")
                env = {**os.environ, "RR_HOME": home}
                env.pop("RR_BLOB_URL", None)
                if lazy_all:
                    env["RR_LAZY_TRACE_BYTES"] = "1"
                try:
                    run = _spawn(["upload", *map(str, files)], env, tree)
                finally:
                    shutil.rmtree(home, ignore_errors=True)
                if Path(run["code"]) != tree.resolve():
                    raise RuntimeError(f"the {name} child ran the code in {run['code']}, not {tree}")
                got[name].append(run)
        for name, runs in got.items():
            wall = statistics.median(r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            rss = statistics.median(r["rss_mb"] for r in runs)
            rows.append(
                [
                    target.name,
                    f"{size / 1e6:.1f}",
                    runs[0]["format"],
                    name,
                    _mb_s(size, wall),
                    _mb_s(size, cpu),
                    f"{rss:.0f}",
                ]
            )
    print(table(["trace", "MB", "format", "tree", "wall MB/s", "CPU MB/s", "peak RSS MB"], rows))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        kind, rest = argv[1], argv[2:]
        if kind == "parse":
            out = _child_parse(rest[0], rest[1], rest[2] == "whole")
        elif kind == "upload":
            out = _child_upload(rest)
        else:
            out = _child_hostile()
        print(json.dumps(out))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument(
        "--baseline", type=Path, help="another tree to upload with (PYTHONPATH), e.g. from git archive"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lazy-all", action="store_true", help="index every trace (RR_LAZY_TRACE_BYTES=1)")
    ap.add_argument(
        "--hostile", action="store_true", help="only the table of what each parser does with hostile inputs"
    )
    ap.add_argument("--skip-parsers", action="store_true")
    args = ap.parse_args(argv)
    if args.hostile:
        from bench.common import table

        res = _spawn(["hostile"])
        names = [p for p in PARSERS if _installed(p)]
        print(table(["input", *names], [[case, *(res[case][p] for p in names)] for case in HOSTILE]))
        return
    with tempfile.TemporaryDirectory(prefix="rr-ingest-") as work:
        if not args.skip_parsers:
            parsers_table(args.traces, Path(work))
            print()
        trees = {"this tree": REPO}
        if args.baseline:
            trees = {"baseline": args.baseline.resolve(), **trees}
        upload_table(args.traces, trees, args.reps, args.lazy_all)


if __name__ == "__main__":
    main()
