"""A content-addressed, file-backed blob store.

Blobs are immutable and named by their sha256, so writes are idempotent: a retried activity or a
replay that stores the same bytes again changes nothing. References are store-relative
(`blob:sha256:<hex>`), so processes with different local paths resolve the same reference.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

__all__ = ["BlobStore", "BlobNotFound", "blob_uri", "parse_blob_uri"]

_PREFIX = "blob:sha256:"


class BlobNotFound(FileNotFoundError):
    pass


def blob_uri(sha256: str) -> str:
    return f"{_PREFIX}{sha256}"


def parse_blob_uri(uri: str) -> str:
    if not uri.startswith(_PREFIX) or len(uri) != len(_PREFIX) + 64:
        raise ValueError(f"not a blob reference: {uri!r}")
    return uri[len(_PREFIX) :]


class BlobStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def path_for_uri(self, uri: str) -> Path:
        path = self.path_for(parse_blob_uri(uri))
        if not path.exists():
            raise BlobNotFound(f"blob {uri} is not in the store at {self.root}")
        return path

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; return its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(digest)
        if not path.exists():
            self._atomic_write(path, data)
        return digest

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
            if path.exists():
                os.unlink(tmp)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, path)
            return digest, size
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get_bytes(self, sha256: str) -> bytes:
        path = self.path_for(sha256)
        try:
            return path.read_bytes()
        except FileNotFoundError as e:
            raise BlobNotFound(f"blob sha256:{sha256} is not in the store at {self.root}") from e

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).exists()

    def _atomic_write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
