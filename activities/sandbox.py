"""Sandbox activities: prepare a session and run one cell in the session's sandbox host.

They are scheduled as *local* activities by the workflow-side `execute_code` tool, so they run on
the worker that holds the workflow (sticky), where the session's live host already is: one marker
event per cell, no extra server dispatch. When the workflow moved to another worker (crash,
eviction), the `SessionManager` rebuilds the namespace from the session's cell journal, so the
cell sees exactly the state an uncrashed run would have.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.facts import FACTS_CODE, _facts
from activities.sandbox_boundary import LANGUAGE_ONLY_WARNING, check_isolation, private_store_dirs
from reflector.analysis.fastscan import FastScanner
from reflector.analysis.limits import SKILL_IDS_SHOWN, InputTooLarge
from reflector.analysis.skillbook import Skill, check_skillbook, look_up, parse_skillbook
from reflector.analysis.traces.budget import host_memory_bytes
from reflector.analysis.traces.index import INDEX_SUFFIX, index_path, write_index
from reflector.contract import (
    CLOSE_ACTIVITY,
    EXPORT_ACTIVITY,
    PREFILL_CODE,
    PREPARE_ACTIVITY,
    RUN_CELL_ACTIVITY,
    SKILL_LOOKUP_ACTIVITY,
    CellInput,
    CellOutcome,
    CloseSessionInput,
    ExportInput,
    ExportResult,
    LimitsInput,
    PrepareSessionInput,
    PrepareSessionResult,
    SkillbookRef,
    SkillLookupInput,
    TraceRef,
    session_key,
)
from reflector.runtime.settings import DEFAULT_LAZY_TRACE_BYTES, Settings
from reflector.runtime.storage.blobs import SESSIONS_DIR, BlobStore
from reflector.runtime.storage.stores import blocking, open_store
from sandbox.archive import GRANTS_SUFFIX, grants_blob
from sandbox.capacity import HOST_MEMORY_BYTES, open_files_needed, raise_open_files
from sandbox.hostproc import sweep_stale_workdirs
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager
from sandbox.zygote_client import close_zygotes

__all__ = [
    "prepare_session",
    "run_cell",
    "export_session",
    "close_session",
    "look_up_skill",
    "grant_archive",
    "configure",
    "runtime_for",
    "RUNTIME",
    "shutdown",
    "hold",
    "release",
    "ACTIVITIES",
    "LANGUAGE_ONLY_WARNING",
    "check_isolation",
    "private_store_dirs",
]


log = logging.getLogger("rr.sandbox")


T = TypeVar("T")


@dataclass
class _Runtime:
    store: BlobStore
    sessions: SessionManager
    lazy_trace_bytes: int = DEFAULT_LAZY_TRACE_BYTES
    loop: asyncio.AbstractEventLoop | None = None  # its hosts' pipes and processes belong to this event loop
    users: int = 0  # workers that hold it (`hold` / `release`): the last one to end stops its hosts

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """A blob-store call (`reflector.runtime.storage.stores.blocking`)."""
        return await blocking(self.store.remote, fn, *args)


_runtime: _Runtime | None = None  # the process default: activities run outside a worker (tools, tests)


_runtimes: dict[tuple[object, ...], _Runtime] = {}


_warned = False
_fd_warned: set[int] = set()  # live-host counts the open-file limit was too low for (said once each)


RUNTIME: ContextVar[_Runtime | None] = ContextVar("rr_sandbox_runtime", default=None)
"""The runtime of the worker running the current activity (bound by `activities.scope.BindWorkerScope`)."""


def runtime_for(settings: Settings, *, max_live: int | None = None) -> _Runtime:
    """The process's sandbox runtime for `settings` on the running event loop: one per blob store, sandbox
    settings and loop, so two workers of one process on different stores never see each other's sessions,
    workers with the same settings on one loop share their live hosts and cap, and a runtime is never used
    from another loop than its hosts' (each `asyncio.run`, e.g. each `reflect()` call, has its own).

    Journal writes are not fsynced unless `RR_JOURNAL_FSYNC=1`: they survive a crash of the worker
    process (page cache), which is the failure the journal is for; fsync cost ~9% of the worker's CPU
    per step under load. A machine loss also loses a local journal dir, fsync or not, unless it is on
    shared storage. `max_live`: the live-host cap (None: `settings.max_live_sandboxes`, i.e.
    `RR_MAX_LIVE_SANDBOXES`).
    """
    global _warned
    sweep_stale_workdirs()
    store = open_store(settings)
    private_store_dirs(Path(settings.blob_dir))
    live = _open_files_for(settings.max_live_sandboxes if max_live is None else max_live)
    key: tuple[object, ...] = (
        str(Path(settings.blob_dir).resolve()),
        settings.s3_url,
        settings.s3_addressing_style,
        settings.s3_region,
        settings.s3_endpoint,
        live,
        settings.journal_fsync,
        settings.sandbox_isolation,
        settings.sandbox_zygote,
        settings.lazy_trace_bytes,
    )
    loop = _running_loop()
    for stale in [k for k, r in _runtimes.items() if r.loop is not None and r.loop.is_closed()]:
        del _runtimes[stale]  # its loop is gone (an `asyncio.run` that ended): nothing of it can be awaited
    key = (*key, loop)
    rt = _runtimes.get(key)
    if rt is None:
        sessions = SessionManager(
            Path(settings.blob_dir) / SESSIONS_DIR,
            max_live=live,
            host_memory=HOST_MEMORY_BYTES,  # and at most `live` x 16 MiB of their memory (sandbox.capacity)
            fsync=settings.journal_fsync,
            archive_root=settings.blob_dir,
            isolation=settings.sandbox_isolation,
            zygote=settings.sandbox_zygote,
            replica=store.remote,  # S3: journals and snapshots are shared by every worker
            archive_fetch=store.fetch if store.remote is not None else None,
            grants_fetch=functools.partial(_fetch_grants, store) if store.remote is not None else None,
        )
        rt = _runtimes[key] = _Runtime(
            store=store, sessions=sessions, lazy_trace_bytes=settings.lazy_trace_bytes, loop=loop
        )
    if settings.sandbox_isolation == "language-only" and not _warned:
        _warned = True  # once per worker process
        log.warning(LANGUAGE_ONLY_WARNING)
    return rt


def _open_files_for(live: int) -> int:
    """`live` hosts, or as many as this process's open-file limit allows once lifted (`sandbox.capacity`)."""
    allowed = raise_open_files(live)
    if allowed < live and live not in _fd_warned:
        _fd_warned.add(live)
        log.warning(
            "%d live sandbox hosts need ~%d open files and this process may open %d (its hard limit, "
            "`ulimit -Hn`): it keeps %d; raise the limit or lower RR_MAX_LIVE_SANDBOXES",
            live,
            open_files_needed(live),
            resource.getrlimit(resource.RLIMIT_NOFILE)[1],
            allowed,
        )
    return allowed


