"""S3 (or any S3-compatible store) as the shared truth behind the blob store: `RR_BLOB_URL=s3://bucket/prefix`.

Why a mirror and not a second store: every reader of the blob store wants a *local file* (the sandbox
host maps a trace and its index, a journal is replayed from files, `ARCHIVE()` opens a blob without
following links), so each process keeps its local blob directory (`RR_BLOB_DIR`, a cache bound to
this one bucket and prefix) and the mirror makes S3 the place every worker finds what any other
wrote:

- a blob, a derived file (a trace's index), a journal entry, a snapshot or a cached model response
  is uploaded *before* it appears in the local directory, so a local file always has its S3 copy:
  a worker that dies after writing leaves nothing only it can see;
- a reader that misses locally downloads the object (to a temp file, renamed into place; a blob's
  content is checked against its name) and from then on reads the local copy;
- object keys are the local layout's relative paths under `prefix/` (`sha256/ab/<hex>`,
  `sessions/<key>/00000003.json`, `responses/<key>/<run>.<id>.json`).

Temporal's external payloads do not go through the mirror: temporalio's own `S3StorageDriver` stores
them (keys `v0/ns/<namespace>/...` in the same bucket), with `S3DriverClient` below as its client.

Credentials and endpoint come from the standard AWS configuration (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_S3`, `AWS_PROFILE`, ...), read by
boto3 itself; the region from `AWS_REGION` or `AWS_DEFAULT_REGION` (`Settings.s3_region`: boto3 reads
only the latter). The bucket must exist. Calls block, so async callers run them on the mirror's own
thread pool (`run`), never on the event loop's default executor (which queued for seconds under load,
see `reflector.runtime.storage.payloads`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio.contrib.aws.s3driver import S3StorageDriverClient

__all__ = [
    "S3Location",
    "S3Mirror",
    "S3DriverClient",
    "S3Unavailable",
    "parse_s3_url",
    "s3_client",
]

T = TypeVar("T")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_BLOB_NAME = re.compile(r"^[0-9a-f]{64}$")
# S3 calls in flight at once per process: uploads of journal entries and responses are small and many
_POOL_THREADS = 16
_MULTIPART_CHUNK = 16 * 1024**2


class S3Unavailable(OSError):
    """The S3 store cannot be used (boto3 missing, the bucket unreachable, access denied); says why.

    An `OSError`, like a failing local disk: the callers' storage-error handling reports it as such.
    """


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or a key prefix without leading/trailing "/"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel


def parse_s3_url(url: str) -> S3Location:
    """`s3://bucket[/prefix]` -> S3Location; ValueError naming what is wrong."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(f"{url!r}: {bucket!r} is not a valid S3 bucket name (3-63 of a-z 0-9 . -)")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{url!r}: the key prefix {prefix!r} has an empty, '.' or '..' segment")
    return S3Location(bucket, prefix)


_clients: dict[tuple[str, str, str, str], Any] = {}
_clients_lock = threading.Lock()


def s3_client(addressing_style: str = "auto", region: str | None = None, endpoint: str | None = None) -> Any:
    """One boto3 S3 client per process and configuration (boto3 clients are thread-safe; sessions are not)."""
    with _clients_lock:
        key = (addressing_style, region or "", endpoint or "", str(os.getpid()))
        if key not in _clients:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise S3Unavailable(
                    "RR_BLOB_URL is an s3:// URL but boto3 is not installed: "
                    "pip install 'durable-recursive-reflector[s3]'"
                ) from None
            config = Config(
                max_pool_connections=_POOL_THREADS * 2,
                retries={"mode": "standard", "max_attempts": 5},
                s3={"addressing_style": addressing_style},
                connect_timeout=10,
                read_timeout=60,
            )
            _clients[key] = boto3.session.Session().client(
                "s3", config=config, region_name=region, endpoint_url=endpoint
            )
        return _clients[key]


