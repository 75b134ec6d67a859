"""`rr` command line: argument parsing and printing only; the logic lives in `reflector.client`.

Here: the parser, `main` and `run` (the console script), the signals, `rr reflect -` (stdin) and the
dispatch to one module per command group: `reflect`, `inspect` (result, status, list), `history`
(replay, export, audit, rerun), `admin` (setup, gc, cancel), `serve` (server, worker); `common` is
what they share."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from reflector.cli.admin import _cancel, _gc, _setup
from reflector.cli.common import _err, _say
from reflector.cli.history import _audit, _export, _replay, _rerun
from reflector.cli.inspect import _list, _result, _status
from reflector.cli.reflect import _reflect
from reflector.cli.serve import _server, _worker
from reflector.runtime.settings import SettingError, Settings

__all__ = ["build_parser", "main", "run"]

DISTRIBUTION = "durable-recursive-reflector"
_STDIN_CHUNK = 1024 * 1024


def _version() -> str:
    """The installed distribution's version; the package's `__version__` when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import reflector

        return str(getattr(reflector, "__version__", "unknown"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rr", description="Durable Recursive Reflector")
    p.add_argument("--version", action="version", version=f"rr {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser(
        "server", help="run the embedded Temporal dev server (SQLite in RR_HOME) in the foreground"
    )
    s.add_argument("--port", type=int, default=7233)
    s.add_argument("--ui-port", type=int, default=8233)
    s.add_argument(
        "--stop",
        action="store_true",
        help="instead: stop the home's embedded server now if no rr process uses it (it stops by itself "
        "RR_EMBEDDED_LINGER_S after its last use); exit 1 if one does",
    )

    w = sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS on RR_TASK_QUEUE")
    w.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="worker processes under one supervisor (default: RR_WORKER_PROCESSES or the cores available)",
    )

    r = sub.add_parser("reflect", help="reflect on a trace file and print the reflection")
    r.add_argument(
        "trace",
        nargs="+",
        help="trace file (.json or .jsonl), or - to read one trace from stdin; several files or "
        "directories of them: a batch, one run per file",
    )
    r.add_argument(
        "--batch",
        action="store_true",
        help="each file holds many runs (a JSON array, JSONL lines): a batch, one run per record",
    )
    r.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="batch: runs reflected at once (default: 8 for in-process models, 4 for provider models)",
    )
    r.add_argument("--model", help="pydantic-ai model string (default: RR_MODEL or 'heuristic')")
    r.add_argument("--question")
    r.add_argument("--ground-truth")
    r.add_argument("--feedback")
    r.add_argument("--skillbook", help="skillbook text file")
    r.add_argument("--mode", choices=["online", "offline"], default="offline")
    r.add_argument("--max-requests", type=int)
    r.add_argument("--max-tokens", type=int)
    r.add_argument(
        "--recursion",
        choices=["auto", "always"],
        help="when the model may start child sessions (recurse): auto (default) on a large trace only, "
        "always below the depth limit",
    )
    r.add_argument("--id", help="workflow id (default: generated)")
    r.add_argument("--json", action="store_true", help="print the ReflectorOutput as JSON")

    rr_ = sub.add_parser(
        "rerun",
        help="a new reflection that reuses the recorded steps before N of another and "
        "continues live from step N (e.g. with another model)",
    )
    rr_.add_argument("id", help="the origin: a finished (or running) root reflection")
    rr_.add_argument(
        "--from-step",
        type=int,
        required=True,
        metavar="N",
        help="the first step (model request of the root session, 1-based) made live again",
    )
    rr_.add_argument("--model", help="model of the live steps (default: the origin's)")
    rr_.add_argument("--max-requests", type=int, help="budget of the live part (default: the origin's)")
    rr_.add_argument("--max-tokens", type=int)
    rr_.add_argument("--id", dest="new_id", help="workflow id of the rerun (default: generated)")
    rr_.add_argument("--json", action="store_true", help="print the ReflectorOutput as JSON")

    res = sub.add_parser("result", help="print the output of a finished reflection")
    res.add_argument("id")
    res.add_argument("--json", action="store_true")

    st = sub.add_parser("status", help="the progress of a reflection and its running children, or of a batch")
    st.add_argument("id")
    st.add_argument("--json", action="store_true", help="print the status as one JSON object")
    st.add_argument(
        "--follow",
        action="store_true",
        help="show the live progress until it ends, then its final status (exit code as `rr result`)",
    )

    ls = sub.add_parser("list", help="reflections and batches, newest first, from Temporal's visibility")
    ls.add_argument(
        "--status",
        choices=["running", "completed", "failed", "incomplete"],
        help="completed: stop reason `completed`; incomplete: finished with another stop reason; "
        "failed: no output (failed, timed out, terminated)",
    )
    ls.add_argument("--limit", type=int, default=20, metavar="N", help="at most N rows (default 20)")
    ls.add_argument("--all", action="store_true", help="include children (recursion, the runs of batches)")
    ls.add_argument("--json", action="store_true", help="print a JSON list of objects")

    ca = sub.add_parser(
        "cancel", help="cancel a reflection (or batch) and its children; it returns its findings so far"
    )
    ca.add_argument("id")
    ca.add_argument(
        "--wait",
        type=float,
        default=60.0,
        metavar="S",
        help="wait at most S seconds for it to close (default 60)",
    )
    ca.add_argument("--json", action="store_true", help="print the outcome and the output as one JSON object")

    su = sub.add_parser("setup", help="register rr's search attributes in TEMPORAL_NAMESPACE (idempotent)")
    su.add_argument("--json", action="store_true")

    rp = sub.add_parser(
        "replay",
        help="replay every history of a reflection (each run of its continue-as-new "
        "chain, each child) against the current code",
    )
    rp.add_argument(
        "id",
        metavar="ID|FILE",
        help="a reflection id, a file written by `rr export` (or one JSON "
        "history), or a directory of `rr export --split` files",
    )
    rp.add_argument("--json", action="store_true", help="print the report as one JSON object")

    ex = sub.add_parser(
        "export",
        help="write every history of a reflection (each run, each child) as one JSON file, "
        "payloads inlined: for `rr replay FILE` / `rr audit FILE` offline",
    )
    ex.add_argument("id")
    ex_out = ex.add_mutually_exclusive_group()
    ex_out.add_argument("-o", "--output", metavar="FILE", help="write the export to FILE (default: stdout)")
    ex_out.add_argument(
        "--split", metavar="DIR", help="write one plain Temporal JSON history per run into DIR"
    )
    ex.add_argument("--json", action="store_true", help="with -o or --split: print a JSON summary on stdout")

    au = sub.add_parser("audit", help="the decision timeline of a reflection, from its history alone")
    au.add_argument(
        "id",
        metavar="ID|FILE",
        help="a reflection id, or a file written by `rr export` (or one JSON history)",
    )
    au_out = au.add_mutually_exclusive_group()
    au_out.add_argument("--json", action="store_true", help="print the timeline as JSON")
    au_out.add_argument(
        "--html", metavar="OUT.html", help="write the timeline as one self-contained HTML file"
    )

    g = sub.add_parser(
        "gc", help="remove blobs, journals and caches that no retained workflow needs any more"
    )
    g.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    g.add_argument(
        "--min-age",
        default="1h",
        metavar="AGE",
        help="never remove anything younger than this (default 1h; e.g. 3600, 90s, 15m, 2d)",
    )
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


