"""`rr` command line: argument parsing and printing only; the logic lives in `reflector.client`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from reflector.runtime.settings import SettingError, Settings

__all__ = ["main", "run"]

DISTRIBUTION = "durable-recursive-reflector"
STDIN_NAME = "<stdin>"  # how a trace read from stdin (`rr reflect -`) is named in messages and `rr list`
_STDIN_CHUNK = 1024 * 1024


def _err(msg: str, code: int = 2) -> int:
    _stop_progress()
    print(f"rr: error: {msg}", file=sys.stderr)
    return code


def _stop_progress() -> None:
    """End a live progress view before a message is printed under it (a no-op unless one was shown)."""
    view = sys.modules.get("reflector.client.progress_view")
    if view is not None:
        view.stop_all()


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

    s = sub.add_parser("server", help="run the embedded Temporal dev server (SQLite in RR_HOME) in the foreground")
    s.add_argument("--port", type=int, default=7233)
    s.add_argument("--ui-port", type=int, default=8233)

    w = sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS on RR_TASK_QUEUE")
    w.add_argument("--processes", type=int, metavar="N",
                   help="worker processes under one supervisor (default: RR_WORKER_PROCESSES or the cores available)")

    r = sub.add_parser("reflect", help="reflect on a trace file and print the reflection")
    r.add_argument("trace", nargs="+",
                   help="trace file (.json or .jsonl), or - to read one trace from stdin; several files or "
                        "directories of them: a batch, one run per file")
    r.add_argument("--batch", action="store_true",
                   help="each file holds many runs (a JSON array, JSONL lines): a batch, one run per record")
    r.add_argument("--concurrency", type=int, metavar="N",
                   help="batch: runs reflected at once (default: 8 for in-process models, 4 for provider models)")
    r.add_argument("--model", help="pydantic-ai model string (default: RR_MODEL or 'heuristic')")
    r.add_argument("--question")
    r.add_argument("--ground-truth")
    r.add_argument("--feedback")
    r.add_argument("--skillbook", help="skillbook text file")
    r.add_argument("--mode", choices=["online", "offline"], default="offline")
    r.add_argument("--max-requests", type=int)
    r.add_argument("--max-tokens", type=int)
    r.add_argument("--recursion", choices=["auto", "always"],
                   help="when the model may start child sessions (recurse): auto (default) on a large trace only, "
                        "always below the depth limit")
    r.add_argument("--id", help="workflow id (default: generated)")
    r.add_argument("--json", action="store_true", help="print the ReflectorOutput as JSON")

    rr_ = sub.add_parser("rerun", help="a new reflection that reuses the recorded steps before N of another and "
                                     "continues live from step N (e.g. with another model)")
    rr_.add_argument("id", help="the origin: a finished (or running) root reflection")
    rr_.add_argument("--from-step", type=int, required=True, metavar="N",
                     help="the first step (model request of the root session, 1-based) made live again")
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
    st.add_argument("--follow", action="store_true",
                    help="show the live progress until it ends, then its final status (exit code as `rr result`)")

    ls = sub.add_parser("list", help="reflections and batches, newest first, from Temporal's visibility")
    ls.add_argument("--status", choices=["running", "completed", "failed", "incomplete"],
                    help="completed: stop reason `completed`; incomplete: finished with another stop reason; "
                         "failed: no output (failed, timed out, terminated)")
    ls.add_argument("--limit", type=int, default=20, metavar="N", help="at most N rows (default 20)")
    ls.add_argument("--all", action="store_true", help="include children (recursion, the runs of batches)")
    ls.add_argument("--json", action="store_true", help="print a JSON list of objects")

    ca = sub.add_parser("cancel", help="cancel a reflection (or batch) and its children; it returns its findings so far")
    ca.add_argument("id")
    ca.add_argument("--wait", type=float, default=60.0, metavar="S",
                    help="wait at most S seconds for it to close (default 60)")
    ca.add_argument("--json", action="store_true", help="print the outcome and the output as one JSON object")

    su = sub.add_parser("setup", help="register rr's search attributes in TEMPORAL_NAMESPACE (idempotent)")
    su.add_argument("--json", action="store_true")

    rp = sub.add_parser("replay", help="replay every history of a reflection (each run of its continue-as-new "
                                       "chain, each child) against the current code")
    rp.add_argument("id", metavar="ID|FILE", help="a reflection id, a file written by `rr export` (or one JSON "
                                                  "history), or a directory of `rr export --split` files")
    rp.add_argument("--json", action="store_true", help="print the report as one JSON object")

    ex = sub.add_parser("export", help="write every history of a reflection (each run, each child) as one JSON file, "
                                       "payloads inlined: for `rr replay FILE` / `rr audit FILE` offline")
    ex.add_argument("id")
    ex_out = ex.add_mutually_exclusive_group()
    ex_out.add_argument("-o", "--output", metavar="FILE", help="write the export to FILE (default: stdout)")
    ex_out.add_argument("--split", metavar="DIR", help="write one plain Temporal JSON history per run into DIR")
    ex.add_argument("--json", action="store_true", help="with -o or --split: print a JSON summary on stdout")

    au = sub.add_parser("audit", help="the decision timeline of a reflection, from its history alone")
    au.add_argument("id", metavar="ID|FILE", help="a reflection id, or a file written by `rr export` (or one JSON history)")
    au_out = au.add_mutually_exclusive_group()
    au_out.add_argument("--json", action="store_true", help="print the timeline as JSON")
    au_out.add_argument("--html", metavar="OUT.html", help="write the timeline as one self-contained HTML file")

    g = sub.add_parser("gc", help="remove blobs, journals and caches that no retained workflow needs any more")
    g.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    g.add_argument("--min-age", default="1h", metavar="AGE",
                   help="never remove anything younger than this (default 1h; e.g. 3600, 90s, 15m, 2d)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


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
    if args.cmd not in ("worker", "server"):  # those stop on SIGTERM their own way (graceful drain, forwarding)
        _on_termination_signals()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.cmd == "server":
            from reflector.runtime.devserver import run_foreground
            from reflector.runtime.settings import usable_dir

            usable_dir(settings.home, "RR_HOME")
            return run_foreground(settings.db_file, port=args.port, ui_port=args.ui_port, home=settings.home)
        if args.cmd == "worker":
            from reflector.runtime.supervisor import run_supervisor, worker_processes

            processes = worker_processes(args.processes)
            if processes > 1:
                return run_supervisor(processes, cmd=[sys.executable, "-m", "reflector.cli.worker_child"])
        from reflector.client import configure_core_logging

        configure_core_logging(worker_warnings=args.cmd in ("worker", "reflect"))
        if args.cmd == "worker":
            from worker import run_worker

            asyncio.run(run_worker(settings))
            return 0
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
        return _err("`rr reflect -` reads one trace from stdin; a batch is read from files (save the runs to a "
                    "file, or drop the -)")
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
                    return _err(f"the trace on stdin is over the limit of {settings.max_trace_bytes:,} bytes "
                                "(raise it with the environment variable RR_MAX_TRACE_BYTES)")
                out.write(chunk)
        if size == 0:
            return _err("the trace on stdin is empty (pipe a trace into `rr reflect -`, e.g. "
                        "`cat trace.json | rr reflect -`)")
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
        if e.status == RPCStatusCode.NOT_FOUND and args.cmd in ("result", "replay", "audit", "cancel", "export"):
            return _err(f"no reflection with id {args.id!r}")
        return _err(f"Temporal error: {e}", 1)
    return _err(f"unknown command {args.cmd}")


def _say(msg: str) -> None:
    print(f"rr: {msg}", file=sys.stderr, flush=True)


async def _reflect(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.analysis.traces import TraceError
    from reflector.client.render import render_progress, render_reflection
    from reflector.contract import ReflectionConfig
    from reflector.runtime.models import HEURISTIC, is_llm

    model = args.model or settings.model or HEURISTIC
    overrides: dict[str, object] = {"model": model}
    if args.max_requests is not None:
        if args.max_requests < 1:
            raise c.ReflectError("--max-requests must be at least 1")
        overrides["max_requests"] = args.max_requests
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise c.ReflectError("--max-tokens must be at least 1")
        overrides["max_tokens"] = args.max_tokens
    if args.recursion is not None:
        overrides["recursion"] = args.recursion
    c.check_id(args.id)  # before anything is uploaded or started
    c.check_task_texts(question=args.question, ground_truth=args.ground_truth, feedback=args.feedback)
    skillbook: Path | None = None  # uploaded to the blob store by build_input (`reflector.client.upload_skillbook`)
    if args.skillbook:
        skillbook = Path(args.skillbook)
        if not skillbook.is_file():
            raise c.ReflectError(f"skillbook file not found: {skillbook}")
    if args.batch or len(args.trace) > 1 or Path(args.trace[0]).is_dir():
        return await _reflect_batch(args, settings, ReflectionConfig(**overrides), skillbook)
    if args.concurrency is not None:
        raise c.ReflectError("--concurrency is for a batch (several traces, a directory, or --batch)")
    spooled: Path | None = getattr(args, "stdin_trace", None)  # `rr reflect -` (see _reflect_stdin)
    try:
        trace = c.upload_trace(args.trace[0], settings)
    except (c.ReflectError, TraceError) as e:
        if spooled is None:
            raise
        raise c.ReflectError(str(e).replace(str(spooled), STDIN_NAME)) from None
    finally:
        if spooled is not None:
            spooled.unlink(missing_ok=True)  # in the blob store now (or refused)
    inp = c.build_input(
        trace,
        question=args.question or "",
        ground_truth=args.ground_truth,
        feedback=args.feedback,
        skillbook=skillbook,
        mode=args.mode,
        config=ReflectionConfig(**overrides),
        settings=settings,
    )
    if not is_llm(model):
        _say(f"model: {model} — a deterministic rule-based driver of the real tools, not an LLM")
    f = _Follower("reflection", render_progress, settings)
    rt: c.Runtime | None = None
    try:
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        async with c.runtime(settings, announce=_say, in_process_worker=in_process_worker([model])) as rt:
            f.address, f.client = rt.address, rt.client
            handle = await c.start_reflection(rt.client, inp, settings.task_queue, args.id,
                                              trace_name=STDIN_NAME if spooled else Path(args.trace[0]).name)
            f.wf_id = handle.id
            _say(f"started reflection {handle.id} (trace {trace.format}, {trace.size:,} bytes) on {rt.address}")
            await rt.ensure_worker(handle)
            out = await c.wait_for_result(handle, on_progress=f.progress, on_no_worker=f.no_worker,
                                          on_worker_back=f.worker_back, no_worker_after_s=settings.no_worker_warn_s)
            f.finish(out, inp.config)
    except asyncio.CancelledError:  # Ctrl-C (asyncio.run cancels this task on SIGINT)
        if not f.wf_id or rt is None:
            raise  # nothing started: the plain "interrupted"
        return _interrupted(f.wf_id, rt, settings, f.tty)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return _finished(out)


async def _rerun(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.client.render import render_progress, render_reflection
    from reflector.client.rerun import plan_rerun, rerun_line
    from reflector.runtime.models import is_llm

    overrides: dict[str, object] = {}
    for flag, name in (("--max-requests", "max_requests"), ("--max-tokens", "max_tokens")):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise c.ReflectError(f"{flag} must be at least 1")
            overrides[name] = value
    f = _Follower("reflection", render_progress, settings)
    rt: c.Runtime | None = None
    try:
        from reflector.runtime.models import (
            SHIPPED_FAMILIES,  # the origin's model is known only once it is read
        )
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        models = [args.model] if args.model else list(SHIPPED_FAMILIES)
        async with c.runtime(settings, announce=_say, in_process_worker=in_process_worker(models)) as rt:
            f.address, f.client = rt.address, rt.client
            plan = await plan_rerun(rt.client, settings, args.id, args.from_step, model=args.model,
                                    config_overrides=overrides)
            model = plan.input.config.model
            if not is_llm(model):
                _say(f"model: {model} — a deterministic rule-based driver of the real tools, not an LLM")
            handle = await c.start_reflection(rt.client, plan.input, settings.task_queue, args.new_id,
                                              trace_name=plan.origin.trace_name)
            f.wf_id = handle.id
            _say(f"started reflection {handle.id}: rerun of {args.id} from step {args.from_step} of "
                 f"{plan.origin.steps} (reusing {len(plan.prefix.responses)} responses, {len(plan.prefix.cells)} "
                 f"cells, {len(plan.prefix.children)} children) with {model}, on {rt.address}")
            await rt.ensure_worker(handle)
            out = await c.wait_for_result(handle, on_progress=f.progress, on_no_worker=f.no_worker,
                                          on_worker_back=f.worker_back, no_worker_after_s=settings.no_worker_warn_s)
            f.finish(out, plan.input.config)
    except asyncio.CancelledError:
        if not f.wf_id or rt is None:
            raise
        return _interrupted(f.wf_id, rt, settings, f.tty)
    line = rerun_line(out)
    if line:
        _say(line)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return _finished(out)


async def _reflect_batch(args: argparse.Namespace, settings: Settings, config: object, skillbook: Path | None) -> int:
    from reflector import client as c
    from reflector.client.batch_render import render_batch, render_batch_progress
    from reflector.contract import ReflectionConfig
    from reflector.runtime.models import is_llm

    assert isinstance(config, ReflectionConfig)
    if args.question or args.ground_truth is not None or args.feedback is not None:
        raise c.ReflectError("--question, --ground-truth and --feedback are for one trace: in a batch each run "
                             "carries its own")
    manifest = c.upload_batch(args.trace, settings, split=args.batch)
    inp = c.build_batch_input(manifest, config=config, skillbook=skillbook, mode=args.mode,
                              concurrency=args.concurrency, settings=settings)
    if not is_llm(config.model):
        _say(f"model: {config.model} — a deterministic rule-based driver of the real tools, not an LLM")
    f = _Follower("batch", render_batch_progress, settings)
    rt: c.Runtime | None = None
    try:
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        async with c.runtime(settings, announce=_say, in_process_worker=in_process_worker([config.model])) as rt:
            f.address = rt.address
            handle = await c.start_batch(rt.client, inp, settings.task_queue, args.id,
                                         name=", ".join(Path(t).name for t in args.trace)[:200])
            f.wf_id = handle.id
            _say(f"started batch {f.wf_id}: {manifest.n_runs} runs, {inp.concurrency} at a time, on {rt.address}")
            await rt.ensure_worker(handle)
            out = await c.wait_for_batch(handle, on_progress=f.progress, on_no_worker=f.no_worker,
                                         on_worker_back=f.worker_back, no_worker_after_s=settings.no_worker_warn_s)
            f.finish(out)
    except asyncio.CancelledError:  # Ctrl-C: the batch goes on durably
        if not f.wf_id or rt is None:
            raise
        return _interrupted(f.wf_id, rt, settings, f.tty, "batch")
    result = c.batch_result(out, settings)
    print(result.model_dump_json(indent=2) if args.json else render_batch(result), end="\n" if args.json else "")
    return _batch_finished(result)


def _batch_finished(out: object) -> int:
    from reflector import client as c
    from reflector.contract import BatchOutput

    assert isinstance(out, BatchOutput)
    if out.cancelled:
        _say(f"the batch was CANCELLED ({out.reflected} runs reflected, {out.failed} failed before it stopped): "
             f"exit code {c.EXIT_CANCELLED}")
        return c.EXIT_CANCELLED
    if c.is_batch_complete(out):
        return 0
    _say(f"the batch is INCOMPLETE ({out.failed} runs could not be reflected on, "
         f"{out.synthesis.incomplete_reflections} reflections stopped early): exit code {c.EXIT_INCOMPLETE}")
    return c.EXIT_INCOMPLETE


def _finished(out: object) -> int:
    from reflector import client as c
    from reflector.contract import ReflectorOutput

    assert isinstance(out, ReflectorOutput)
    if c.is_complete(out):
        return 0
    if c.is_cancelled(out):
        _say(f"the reflection was CANCELLED (rr cancel): the text is built from its findings so far: "
             f"exit code {c.EXIT_CANCELLED}")
        return c.EXIT_CANCELLED
    stop = out.raw.get("rr_trace", {}).get("stop_reason")
    error = " ".join(str(out.raw.get("error") or "").split()) if stop == "error" else ""  # e.g. the provider's complaint
    _say(f"the reflection is INCOMPLETE (stop reason: {stop}{': ' + error if error else ''}): "
         f"exit code {c.EXIT_INCOMPLETE}")
    return c.EXIT_INCOMPLETE


class _Follower:
    """The live progress (`reflector.client.progress_view`) and the no-worker notices `rr reflect` shows while it
    waits for a `noun` ("reflection" or "batch"); `wf_id` and `address` are filled in once it has started
    (setting `wf_id` starts the elapsed clock), `client` to show the running children's progress too."""

    def __init__(self, noun: str, render: Callable[..., str], settings: Settings) -> None:
        from reflector.client.progress_view import ProgressDisplay

        self.noun, self.render, self.settings = noun, render, settings
        self.display = ProgressDisplay(render, title=noun)
        self.tty = self.display.tty
        self._wf_id = self.address = ""
        self.client: Any = None
        self._chain: Any = None  # a `reflector.client.status.ChainFollower` once there is a client

    @property
    def wf_id(self) -> str:
        return self._wf_id

    @wf_id.setter
    def wf_id(self, value: str) -> None:
        self._wf_id = value
        self.display.title = f"{self.noun} {value}"
        self.display.start_clock()

    async def progress(self, p: object) -> None:
        from reflector.client.status import ChainFollower
        from reflector.contract import BatchProgress, Progress

        assert isinstance(p, Progress | BatchProgress)
        if isinstance(p, Progress) and self.client is not None:
            self._chain = self._chain or ChainFollower(self.client)
            self.display.update(p, await self._chain(p))
        else:
            self.display.update(p)

    def end_line(self) -> None:
        self.display.stop()

    def finish(self, out: object, config: object = None) -> None:
        """The summary line (the final numbers, from the result), shown also when no poll saw any progress."""
        from reflector import client as c
        from reflector.client.progress_view import summary_line
        from reflector.client.status import final_progress
        from reflector.contract import BatchOutput, BatchProgress, ReflectionConfig, ReflectorOutput

        elapsed = self.display.elapsed
        if isinstance(out, BatchOutput):
            p = BatchProgress(phase="done", total=out.n_runs, done=out.reflected, failed=out.failed,
                              continued_as_new=out.continued_as_new)
            outcome = "CANCELLED" if out.cancelled else "completed" if c.is_batch_complete(out) else "INCOMPLETE"
            self.display.finish(summary_line(self.noun, self.wf_id, outcome, elapsed, p))
            return
        assert isinstance(out, ReflectorOutput)
        stop = out.raw.get("rr_trace", {}).get("stop_reason")
        outcome = "CANCELLED" if c.is_cancelled(out) else "completed" if c.is_complete(out) else f"INCOMPLETE ({stop})"
        cfg = config if isinstance(config, ReflectionConfig) else None
        self.display.finish(summary_line(self.noun, self.wf_id, outcome, elapsed, final_progress(out, cfg)))

    def no_worker(self, waited: float) -> None:
        self.display.note(
            f"rr: no worker is polling task queue {self.settings.task_queue!r} on {self.address}: {self.noun} "
            f"{self.wf_id} has waited {waited:.0f} s for one; start `rr worker` (same TEMPORAL_ADDRESS, "
            f"RR_TASK_QUEUE and RR_BLOB_DIR), or press Ctrl-C (the {self.noun} stays; `rr result {self.wf_id}` "
            "follows it later)")

    def worker_back(self) -> None:
        self.display.note(f"rr: a worker took {self.noun} {self.wf_id}")


