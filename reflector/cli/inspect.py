"""`rr result`, `rr status`, `rr list`: what a reflection (or a batch) returned, is doing, and which ones there are."""

from __future__ import annotations

import argparse

from reflector.cli.common import (
    _batch_finished,
    _err,
    _finished,
    _say,
)
from reflector.runtime.settings import Settings


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
                        line = render_batch_progress(
                            await handle.query(
                                PROGRESS_QUERY, result_type=BatchProgress, rpc_timeout=c.QUERY_TIMEOUT
                            )
                        )
                    else:
                        line = render_progress(
                            await handle.query(
                                PROGRESS_QUERY, result_type=Progress, rpc_timeout=c.QUERY_TIMEOUT
                            )
                        )
            except Exception:  # progress is best effort; the state (running) is not
                pass
            return _err(f"{'batch' if is_batch else 'reflection'} {args.id} is still running:{line}", 3)
        if (
            desc.status == WorkflowExecutionStatus.CANCELED
        ):  # cancelled by a worker older than cancelled outputs
            return _err(
                f"{'batch' if is_batch else 'reflection'} {args.id} was cancelled before it returned any "
                "findings (no output)",
                c.EXIT_CANCELLED,
            )
        if is_batch:
            batch = await c.fetch_batch_result(rt.client, args.id, settings)
            print(
                batch.model_dump_json(indent=2) if args.json else render_batch(batch),
                end="\n" if args.json else "",
            )
            return _batch_finished(batch)
        out = await c.fetch_result(rt.client, args.id)
    print(
        out.model_dump_json(indent=2) if args.json else render_reflection(out),
        end="" if not args.json else "\n",
    )
    return _finished(out)


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    from reflector import client as c
    from reflector.client.status import status_command

    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        return await status_command(rt.client, args.id, as_json=args.json, follow_it=args.follow)


async def _list(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.client import ops
    from reflector.runtime.search_attributes import register_hint

    if args.limit < 1:
        raise c.ReflectError("--limit must be at least 1")
    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        listing = await ops.list_reflections(
            rt.client, status=args.status, limit=args.limit, include_children=args.all
        )
    if listing.missing_attributes:
        _say(
            f"rr's search attributes are not registered in namespace {settings.namespace!r} "
            f"(missing: {', '.join(listing.missing_attributes)}): model, stop reason and totals are read from "
            f"results where they can be; to register them {register_hint(settings.namespace)}"
        )
    if args.json:
        print(json.dumps([r.to_json() for r in listing.rows], indent=2))
    elif listing.rows:
        print(ops.render_rows(listing.rows), end="")
    else:
        _say("no reflection matches" + (f" (--status {args.status})" if args.status else ""))
    return 0
