"""The S3 blob store (RR_BLOB_URL=s3://...) against a real S3-compatible server (moto's, on loopback).

Two processes that share only the bucket are modelled by two stores on separate local cache
directories: what one writes, the other reads, and nothing exists only in one cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload

from reflector.runtime.settings import SettingError, Settings
from reflector.runtime.storage.blobs import BlobNotFound, BlobStore
from reflector.runtime.storage.s3 import S3Mirror, S3Unavailable, parse_s3_url
from reflector.runtime.storage.stores import check_store, mirror_for, open_store
from sandbox.journal import Journal
from tests.support import prefork
from tests.support.s3_server import S3Server, s3_server
from tests.support.user_env import user_env

pytest.importorskip("moto", reason="moto[server] comes with the dev extra")
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    env = {**s3.env(prefix=f"t/{tmp_path.name}"), "RR_HOME": str(tmp_path / "home")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    return env


def _store(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    """A store on its own cache directory (another process, as far as the cache goes)."""
    monkeypatch.setenv("RR_BLOB_DIR", str(tmp_path / name))
    store = open_store(Settings.from_env())
    assert store.remote is not None
    return store


def test_the_url_is_checked() -> None:
    assert parse_s3_url("s3://my-bucket/a/b/").prefix == "a/b"
    assert parse_s3_url("s3://my-bucket").prefix == ""
    for bad in ("s3://", "s3://UPPER/x", "s3://b/x//y", "s3://bucket/../x", "http://bucket/x"):
        with pytest.raises(ValueError):
            parse_s3_url(bad)


@pytest.mark.parametrize("raw", ["s3://Bad_Bucket/x", "gs://bucket/x", "file://relative/dir", "s3://b/./x"])
def test_a_bad_blob_url_is_a_setting_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RR_BLOB_URL", raw)
    with pytest.raises(SettingError, match="RR_BLOB_URL"):
        Settings.from_env()


def test_the_cache_is_bound_to_the_bucket_and_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    monkeypatch.setenv("RR_HOME", str(tmp_path))
    monkeypatch.setenv("RR_BLOB_URL", "s3://rr-blobs/team/a")
    assert Settings.from_env().blob_dir == tmp_path / "s3-cache" / "rr-blobs" / "team" / "a"
    monkeypatch.setenv("RR_BLOB_URL", "file:///srv/rr-blobs")
    assert Settings.from_env().blob_dir == Path("/srv/rr-blobs")
    monkeypatch.delenv("RR_BLOB_URL")
    assert Settings.from_env().blob_dir == tmp_path / "blobs"


def test_what_one_cache_writes_the_other_reads(s3_env, s3: S3Server, tmp_path, monkeypatch) -> None:
    a, b = _store(tmp_path, "a", monkeypatch), _store(tmp_path, "b", monkeypatch)
    digest = a.put_bytes(b"hello from a")
    assert not b.path_for(digest).exists()
    assert b.exists(digest)
    assert b.get_bytes(digest) == b"hello from a"
    assert b.path_for(digest).read_bytes() == b"hello from a"  # now cached
    src = tmp_path / "trace.json"
    src.write_bytes(b'{"steps": []}' * 1000)
    sha, size = a.put_file(src)
    assert (
        b.path_for_uri(f"blob:sha256:{sha}").read_bytes() == src.read_bytes() and size == src.stat().st_size
    )
    a.put_beside(sha, "idx", b"an index")
    assert b.fetch_derived(sha, "idx") is not None
    assert b.derived_path(sha, "idx").read_bytes() == b"an index"
    assert b.fetch_derived(digest, "idx") is None
    keys = s3.keys(f"t/{tmp_path.name}/")
    assert (
        f"t/{tmp_path.name}/sha256/{sha[:2]}/{sha}" in keys
        and f"t/{tmp_path.name}/sha256/{sha[:2]}/{sha}.idx" in keys
    )


def test_a_missing_blob_says_where_it_was_looked_for(s3_env, tmp_path, monkeypatch) -> None:
    b = _store(tmp_path, "b", monkeypatch)
    with pytest.raises(BlobNotFound, match=r"s3://rr-test-"):
        b.get_bytes("0" * 64)
    assert not b.exists("0" * 64)


def test_a_corrupt_object_is_never_cached(s3_env, s3: S3Server, tmp_path, monkeypatch) -> None:
    a, b = _store(tmp_path, "a", monkeypatch), _store(tmp_path, "b", monkeypatch)
    digest = a.put_bytes(b"the real content")
    assert a.remote is not None
    s3.client().put_object(Bucket=s3.bucket, Key=a.remote.key(a.path_for(digest)), Body=b"tampered")
    with pytest.raises(S3Unavailable, match="corrupt"):
        b.get_bytes(digest)
    assert not b.path_for(digest).exists()


def test_the_upload_comes_before_the_local_file(s3_env, tmp_path, monkeypatch) -> None:
    """A local blob always has its S3 copy: when the upload fails, nothing is written locally."""
    a = _store(tmp_path, "a", monkeypatch)
    assert a.remote is not None
    broken = S3Mirror(a.root, parse_s3_url("s3://no-such-bucket-rr/x"), a.remote.client)
    store = BlobStore(a.root, broken)
    with pytest.raises(S3Unavailable, match="no-such-bucket-rr"):
        store.put_bytes(b"never local")
    assert not store.path_for(hashlib.sha256(b"never local").hexdigest()).exists()


def test_a_missing_bucket_fails_at_start(s3_env, monkeypatch) -> None:
    monkeypatch.setenv("RR_BLOB_URL", "s3://rr-no-such-bucket/x")
    with pytest.raises(SettingError, match="does not exist"):
        check_store(Settings.from_env())


def test_a_journal_moves_between_workers_through_s3(s3_env, tmp_path, monkeypatch) -> None:
    a_store, b_store = _store(tmp_path, "a", monkeypatch), _store(tmp_path, "b", monkeypatch)
    a = Journal(a_store.root / "sessions", fsync=False, replica=a_store.remote)
    b = Journal(b_store.root / "sessions", fsync=False, replica=b_store.remote)
    for seq in (1, 2, 3):
        a.write_entry("s1", seq, f"x = {seq}")
    a.write_snapshot("s1", 2, "start", b"pickled", keep_from=0)
    assert b.entries("s1") == []
    assert b.sync("s1") == 5  # three entries, a snapshot and its sidecar
    assert b.entries("s1") == [(1, "x = 1"), (2, "x = 2"), (3, "x = 3")]
    assert b.latest_snapshot("s1", 3, "start") == (2, b"pickled")
    b.forget("s1", 3, only_this=False)  # b re-runs cell 3: a later sync elsewhere must not see the old one
    b.write_entry("s1", 3, "x = 'again'")
    a.sync("s1")
    assert a.entries("s1")[-1] == (3, "x = 'again'")
    b.forget("s1", 2, only_this=False)
    a.sync("s1")
    assert a.entries("s1") == [(1, "x = 1")] and a.latest_snapshot("s1", 9, "start") is None
    a.delete("s1")
    assert b.sync("s1") == 0 and b.entries("s1") == []


def test_large_payloads_go_to_s3_through_temporalios_driver(
    s3_env, s3: S3Server, tmp_path, monkeypatch
) -> None:
    from temporalio.converter import StorageDriverStoreContext

    from reflector.runtime.storage.payloads import data_converter, resolve, s3_claim

    settings = Settings.from_env()
    storage = data_converter(settings, threshold=1024).external_storage
    assert storage is not None
    big = Payload(metadata={"encoding": b"binary/plain"}, data=b"x" * 4096)
    [driver] = [d for d in storage.drivers if d.name() == "rr-s3"]
    [claim] = asyncio.run(driver.store(StorageDriverStoreContext(target=None), [big]))
    assert claim.claim_data["bucket"] == s3.bucket and claim.claim_data["key"] in s3.keys("v0/")
    mirror = mirror_for(settings)
    assert mirror is not None
    from google.protobuf import json_format
    from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference

    ref = ExternalStorageReference(driver_name="rr-s3", claim_data=claim.claim_data)
    reference = Payload(
        metadata={
            "encoding": b"json/protobuf",
            "messageType": ExternalStorageReference.DESCRIPTOR.full_name.encode(),
        },
        data=json_format.MessageToJson(ref).encode(),
    )
    assert s3_claim(reference) == dict(claim.claim_data)
    assert resolve(reference, settings.blob_dir) == big
    # a replayer's converter stores nothing new
    ro = data_converter(settings, read_only=True, threshold=1024).external_storage
    assert ro is not None and ro.driver_selector is not None
    assert ro.driver_selector(None, big) is None  # type: ignore[arg-type]


def _rr(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = user_env()
    return prefork.run(
        [sys.executable, "-m", "reflector.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        cwd=REPO_ROOT,
    )


@pytest.mark.slow
def test_rr_reflect_with_an_s3_store(s3_env, s3: S3Server, temporal_server_factory, tmp_path) -> None:
    """`rr reflect` with its in-process worker (a private server: its histories may name S3 payloads)."""
    env = {
        **s3_env,
        "RR_HOME": str(tmp_path / "cli-home"),
        "TEMPORAL_ADDRESS": temporal_server_factory().address,
        "RR_PAYLOAD_THRESHOLD_BYTES": "512",
    }  # many payloads through temporalio's S3 driver
    p = _rr("reflect", str(REPO_ROOT / "reflector" / "examples" / "failed_math.json"), "--json", env=env)
    assert p.returncode in (0, 4), p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["raw"]["rr_trace"]["cells"] >= 1
    prefix = f"t/{tmp_path.name}/"
    assert any("/sha256/" in k for k in s3.keys(prefix)), "the trace was not uploaded to the bucket"
    assert s3.keys("v0/"), "no payload went to S3"
    # the tools that read raw histories follow the S3 references: export (inlined), audit, replay from a new cache
    bundle = tmp_path / "export.json"
    other = {**env, "RR_HOME": str(tmp_path / "other-home")}
    ex = _rr("export", out["raw"]["workflow_id"], "-o", str(bundle), env=other)
    assert ex.returncode == 0, ex.stderr[-2000:]
    offline = {k: v for k, v in other.items() if not k.startswith(("AWS_", "RR_BLOB_URL"))}
    offline["RR_HOME"] = str(tmp_path / "offline-home")
    rf = _rr("replay", str(bundle), env=offline)  # no S3 here: every payload is in the file
    assert rf.returncode == 0, rf.stderr[-2000:]
    rp = _rr("replay", out["raw"]["workflow_id"], env=other)
    assert rp.returncode == 0, rp.stderr[-2000:]
    au = _rr("audit", out["raw"]["workflow_id"], env=other)
    assert au.returncode == 0 and "learning" in au.stdout.lower(), au.stderr[-2000:]
    gc = _rr("gc", env=env)
    assert gc.returncode == 2 and "lifecycle" in gc.stderr and len(gc.stderr.strip().splitlines()) == 1, (
        gc.stderr
    )


def test_rr_reflect_names_a_missing_bucket(s3_env, tmp_path) -> None:
    env = {**s3_env, "RR_HOME": str(tmp_path / "cli-home"), "RR_BLOB_URL": "s3://rr-no-such-bucket/x"}
    p = _rr("reflect", str(REPO_ROOT / "reflector" / "examples" / "failed_math.json"), env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "rr-no-such-bucket" in p.stderr and "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_a_large_object_is_fetched_in_parallel_ranges(s3_env, tmp_path, monkeypatch) -> None:
    import reflector.runtime.storage.s3 as s3_module

    monkeypatch.setattr(s3_module, "_MULTIPART_CHUNK", 5 * 1024**2)  # S3's smallest part: 4 parts = 20 MiB
    a, b = _store(tmp_path, "a", monkeypatch), _store(tmp_path, "b", monkeypatch)
    src = tmp_path / "big.jsonl"
    src.write_bytes(b'{"step": 1, "content": "' + b"x" * (21 * 1024**2) + b'"}\n')
    sha, _ = a.put_file(src)  # multipart upload
    assert b.fetch(sha).read_bytes() == src.read_bytes()


def test_a_client_is_never_reused_for_another_endpoint(s3_env, s3: S3Server, monkeypatch) -> None:
    first = mirror_for(Settings.from_env())
    assert first is not None and first.client.meta.endpoint_url == s3.endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    other = mirror_for(Settings.from_env())
    assert other is not None and other.client.meta.endpoint_url == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # the S3-specific variable wins
    assert mirror_for(Settings.from_env()).client.meta.endpoint_url == s3.endpoint