def configure(settings: Settings | None = None, *, max_live: int | None = None) -> _Runtime:
    """Set the process default runtime (`runtime_for`; settings default to the environment's) and return it.
    A worker does not rely on it: `worker.build_worker` binds its own runtime to its activities."""
    global _runtime
    _runtime = runtime_for(settings or Settings.from_env(), max_live=max_live)
    return _runtime


async def shutdown() -> None:
    """Stop the live sandbox hosts of every runtime on this event loop (each worker's), and the zygotes."""
    loop = _running_loop()
    for rt in {id(r): r for r in [*_runtimes.values(), *([_runtime] if _runtime else [])]}.values():
        if rt.loop is loop or rt.loop is None:
            await rt.sessions.close_all()
    await close_zygotes()


def hold(settings: Settings) -> _Runtime:
    """The runtime for `settings` on this loop (`runtime_for`), held until `release`: for a worker that ends
    while others of this loop may still run (the Python API's in-process worker, one per call)."""
    rt = runtime_for(settings)
    rt.users += 1
    return rt


async def release(rt: _Runtime) -> None:
    """End a `hold`. The last holder of a runtime stops its live hosts; the loop's zygotes stop when no runtime
    of the loop is held any more. A call that ends never stops the hosts of a call still running beside it
    on the same loop (it did, through `shutdown`: the other reflection's next cell rebuilt its host)."""
    rt.users -= 1
    if rt.users > 0:
        return
    await rt.sessions.close_all()
    loop = _running_loop()
    if not any(r.users > 0 for r in _runtimes.values() if r.loop is loop):
        await close_zygotes()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _rt() -> _Runtime:
    """The running worker's runtime; outside a worker, the process default (`configure`) of this loop."""
    bound = RUNTIME.get()
    if bound is not None:
        return bound
    if _runtime is not None and _runtime.loop in (None, _running_loop()):
        return _runtime
    return configure()


