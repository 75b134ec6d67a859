"""`rr reflect`: one trace, or a batch of runs."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from reflector.cli.common import (
    _batch_finished,
    _finished,
    _Follower,
    _interrupted,
    _say,
)
from reflector.runtime.settings import Settings

STDIN_NAME = "<stdin>"  # how a trace read from stdin (`rr reflect -`) is named in messages and `rr list`


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
    skillbook: Path | None = (
        None  # uploaded to the blob store by build_input (`reflector.client.upload_skillbook`)
    )
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
            handle = await c.start_reflection(
                rt.client,
                inp,
                settings.task_queue,
                args.id,
                trace_name=STDIN_NAME if spooled else Path(args.trace[0]).name,
            )
            f.wf_id = handle.id
            _say(
                f"started reflection {handle.id} (trace {trace.format}, {trace.size:,} bytes) on {rt.address}"
            )
            await rt.ensure_worker(handle)
            out = await c.wait_for_result(
                handle,
                on_progress=f.progress,
                on_no_worker=f.no_worker,
                on_worker_back=f.worker_back,
                no_worker_after_s=settings.no_worker_warn_s,
            )
            f.finish(out, inp.config)
    except asyncio.CancelledError:  # Ctrl-C (asyncio.run cancels this task on SIGINT)
        if not f.wf_id or rt is None:
            raise  # nothing started: the plain "interrupted"
        return _interrupted(f.wf_id, rt, settings, f.tty)
    print(
        out.model_dump_json(indent=2) if args.json else render_reflection(out),
        end="" if not args.json else "\n",
    )
    return _finished(out)


async def _reflect_batch(
    args: argparse.Namespace, settings: Settings, config: object, skillbook: Path | None
) -> int:
    from reflector import client as c
    from reflector.client.batch_render import render_batch, render_batch_progress
    from reflector.contract import ReflectionConfig
    from reflector.runtime.models import is_llm

    assert isinstance(config, ReflectionConfig)
    if args.question or args.ground_truth is not None or args.feedback is not None:
        raise c.ReflectError(
            "--question, --ground-truth and --feedback are for one trace: in a batch each run carries its own"
        )
    manifest = c.upload_batch(args.trace, settings, split=args.batch)
    inp = c.build_batch_input(
        manifest,
        config=config,
        skillbook=skillbook,
        mode=args.mode,
        concurrency=args.concurrency,
        settings=settings,
    )
    if not is_llm(config.model):
        _say(f"model: {config.model} — a deterministic rule-based driver of the real tools, not an LLM")
    f = _Follower("batch", render_batch_progress, settings)
    rt: c.Runtime | None = None
    try:
        from worker import in_process_worker  # the composition root (workflows, activities, sandbox)

        async with c.runtime(
            settings, announce=_say, in_process_worker=in_process_worker([config.model])
        ) as rt:
            f.address = rt.address
            handle = await c.start_batch(
                rt.client,
                inp,
                settings.task_queue,
                args.id,
                name=", ".join(Path(t).name for t in args.trace)[:200],
            )
            f.wf_id = handle.id
            _say(
                f"started batch {f.wf_id}: {manifest.n_runs} runs, {inp.concurrency} at a time, on {rt.address}"
            )
            await rt.ensure_worker(handle)
            out = await c.wait_for_batch(
                handle,
                on_progress=f.progress,
                on_no_worker=f.no_worker,
                on_worker_back=f.worker_back,
                no_worker_after_s=settings.no_worker_warn_s,
            )
            f.finish(out)
    except asyncio.CancelledError:  # Ctrl-C: the batch goes on durably
        if not f.wf_id or rt is None:
            raise
        return _interrupted(f.wf_id, rt, settings, f.tty, "batch")
    result = c.batch_result(out, settings)
    print(
        result.model_dump_json(indent=2) if args.json else render_batch(result), end="\n" if args.json else ""
    )
    return _batch_finished(result)
