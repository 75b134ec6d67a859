"""`rr` command line: argument parsing and printing only; the logic lives in `reflector.client`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from reflector.settings import SettingError, Settings

__all__ = ["main", "run"]


def _err(msg: str, code: int = 2) -> int:
    print(f"rr: error: {msg}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rr", description="Durable Recursive Reflector")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("server", help="run the embedded Temporal dev server (SQLite in RR_HOME) in the foreground")
    s.add_argument("--port", type=int, default=7233)
    s.add_argument("--ui-port", type=int, default=8233)

    w = sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS on RR_TASK_QUEUE")
    w.add_argument("--processes", type=int, metavar="N",
                   help="worker processes under one supervisor (default: RR_WORKER_PROCESSES or the cores available)")

    r = sub.add_parser("reflect", help="reflect on a trace file and print the reflection")
    r.add_argument("trace", nargs="+",
                   help="trace file (.json or .jsonl); several files or directories of them: a batch, one run per file")
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
    r.add_argument("--id", help="workflow id (default: generated)")
    r.add_argument("--json", action="store_true", help="print the ReflectorOutput as JSON")

    res = sub.add_parser("result", help="print the output of a finished reflection")
    res.add_argument("id")
    res.add_argument("--json", action="store_true")

    rp = sub.add_parser("replay", help="replay a reflection's history against the current code")
    rp.add_argument("id")

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
    from reflector.devserver import stop_live_servers

    stop_live_servers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        if args.cmd == "server":
            from reflector.devserver import run_foreground
            from reflector.settings import usable_dir

            usable_dir(settings.home, "RR_HOME")
            return run_foreground(settings.db_file, port=args.port, ui_port=args.ui_port)
        if args.cmd == "worker":
            from reflector.supervisor import run_supervisor, worker_processes

            processes = worker_processes(args.processes)
            if processes > 1:
                return run_supervisor(processes)
        from reflector.client import configure_core_logging

        configure_core_logging(worker_warnings=args.cmd in ("worker", "reflect"))
        if args.cmd == "worker":
            from worker import run_worker

            asyncio.run(run_worker(settings))
            return 0
        return asyncio.run(_dispatch(args, settings))
    except SettingError as e:
        return _err(str(e))
    except KeyboardInterrupt:
        return _err("interrupted", 130)
    except OSError as e:  # a file-system fault nothing above expected: still one line
        where = f" ({e.filename})" if e.filename else ""
        return _err(f"{e.strerror or e}{where}", 1)


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError, RPCStatusCode

    from reflector.client import ReflectError
    from reflector.traces import TraceError

    try:
        if args.cmd == "reflect":
            return await _reflect(args, settings)
        if args.cmd == "result":
            return await _result(args, settings)
        if args.cmd == "replay":
            return await _replay(args, settings)
        if args.cmd == "gc":
            return await _gc(args, settings)
    except (ReflectError, TraceError) as e:
        return _err(str(e))
    except WorkflowFailureError as e:
        cause = e.cause
        return _err(f"reflection failed: {getattr(cause, 'message', None) or cause or e}", 1)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND and args.cmd in ("result", "replay"):
            return _err(f"no reflection with id {args.id!r}")
        return _err(f"Temporal error: {e}", 1)
    return _err(f"unknown command {args.cmd}")


def _say(msg: str) -> None:
    print(f"rr: {msg}", file=sys.stderr, flush=True)


async def _reflect(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.contract import ReflectionConfig
    from reflector.models import HEURISTIC, is_llm
    from reflector.render import render_progress, render_reflection

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
    skillbook = ""
    if args.skillbook:
        sb = Path(args.skillbook)
        if not sb.is_file():
            raise c.ReflectError(f"skillbook file not found: {sb}")
        skillbook = sb.read_text(encoding="utf-8", errors="replace")
    if args.batch or len(args.trace) > 1 or Path(args.trace[0]).is_dir():
        return await _reflect_batch(args, settings, ReflectionConfig(**overrides), skillbook)
    if args.concurrency is not None:
        raise c.ReflectError("--concurrency is for a batch (several traces, a directory, or --batch)")
    trace = c.upload_trace(args.trace[0], settings)
    inp = c.build_input(
        trace,
        question=args.question or "",
        ground_truth=args.ground_truth,
        feedback=args.feedback,
        skillbook=skillbook,
        mode=args.mode,
        config=ReflectionConfig(**overrides),
    )
    if not is_llm(model):
        _say(f"model: {model} — a deterministic rule-based driver of the real tools, not an LLM")
    f = _Follower("reflection", render_progress, settings)
    rt: c.Runtime | None = None
    try:
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        async with c.runtime(settings, announce=_say, in_process_worker=in_process_worker([model])) as rt:
            f.address = rt.address
            handle = await c.start_reflection(rt.client, inp, settings.task_queue, args.id)
            f.wf_id = handle.id
            _say(f"started reflection {handle.id} (trace {trace.format}, {trace.size:,} bytes) on {rt.address}")
            await rt.ensure_worker(handle)
            out = await c.wait_for_result(handle, on_progress=f.progress, on_no_worker=f.no_worker,
                                          on_worker_back=f.worker_back, no_worker_after_s=settings.no_worker_warn_s)
            f.end_line()
    except asyncio.CancelledError:  # Ctrl-C (asyncio.run cancels this task on SIGINT)
        if not f.wf_id or rt is None:
            raise  # nothing started: the plain "interrupted"
        return _interrupted(f.wf_id, rt, settings, f.tty)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return _finished(out)


async def _reflect_batch(args: argparse.Namespace, settings: Settings, config: object, skillbook: str) -> int:
    from reflector import client as c
    from reflector.batch.render import render_batch, render_batch_progress
    from reflector.contract import ReflectionConfig
    from reflector.models import is_llm

    assert isinstance(config, ReflectionConfig)
    if args.question or args.ground_truth is not None or args.feedback is not None:
        raise c.ReflectError("--question, --ground-truth and --feedback are for one trace: in a batch each run "
                             "carries its own")
    manifest = c.upload_batch(args.trace, settings, split=args.batch)
    inp = c.build_batch_input(manifest, config=config, skillbook=skillbook, mode=args.mode,
                              concurrency=args.concurrency)
    if not is_llm(config.model):
        _say(f"model: {config.model} — a deterministic rule-based driver of the real tools, not an LLM")
    f = _Follower("batch", render_batch_progress, settings)
    rt: c.Runtime | None = None
    try:
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        async with c.runtime(settings, announce=_say, in_process_worker=in_process_worker([config.model])) as rt:
            f.address = rt.address
            handle = await c.start_batch(rt.client, inp, settings.task_queue, args.id)
            f.wf_id = handle.id
            _say(f"started batch {f.wf_id}: {manifest.n_runs} runs, {inp.concurrency} at a time, on {rt.address}")
            await rt.ensure_worker(handle)
            out = await c.wait_for_batch(handle, on_progress=f.progress, on_no_worker=f.no_worker,
                                         on_worker_back=f.worker_back, no_worker_after_s=settings.no_worker_warn_s)
            f.end_line()
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
    stop = out.raw.get("rr_trace", {}).get("stop_reason")
    _say(f"the reflection is INCOMPLETE (stop reason: {stop}): exit code {c.EXIT_INCOMPLETE}")
    return c.EXIT_INCOMPLETE


class _Follower:
    """The progress line and the no-worker notices `rr reflect` shows while it waits for a `noun`
    ("reflection" or "batch"); `wf_id` and `address` are filled in once it has started."""

    def __init__(self, noun: str, render: Callable[[Any], str], settings: Settings) -> None:
        self.noun, self.render, self.settings = noun, render, settings
        self.tty = sys.stderr.isatty()
        self.wf_id = self.address = ""

    def progress(self, p: object) -> None:
        line = self.render(p)
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr,
              flush=True)

    def end_line(self) -> None:
        if self.tty:
            print(file=sys.stderr)

    def no_worker(self, waited: float) -> None:
        self.end_line()
        _say(f"no worker is polling task queue {self.settings.task_queue!r} on {self.address}: {self.noun} "
             f"{self.wf_id} has waited {waited:.0f} s for one; start `rr worker` (same TEMPORAL_ADDRESS, "
             f"RR_TASK_QUEUE and RR_BLOB_DIR), or press Ctrl-C (the {self.noun} stays; `rr result {self.wf_id}` "
             "follows it later)")

    def worker_back(self) -> None:
        _say(f"a worker took {self.noun} {self.wf_id}")


def _interrupted(wf_id: str, rt: object, settings: Settings, tty: bool, noun: str = "reflection") -> int:
    from reflector.client import Runtime

    assert isinstance(rt, Runtime)
    if tty:
        print(file=sys.stderr)
    ns = settings.namespace
    print(f"rr: error: interrupted: {noun} {wf_id} was not stopped; it goes on durably on {rt.address} "
          f"(namespace {ns!r})", file=sys.stderr)
    _say(f"  follow it: rr result {wf_id}")
    _say(f"  cancel it: temporal workflow cancel --workflow-id {wf_id} --address {rt.address} --namespace {ns}")
    if rt.local_worker:
        _say(f"  this process ran its only worker: the {noun} continues when a worker runs (`rr worker` "
             f"with TEMPORAL_ADDRESS={rt.address} RR_TASK_QUEUE={settings.task_queue})")
    if rt.embedded_server:
        _say(f"  the embedded server stopped with this process; the {noun} is saved in {settings.db_file}: "
             "run `rr server` (same RR_HOME) for the commands above")
    return 130


async def _result(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus

    from reflector import client as c
    from reflector.batch.render import render_batch, render_batch_progress
    from reflector.contract import BATCH_WORKFLOW_NAME, PROGRESS_QUERY, BatchProgress, Progress
    from reflector.render import render_progress, render_reflection

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
        if is_batch:
            batch = await c.fetch_batch_result(rt.client, args.id, settings)
            print(batch.model_dump_json(indent=2) if args.json else render_batch(batch), end="\n" if args.json else "")
            return _batch_finished(batch)
        out = await c.fetch_result(rt.client, args.id)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return _finished(out)


async def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.service import RPCError

    from reflector import client as c

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            from worker import replay

            report = await replay(rt.client, args.id)
        except (SettingError, RPCError):
            raise
        except Exception as e:
            if "not found" in str(e).lower():
                raise
            return _err(f"replay of {args.id} FAILED (non-determinism or error): {e}", 1)
    if report.running:
        print(f"replay of {args.id} OK: replayed a partial history of a running reflection "
              f"({report.events} events so far) against the current code")
    else:
        print(f"replay of {args.id} OK: {report.events} events replayed against the current code")
    return 0


async def _gc(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector import gc
    from reflector.devserver import is_reachable

    try:
        min_age = gc.parse_duration(args.min_age)
    except ValueError as e:
        raise c.ReflectError(f"--min-age: {e}") from None
    if not settings.address_explicit and not settings.db_file.exists() and not is_reachable(settings.address):
        # an embedded server started on a new database would list no workflow: everything would look unused
        raise c.ReflectError(f"no Temporal server at {settings.address} and no embedded server database "
                             f"{settings.db_file}: nothing can say which blobs are in use (set TEMPORAL_ADDRESS)")
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


if __name__ == "__main__":
    run()
