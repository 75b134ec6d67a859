"""A blob store's identity, and the default task queue that carries it.

Why: Temporal routes work by task queue only. Two `rr` setups on one machine (two `RR_HOME`s, or a file
store beside an S3 one) that shared a queue handed each other reflections whose trace blobs the taking
worker cannot read (`blob ... is not in the store at <other home>/blobs`). So every store gets a random
id, written into the store itself on first use (`rr-store-id` at its root: the file store's directory, or
the S3 prefix, so every process that reads the same store reads the same id), and the default queue is
`rr-<id>`: a client and a worker of different stores never share a queue. With an explicit `RR_TASK_QUEUE`
the reflection carries its store's id and a worker of another store refuses its first activity
(`check_same_store`).

The id is created at most once per store, race-free: a file store links a fully written temporary file
into place (the first link wins, the others read it); S3 uses a conditional put (`If-None-Match: *`).
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore

if TYPE_CHECKING:
    from reflector.runtime.storage.s3 import S3Location

__all__ = [
    "STORE_ID_FILE",
    "store_id",
    "store_id_of",
    "store_queue",
    "store_label",
    "StoreMismatch",
    "check_same_store",
]

STORE_ID_FILE = "rr-store-id"
_ID = re.compile(r"[0-9a-f]{16}")
_cache: dict[tuple[str, ...], str] = {}
_lock = threading.Lock()


class StoreMismatch(Exception):
    """A reflection reached a worker whose blob store is not the one its client uploaded to."""


def store_label(settings: Settings) -> str:
    """Where the store is, for messages: `s3://bucket/prefix` or the directory."""
    return settings.s3_url.rstrip("/") if settings.s3_url is not None else str(settings.blob_dir)


def store_id(settings: Settings) -> str:
    """The id of `settings`' store (16 hex characters), created in the store on first use; cached per process."""
    from reflector.runtime.storage.stores import open_store

    return store_id_of(open_store(settings))


def store_id_of(store: BlobStore) -> str:
    """The id of `store` (its S3 prefix when it mirrors one, else its directory); cached per process."""
    remote = store.remote
    key: tuple[str, ...] = (
        ("s3", remote.location.url, str(getattr(getattr(remote.client, "meta", None), "endpoint_url", "")))
        if remote is not None
        else ("file", str(store.root.expanduser().resolve()))
    )
    with _lock:
        found = _cache.get(key)
        if found is None:
            found = _cache[key] = (
                _s3_id(remote.location, remote.client) if remote is not None else _file_id(store.root)
            )
        return found


def store_queue(settings: Settings) -> str:
    """The default task queue of `settings`' store: `rr-<store id>`."""
    return f"rr-{store_id(settings)}"


def _valid(text: str, where: str) -> str:
    value = text.strip()
    if not _ID.fullmatch(value):
        raise OSError(
            f"{where} is not an rr store id (16 hex characters); remove it to let rr write a new one"
        )
    return value


def _file_id(root: Path) -> str:
    root = Path(root).expanduser()
    target = root / STORE_ID_FILE
    try:
        return _valid(target.read_text(), str(target))
    except FileNotFoundError:
        pass
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".store-id-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(8) + "\n")
        try:
            os.link(tmp, target)  # atomic: exactly one creator wins, the others read its id
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _valid(target.read_text(), str(target))


def _s3_id(location: S3Location, client: Any) -> str:
    from reflector.runtime.storage.s3 import _explain, _is_missing

    key = location.key(STORE_ID_FILE)
    where = f"s3://{location.bucket}/{key}"

    def read() -> str | None:
        try:
            body = client.get_object(Bucket=location.bucket, Key=key)["Body"]
        except Exception as exc:
            if _is_missing(exc):
                return None
            raise _explain(location, exc) from exc
        try:
            return _valid(body.read(64).decode("ascii", "replace"), where)
        finally:
            body.close()

    found = read()
    if found is not None:
        return found
    try:
        client.put_object(
            Bucket=location.bucket, Key=key, Body=(secrets.token_hex(8) + "\n").encode(), IfNoneMatch="*"
        )
    except Exception as exc:  # 412: another process wrote it first (read it below); anything else is an error
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        if code not in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
            raise _explain(location, exc) from exc
    found = read()
    if found is None:
        raise OSError(f"{where}: the store id was written but cannot be read back")
    return found


def check_same_store(store: BlobStore, expected_id: str, expected_label: str) -> None:
    """Raise `StoreMismatch` (naming both stores) when `store` (the worker's) is not `expected_id`.

    `expected_id` empty: a reflection started before stores had ids (nothing to check).
    """
    if not expected_id:
        return
    mine = store_id_of(store)
    if mine != expected_id:
        raise StoreMismatch(
            f"this worker's blob store is {store.where} (id {mine}), but the reflection's trace was "
            f"uploaded to {expected_label or 'another store'} (id {expected_id}): the worker cannot read it. Run "
            "workers with the same RR_BLOB_URL / RR_HOME as the client, or give each store its own RR_TASK_QUEUE "
            "(unset, the queue is derived from the store)"
        )
