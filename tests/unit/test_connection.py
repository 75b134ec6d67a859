"""The Temporal connection every client uses: what `reflector.runtime.settings.load_temporal` resolves through
temporalio's envconfig (TEMPORAL_* variables, TOML profiles), the `Client.connect` arguments
`reflector.runtime.connection` makes of it, and a one-line `SettingError` for each configuration that cannot work.

The resolved arguments are compared with what `temporalio.envconfig` itself makes of the same
environment, so rr connects exactly as any Temporal SDK client configured the same way would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from temporalio.envconfig import ClientConfig
from temporalio.service import TLSConfig

from reflector.runtime.connection import connect_config, describe_target
from reflector.runtime.settings import DEFAULT_ADDRESS, SettingError, Settings, TemporalConnect, load_temporal

API_KEY = "rr-test-secret-api-key-0123456789"
CA, CERT, KEY = b"-----CA PEM-----\n", b"-----CLIENT CERT PEM-----\n", b"-----CLIENT KEY PEM-----\n"


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default config file (XDG_CONFIG_HOME/temporalio/temporal.toml) of an empty, private directory,
    and no TEMPORAL_* variable of the machine running the tests."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    for name in [n for n in os.environ if n.startswith("TEMPORAL_")]:
        monkeypatch.delenv(name)
    return xdg


@pytest.fixture
def pems(tmp_path: Path) -> dict[str, Path]:
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "client.pem", "key": tmp_path / "client.key"}
    for (_name, path), data in zip(files.items(), (CA, CERT, KEY), strict=True):
        path.write_bytes(data)
    return files


def _settings(env: Mapping[str, str]) -> Settings:
    address, namespace, temporal = load_temporal(env)
    return Settings(
        home=Path("/nonexistent-rr-home"),
        address=address or DEFAULT_ADDRESS,
        address_explicit=bool(address),
        namespace=namespace or "default",
        task_queue_setting="q",
        model=None,
        max_trace_bytes=1,
        temporal=temporal,
    )


def _sdk(env: Mapping[str, str]) -> dict[str, Any]:
    """What temporalio.envconfig makes of `env`, in the shape `connect_config` returns."""
    cfg: dict[str, Any] = dict(ClientConfig.load_client_connect_config(override_env_vars=dict(env)))
    cfg.setdefault("target_host", DEFAULT_ADDRESS)
    cfg.setdefault("namespace", "default")
    tls = cfg.get("tls", False)
    cfg["tls"] = True if tls == TLSConfig() else tls  # TLS with every field unset: the system defaults
    if "rpc_metadata" in cfg:
        cfg["rpc_metadata"] = dict(cfg["rpc_metadata"])
    return cfg


def _ours(env: Mapping[str, str]) -> dict[str, Any]:
    return dict(connect_config(_settings(env)))


def test_nothing_configured_is_the_default_address_and_not_explicit() -> None:
    s = _settings({})
    assert (s.address, s.address_explicit, s.namespace) == (DEFAULT_ADDRESS, False, "default")
    assert s.temporal == TemporalConnect()
    assert _ours({}) == {"target_host": DEFAULT_ADDRESS, "namespace": "default", "tls": False} == _sdk({})
    assert describe_target(s) == DEFAULT_ADDRESS


def test_address_and_namespace_from_the_variables() -> None:
    env = {"TEMPORAL_ADDRESS": "temporal.internal:7233", "TEMPORAL_NAMESPACE": "team-a"}
    s = _settings(env)
    assert s.address_explicit and s.temporal.address_source == "TEMPORAL_ADDRESS"
    assert (
        _ours(env)
        == {"target_host": "temporal.internal:7233", "namespace": "team-a", "tls": False}
        == _sdk(env)
    )
    assert describe_target(s) == "TEMPORAL_ADDRESS=temporal.internal:7233"


def test_an_empty_address_is_not_configured() -> None:
    s = _settings({"TEMPORAL_ADDRESS": "", "TEMPORAL_NAMESPACE": ""})
    assert (s.address, s.address_explicit, s.namespace) == (DEFAULT_ADDRESS, False, "default")


def test_api_key_implies_tls_and_never_shows() -> None:
    env = {
        "TEMPORAL_ADDRESS": "ns.acct.tmprl.cloud:7233",
        "TEMPORAL_NAMESPACE": "ns.acct",
        "TEMPORAL_API_KEY": API_KEY,
    }
    s = _settings(env)
    cfg = _ours(env)
    assert (
        cfg
        == {
            "target_host": "ns.acct.tmprl.cloud:7233",
            "namespace": "ns.acct",
            "tls": True,
            "api_key": API_KEY,
        }
        == _sdk(env)
    )
    assert API_KEY not in repr(s) and API_KEY not in str(s)
    assert describe_target(s) == "TEMPORAL_ADDRESS=ns.acct.tmprl.cloud:7233 (TLS, API key)"
    # an API key over plain gRPC only when TLS is switched off explicitly (e.g. a proxy on localhost)
    plain = {**env, "TEMPORAL_TLS": "false"}
    assert _ours(plain)["tls"] is False and _ours(plain)["api_key"] == API_KEY and _sdk(plain)["tls"] is False


def test_mtls_files_are_read_into_the_tls_config(pems: dict[str, Path]) -> None:
    env = {
        "TEMPORAL_ADDRESS": "10.0.0.5:7233",
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pems["ca"]),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pems["cert"]),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pems["key"]),
        "TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
    }
    tls = _ours(env)["tls"]
    assert tls == TLSConfig(
        server_root_ca_cert=CA, domain="temporal.internal", client_cert=CERT, client_private_key=KEY
    )
    assert _ours(env) == _sdk(env)
    s = _settings(env)
    assert KEY not in repr(s).encode() and describe_target(s) == "TEMPORAL_ADDRESS=10.0.0.5:7233 (TLS)"
    # the files were read when the settings were made: changing them later changes nothing
    pems["key"].write_bytes(b"other")
    assert connect_config(s)["tls"] == tls


def test_inline_pem_data_and_grpc_metadata() -> None:
    env = {
        "TEMPORAL_ADDRESS": "h:1",
        "TEMPORAL_TLS_SERVER_CA_CERT_DATA": CA.decode(),
        "TEMPORAL_GRPC_META_X_TENANT_ID": "blue",
        "TEMPORAL_GRPC_META_AUTHORIZATION": "Bearer abc",
    }
    cfg = _ours(env)
    assert cfg["tls"] == TLSConfig(server_root_ca_cert=CA)
    assert cfg["rpc_metadata"] == {"x-tenant-id": "blue", "authorization": "Bearer abc"}
    assert cfg == _sdk(env)
    assert "Bearer abc" not in repr(_settings(env)) and "Bearer" not in describe_target(_settings(env))


def _write_toml(path: Path, pems: dict[str, Path]) -> Path:
    path.write_text(f"""