def _limits(inp: LimitsInput, trace: TraceRef, trace_path: Path) -> SandboxLimits:
    """The host's limits: the workflow's, and an address space sized for the trace (`reflector.analysis.traces.budget`)."""
    ipath = index_path(str(trace_path))
    index_size = os.path.getsize(ipath) if os.path.exists(ipath) else None
    return SandboxLimits(
        cell_timeout_s=inp.cell_timeout_s,
        max_output_chars=inp.max_output_chars,
        memory_bytes=host_memory_bytes(trace.size, index_size),
    )


async def _start_args(
    trace: TraceRef, init_ref: str, limits: LimitsInput, inherit_ref: str | None
) -> dict[str, Any]:
    rt = _rt()
    trace_path = await rt.io(rt.store.path_for_uri, trace.uri)
    extra_vars = json.loads(await rt.io(rt.store.get_bytes, init_ref))
    if SKILLBOOK_BLOB_KEY in extra_vars:  # the init names the skillbook blob: the host gets its text
        book = await _skillbook(SkillbookRef.model_validate(extra_vars.pop(SKILLBOOK_BLOB_KEY)))
        extra_vars["skillbook"] = book.text
    return {
        "trace_path": str(trace_path),
        "trace_format": trace.format,
        "extra_vars": extra_vars,
        "limits": _limits(limits, trace, trace_path),
        "inherit": await rt.io(rt.store.fetch, inherit_ref) if inherit_ref else None,
    }