def _interrupted(wf_id: str, rt: object, settings: Settings, tty: bool, noun: str = "reflection") -> int:
    from reflector.client import Runtime

    assert isinstance(rt, Runtime)
    _stop_progress()  # (`tty`: kept for callers; the live view ends itself)
    ns = settings.namespace
    print(f"rr: error: interrupted: {noun} {wf_id} was not stopped; it goes on durably on {rt.address} "
          f"(namespace {ns!r})", file=sys.stderr)
    _say(f"  follow it: rr result {wf_id}")
    _say(f"  cancel it: rr cancel {wf_id}")
    if rt.local_worker:
        _say(f"  this process ran its only worker: the {noun} continues when a worker runs (`rr worker` "
             f"with TEMPORAL_ADDRESS={rt.address} RR_TASK_QUEUE={settings.task_queue})")
    if rt.embedded_server:
        _say(f"  the embedded server of this RR_HOME stops when no rr process of it runs; the {noun} is saved in "
             f"{settings.db_file}: the commands above (same RR_HOME) start it again")
    return 130


async def _result(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus

    from reflector import client as c
    from reflector.client.batch_render import render_batch, render_batch_progress
    from reflector.client.render import render_progress, render_reflection
    from reflector.contract import BATCH_WORKFLOW_NAME, PROGRESS_QUERY, BatchProgress, Progress

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        handle = rt.client.get_workflow_handle(args.id)
        desc = await handle.describe()
        is_batch = desc.workflow_type == BATCH_WORKFLOW_NAME
        if desc.status == WorkflowExecutionStatus.RUNNING:
            line = "  (no worker is running it right now)"
            try:
                # a query waits for a worker; with none taking the reflection's tasks it would only time out
                if not await c.waiting_for_worker(handle):
                    if is_batch:
                        line = render_batch_progress(await handle.query(
                            PROGRESS_QUERY, result_type=BatchProgress, rpc_timeout=c.QUERY_TIMEOUT))
                    else:
                        line = render_progress(
                            await handle.query(PROGRESS_QUERY, result_type=Progress, rpc_timeout=c.QUERY_TIMEOUT)
                        )
            except Exception:  # progress is best effort; the state (running) is not
                pass
            return _err(f"{'batch' if is_batch else 'reflection'} {args.id} is still running:{line}", 3)
        if desc.status == WorkflowExecutionStatus.CANCELED:  # cancelled by a worker older than cancelled outputs
            return _err(f"{'batch' if is_batch else 'reflection'} {args.id} was cancelled before it returned any "
                        "findings (no output)", c.EXIT_CANCELLED)
        if is_batch:
            batch = await c.fetch_batch_result(rt.client, args.id, settings)
            print(batch.model_dump_json(indent=2) if args.json else render_batch(batch), end="\n" if args.json else "")
            return _batch_finished(batch)
        out = await c.fetch_result(rt.client, args.id)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return _finished(out)


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.client.status import status_command

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        return await status_command(rt.client, args.id, as_json=args.json, follow_it=args.follow)


async def _replay(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.client.audit import replay as rp
    from reflector.client.audit.events import models_of
    from reflector.client.audit.histories import BundleError, iter_runs, load_bundle
    from reflector.runtime.storage.blobs import BlobNotFound
    from reflector.runtime.storage.payloads import blob_dir_of
    from worker import replay_factory  # the composition root: the workflows and their models

    def line(r: rp.RunReplay) -> None:
        if not args.json:
            print(rp.render_line(r), flush=True)

    path = Path(args.id)
    report: rp.ReplayReport
    if path.exists() or path.suffix.lower() == ".json":  # an export file, a JSON history, a --split directory
        if not path.exists():
            return _err(f"{args.id}: no such file")
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            return _err(str(e))
        firsts = (r.history.events[0] for r in bundle.runs if r.history.events)
        report = await rp.replay_all(rp.as_stream(bundle.runs), root_id=bundle.root_id, source=str(path),
                                     blob_dir=settings.blob_dir, make_replayer=replay_factory,
                                     models=models_of(firsts, settings.blob_dir) or None, on_run=line)
    else:
        async with c.runtime(settings, want_worker=False, announce=_say) as rt:
            blob_dir = blob_dir_of(rt.client.data_converter) or settings.blob_dir
            try:
                # every session of a tree (a batch's runs too) uses the root's model: prepare only that one
                first = [ev async for ev in _first_event(rt.client, args.id)]
                report = await rp.replay_all(iter_runs(rt.client, args.id, blob_dir), root_id=args.id,
                                             source="server", blob_dir=blob_dir, make_replayer=replay_factory,
                                             models=models_of(first, blob_dir) or None, on_run=line)
            except (BundleError, BlobNotFound) as e:
                return _err(f"replay of {args.id}: {e}", 1)
    print(json.dumps(report.to_json(), indent=2) if args.json else rp.render_summary(report))
    return 0 if report.ok else 1


async def _first_event(client: Any, workflow_id: str) -> Any:
    """The first event of a workflow's latest run (an async generator of at most one)."""
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events(page_size=1):
        yield event
        return


async def _export(args: argparse.Namespace, settings: Settings) -> int:
    import json
    import tempfile

    from reflector import client as c
    from reflector.client.audit.histories import BundleError, ExportSummary, export
    from reflector.runtime.storage.blobs import BlobNotFound
    from reflector.runtime.storage.payloads import blob_dir_of

    split = Path(args.split) if args.split else None
    if split is not None:
        if split.exists() and (not split.is_dir() or any(split.iterdir())):
            return _err(f"--split {split}: not an empty directory")
        split.mkdir(parents=True, exist_ok=True)
    target = Path(args.output) if args.output else None
    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        blob_dir = blob_dir_of(rt.client.data_converter) or settings.blob_dir
        try:
            summary: ExportSummary
            if target is not None:  # written beside the target, renamed into place once complete
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "w", encoding="utf-8") as out:
                        summary = await export(rt.client, args.id, blob_dir, out=out)
                    os.replace(tmp, target)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
            else:
                summary = await export(rt.client, args.id, blob_dir, out=None if split else sys.stdout,
                                       split_dir=split)
        except (BundleError, BlobNotFound) as e:
            return _err(f"export of {args.id}: {e}", 1)
    where = str(target) if target else (f"{summary.histories} files in {split}" if split else "stdout")
    _say(f"exported {summary.histories} histor{'y' if summary.histories == 1 else 'ies'} ({summary.events} events) "
         f"of {args.id} to {where}")
    if summary.partial:
        _say(f"{args.id} is still running: exported the histories so far; partial: {', '.join(summary.partial)}")
    if args.json and (target or split):
        print(json.dumps(summary.to_json(), indent=2))
    return 0


async def _audit(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.client.audit.build import audit_file, audit_workflow
    from reflector.client.audit.histories import BundleError
    from reflector.client.audit.render_html import render_html
    from reflector.client.audit.render_text import render_text
    from reflector.runtime.storage.payloads import blob_dir_of
    from worker import audit_replay_hooks  # the composition root: the workflows that replay the histories

    hooks = audit_replay_hooks()
    path = Path(args.id)
    if path.suffix.lower() == ".json" and not path.is_file():
        return _err(f"{args.id}: no such file")
    if path.is_file():
        try:
            audit = await audit_file(path, settings.blob_dir, hooks)
        except BundleError as e:
            return _err(str(e))
    else:
        async with c.runtime(settings, want_worker=False, announce=_say) as rt:
            blob_dir = blob_dir_of(rt.client.data_converter) or settings.blob_dir
            audit = await audit_workflow(rt.client, args.id, blob_dir, hooks)
    if args.html:
        Path(args.html).write_text(render_html(audit), encoding="utf-8")
        _say(f"wrote the audit of {audit.root_id} to {args.html}")
    elif args.json:
        print(audit.model_dump_json(indent=2))
    else:
        print(render_text(audit), end="")
    return 0


async def _gc(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.runtime import gc

    if settings.s3_url is not None:
        raise c.ReflectError(f"rr gc manages a file blob store; RR_BLOB_URL is {settings.s3_url}: expire its objects "
                             "with the bucket's lifecycle rules; rr gc does not sweep S3")
    try:
        min_age = gc.parse_duration(args.min_age)
    except ValueError as e:
        raise c.ReflectError(f"--min-age: {e}") from None
    if not settings.address_explicit and not settings.db_file.exists():
        # an embedded server started on a new database would list no workflow: everything would look unused
        raise c.ReflectError(f"no embedded server database {settings.db_file} and no TEMPORAL_ADDRESS: nothing "
                             "can say which blobs are in use (set TEMPORAL_ADDRESS)")
    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            report = await gc.run_gc(gc.TemporalSource(rt.client), settings.blob_dir, min_age_s=min_age,
                                     dry_run=args.dry_run)
        except gc.GCRefused as e:
            return _err(f"gc removed nothing: {e}", 1)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(gc.render_report(report), end="")
    return 0


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.client import ops
    from reflector.runtime.search_attributes import register_hint

    if args.limit < 1:
        raise c.ReflectError("--limit must be at least 1")
    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        listing = await ops.list_reflections(rt.client, status=args.status, limit=args.limit,
                                             include_children=args.all)
    if listing.missing_attributes:
        _say(f"rr's search attributes are not registered in namespace {settings.namespace!r} "
             f"(missing: {', '.join(listing.missing_attributes)}): model, stop reason and totals are read from "
             f"results where they can be; to register them {register_hint(settings.namespace)}")
    if args.json:
        print(json.dumps([r.to_json() for r in listing.rows], indent=2))
    elif listing.rows:
        print(ops.render_rows(listing.rows), end="")
    else:
        _say("no reflection matches" + (f" (--status {args.status})" if args.status else ""))
    return 0


async def _cancel(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.client import ops
    from reflector.client.batch_render import render_batch
    from reflector.client.render import render_reflection
    from reflector.contract import BatchOutput, ReflectorOutput

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            res = await ops.cancel(rt.client, args.id, wait_s=max(0.0, args.wait))
        except ops.NotFound:
            return _err(f"no reflection with id {args.id!r}")
        out = res.output
        text = ""
        if isinstance(out, BatchOutput):
            text = render_batch(c.batch_result(out, settings))
        elif isinstance(out, ReflectorOutput):
            text = render_reflection(out)
    _say(ops.render_cancel(res))
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    elif text:
        print(text, end="")
    return {"cancelled": 0, "finished": 0, "already_closed": c.EXIT_NOT_RUNNING, "cancel_requested": 3}[res.outcome]


async def _setup(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.contract import SEARCH_ATTRIBUTES
    from reflector.runtime import search_attributes as sa

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            added = await sa.register(rt.client)
        except sa.RegistrationError as e:
            return _err(str(e), 1)
    if args.json:
        print(json.dumps({"namespace": settings.namespace, "added": added,
                          "registered": dict(SEARCH_ATTRIBUTES)}, indent=2))
    else:
        print(f"search attributes in namespace {settings.namespace!r}: "
              + (f"added {', '.join(added)}" if added else "all registered already")
              + f" ({', '.join(f'{n} {t}' for n, t in SEARCH_ATTRIBUTES.items())})")
    return 0


if __name__ == "__main__":
    run()
