"""A content-addressed, file-backed blob store.

Blobs are immutable and named by their sha256, so writes are idempotent: a retried activity or a
replay that stores the same bytes again changes nothing. References are store-relative
(`blob:sha256:<hex>`), so processes with different local paths resolve the same reference.

Storing bytes that are already there refreshes the blob's modification time: `rr gc` (`reflector.runtime.gc`)
never removes a blob younger than its grace period, and a blob stored again is about to be referenced
again (a client uploads a trace before its workflow starts; a worker stores a payload before the
history records its reference). `rr gc` removes a blob by renaming it away, checking its mtime again
and only then deleting it, so a store that refreshes it meanwhile either finds it renamed (and writes
it anew) or makes the check keep it.

Layout under the root (`rr gc` reads it; every writer uses these names):
- `sha256/<2 hex>/<64 hex>`: the blobs; `sha256/<2 hex>/<64 hex>.<suffix>`: a file derived from that blob
  (`derived_path`, `derived_source`), alive exactly as long as its source;
- `sessions/<session key>/`: each sandbox session's cell journal and snapshots (`sandbox.journal`);
- `responses/<session key>/`: each session's model-response cache (`activities.model_requests`);
- files whose names start with `.` (`TEMP_PREFIXES`) are writes in progress.

With `RR_BLOB_URL=s3://...` the root is this process's cache of the S3 store and `remote` (an
`S3Mirror`, `reflector.runtime.storage.s3`) keeps both in step: every write reaches S3 before the local file
appears, and a blob missing locally is downloaded on first use (`path_for_uri`, `get_bytes`, `fetch`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from reflector.runtime.storage.s3 import S3Mirror

__all__ = [
    "BlobStore",
    "BlobNotFound",
    "blob_uri",
    "parse_blob_uri",
    "derived_source",
    "BLOBS_DIR",
    "SESSIONS_DIR",
    "RESPONSES_DIR",
    "TEMP_PREFIXES",
]

T = TypeVar("T")
_PREFIX = "blob:sha256:"
BLOBS_DIR = "sha256"
SESSIONS_DIR = "sessions"
RESPONSES_DIR = "responses"
# Names of files being written (temp file + rename) in the root and the fan-out dirs: `.incoming-`
# (`put_file`), `.tmp-` (`put_bytes`), `.manifest-` (a batch manifest being written), `.gc-` (`rr gc`
# removing a blob), `.rr-probe-` (`settings.usable_dir`).
TEMP_PREFIXES = (".incoming-", ".tmp-", ".manifest-", ".gc-", ".rr-probe-")
_DERIVED = re.compile(r"^([0-9a-f]{64})\.([A-Za-z0-9][A-Za-z0-9._-]*)$")


class BlobNotFound(FileNotFoundError):
    pass


def blob_uri(sha256: str) -> str:
    return f"{_PREFIX}{sha256}"


def parse_blob_uri(uri: str) -> str:
    if not uri.startswith(_PREFIX) or len(uri) != len(_PREFIX) + 64:
        raise ValueError(f"not a blob reference: {uri!r}")
    return uri[len(_PREFIX) :]


def derived_source(name: str) -> tuple[str, str] | None:
    """(source sha256, suffix) when the file name `name` is that of a file derived from a blob, else None.

    The one rule that says "derived from X": `<sha256 of X>.<suffix>`, next to X in its fan-out dir
    (`BlobStore.derived_path`). `rr gc` keeps such a file exactly while X is kept.
    """
    m = _DERIVED.match(name)
    return (m.group(1), m.group(2)) if m else None


def _refresh(path: Path) -> bool:
    """Refresh the mtime of the blob at `path` (it is being stored again); False when there is none."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:  # a read-only store, or a blob of another user: it is there, leave it as it is
        return path.exists()