build_parser = _parser  # public: the manual's CLI reference is rendered from it (docs/hooks/cli_reference.py)


def run() -> NoReturn:
    """The `rr` console script: `main`, then exit without interpreter finalization.

    The Temporal client's native (Rust/tokio) threads can outlive `asyncio.run` and abort CPython's
    finalization ("PyGILState_Release ... Python runtime state: finalizing", SIGABRT) after the command
    has printed its result: seen once per few suite runs on `rr result`, known upstream
    (temporalio/sdk-python#300). So the exit code must not depend on finalization: flush what was
    written, stop any embedded server this process started, and `os._exit`.
    """
    code = main()
    if code == 130 and _TERMINATED:  # SIGTERM / SIGHUP, ended like Ctrl-C: the shell's code for that signal
        code = 128 + _TERMINATED[0]
    from reflector.runtime.devserver import stop_live_servers

    stop_live_servers()
    from reflector.runtime import telemetry

    with contextlib.suppress(Exception):  # RR_OTEL: os._exit skips the SDK's atexit export of buffered spans
        telemetry.flush()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


_TERMINATED: list[int] = []  # the SIGTERM / SIGHUP that ended this process


def _end_like_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """SIGTERM / SIGHUP (`timeout`, `kill`, a CI job's cancellation, a closed terminal) end a command the way
    Ctrl-C does: the running reflection is left to go on durably, its id is printed, and the lease on the
    home's embedded server is released."""
    _TERMINATED.append(signum)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):  # a background job that ignores Ctrl-C
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)  # asyncio.run's handler cancels the command's task, as for Ctrl-C