[profile.default]
address = "localhost:7999"

[profile.prod]
address = "prod.temporal.example:7233"
namespace = "prod-ns"
api_key = "{API_KEY}"

[profile.prod.tls]
server_ca_cert_path = "{pems["ca"]}"
client_cert_path = "{pems["cert"]}"
client_key_path = "{pems["key"]}"
server_name = "prod.temporal.example"

[profile.prod.grpc_meta]
x-team = "reflector"
""")
    return path


def test_a_profile_of_the_config_file(tmp_path: Path, pems: dict[str, Path]) -> None:
    toml = _write_toml(tmp_path / "temporal.toml", pems)
    env = {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "prod"}
    s = _settings(env)
    assert s.address == "prod.temporal.example:7233" and s.address_explicit  # a profile's address is explicit
    assert s.temporal.address_source == f"profile 'prod' in {toml}" and s.temporal.config_file == toml
    cfg = _ours(env)
    assert cfg == {
        "target_host": "prod.temporal.example:7233",
        "namespace": "prod-ns",
        "api_key": API_KEY,
        "tls": TLSConfig(
            server_root_ca_cert=CA, domain="prod.temporal.example", client_cert=CERT, client_private_key=KEY
        ),
        "rpc_metadata": {"x-team": "reflector"},
    }
    assert cfg == _sdk(env)
    assert describe_target(s) == f"prod.temporal.example:7233 (profile 'prod' in {toml}, TLS, API key)"
    assert API_KEY not in describe_target(s) and API_KEY not in repr(s)
    # the variables override the profile, field by field
    over = {**env, "TEMPORAL_NAMESPACE": "other-ns", "TEMPORAL_ADDRESS": "elsewhere:7233"}
    assert _ours(over)["namespace"] == "other-ns" and _ours(over)["target_host"] == "elsewhere:7233"
    assert _settings(over).temporal.address_source == "TEMPORAL_ADDRESS"
    assert _ours(over) == _sdk(over)
    # no TEMPORAL_PROFILE: the profile called "default"
    assert _ours({"TEMPORAL_CONFIG_FILE": str(toml)}) == {
        "target_host": "localhost:7999",
        "namespace": "default",
        "tls": False,
    }


def test_the_default_config_file_is_read(no_user_config: Path, pems: dict[str, Path]) -> None:
    (no_user_config / "temporalio").mkdir()
    toml = _write_toml(no_user_config / "temporalio" / "temporal.toml", pems)
    s = _settings({})
    assert s.address == "localhost:7999" and s.address_explicit and s.temporal.config_file == toml
    assert _settings({"TEMPORAL_PROFILE": "prod"}).namespace == "prod-ns"


def test_settings_from_env_resolve_through_envconfig(
    monkeypatch: pytest.MonkeyPatch, pems: dict[str, Path]
) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "h.example:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "n1")
    monkeypatch.setenv("TEMPORAL_API_KEY", API_KEY)
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(pems["ca"]))
    s = Settings.from_env()
    assert (s.address, s.address_explicit, s.namespace) == ("h.example:7233", True, "n1")
    cfg = connect_config(s)
    assert cfg["tls"] == TLSConfig(server_root_ca_cert=CA) and cfg["api_key"] == API_KEY
    assert API_KEY not in repr(s)


def test_the_embedded_server_gets_no_credentials(pems: dict[str, Path]) -> None:
    s = _settings(
        {
            "TEMPORAL_API_KEY": API_KEY,
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pems["ca"]),
            "TEMPORAL_GRPC_META_X_A": "b",
        }
    )
    assert not s.address_explicit  # credentials without an address: the default address
    assert dict(connect_config(s, address="127.0.0.1:40001", embedded=True)) == {
        "target_host": "127.0.0.1:40001",
        "namespace": "default",
        "tls": False,
    }
    assert describe_target(s, "127.0.0.1:40001") == "127.0.0.1:40001"


def _refused(env: Mapping[str, str], *needles: str) -> str:
    with pytest.raises(SettingError) as info:
        load_temporal(env)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    assert API_KEY not in msg
    return msg


def test_a_missing_certificate_file_names_the_variable(tmp_path: Path, pems: dict[str, Path]) -> None:
    missing = tmp_path / "nope.pem"
    _refused(
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(missing), "TEMPORAL_TLS_CLIENT_KEY_PATH": str(pems["key"])},
        "TEMPORAL_TLS_CLIENT_CERT_PATH",
        str(missing),
        "No such file",
    )
    _refused(
        {"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(tmp_path)}, "TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(tmp_path)
    )
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    _refused({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(empty)}, "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "empty")


def test_a_missing_certificate_file_of_a_profile_names_the_profile(
    tmp_path: Path, pems: dict[str, Path]
) -> None:
    toml = _write_toml(tmp_path / "t.toml", pems)
    pems["ca"].unlink()
    _refused(
        {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "prod"},
        "tls.server_ca_cert_path",
        "profile 'prod'",
        str(toml),
        str(pems["ca"]),
    )


def test_a_client_certificate_needs_its_key(pems: dict[str, Path]) -> None:
    _refused(
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(pems["cert"])}, "private key", "TEMPORAL_TLS_CLIENT_KEY_PATH"
    )


def test_unknown_profile(tmp_path: Path, pems: dict[str, Path]) -> None:
    toml = _write_toml(tmp_path / "t.toml", pems)
    _refused(
        {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "staging"},
        "TEMPORAL_PROFILE",
        "'staging'",
        str(toml),
    )
    _refused({"TEMPORAL_PROFILE": "staging"}, "TEMPORAL_PROFILE", "'staging'", "no config file")


def test_a_config_file_that_cannot_be_used(tmp_path: Path) -> None:
    _refused({"TEMPORAL_CONFIG_FILE": str(tmp_path / "absent.toml")}, "TEMPORAL_CONFIG_FILE", "no such file")
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile.default]\naddress = "unterminated\n')
    _refused({"TEMPORAL_CONFIG_FILE": str(bad)}, f"TEMPORAL_CONFIG_FILE={bad}", "TOML")


def test_malformed_default_config_file_names_it(no_user_config: Path) -> None:
    (no_user_config / "temporalio").mkdir()
    bad = no_user_config / "temporalio" / "temporal.toml"
    bad.write_text("profile = [[[\n")
    _refused({}, str(bad))


def test_conflicting_or_unsupported_variables(pems: dict[str, Path]) -> None:
    _refused(
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(pems["cert"]), "TEMPORAL_TLS_CLIENT_CERT_DATA": "x"},
        "TEMPORAL_TLS_CLIENT_CERT_PATH",
        "TEMPORAL_TLS_CLIENT_CERT_DATA",
    )
    _refused({"TEMPORAL_TLS": "maybe"}, "TEMPORAL_TLS must be true/false")
    _refused(
        {"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": "true"},
        "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION",
        "not supported",
    )
    # as in the SDK, any TEMPORAL_TLS* variable (even this one, false) turns TLS on
    harmless = {"TEMPORAL_TLS_DISABLE_HOST_VERIFICATION": "false"}
    assert _ours(harmless)["tls"] is True and _sdk(harmless)["tls"] is True