class BlobStore:
    def __init__(self, root: Path | str, remote: S3Mirror | None = None) -> None:
        self.root = Path(root)
        self.remote = remote

    def __repr__(self) -> str:
        return f"BlobStore({self.root}{', ' + self.remote.location.url if self.remote else ''})"

    @property
    def where(self) -> str:
        """The store's location for messages (the S3 URL when there is one)."""
        return self.remote.location.url if self.remote is not None else str(self.root)

    def _pulled(self, path: Path) -> bool:
        """True if `path` exists locally, after downloading it from the remote when it is only there."""
        return path.exists() or (self.remote is not None and self.remote.pull(path))

    def fetch(self, sha256: str) -> Path:
        """The local path of blob `sha256` (downloaded from the remote if needed); BlobNotFound if none."""
        path = self.path_for(sha256)
        if not self._pulled(path):
            raise BlobNotFound(f"blob sha256:{sha256} is not in the store at {self.where}")
        return path

    def fetch_derived(self, sha256: str, suffix: str) -> Path | None:
        """The local path of the file derived from blob `sha256` (downloaded if needed), or None."""
        path = self.derived_path(sha256, suffix.lstrip("."))
        return path if self._pulled(path) else None

    def path_for(self, sha256: str) -> Path:
        return self.root / BLOBS_DIR / sha256[:2] / sha256

    def derived_path(self, sha256: str, suffix: str) -> Path:
        """Where a file derived from blob `sha256` lives (kept by `rr gc` as long as the blob is)."""
        path = self.path_for(sha256).with_name(f"{sha256}.{suffix}")
        if derived_source(path.name) != (sha256, suffix):
            raise ValueError(f"not a derived-file suffix: {suffix!r}")
        return path

    def path_for_uri(self, uri: str) -> Path:
        path = self.path_for(parse_blob_uri(uri))
        if not self._pulled(path):
            raise BlobNotFound(f"blob {uri} is not in the store at {self.where}")
        return path

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; return its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(digest)
        if not _refresh(path):
            if self.remote is not None:
                self.remote.push_bytes(path, data)
            self._atomic_write(path, data)
        return digest

    def _publish(self, tmp: str | Path, path: Path) -> None:
        """Move the finished temp file `tmp` to `path` (after its upload, when there is a remote)."""
        if self.remote is not None:
            self.remote.push_file(tmp, path, skip_existing=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)

    def put_file(self, src: Path | str, chunk: int = 1 << 20) -> tuple[str, int]:
        """Stream a file into the store; return (sha256, size)."""
        h = hashlib.sha256()
        size = 0
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                while block := inp.read(chunk):
                    h.update(block)
                    size += len(block)
                    out.write(block)
            digest = h.hexdigest()
            path = self.path_for(digest)
            if _refresh(path):
                os.unlink(tmp)
            else:
                self._publish(tmp, path)
            return digest, size
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def ingest(
        self, src: Path | str, consume: Callable[[IO[bytes]], T], chunk: int = 1 << 20
    ) -> tuple[str, int, T]:
        """Copy a file into the store and let `consume` read the copy; return (sha256, size, what
        `consume` returned).

        The copy is made by the kernel (`shutil.copyfile`: `sendfile` on Linux; copying through this
        process's memory cost ~8x the CPU, most of it in the kernel's page handling of the writes), then
        `consume` gets a binary reader over it (e.g. a validating scan) that hashes what it reads;
        whatever it leaves unread is hashed after it returns. The digest, the scan and the stored blob
        are the same bytes even if `src` changes meanwhile. Nothing is stored if `consume` raises.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as inp:
                reader = _Hashing(inp)
                result = consume(reader)  # type: ignore[arg-type]  # a reader with read()
                while reader.read(chunk):
                    pass
            digest = reader.hash.hexdigest()
            path = self.path_for(digest)
            if path.exists():
                os.unlink(tmp)
            else:
                self._publish(tmp, path)
            return digest, reader.size, result
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def new_temp(self) -> Path:
        """A fresh temp file in the store (named as a write in progress, see `TEMP_PREFIXES`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        os.close(fd)
        return Path(tmp)

    def adopt_beside(self, sha256: str, suffix: str, src: Path) -> Path:
        """Move the file `src` (written in the store, e.g. by `new_temp`) next to blob `sha256`, like
        `put_beside`; an existing one is kept (derived files of one blob are identical)."""
        path = self.derived_path(sha256, suffix.lstrip("."))
        if path.exists():
            src.unlink(missing_ok=True)
        else:
            self._publish(src, path)
        return path

    def put_beside(self, sha256: str, suffix: str, data: bytes) -> Path:
        """Store `data` next to blob `sha256` as `<blob path>.<suffix>` (derived data, e.g. a trace's
        index: found from the blob's name, kept by `rr gc` as long as the blob). Idempotent."""
        path = self.derived_path(sha256, suffix.lstrip("."))
        if not path.exists():
            if self.remote is not None:
                self.remote.push_bytes(path, data)
            self._atomic_write(path, data)
        return path

    def get_bytes(self, sha256: str) -> bytes:
        path = self.path_for(sha256)
        try:
            return path.read_bytes()
        except FileNotFoundError as e:
            if self.remote is not None and self.remote.pull(path):
                return path.read_bytes()
            raise BlobNotFound(f"blob sha256:{sha256} is not in the store at {self.where}") from e

    def exists(self, sha256: str) -> bool:
        path = self.path_for(sha256)
        return path.exists() or (self.remote is not None and self.remote.exists(path))

    def _atomic_write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)


class _Hashing:
    """A binary reader over `inp` that hashes and counts every byte read through it."""

    def __init__(self, inp: IO[bytes]) -> None:
        self.inp = inp
        self.hash = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        block = self.inp.read(n)
        if block:
            self.hash.update(block)
            self.size += len(block)
        return block