def _on_termination_signals() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _end_like_ctrl_c)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd not in (
        "worker",
        "server",
    ):  # those stop on SIGTERM their own way (graceful drain, forwarding)
        _on_termination_signals()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.cmd == "server":
            return _server(args, settings)
        if args.cmd == "worker":
            return _worker(args, settings)
        from reflector.client import configure_core_logging

        configure_core_logging(worker_warnings=args.cmd in ("worker", "reflect"))
        if args.cmd == "reflect" and "-" in args.trace:
            return _reflect_stdin(args, settings)
        return asyncio.run(_dispatch(args, settings))
    except SettingError as e:
        return _err(str(e))
    except KeyboardInterrupt:
        return _err("interrupted", 130)
    except OSError as e:  # a file-system fault nothing above expected: still one line
        where = f" ({e.filename})" if e.filename else ""
        return _err(f"{e.strerror or e}{where}", 1)


def _reflect_stdin(args: argparse.Namespace, settings: Settings) -> int:
    """`rr reflect -`: the trace from stdin, copied in chunks (it can be big) to a temporary file in
    RR_HOME/tmp, then reflected on as that file would be (format detected from its content); the file
    is removed once the trace is in the blob store. Read before the event loop starts, so that Ctrl-C
    interrupts a read that waits."""
    import tempfile

    from reflector.runtime.settings import usable_dir

    if len(args.trace) > 1 or args.batch:
        return _err(
            "`rr reflect -` reads one trace from stdin; a batch is read from files (save the runs to a "
            "file, or drop the -)"
        )
    if sys.stdin is None:
        return _err("`rr reflect -`: this process has no stdin")
    tmp_dir = usable_dir(settings.home / "tmp", "RR_HOME")
    fd, name = tempfile.mkstemp(prefix="stdin-", suffix=".trace", dir=tmp_dir)
    spooled = Path(name)
    try:
        if sys.stdin.isatty():
            _say("reading the trace from stdin (end it with Ctrl-D)")
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := sys.stdin.buffer.read(_STDIN_CHUNK):
                size += len(chunk)
                if size > settings.max_trace_bytes:
                    return _err(
                        f"the trace on stdin is over the limit of {settings.max_trace_bytes:,} bytes "
                        "(raise it with the environment variable RR_MAX_TRACE_BYTES)"
                    )
                out.write(chunk)
        if size == 0:
            return _err(
                "the trace on stdin is empty (pipe a trace into `rr reflect -`, e.g. "
                "`cat trace.json | rr reflect -`)"
            )
        args.trace, args.stdin_trace = [str(spooled)], spooled
        return asyncio.run(_dispatch(args, settings))
    finally:
        spooled.unlink(missing_ok=True)


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError, RPCStatusCode

    from reflector.analysis.traces import TraceError
    from reflector.client import ReflectError

    try:
        if args.cmd == "reflect":
            return await _reflect(args, settings)
        if args.cmd == "result":
            return await _result(args, settings)
        if args.cmd == "status":
            return await _status(args, settings)
        if args.cmd == "replay":
            return await _replay(args, settings)
        if args.cmd == "export":
            return await _export(args, settings)
        if args.cmd == "gc":
            return await _gc(args, settings)
        if args.cmd == "rerun":
            return await _rerun(args, settings)
        if args.cmd == "audit":
            return await _audit(args, settings)
        if args.cmd == "list":
            return await _list(args, settings)
        if args.cmd == "cancel":
            return await _cancel(args, settings)
        if args.cmd == "setup":
            return await _setup(args, settings)
    except (ReflectError, TraceError) as e:
        return _err(str(e))
    except WorkflowFailureError as e:
        cause = e.cause
        return _err(f"reflection failed: {getattr(cause, 'message', None) or cause or e}", 1)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND and args.cmd in (
            "result",
            "replay",
            "audit",
            "cancel",
            "export",
        ):
            return _err(f"no reflection with id {args.id!r}")
        return _err(f"Temporal error: {e}", 1)
    return _err(f"unknown command {args.cmd}")