async def ensure_index(trace: TraceRef) -> None:
    """Give a large trace its record index before a host opens it (the client builds it when it uploads;
    a trace stored some other way gets it here, once: the write is atomic and idempotent).

    A trace at least `RR_LAZY_TRACE_BYTES` big is read lazily exactly when its index exists, so the
    decision is made before the session's first host and every later host (after a crash, for a
    child) makes the same one.
    """
    rt = _rt()
    if trace.size < rt.lazy_trace_bytes:
        return
    path = await rt.io(rt.store.path_for_uri, trace.uri)
    if os.path.exists(index_path(str(path))):
        return
    if rt.store.remote is not None:
        pulled: Path | None = await rt.io(rt.store.fetch_derived, trace.sha256, INDEX_SUFFIX)
        if pulled is not None:
            return  # the client (or another worker) built it

    def build() -> None:
        tmp = rt.store.new_temp()
        try:
            with open(path, "rb") as fh, open(tmp, "wb") as out:
                _fmt, size = write_index(fh, str(path), out, scanner=FastScanner)  # the same records, faster
            if size is not None:
                rt.store.adopt_beside(trace.sha256, INDEX_SUFFIX, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    log.info("building the record index of trace %s (%s bytes)", trace.sha256[:12], f"{trace.size:,}")
    await asyncio.to_thread(build)


async def _run(
    session_id: str,
    seq: int,
    code: str,
    trace: TraceRef,
    init_ref: str,
    limits: LimitsInput,
    inherit_ref: str | None = None,
) -> CellOutcome:
    rt = _rt()
    await ensure_index(trace)
    result = await rt.sessions.run_cell(
        session_key(session_id), seq, code, **await _start_args(trace, init_ref, limits, inherit_ref)
    )
    output = result.stdout
    if not result.ok:
        output = (output + "\n" if output else "") + f"ERROR ({result.error_kind}): {result.error}"
    return CellOutcome(
        ok=result.ok,
        output=output,
        error=result.error,
        error_kind=result.error_kind,
        duration_ms=result.duration_ms,
        truncated=result.truncated,
        submitted=result.submitted,
        host_restarted=result.host_restarted,
        cells_replayed=int(result.meta.get("cells_replayed", 0)),
        seq=seq,
    )


SKILLBOOK_BLOB_KEY = "rr_skillbook_blob"
"""In a session's init blob: the `SkillbookRef` whose text is the sandbox variable `skillbook` (the init stays
small; a session's hosts, a rebuilt one too, read the skillbook blob)."""


_SKILLBOOKS_KEPT = 2  # parsed skillbooks kept in memory per worker process (a batch's runs share one)


@dataclass(frozen=True)
class _Skillbook:
    text: str
    skills: tuple[Skill, ...]
    error: str | None  # over a cap (`reflector.analysis.skillbook.check_skillbook`)


_skillbooks: dict[str, _Skillbook] = {}


async def _skillbook(ref: SkillbookRef) -> _Skillbook:
    """A skillbook blob's text and skills, parsed once per process (in a thread: it may be 100 MB)."""
    book = _skillbooks.pop(ref.sha256, None)
    if book is None:
        rt = _rt()
        path = await rt.io(rt.store.path_for_uri, ref.uri)

        def load() -> _Skillbook:
            text = Path(path).read_bytes().decode("utf-8", "surrogatepass")
            try:
                check_skillbook(text)
            except InputTooLarge as e:
                return _Skillbook(text="", skills=(), error=str(e))
            return _Skillbook(text=text, skills=tuple(parse_skillbook(text)), error=None)

        book = await asyncio.to_thread(load)
    _skillbooks[ref.sha256] = book  # the most recently used last
    while len(_skillbooks) > _SKILLBOOKS_KEPT:
        del _skillbooks[next(iter(_skillbooks))]
    return book


def _check_store(store: BlobStore, trace: TraceRef) -> None:
    """A reflection whose trace was uploaded to another blob store than this worker's fails now, for good,
    naming both stores (same task queue, different stores: an explicit RR_TASK_QUEUE shared by two setups)."""
    from reflector.runtime.storage.identity import StoreMismatch, check_same_store

    try:
        check_same_store(store, trace.store_id, trace.store_url)
    except StoreMismatch as e:
        raise ApplicationError(str(e), type="StoreMismatch", non_retryable=True) from None


@activity.defn(name=PREPARE_ACTIVITY)
async def prepare_session(inp: PrepareSessionInput) -> PrepareSessionResult:
    """Start the session's sandbox: initial variables (by content hash), the trace-shape prefill cell,
    the facts cell, and for a child session the parent's inherited namespace and its `context_code`.
    With a skillbook blob: also the first ids of the skillbook and its count (the task prompt lists them)."""
    rt = _rt()
    _check_store(rt.store, inp.trace)
    init: dict[str, Any] = {
        "task": {"question": inp.question, "ground_truth": inp.ground_truth, "feedback": inp.feedback},
        "skillbook": inp.skillbook,
    }
    ids: list[str] = []
    if inp.skillbook_ref is not None:
        book = await _skillbook(inp.skillbook_ref)
        if book.error is not None:
            return PrepareSessionResult(init_ref="", preview="", preview_ok=False, skillbook_error=book.error)
        ids = [skill.id for skill in book.skills]
        del init["skillbook"]
        init[SKILLBOOK_BLOB_KEY] = inp.skillbook_ref.model_dump()
    init_ref = await rt.io(rt.store.put_bytes, json.dumps(init, sort_keys=True).encode())

    async def cell(seq: int, code: str) -> CellOutcome:
        return await _run(inp.session_id, seq, code, inp.trace, init_ref, inp.limits, inp.inherit_ref)

    preview = await cell(1, PREFILL_CODE)
    facts = _facts(await cell(2, FACTS_CODE))
    next_seq, context_error = 3, None
    if inp.context_code.strip():
        ctx = await cell(3, inp.context_code)
        next_seq = 4
        if not ctx.ok:
            context_error = ctx.output[-4_000:]
    return PrepareSessionResult(
        init_ref=init_ref,
        preview=preview.output,
        preview_ok=preview.ok,
        facts=facts,
        context_error=context_error,
        next_seq=next_seq,
        skill_ids=ids[:SKILL_IDS_SHOWN],
        skill_count=len(ids),
    )


@activity.defn(name=SKILL_LOOKUP_ACTIVITY)
async def look_up_skill(inp: SkillLookupInput) -> str:
    """A skill tool's answer from the session's skillbook blob (bounded: `reflector.analysis.skillbook.look_up`)."""
    book = await _skillbook(inp.skillbook)
    if book.error is not None:
        return f"ERROR: {book.error}"
    return await asyncio.to_thread(look_up, book.skills, inp.tool, inp.arg)


@activity.defn(name=RUN_CELL_ACTIVITY)
async def run_cell(inp: CellInput) -> CellOutcome:
    """Run one model-written cell (sequence number `seq`) in the session's sandbox host."""
    return await _run(inp.session_id, inp.seq, inp.code, inp.trace, inp.init_ref, inp.limits, inp.inherit_ref)


@activity.defn(name=EXPORT_ACTIVITY)
async def export_session(inp: ExportInput) -> ExportResult:
    """Export the namespace after cell `seq` into the blob store, for a child session to inherit."""
    rt = _rt()
    # The host's bytes stream to a file and from it into the store: never whole in worker memory.
    with tempfile.TemporaryDirectory(prefix="rr-export-") as directory:
        path, skipped = await rt.sessions.export_to_file(
            session_key(inp.session_id),
            inp.seq,
            Path(directory),
            **await _start_args(inp.trace, inp.init_ref, inp.limits, inp.inherit_ref),
        )
        digest, _size = await rt.io(rt.store.put_file, path)
    await _pass_on_grants(rt, inp.session_id, inp.inherit_ref, digest)
    return ExportResult(export_ref=digest, skipped=list(skipped))


async def _pass_on_grants(rt: _Runtime, session_id: str, inherit_ref: str | None, export_ref: str) -> None:
    """Beside the export blob, the archived transcripts the exporting session may read (its own and its
    ancestors'): a child that inherits the export may read them too (`sandbox.archive.ArchiveGrants`).
    Written by the worker from its own grant files; an export stored before keeps its file."""
    inherit = await rt.io(rt.store.fetch, inherit_ref) if inherit_ref else None
    names = rt.sessions.archive_grants(session_key(session_id), inherit).all()
    await rt.io(rt.store.put_beside, export_ref, GRANTS_SUFFIX, grants_blob(names))


def _fetch_grants(store: BlobStore, path: Path) -> None:
    """Bring an export's grants file (`<export sha256>.grants`) from the shared store, if it is there."""
    store.fetch_derived(path.name.split(".", 1)[0], GRANTS_SUFFIX)


async def grant_archive(workflow_id: str, sha256_hex: str) -> None:
    """The session of `workflow_id` archived transcript `sha256_hex` (the summarise activity stored it):
    from now on its cells, and its children's, may read it with `ARCHIVE`."""
    await _rt().sessions.grant_archive(session_key(workflow_id), sha256_hex)


@activity.defn(name=CLOSE_ACTIVITY)
async def close_session(inp: CloseSessionInput) -> None:
    """Stop the session's live host (its journal stays on disk for audit and resume)."""
    await _rt().sessions.close_session(session_key(inp.session_id))


ACTIVITIES: list[Callable[..., Any]] = [
    prepare_session,
    run_cell,
    export_session,
    close_session,
    look_up_skill,
]
