"""`rr setup`, `rr gc`, `rr cancel`: the server's search attributes, old files, a running reflection."""

from __future__ import annotations

import argparse

from reflector.cli.common import (
    _err,
    _say,
)
from reflector.runtime.settings import Settings


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
        print(
            json.dumps(
                {"namespace": settings.namespace, "added": added, "registered": dict(SEARCH_ATTRIBUTES)},
                indent=2,
            )
        )
    else:
        print(
            f"search attributes in namespace {settings.namespace!r}: "
            + (f"added {', '.join(added)}" if added else "all registered already")
            + f" ({', '.join(f'{n} {t}' for n, t in SEARCH_ATTRIBUTES.items())})"
        )
    return 0


async def _gc(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from reflector import client as c
    from reflector.runtime import gc

    if settings.s3_url is not None:
        raise c.ReflectError(
            f"rr gc manages a file blob store; RR_BLOB_URL is {settings.s3_url}: expire its objects "
            "with the bucket's lifecycle rules; rr gc does not sweep S3"
        )
    try:
        min_age = gc.parse_duration(args.min_age)
    except ValueError as e:
        raise c.ReflectError(f"--min-age: {e}") from None
    if not settings.address_explicit and not settings.db_file.exists():
        # an embedded server started on a new database would list no workflow: everything would look unused
        raise c.ReflectError(
            f"no embedded server database {settings.db_file} and no TEMPORAL_ADDRESS: nothing "
            "can say which blobs are in use (set TEMPORAL_ADDRESS)"
        )
    async with c.runtime(settings, want_worker=False, announce=_say) as rt:
        try:
            report = await gc.run_gc(
                gc.TemporalSource(rt.client), settings.blob_dir, min_age_s=min_age, dry_run=args.dry_run
            )
        except gc.GCRefused as e:
            return _err(f"gc removed nothing: {e}", 1)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(gc.render_report(report), end="")
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
    return {"cancelled": 0, "finished": 0, "already_closed": c.EXIT_NOT_RUNNING, "cancel_requested": 3}[
        res.outcome
    ]
