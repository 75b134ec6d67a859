"""The batch workflow's activities: manifest pages, run records, record pages, the synthesis.

All of them only read and write the content-addressed blob store, so a retry or a re-execution after a
crash writes the same bytes under the same names (idempotent). The workflow runs them as local
activities: their inputs (a child's whole reflection, for `record_run`) are never written to the history;
only their small results (a page of the manifest, a sha256, the synthesis) are.
File reads and parsing run in a thread, off the worker's event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.scope import current_store
from reflector.analysis.batch.records import MAX_FACTS_BYTES, build_record
from reflector.analysis.batch.synthesis import synthesise
from reflector.contract import (
    READ_MANIFEST_ACTIVITY,
    RECORD_RUN_ACTIVITY,
    SYNTHESISE_BATCH_ACTIVITY,
    WRITE_RECORDS_ACTIVITY,
    ManifestPage,
    ReadManifestInput,
    RecordRunInput,
    SynthesiseBatchInput,
    SynthesiseBatchResult,
    TraceRef,
    WriteRecordsInput,
)
from reflector.runtime.storage.blobs import BlobNotFound, BlobStore, blob_uri
from reflector.runtime.storage.manifest import load_records, read_manifest_page

__all__ = ["ACTIVITIES", "read_manifest", "record_run", "write_records", "synthesise_batch"]


def _store() -> BlobStore:
    return current_store()  # the running worker's (`asyncio.to_thread` copies the activity's context)


@activity.defn(name=READ_MANIFEST_ACTIVITY)
async def read_manifest(inp: ReadManifestInput) -> ManifestPage:
    return await asyncio.to_thread(
        read_manifest_page, _store(), inp.manifest, inp.offset, inp.first_index, inp.limit
    )


def _record(inp: RecordRunInput) -> str:
    store = _store()
    data: bytes | None = None
    facts_error: str | None = None
    trace = inp.run.trace
    if trace is not None:
        if trace.size > MAX_FACTS_BYTES:
            facts_error = f"trace of {trace.size:,} bytes is over {MAX_FACTS_BYTES:,}: facts not read"
        else:
            try:
                data = store.get_bytes(trace.sha256)
            except BlobNotFound as e:
                facts_error = str(e)
    record = build_record(inp, data, facts_error)
    return store.put_bytes(record.model_dump_json().encode())


@activity.defn(name=RECORD_RUN_ACTIVITY)
async def record_run(inp: RecordRunInput) -> str:
    """Store the run's compact record; returns its sha256."""
    return await asyncio.to_thread(_record, inp)


def _write(inp: WriteRecordsInput) -> str:
    store = _store()
    records = [json.loads(store.get_bytes(sha)) for sha in inp.records]
    return store.put_bytes(json.dumps(records, separators=(",", ":")).encode())


@activity.defn(name=WRITE_RECORDS_ACTIVITY)
async def write_records(inp: WriteRecordsInput) -> str:
    """Gather a chunk's records (in index order) into one page blob; returns its sha256."""
    return await asyncio.to_thread(_write, inp)


def _synthesise(inp: SynthesiseBatchInput) -> SynthesiseBatchResult:
    store = _store()
    records = load_records(store, inp.record_pages)
    body = ("[" + ",".join(r.model_dump_json() for r in records) + "]").encode()
    digest = store.put_bytes(body)
    ref = TraceRef(uri=blob_uri(digest), sha256=digest, size=len(body), format="unknown")
    return SynthesiseBatchResult(synthesis=synthesise(records, inp.n_runs), records=ref)


@activity.defn(name=SYNTHESISE_BATCH_ACTIVITY)
async def synthesise_batch(inp: SynthesiseBatchInput) -> SynthesiseBatchResult:
    """The computed synthesis over every record, and all records as one JSON blob (a trace for the LLM)."""
    return await asyncio.to_thread(_synthesise, inp)


ACTIVITIES: list[Callable[..., Any]] = [read_manifest, record_run, write_records, synthesise_batch]
