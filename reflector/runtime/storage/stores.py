"""Which blob store a process uses: the local directory, or S3 through this process's cache of it.

The one place that turns settings into a `BlobStore` (and, for S3, its `S3Mirror`): clients,
workers, activities and the audit tools all open the store here, so they all agree on where a blob is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BlobStore

if TYPE_CHECKING:  # boto3 is imported only when S3 is configured
    from reflector.runtime.storage.s3 import S3Mirror

__all__ = ["open_store", "mirror_for", "store_at", "check_store", "describe_store", "blocking"]

T = TypeVar("T")


async def blocking(mirror: S3Mirror | None, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, a blob-store call from async code: inline on the file store (page-cache I/O, well under
    a millisecond), on the S3 mirror's threads when the call may go over the network."""
    if mirror is None:
        return fn(*args)
    return await mirror.run(fn, *args)


_mirrors: dict[tuple[str, str, str], object] = {}
_lock = threading.Lock()


def mirror_for(settings: Settings) -> S3Mirror | None:
    """The process's `S3Mirror` for `settings` (one per bucket, prefix and cache dir), or None (file store)."""
    if settings.s3_url is None:
        return None
    from reflector.runtime.storage.s3 import S3Mirror, parse_s3_url, s3_client

    root = str(Path(settings.blob_dir).resolve())
    key = (
        settings.s3_url,
        root,
        f"{settings.s3_addressing_style}/{settings.s3_region}/{settings.s3_endpoint}",
    )
    with _lock:
        mirror = _mirrors.get(key)
        if mirror is None:
            mirror = _mirrors[key] = S3Mirror(
                root,
                parse_s3_url(settings.s3_url),
                s3_client(settings.s3_addressing_style, settings.s3_region, settings.s3_endpoint),
            )
    assert isinstance(mirror, S3Mirror)
    return mirror


def check_store(settings: Settings) -> None:
    """Fail now (`SettingError`, saying why) when the configured S3 store cannot be used: workers and
    clients call this at start, rather than failing the first cell or upload."""
    from reflector.runtime.settings import SettingError

    try:
        mirror = mirror_for(settings)
        if mirror is not None:
            mirror.check()
    except OSError as exc:  # S3Unavailable: boto3 missing, no such bucket, access denied, unreachable
        raise SettingError(str(exc)) from None


def describe_store(settings: Settings) -> str:
    """Where blobs live, for a start-up line: the directory, or the S3 URL and this process's cache."""
    if settings.s3_url is not None:
        return f"{settings.s3_url} (local cache {settings.blob_dir})"
    return str(settings.blob_dir)


def open_store(settings: Settings | None = None) -> BlobStore:
    """The blob store of `settings` (default: from the environment)."""
    settings = settings or Settings.from_env()
    return BlobStore(settings.blob_dir, mirror_for(settings))


def store_at(root: Path | str, settings: Settings | None = None) -> BlobStore:
    """A store on the local directory `root`: with the process's S3 mirror when `root` is its cache.

    For tools handed a blob directory (audit, export, replay): a directory that is not the
    configured one is read as a plain file store.
    """
    settings = settings or Settings.from_env()
    mirror = mirror_for(settings)
    if mirror is not None and Path(root).resolve() == Path(mirror.root).resolve():
        return BlobStore(root, mirror)
    return BlobStore(root)
