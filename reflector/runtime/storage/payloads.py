"""Temporal external payload storage on the content-addressed blob store.

Cell outputs (up to `max_output_chars` each) and model responses are recorded in the history as
local-activity markers, so a long reflection whose cells print a lot makes a large history (and
histories recorded before model requests became local activities also carry the whole message
history at every step). With temporalio's `ExternalStorage`, payloads at or above a
threshold (default 16 KiB, env `RR_PAYLOAD_THRESHOLD_BYTES`; 0 keeps every new payload inline) go to the blob store and the
history carries only a small reference (`{"sha256": <hex>, "size": <n>}` under the driver name
`rr-blobs`). The serialized `Payload` proto is the blob, so storing is idempotent: retries, other
workers and replays that produce the same bytes write nothing new.

Replay (`rr replay`) re-runs the workflow code, and the SDK encodes the commands it produces exactly as
a worker would, including a *store* of every large payload. Model-request inputs, which pydantic-ai
would re-encode with a fresh timestamp (new bytes under new hashes), are never encoded (they are handed
to the local activity in process, `activities.model_requests`), but a writing driver would grow the
store with anything a future workflow re-encodes differently. The read-only converter (`data_converter(..., read_only=True)`)
retrieves normally but offloads only payloads whose blob already exists; any other large payload stays
inline in the replayer's memory (nothing is sent to the server during a replay, so this is harmless)
and nothing is ever written. Its `store()` refuses (raises `ReadOnlyBlobStore`) if called for a
payload that is not already stored, which the selector prevents.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    PayloadConverter,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
)

from reflector.contract import PAYLOAD_DRIVER_NAME, PAYLOAD_S3_DRIVER_NAME
from reflector.runtime.settings import Settings, env_number
from reflector.runtime.storage.blobs import BlobNotFound, BlobStore
from reflector.runtime.storage.stores import mirror_for, store_at

__all__ = [
    "DEFAULT_THRESHOLD_BYTES",
    "THRESHOLD_ENV",
    "BlobStorageDriver",
    "ReadOnlyBlobStorageDriver",
    "ReadOnlyBlobStore",
    "payload_threshold",
    "external_storage",
    "data_converter",
    "blob_dir_of",
    "resolve",
    "stored_digest",
    "ForeignReference",
    "s3_claim",
    "replay_storage",
    "s3_payload",
]

# Written into every reference in the history: never rename (old histories must stay readable).
DEFAULT_THRESHOLD_BYTES = 16 * 1024
THRESHOLD_ENV = "RR_PAYLOAD_THRESHOLD_BYTES"
_REFERENCE_TYPE = ExternalStorageReference.DESCRIPTOR.full_name.encode()
# how temporalio wrote references before its `ExternalStorageReference` proto (it still reads them), and
# the metadata key it will mark (codec-encoded) references with
_LEGACY_REFERENCE_ENCODING = b"json/external-storage-reference"
_REFERENCE_MARKER_KEY = "__temporal_external_storage_reference"


class ReadOnlyBlobStore(PermissionError):
    """A read-only driver was asked to store a payload that is not in the blob store."""


def _payload_bytes(payload: Payload) -> bytes:
    # deterministic: map fields (metadata) serialize in a stable order, so equal payloads share a blob
    return payload.SerializeToString(deterministic=True)


def _claim(digest: str, size: int) -> StorageDriverClaim:
    return StorageDriverClaim(claim_data={"sha256": digest, "size": str(size)})


class BlobStorageDriver(StorageDriver):
    """Stores each payload as the blob of its serialized proto (`<root>/sha256/<2 hex>/<hex>`)."""

    def __init__(self, root: Path | str, store: BlobStore | None = None) -> None:
        self.blobs = store if store is not None else BlobStore(root)

    @property
    def root(self) -> Path:
        return self.blobs.root

    def name(self) -> str:
        return PAYLOAD_DRIVER_NAME

    def type(self) -> str:
        return "rr.blobstore"

    def _put(self, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for p in payloads:
            data = _payload_bytes(p)
            claims.append(_claim(self.blobs.put_bytes(data), len(data)))
        return claims

    def _get(self, claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        out = []
        for c in claims:
            digest = c.claim_data.get("sha256", "")
            if len(digest) != 64:
                raise ValueError(f"{PAYLOAD_DRIVER_NAME}: malformed claim {dict(c.claim_data)!r}")
            try:
                data = self.blobs.get_bytes(digest)
            except BlobNotFound as e:
                raise BlobNotFound(
                    f"{PAYLOAD_DRIVER_NAME}: payload blob sha256:{digest} is missing from {self.root} "
                    "(is RR_BLOB_DIR the store this workflow was run with?)"
                ) from e
            if hashlib.sha256(data).hexdigest() != digest:
                raise ValueError(f"{PAYLOAD_DRIVER_NAME}: blob sha256:{digest} in {self.root} is corrupt")
            p = Payload()
            p.ParseFromString(data)
            out.append(p)
        return out

    # Inline file I/O, not `asyncio.to_thread`: blobs are small page-cache reads/writes (well under a
    # millisecond), while under load the default executor (cpu+4 threads) queued them for seconds and
    # delayed activity starts past their heartbeat timeout (measured in bench/throughput.py).
    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        return self._put(payloads)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return self._get(claims)


class ReadOnlyBlobStorageDriver(BlobStorageDriver):
    """Retrieves like `BlobStorageDriver`; stores nothing: claims only for blobs that already exist.

    Same driver name, so it reads the references written by the writing driver.
    """

    def __init__(self, root: Path | str) -> None:
        super().__init__(root)
        self.refused = 0  # payloads the selector kept inline because their blob did not exist

    def has(self, payload: Payload) -> bool:
        return self.blobs.exists(hashlib.sha256(_payload_bytes(payload)).hexdigest())

    def _put(self, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for p in payloads:
            data = _payload_bytes(p)
            digest = hashlib.sha256(data).hexdigest()
            if not self.blobs.exists(digest):
                raise ReadOnlyBlobStore(
                    f"{PAYLOAD_DRIVER_NAME} is read-only here: refusing to store a new {len(data)}-byte payload "
                    f"(sha256:{digest}) in {self.root}"
                )
            claims.append(_claim(digest, len(data)))
        return claims

    def select(self, _context: StorageDriverSelectContext, payload: Payload) -> StorageDriver | None:
        """`ExternalStorage.driver_selector`: offload only payloads that are already stored."""
        if self.has(payload):
            return self
        self.refused += 1
        return None


def payload_threshold(default: int = DEFAULT_THRESHOLD_BYTES) -> int:
    """Bytes from `RR_PAYLOAD_THRESHOLD_BYTES` (0 = keep new payloads inline)."""
    return int(env_number(THRESHOLD_ENV, default, minimum=0))


def _never(_context: StorageDriverSelectContext, _payload: Payload) -> StorageDriver | None:
    return None


def external_storage(
    blob_dir: Path | str, *, read_only: bool = False, threshold: int | None = None
) -> ExternalStorage:
    """The `ExternalStorage` on `blob_dir`.

    With a threshold of 0 nothing new is offloaded (every payload stays inline), but references
    already in histories still resolve: turning the feature off never strands a running workflow.
    """
    limit = payload_threshold() if threshold is None else threshold
    if limit < 0:
        raise ValueError(f"payload threshold must be >= 0, got {limit}")
    if read_only:
        ro = ReadOnlyBlobStorageDriver(blob_dir)
        selector = ro.select if limit > 0 else _never
        return ExternalStorage(drivers=[ro], driver_selector=selector, payload_size_threshold=limit)
    driver = BlobStorageDriver(blob_dir)
    if limit == 0:
        return ExternalStorage(drivers=[driver], driver_selector=_never)
    return ExternalStorage(drivers=[driver], payload_size_threshold=limit)


def s3_external_storage(
    settings: Settings, *, read_only: bool = False, threshold: int | None = None
) -> ExternalStorage:
    """`ExternalStorage` on S3 (`RR_BLOB_URL=s3://...`): temporalio's `S3StorageDriver` stores large payloads
    (keys `v0/ns/<namespace>/...` in the bucket); references an earlier file-store run wrote (`rr-blobs`)
    still resolve from the local directory. A replayer (`read_only`) stores nothing: its large payloads
    stay inline in its memory (nothing is sent to the server during a replay)."""
    from temporalio.contrib.aws.s3driver import S3StorageDriver

    from reflector.runtime.storage.s3 import S3DriverClient

    mirror = mirror_for(settings)
    assert mirror is not None
    limit = payload_threshold() if threshold is None else threshold
    s3 = S3StorageDriver(S3DriverClient(mirror), mirror.location.bucket, driver_name=PAYLOAD_S3_DRIVER_NAME)
    files = ReadOnlyBlobStorageDriver(settings.blob_dir)

    def select(_context: StorageDriverSelectContext, _payload: Payload) -> StorageDriver | None:
        return s3

    selector = _never if read_only or limit == 0 else select
    return ExternalStorage(drivers=[s3, files], driver_selector=selector, payload_size_threshold=limit)


def replay_storage(blob_dir: Path | str, settings: Settings) -> ExternalStorage:
    """A replayer's (read-only) storage on `blob_dir`: with S3's driver too when `blob_dir` is the S3 cache."""
    if settings.s3_url is not None and Path(blob_dir).resolve() == Path(settings.blob_dir).resolve():
        return s3_external_storage(settings, read_only=True)
    return external_storage(blob_dir, read_only=True)


def data_converter(
    settings: Settings, *, read_only: bool = False, threshold: int | None = None, light: bool = False
) -> DataConverter:
    """The data converter for clients, workers (`read_only=False`) and replayers (`read_only=True`).

    The payload converter is pydantic-ai's, instantiated once per process (`SharedPayloadConverter`);
    `PydanticAIPlugin` keeps it (a subclass of its own) and keeps `external_storage`. `light=True` is for a
    client that hosts no worker: `LightPayloadConverter` writes and reads the same payloads without
    importing pydantic-ai (`reflector.runtime.storage.light_converter`).
    """
    if settings.s3_url is not None:
        storage = s3_external_storage(settings, read_only=read_only, threshold=threshold)
    else:
        storage = external_storage(settings.blob_dir, read_only=read_only, threshold=threshold)
    converter: type[PayloadConverter]
    if light:
        from reflector.runtime.storage.light_converter import LightPayloadConverter

        converter = LightPayloadConverter
    else:
        from reflector.runtime.storage.converter import SharedPayloadConverter

        converter = SharedPayloadConverter
    return DataConverter(payload_converter_class=converter, external_storage=storage)


def resolve(payload: Payload, blob_dir: Path | str) -> Payload:
    """The stored payload if `payload` is a reference written by rr's drivers, else `payload` itself.

    For tools and tests that read raw histories (the SDK resolves references itself). A reference to
    S3 (`rr-s3`) is read with the process's S3 settings (`RR_BLOB_URL`, the AWS variables).
    """
    if (
        payload.metadata.get("encoding") != b"json/protobuf"
        or payload.metadata.get("messageType") != _REFERENCE_TYPE
    ):
        return payload
    ref = json_format.Parse(payload.data, ExternalStorageReference())
    if ref.driver_name == PAYLOAD_S3_DRIVER_NAME:
        return s3_payload(dict(ref.claim_data))
    if ref.driver_name != PAYLOAD_DRIVER_NAME:
        raise ValueError(f"payload is stored by driver {ref.driver_name!r}, not {PAYLOAD_DRIVER_NAME!r}")
    [stored] = BlobStorageDriver(blob_dir, store_at(blob_dir))._get(
        [StorageDriverClaim(claim_data=dict(ref.claim_data))]
    )
    return stored


def s3_claim(payload: Payload) -> dict[str, str] | None:
    """The claim of an `rr-s3` reference in a raw history (None: not one)."""
    if (
        payload.metadata.get("encoding") != b"json/protobuf"
        or payload.metadata.get("messageType") != _REFERENCE_TYPE
    ):
        return None
    ref = json_format.Parse(payload.data, ExternalStorageReference())
    return dict(ref.claim_data) if ref.driver_name == PAYLOAD_S3_DRIVER_NAME else None


def s3_payload(claim: dict[str, str], settings: Settings | None = None) -> Payload:
    """The payload an `rr-s3` reference names, checked against the hash in its claim."""
    from reflector.runtime.storage.s3 import S3DriverClient

    settings = settings or Settings.from_env()
    mirror = mirror_for(settings)
    if mirror is None:
        raise ForeignReference(
            "a payload is stored in S3 (driver rr-s3) but RR_BLOB_URL names no S3 store here"
        )
    bucket, key, digest = claim.get("bucket", ""), claim.get("key", ""), claim.get("hash_value", "")
    if not bucket or not key or len(digest) != 64:
        raise ForeignReference(f"{PAYLOAD_S3_DRIVER_NAME}: malformed claim {claim!r}")
    data = S3DriverClient(mirror).get_object_sync(bucket, key)
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"{PAYLOAD_S3_DRIVER_NAME}: s3://{bucket}/{key} is corrupt")
    p = Payload()
    p.ParseFromString(data)
    return p


class ForeignReference(ValueError):
    """An external-storage reference this store cannot answer (another driver, or an encoded reference)."""


def stored_digest(payload: Payload) -> str | None:
    """The sha256 of the blob an external-storage reference in a raw history names (None: an inline payload).

    Reads references as temporalio writes them (and its legacy form); a reference written by another
    driver, or one this module cannot decode, raises `ForeignReference`: its payload is somewhere this
    store cannot see (`rr gc` then removes nothing).
    """
    encoding = payload.metadata.get("encoding", b"")
    if encoding == b"json/protobuf" and payload.metadata.get("messageType") == _REFERENCE_TYPE:
        ref = json_format.Parse(payload.data, ExternalStorageReference())
        driver, claim = ref.driver_name, dict(ref.claim_data)
    elif encoding == _LEGACY_REFERENCE_ENCODING:
        raw = json.loads(payload.data)
        driver = str(raw.get("driver_name", ""))
        claim = dict((raw.get("driver_claim") or {}).get("claim_data") or {})
    elif payload.metadata.get(_REFERENCE_MARKER_KEY) == b"true":
        raise ForeignReference(f"an encoded external-storage reference ({encoding!r}) cannot be read here")
    else:
        return None
    if driver != PAYLOAD_DRIVER_NAME:
        raise ForeignReference(f"a payload is stored by driver {driver!r}, not {PAYLOAD_DRIVER_NAME!r}")
    digest = str(claim.get("sha256", ""))
    if len(digest) != 64:
        raise ForeignReference(f"{PAYLOAD_DRIVER_NAME}: malformed claim {claim!r}")
    return digest


def blob_dir_of(converter: DataConverter) -> Path | None:
    """The blob store a converter built here offloads to (None for any other converter)."""
    storage = converter.external_storage
    for driver in storage.drivers if storage else ():
        if isinstance(driver, BlobStorageDriver):
            return driver.root
    return None
