"""Before a reflection starts: the trace and the skillbook into the blob store, the task texts and the
workflow id checked, the workflow input built."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import IO, cast

from reflector.analysis.fastscan import FastScanner
from reflector.analysis.traces import TraceFormat, check_trace_file, detect_format, read_trace_file
from reflector.analysis.traces.budget import explain_refusal
from reflector.analysis.traces.index import INDEX_SUFFIX, write_index
from reflector.client.temporal import ReflectError
from reflector.contract import (
    ReflectionConfig,
    ReflectionInput,
    SkillbookRef,
    TraceRef,
)
from reflector.runtime.settings import Settings, usable_dir
from reflector.runtime.storage.blobs import BlobStore, blob_uri


def upload_trace(path: str | Path, settings: Settings) -> TraceRef:
    """Validate a trace file and put it in the blob store; the workflow only gets the reference.

    A trace under `settings.lazy_trace_bytes` is parsed whole (it is small) to check it and detect its
    format. A larger one is streamed once: hashed, copied into the store and scanned record by record
    (validation, format from the first records, the record index the sandbox reads it lazily with),
    so the client's memory does not grow with the trace. A trace whose sandbox host would need more
    memory than the workers allow (`reflector.analysis.traces.budget`) is refused before anything is stored.
    """
    p = Path(path)
    size = check_trace_file(p, settings.max_trace_bytes)
    usable_dir(settings.blob_dir, settings.blob_dir_setting)
    store = _open_store(settings)
    try:
        if size < settings.lazy_trace_bytes:
            data, _container = read_trace_file(p, settings.max_trace_bytes)
            fmt: str = detect_format(data)
            del data
            _refuse(size, None, settings, fmt)
            digest, size = store.put_file(p)  # removes its partial file on any failure
        else:
            index_tmp = store.new_temp()

            def scan(fh: IO[bytes]) -> tuple[str, int | None]:
                with open(index_tmp, "wb") as out:  # the index is written as the scan goes
                    found = write_index(fh, str(p), out, scanner=FastScanner)
                _refuse(size, found[1], settings, found[0])
                return found

            try:
                digest, size, (fmt, index_size) = store.ingest(p, scan)
                if index_size is not None:
                    store.adopt_beside(digest, INDEX_SUFFIX, index_tmp)
            finally:
                index_tmp.unlink(missing_ok=True)
        from reflector.runtime.storage.identity import store_id_of

        sid = store_id_of(store)
    except OSError as e:
        raise ReflectError(
            f"cannot store the trace in the blob store {store.where}: {e.strerror or e}"
        ) from None
    return TraceRef(
        uri=blob_uri(digest),
        sha256=digest,
        size=size,
        format=cast(TraceFormat, fmt),
        store_id=sid,
        store_url=store.where,
    )


def _open_store(settings: Settings) -> BlobStore:
    """The blob store of `settings`; an S3 store that cannot be used is a `ReflectError` saying why."""
    from reflector.runtime.storage.stores import open_store

    try:
        return open_store(settings)
    except OSError as e:  # S3Unavailable (boto3 missing)
        raise ReflectError(str(e)) from None


def _refuse(size: int, index_size: int | None, settings: Settings, fmt: str) -> None:
    why = f"format {fmt!r} is not indexed" if size >= settings.lazy_trace_bytes else ""
    msg = explain_refusal(size, index_size, settings.sandbox_max_memory, why, fmt)
    if msg is not None:
        raise ReflectError(msg)


def upload_skillbook(
    skillbook: str | Path | SkillbookRef | None, settings: Settings | None = None
) -> SkillbookRef | None:
    """Check a skillbook against its caps (`reflector.analysis.limits`) and put it in the blob store; the workflow only
    gets the reference (the prepare activity reads it into the sandbox, the skill tools look skills up in it).

    `skillbook`: its text, or a `Path` to a text file (read as UTF-8, undecodable bytes replaced); a blank one
    is None. Over a cap: a `ReflectError` with the one-line reason."""
    from reflector.analysis.limits import InputTooLarge
    from reflector.analysis.skillbook import check_skillbook

    if skillbook is None or isinstance(skillbook, SkillbookRef):
        return skillbook
    if isinstance(skillbook, Path):
        if not skillbook.is_file():
            raise ReflectError(f"skillbook file not found: {skillbook}")
        text = skillbook.read_text(encoding="utf-8", errors="replace")
    else:
        text = skillbook
    if not text.strip():
        return None
    try:
        skills = check_skillbook(text)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None
    settings = settings or Settings.from_env()
    store = _open_store(settings)
    data = text.encode("utf-8", "surrogatepass")
    try:
        digest = store.put_bytes(data)
    except OSError as e:
        raise ReflectError(
            f"cannot store the skillbook in the blob store {store.where}: {e.strerror or e}"
        ) from None
    return SkillbookRef(uri=blob_uri(digest), sha256=digest, size=len(data), chars=len(text), skills=skills)


def check_task_texts(**texts: str | None) -> None:
    from reflector.analysis.limits import InputTooLarge, check_task_text

    try:
        for name, value in texts.items():
            check_task_text(name, value)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None


def build_input(
    trace: TraceRef,
    *,
    question: str = "",
    ground_truth: str | None = None,
    feedback: str | None = None,
    skillbook: str | Path | SkillbookRef | None = "",
    mode: str = "offline",
    config: ReflectionConfig | None = None,
    settings: Settings | None = None,
) -> ReflectionInput:
    """The workflow's input. Every user-sized value is checked against its cap (`reflector.analysis.limits`: a
    `ReflectError` with one line); a skillbook goes to the blob store (`upload_skillbook`, into the store of
    `settings`, default: the environment's)."""
    from reflector.runtime.models import check_model_name  # pydantic-ai: not for clients that only read

    config = config or ReflectionConfig()
    try:
        check_model_name(config.model)
    except ValueError as e:
        raise ReflectError(str(e)) from e
    check_task_texts(question=question, ground_truth=ground_truth, feedback=feedback)
    return ReflectionInput(
        trace=trace,
        question=question,
        ground_truth=ground_truth,
        feedback=feedback,
        skillbook_ref=upload_skillbook(skillbook, settings),
        mode=mode,
        config=config,
    )


def check_id(workflow_id: str | None) -> None:
    from reflector.analysis.limits import InputTooLarge, check_workflow_id

    try:
        check_workflow_id(workflow_id)
    except InputTooLarge as e:
        raise ReflectError(str(e)) from None


def new_workflow_id(trace: TraceRef) -> str:
    return f"rr-{trace.sha256[:8]}-{uuid.uuid4().hex[:8]}"