def _is_missing(exc: BaseException) -> bool:
    response: Mapping[str, Any] = getattr(exc, "response", None) or {}
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("404", "NoSuchKey", "NotFound") or status == 404


def _explain(location: S3Location, exc: BaseException) -> S3Unavailable:
    response: Mapping[str, Any] = getattr(exc, "response", None) or {}
    code = str((response.get("Error") or {}).get("Code", "")) or type(exc).__name__
    if code == "NoSuchBucket":
        why = f"the bucket {location.bucket!r} does not exist (rr does not create buckets)"
    elif code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        why = f"access denied ({code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / the bucket policy"
    else:
        why = f"{code}: {exc}"
    return S3Unavailable(f"S3 blob store {location.url}: {why}")


class S3Mirror:
    """Keeps the local blob directory `root` and `location` in step (see the module doc)."""

    def __init__(self, root: Path | str, location: S3Location, client: Any) -> None:
        self.root = Path(root)
        self.location = location
        self.client = client
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Mirror({self.location.url} <-> {self.root})"

    # -- names ---------------------------------------------------------------------------------
    def rel(self, path: Path | str) -> str:
        """The relative name of a local path under the root (the object key below the prefix)."""
        rel = Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        if rel in ("", ".") or rel.startswith("../"):
            raise ValueError(f"{path} is not a file in the blob store at {self.root}")
        return rel

    def key(self, path: Path | str) -> str:
        return self.location.key(self.rel(path))

    def where(self, path: Path | str) -> str:
        return f"s3://{self.location.bucket}/{self.key(path)}"

    # -- async use -----------------------------------------------------------------------------
    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the mirror's thread pool (S3 calls block)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="rr-s3-io")
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    # -- objects -------------------------------------------------------------------------------
    def exists(self, path: Path | str) -> bool:
        try:
            self.client.head_object(Bucket=self.location.bucket, Key=self.key(path))
            return True
        except Exception as exc:
            if _is_missing(exc):
                return False
            raise _explain(self.location, exc) from exc

    def push_bytes(self, path: Path | str, data: bytes) -> None:
        """Upload `data` as the object of local path `path` (before the local file is written)."""
        try:
            self.client.put_object(Bucket=self.location.bucket, Key=self.key(path), Body=data)
        except Exception as exc:
            raise _explain(self.location, exc) from exc

    def push_file(self, src: Path | str, path: Path | str, *, skip_existing: bool = False) -> None:
        """Upload the file `src` as the object of local path `path` (multipart for large files)."""
        if skip_existing and self.exists(path):
            return
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=_MULTIPART_CHUNK, multipart_chunksize=_MULTIPART_CHUNK, use_threads=True
        )
        try:
            self.client.upload_file(str(src), self.location.bucket, self.key(path), Config=config)
        except Exception as exc:
            raise _explain(self.location, exc) from exc

    def pull(self, path: Path | str) -> bool:
        """Download the object of local path `path` into place; False if S3 has none.

        A blob (`sha256/xx/<hex>`) must hash to its name, or nothing is kept.
        """
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".incoming-")
        os.close(fd)
        try:
            try:
                self._download(self.key(dest), tmp)
            except Exception as exc:
                if _is_missing(exc):
                    return False
                raise _explain(self.location, exc) from exc
            if _BLOB_NAME.match(dest.name) and _sha256_file(tmp) != dest.name:
                raise S3Unavailable(f"{self.where(dest)} is corrupt: its content does not hash to its name")
            os.replace(tmp, dest)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _download(self, key: str, dest: str) -> None:
        """One GET (a miss costs one round trip); a large object is fetched again in parallel ranges."""
        response = self.client.get_object(Bucket=self.location.bucket, Key=key)
        body = response["Body"]
        try:
            if int(response.get("ContentLength") or 0) > _MULTIPART_CHUNK * 4:
                body.close()
                from boto3.s3.transfer import TransferConfig

                config = TransferConfig(
                    multipart_threshold=_MULTIPART_CHUNK, multipart_chunksize=_MULTIPART_CHUNK
                )
                self.client.download_file(self.location.bucket, key, dest, Config=config)
                return
            with open(dest, "wb") as out:
                while block := body.read(1 << 20):
                    out.write(block)
        finally:
            body.close()

    def remove(self, paths: Iterable[Path | str]) -> None:
        keys = [{"Key": self.key(p)} for p in paths]
        for i in range(0, len(keys), 1000):
            try:
                self.client.delete_objects(
                    Bucket=self.location.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True}
                )
            except Exception as exc:
                raise _explain(self.location, exc) from exc

    def listing(self, directory: Path | str) -> dict[str, int]:
        """{file name: size} of the objects directly under local directory `directory`."""
        prefix = self.key(directory).rstrip("/") + "/"
        out: dict[str, int] = {}
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            ):
                for obj in page.get("Contents") or ():
                    name = str(obj["Key"])[len(prefix) :]
                    if name and "/" not in name:
                        out[name] = int(obj.get("Size", 0))
        except Exception as exc:
            raise _explain(self.location, exc) from exc
        return out

    def remove_tree(self, directory: Path | str) -> None:
        names = self.listing(directory)
        if names:
            self.remove(Path(directory) / n for n in names)

    def pull_tree(self, directory: Path | str) -> int:
        """Make local `directory` hold exactly the objects S3 has under it; returns how many there are.

        Downloaded into a fresh sibling directory that then replaces the local one, so a reader never
        mixes entries of two writers. Files whose names start with `.` (writes in progress) are S3-less.
        """
        local = Path(directory)
        names = self.listing(local)
        if not names and not local.exists():
            return 0
        local.parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(dir=local.parent, prefix=f".incoming-{local.name}-"))
        try:
            for name in names:
                target = fresh / name
                try:
                    self._download(self.key(local / name), str(target))
                except Exception as exc:
                    if _is_missing(exc):  # removed meanwhile (a forget): not part of the state
                        continue
                    raise _explain(self.location, exc) from exc
            old = local.with_name(f".gc-{local.name}-{os.getpid()}")
            if local.exists():
                os.replace(local, old)
            os.replace(fresh, local)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        return len(names)

    def check(self) -> None:
        """Fail now, with the reason, when the bucket cannot be used (worker and client start)."""
        try:
            self.client.head_bucket(Bucket=self.location.bucket)
        except Exception as exc:
            if _is_missing(exc):
                raise S3Unavailable(
                    f"S3 blob store {self.location.url}: the bucket {self.location.bucket!r} "
                    "does not exist (rr does not create buckets)"
                ) from exc
            raise _explain(self.location, exc) from exc


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class S3DriverClient(S3StorageDriverClient):
    """temporalio's `S3StorageDriver` client on a (blocking, thread-safe) boto3 client.

    temporalio ships an aioboto3 adapter; this one runs boto3 calls on the mirror's thread pool
    instead, so one client serves the worker, its activities and the payload driver without an
    async context to enter and leave.
    """

    def __init__(self, mirror: S3Mirror) -> None:
        self.mirror = mirror

    def describe(self) -> Mapping[str, str]:
        region = getattr(self.mirror.client.meta, "region_name", None)
        return {"blob_url": self.mirror.location.url, **({"client_region": region} if region else {})}

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        await self.mirror.run(
            functools.partial(self.mirror.client.put_object, Bucket=bucket, Key=key, Body=data)
        )

    async def object_exists(self, *, bucket: str, key: str) -> bool:
        def head() -> bool:
            try:
                self.mirror.client.head_object(Bucket=bucket, Key=key)
                return True
            except Exception as exc:
                if _is_missing(exc):
                    return False
                raise

        return await self.mirror.run(head)

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        return await self.mirror.run(self.get_object_sync, bucket, key)

    def get_object_sync(self, bucket: str, key: str) -> bytes:
        body = self.mirror.client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()
