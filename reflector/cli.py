"""`rr` command line: argument parsing and printing only; the logic lives in `reflector.client`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

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

    sub.add_parser("worker", help="run a worker against TEMPORAL_ADDRESS on RR_TASK_QUEUE")

    r = sub.add_parser("reflect", help="reflect on a trace file and print the reflection")
    r.add_argument("trace", help="trace file (.json or .jsonl)")
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

            settings.home.mkdir(parents=True, exist_ok=True)
            return run_foreground(settings.db_file, port=args.port, ui_port=args.ui_port)
        if args.cmd == "worker":
            from reflector.worker import run_worker

            asyncio.run(run_worker(settings))
            return 0
        return asyncio.run(_dispatch(args, settings))
    except SettingError as e:
        return _err(str(e))
    except KeyboardInterrupt:
        return _err("interrupted", 130)


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from reflector.client import ReflectError
    from reflector.traces import TraceError

    try:
        if args.cmd == "reflect":
            return await _reflect(args, settings)
        if args.cmd == "result":
            return await _result(args, settings)
        if args.cmd == "replay":
            return await _replay(args, settings)
    except (ReflectError, TraceError) as e:
        return _err(str(e))
    except WorkflowFailureError as e:
        cause = e.cause
        return _err(f"reflection failed: {getattr(cause, 'message', None) or cause or e}", 1)
    except RPCError as e:
        if "not found" in str(e).lower():
            return _err(f"no reflection with id {getattr(args, 'id', '?')!r}")
        return _err(f"Temporal error: {e}", 1)
    return _err(f"unknown command {args.cmd}")


def _say(msg: str) -> None:
    print(f"rr: {msg}", file=sys.stderr, flush=True)


async def _reflect(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.models import HEURISTIC, is_llm
    from reflector.render import render_progress, render_reflection
    from reflector.types import ReflectionConfig

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
    trace = c.upload_trace(args.trace, settings)
    inp = c.build_input(
        trace,
        question=args.question or "",
        ground_truth=args.ground_truth,
        feedback=args.feedback,
        skillbook=skillbook,
        mode=args.mode,
        config=ReflectionConfig(**overrides),  # type: ignore[arg-type]
    )
    if not is_llm(model):
        _say(f"model: {model} — a deterministic rule-based driver of the real tools, not an LLM")
    tty = sys.stderr.isatty()

    def progress(p: object) -> None:
        line = render_progress(p)  # type: ignore[arg-type]
        print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    async with c.runtime(settings, announce=_say) as rt:
        handle = await c.start_reflection(rt.client, inp, settings.task_queue, args.id)
        _say(f"started reflection {handle.id} (trace {trace.format}, {trace.size:,} bytes) on {rt.address}")
        out = await c.wait_for_result(handle, on_progress=progress)
        if tty:
            print(file=sys.stderr)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return 0


async def _result(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.client import WorkflowExecutionStatus

    from reflector import client as c
    from reflector.render import render_progress, render_reflection
    from reflector.types import Progress

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        handle = rt.client.get_workflow_handle(args.id)
        desc = await handle.describe()
        if desc.status == WorkflowExecutionStatus.RUNNING:
            line = "  (no worker is running it right now)"
            try:
                # a query waits for a worker; with none polling it would only time out
                if await c.has_pollers(rt.client, desc.task_queue):
                    line = render_progress(
                        await handle.query("progress", result_type=Progress, rpc_timeout=c.QUERY_TIMEOUT)
                    )
            except Exception:  # progress is best effort; the state (running) is not
                pass
            return _err(f"reflection {args.id} is still running:{line}", 3)
        out = await c.fetch_result(rt.client, args.id)
    print(out.model_dump_json(indent=2) if args.json else render_reflection(out), end="" if not args.json else "\n")
    return 0


async def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            n = await c.replay_workflow(rt.client, args.id)
        except Exception as e:
            if "not found" in str(e).lower():
                raise
            return _err(f"replay of {args.id} FAILED (non-determinism or error): {e}", 1)
    print(f"replay of {args.id} OK: {n} events replayed against the current code")
    return 0


if __name__ == "__main__":
    run()
