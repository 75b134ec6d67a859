"""A batch's input as runs: each run its own trace blob, all of them listed in a manifest blob.

Two ways in:
- several files and/or directories (their `.json` / `.jsonl` files, recursively, sorted): each file is
  one run, validated and stored as `rr reflect FILE` would (`upload`); a file that cannot be read as a
  trace becomes a *broken run* (reported as failed, never reflected on), not an error of the batch;
- files that each hold many runs (`split=True`, the CLI's `--batch`): every top-level record
  (`reflector.analysis.traces.scan.iter_records`: the elements of a JSON array, the lines of a JSONL file, a
  single JSON object) is one run, and its exact bytes in the file are its trace blob. The file is
  streamed: one record in memory at a time. A record that is not a JSON object or array, or is over the
  size limit, is a broken run; a file that does not parse is an input error (nothing is started).

The manifest is JSONL, one `BatchRun` per line in index order, so the workflow reads it page by page
from a byte offset (`read_manifest_page`) and never holds the list of runs in its history. The runs'
records are JSON pages too (`load_records`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflector.analysis.traces import TraceError, detect_format
from reflector.analysis.traces.scan import BrokenLine, iter_records
from reflector.contract import BatchRun, ManifestPage, ManifestRef, RunRecord, TraceRef
from reflector.runtime.storage.blobs import BlobStore, blob_uri
from reflector.runtime.storage.identity import store_id_of

__all__ = [
    "RunSource",
    "expand_paths",
    "iter_sources",
    "split_file",
    "write_manifest",
    "read_manifest_page",
    "load_records",
]

TRACE_SUFFIXES = (".json", ".jsonl")
_ID_KEYS = ("run_id", "id", "session_id", "trace_id")


@dataclass(frozen=True)
class RunSource:
    """A run before it is numbered: its id, where it came from, and its trace blob or why there is none."""

    run_id: str
    source: str
    trace: TraceRef | None = None
    error: str | None = None


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The files of `paths`: a directory stands for its `.json` / `.jsonl` files (recursively, sorted,
    hidden ones skipped). A path that does not exist, or a directory without trace files, is an error."""
    if not paths:
        raise TraceError("no trace file given")
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and f.suffix.lower() in TRACE_SUFFIXES
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not files:
                raise TraceError(f"directory {p} holds no .json or .jsonl file")
            out += files
        elif p.exists():
            out.append(p)
        else:
            raise TraceError(f"trace file not found: {p}")
    return out


def iter_sources(
    paths: Sequence[str | Path],
    store: BlobStore,
    *,
    upload: Callable[[Path], TraceRef],
    split: bool = False,
    max_bytes: int | None = None,
) -> Iterator[RunSource]:
    """The runs of `paths` in order (see the module docstring); `upload` stores one whole file as a trace."""
    for path in expand_paths(paths):
        if split:
            yield from split_file(path, store, max_bytes)
            continue
        try:
            ref = upload(path)
        except TraceError as e:
            yield RunSource(run_id=str(path), source=str(path), error=str(e))
            continue
        yield RunSource(run_id=str(path), source=str(path), trace=ref)


def split_file(path: Path, store: BlobStore, max_bytes: int | None = None) -> Iterator[RunSource]:
    """Every top-level record of `path` as a run whose trace blob is exactly the record's bytes."""
    name = str(path)
    with open(path, "rb") as scan, open(path, "rb") as raw:
        for i, (start, end, value) in enumerate(iter_records(scan, name, yield_broken=True)):
            source = f"{name}#{i}"
            if isinstance(value, BrokenLine):
                yield RunSource(
                    run_id=source,
                    source=source,
                    error=f"broken JSONL in {name}: line {value.lineno} is not valid JSON: {value.error}",
                )
                continue
            if not isinstance(value, dict | list) or not value:
                shown = json.dumps(value)[:80] if not isinstance(value, dict | list) else json.dumps(value)
                yield RunSource(
                    run_id=source,
                    source=source,
                    error=f"record {i} of {name} is not a run (a non-empty JSON object or array): {shown}",
                )
                continue
            size = end - start
            if max_bytes is not None and size > max_bytes:
                yield RunSource(
                    run_id=_run_id(value) or source,
                    source=source,
                    error=f"record {i} of {name} is {size:,} bytes, over the limit of {max_bytes:,} bytes "
                    "(raise it with RR_MAX_TRACE_BYTES)",
                )
                continue
            raw.seek(start)
            data = raw.read(size)
            digest = store.put_bytes(data)
            ref = TraceRef(
                uri=blob_uri(digest),
                sha256=digest,
                size=size,
                format=detect_format(value),
                store_id=store_id_of(store),
                store_url=store.where,
            )
            yield RunSource(run_id=_run_id(value) or source, source=source, trace=ref)


def _run_id(value: Any) -> str | None:
    """The run's own id when it has one: a tau-bench run's `task<id>-trial<n>` (as its adapter names it),
    else an `run_id` / `id` / `session_id` / `trace_id` field."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("traj"), list) and "task_id" in value:
        return f"task{value.get('task_id')}-trial{value.get('trial')}"
    for key in _ID_KEYS:
        v = value.get(key)
        if isinstance(v, str | int) and not isinstance(v, bool) and str(v).strip():
            return str(v).strip()[:200]
    return None


def write_manifest(sources: Iterable[RunSource], store: BlobStore) -> ManifestRef:
    """Number the runs, make their ids unique (`id~2`, `id~3` for repeats) and store the manifest."""
    store.root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=store.root, prefix=".manifest-")
    seen: dict[str, int] = {}
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for src in sources:
                count = seen.get(src.run_id, 0) + 1
                seen[src.run_id] = count
                run_id = src.run_id if count == 1 else f"{src.run_id}~{count}"
                run = BatchRun(index=n, run_id=run_id, source=src.source, trace=src.trace, error=src.error)
                out.write(run.model_dump_json() + "\n")
                n += 1
        if n == 0:
            raise TraceError("the batch has no runs")
        digest, size = store.put_file(tmp)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ManifestRef(sha256=digest, size=size, n_runs=n)


def read_manifest_page(
    store: BlobStore, ref: ManifestRef, offset: int, first_index: int, limit: int
) -> ManifestPage:
    """Up to `limit` runs from byte `offset` of the manifest, the first of them number `first_index`."""
    runs: list[BatchRun] = []
    with open(store.fetch(ref.sha256), "rb") as f:
        f.seek(offset)
        while len(runs) < limit:
            line = f.readline()
            if not line:
                break
            run = BatchRun.model_validate_json(line)
            if run.index != first_index + len(runs):
                raise ValueError(
                    f"manifest {ref.sha256[:12]} is out of order at byte {offset}: run {run.index}, "
                    f"expected {first_index + len(runs)}"
                )
            runs.append(run)
        return ManifestPage(runs=runs, next_offset=f.tell())


def load_records(store: BlobStore, blobs: list[str]) -> list[RunRecord]:
    """Every record of the given blobs (each a JSON list of records: a page, or all of a batch's), in order."""
    return [RunRecord.model_validate(r) for sha in blobs for r in json.loads(store.get_bytes(sha))]
