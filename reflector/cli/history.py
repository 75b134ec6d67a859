"""`rr replay`, `rr export`, `rr audit`, `rr rerun`: a reflection read back from its histories."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from reflector.cli.common import (
    _err,
    _finished,
    _Follower,
    _interrupted,
    _say,
)
from reflector.runtime.settings import Settings


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
        report = await rp.replay_all(
            rp.as_stream(bundle.runs),
            root_id=bundle.root_id,
            source=str(path),
            blob_dir=settings.blob_dir,
            make_replayer=replay_factory,
            models=models_of(firsts, settings.blob_dir) or None,
            on_run=line,
        )
    else:
        async with c.runtime(settings, want_worker=False, announce=_say) as rt:
            blob_dir = blob_dir_of(rt.client.data_converter) or settings.blob_dir
            try:
                # every session of a tree (a batch's runs too) uses the root's model: prepare only that one
                first = [ev async for ev in _first_event(rt.client, args.id)]
                report = await rp.replay_all(
                    iter_runs(rt.client, args.id, blob_dir),
                    root_id=args.id,
                    source="server",
                    blob_dir=blob_dir,
                    make_replayer=replay_factory,
                    models=models_of(first, blob_dir) or None,
                    on_run=line,
                )
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
                summary = await export(
                    rt.client, args.id, blob_dir, out=None if split else sys.stdout, split_dir=split
                )
        except (BundleError, BlobNotFound) as e:
            return _err(f"export of {args.id}: {e}", 1)
    where = str(target) if target else (f"{summary.histories} files in {split}" if split else "stdout")
    _say(
        f"exported {summary.histories} histor{'y' if summary.histories == 1 else 'ies'} ({summary.events} events) "
        f"of {args.id} to {where}"
    )
    if summary.partial:
        _say(
            f"{args.id} is still running: exported the histories so far; partial: {', '.join(summary.partial)}"
        )
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
            plan = await plan_rerun(
                rt.client, settings, args.id, args.from_step, model=args.model, config_overrides=overrides
            )
            model = plan.input.config.model
            if not is_llm(model):
                _say(f"model: {model} — a deterministic rule-based driver of the real tools, not an LLM")
            handle = await c.start_reflection(
                rt.client, plan.input, settings.task_queue, args.new_id, trace_name=plan.origin.trace_name
            )
            f.wf_id = handle.id
            _say(
                f"started reflection {handle.id}: rerun of {args.id} from step {args.from_step} of "
                f"{plan.origin.steps} (reusing {len(plan.prefix.responses)} responses, {len(plan.prefix.cells)} "
                f"cells, {len(plan.prefix.children)} children) with {model}, on {rt.address}"
            )
            await rt.ensure_worker(handle)
            out = await c.wait_for_result(
                handle,
                on_progress=f.progress,
                on_no_worker=f.no_worker,
                on_worker_back=f.worker_back,
                no_worker_after_s=settings.no_worker_warn_s,
            )
            f.finish(out, plan.input.config)
    except asyncio.CancelledError:
        if not f.wf_id or rt is None:
            raise
        return _interrupted(f.wf_id, rt, settings, f.tty)
    line = rerun_line(out)
    if line:
        _say(line)
    print(
        out.model_dump_json(indent=2) if args.json else render_reflection(out),
        end="" if not args.json else "\n",
    )
    return _finished(out)
