"""rr against a TLS-only Temporal endpoint with mutual TLS, configured the standard way (TEMPORAL_TLS_*
variables, or a TOML profile), for the Python API, `rr worker` and `rr reflect`.

The dev server cannot serve TLS itself: `temporal server start-dev --help` (CLI 1.9.1) has no TLS flag
(only --ip/--port/--db-filename/--dynamic-config-value/... ; TLS is static server configuration, which
dynamic config cannot set). So the endpoint is what a TLS-terminating front door of a cluster is: a
proxy on loopback that speaks TLS 1.2+ with ALPN h2, presents a server certificate signed by a private
CA, requires a client certificate signed by another CA, and forwards the decrypted gRPC stream to the
suite's dev server. Nothing reaches the server except through it; it counts the client certificates it
verified, so the tests know the traffic went through TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509  # a dev dependency: the test's private CAs and certificates
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from reflector.runtime.settings import Settings
from tests.support import prefork

pytestmark = [pytest.mark.server]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
SERVER_NAME = "temporal.rr-test.internal"


# -- certificates ----------------------------------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, cn: str, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Pki:
    server_ca: Path  # what clients trust (TEMPORAL_TLS_SERVER_CA_CERT_PATH)
    client_cert: Path
    client_key: Path
    server_cert: Path
    server_key: Path
    client_ca: Path  # what the endpoint trusts


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    server_ca_key, server_ca = _ca("rr test server CA")
    client_ca_key, client_ca = _ca("rr test client CA")
    server_key, server_cert = _leaf(server_ca_key, server_ca, SERVER_NAME, server=True)
    client_key, client_cert = _leaf(client_ca_key, client_ca, "rr-test-client", server=False)
    files = {
        "server_ca": _pem_cert(server_ca),
        "client_ca": _pem_cert(client_ca),
        "server_cert": _pem_cert(server_cert),
        "server_key": _pem_key(server_key),
        "client_cert": _pem_cert(client_cert),
        "client_key": _pem_key(client_key),
    }
    for name, data in files.items():
        (d / f"{name}.pem").write_bytes(data)
    return Pki(**{name: d / f"{name}.pem" for name in files})


# -- the TLS endpoint --------------------------------------------------------------------------------


@dataclass
class TlsEndpoint:
    """A mutual-TLS front door on 127.0.0.1 that forwards to `upstream` (host:port, plain gRPC)."""

    upstream: str
    pki: Pki
    address: str = ""
    verified_clients: list[str] = field(default_factory=list)  # the CN of each verified client certificate
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        ctx.load_verify_locations(cafile=str(self.pki.client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no connection
        ctx.set_alpn_protocols(["h2"])  # gRPC
        return ctx

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        self.verified_clients.append(cn)
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> str:
        ready = threading.Event()

        async def serve() -> None:
            self._stop = asyncio.Event()
            asyncio.get_running_loop().set_exception_handler(lambda _loop, _ctx: None)  # refused handshakes
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self._context())
            self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()
            async with server:
                await self._stop.wait()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(serve())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="tls-endpoint", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the TLS endpoint did not start"
        return self.address

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture(scope="module")
def endpoint(temporal_server, pki: Pki) -> Iterator[TlsEndpoint]:
    ep = TlsEndpoint(temporal_server.address, pki)
    ep.start()
    try:
        yield ep
    finally:
        ep.stop()


def _tls_env(ep: TlsEndpoint, pki: Pki) -> dict[str, str]:
    return {
        "TEMPORAL_ADDRESS": ep.address,
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.server_ca),
        "TEMPORAL_TLS_SERVER_NAME": SERVER_NAME,
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pki.client_cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pki.client_key),
    }


def _clean_env(tmp_path: Path, extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RR_", "TEMPORAL_"))}
    xdg = tmp_path / "xdg"  # no config file of the machine running the tests
    xdg.mkdir(exist_ok=True)
    return {**base, "XDG_CONFIG_HOME": str(xdg), "RR_HOME": str(tmp_path / "rr-home"), **extra}


def _rr_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "rr"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]


# -- the tests -----------------------------------------------------------------------------------


async def test_python_api_connects_through_mutual_tls(
    endpoint: TlsEndpoint, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    from reflector.client import check_namespace, connect

    for name, value in _clean_env(tmp_path, _tls_env(endpoint, pki)).items():
        monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    assert settings.address == endpoint.address and settings.temporal.tls is not None
    before = len(endpoint.verified_clients)
    client = await connect(settings=settings)
    await check_namespace(client, settings.address)
    info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version
    assert endpoint.verified_clients[before:] and set(endpoint.verified_clients[before:]) == {
        "rr-test-client"
    }


async def test_without_the_client_certificate_or_the_ca_it_fails_clearly(
    endpoint: TlsEndpoint, pki: Pki, tmp_path: Path
) -> None:
    env = _clean_env(tmp_path, _tls_env(endpoint, pki))
    no_client_cert = {k: v for k, v in env.items() if "CLIENT" not in k}
    no_ca = {k: v for k, v in env.items() if "SERVER_CA" not in k}
    plain = {k: v for k, v in env.items() if not k.startswith("TEMPORAL_TLS")}
    for bad, why in ((no_client_cert, "cannot connect"), (no_ca, "UnknownIssuer"), (plain, "cannot connect")):
        p = prefork.run(
            [*_rr_cmd(), "list"],
            env=bad,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode != 0, p.stdout
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("rr: error:")]
        assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr
        assert f"TEMPORAL_ADDRESS={endpoint.address}" in errors[0] and why in errors[0], errors[0]


@pytest.mark.slow
def test_worker_and_reflect_over_mutual_tls_with_a_profile(
    endpoint: TlsEndpoint, pki: Pki, tmp_path: Path
) -> None:
    """`rr worker` configured by the TEMPORAL_TLS_* variables, `rr reflect` by a TOML profile; the
    worker (not an in-process one) runs the reflection, everything through the TLS endpoint."""
    queue = f"rr-tls-{os.getpid()}-{tmp_path.name}"[:120]
    shared = {"RR_TASK_QUEUE": queue, "RR_BLOB_DIR": str(tmp_path / "blobs")}
    worker_env = _clean_env(tmp_path, {**_tls_env(endpoint, pki), **shared})
    toml = tmp_path / "temporal.toml"
    toml.write_text(f"""
[profile.tls-test]
address = "{endpoint.address}"

[profile.tls-test.tls]
server_ca_cert_path = "{pki.server_ca}"
server_name = "{SERVER_NAME}"
client_cert_path = "{pki.client_cert}"
client_key_path = "{pki.client_key}"
""")
    client_env = _clean_env(
        tmp_path, {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "tls-test", **shared}
    )
    before = len(endpoint.verified_clients)
    worker = prefork.Popen(
        [*_rr_cmd(), "worker", "--processes", "1"],
        env=worker_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert first.startswith("rr worker pid=") and endpoint.address in first, (first, worker.stderr)
        p = prefork.run(
            [*_rr_cmd(), "reflect", str(EXAMPLE), "--json"],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["raw"]["rr_trace"]["stop_reason"] == "completed"
        assert f"on {endpoint.address}" in p.stderr, p.stderr
        assert "embedded" not in p.stderr and "did not take" not in p.stderr, (
            p.stderr
        )  # the TLS worker took it
    finally:
        worker.send_signal(signal.SIGTERM)
        _out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert len(endpoint.verified_clients) - before >= 2  # the worker's and the client's connections
