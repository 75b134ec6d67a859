"""`Settings` -> `Client.connect` arguments: the one way every client (the CLI, `rr worker`, the Python API)
reaches Temporal.

The environment is read in `reflector.runtime.settings` (`load_temporal`, through `temporalio.envconfig`: the
standard TEMPORAL_* variables and the TOML profiles); this module only turns what it resolved into the
SDK's connect options, and describes the target for messages without any secret (API key, gRPC
metadata, key material).
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.client import Client, Plugin
from temporalio.converter import DataConverter
from temporalio.envconfig import ClientConnectConfig
from temporalio.service import TLSConfig

from reflector.runtime.settings import SettingError, Settings, TemporalConnect, TemporalTLS

__all__ = ["connect_config", "tls_config", "describe_target", "open_client"]


def tls_config(temporal: TemporalConnect) -> bool | TLSConfig:
    """The `tls` argument of `Client.connect`: False (plain), True (system roots) or the configured PEMs."""
    t = temporal.tls
    if t is None:
        return False
    if t == TemporalTLS():
        return True
    return TLSConfig(
        server_root_ca_cert=t.server_root_ca_cert,
        domain=t.server_name,
        client_cert=t.client_cert,
        client_private_key=t.client_private_key,
    )


def connect_config(
    settings: Settings, *, address: str | None = None, namespace: str | None = None, embedded: bool = False
) -> ClientConnectConfig:
    """The keyword arguments of `Client.connect` for `settings` (`address` / `namespace` override theirs).

    `embedded=True`: the embedded dev server this process started (plain gRPC, no credentials): the
    configured TLS, API key and gRPC metadata belong to a configured server, not to it.
    """
    cfg: ClientConnectConfig = {
        "target_host": address or settings.address,
        "namespace": namespace or settings.namespace,
        "tls": False,
    }
    if embedded:
        return cfg
    temporal = settings.temporal
    cfg["tls"] = tls_config(temporal)
    if temporal.api_key:
        cfg["api_key"] = temporal.api_key
    if temporal.rpc_metadata:
        cfg["rpc_metadata"] = dict(temporal.rpc_metadata)
    return cfg


def describe_target(settings: Settings, address: str | None = None) -> str:
    """The server for messages: `TEMPORAL_ADDRESS=host:port`, `host:port (profile 'p' in FILE)` or
    `host:port` (the default), noting `TLS` / `API key` when they are used. Never a secret."""
    if address is not None and address != settings.address:
        return address  # another server (the embedded one): none of the configuration applies
    temporal = settings.temporal
    source = temporal.address_source
    notes = [
        *([source] if source and source != "TEMPORAL_ADDRESS" else []),
        *(["TLS"] if temporal.tls is not None else []),
        *(["API key"] if temporal.api_key else []),
    ]
    head = f"TEMPORAL_ADDRESS={settings.address}" if source == "TEMPORAL_ADDRESS" else settings.address
    return head + (f" ({', '.join(notes)})" if notes else "")


def check_reachable(settings: Settings) -> None:
    """A `SettingError` when the configured server (`settings.address_explicit`) does not answer; nothing to check
    for the embedded default (it is started when none runs)."""
    from reflector.runtime.devserver import is_reachable

    if settings.address_explicit and not is_reachable(settings.address):
        raise SettingError(
            f"the Temporal server at {describe_target(settings)} is not reachable "
            "(start one with `rr server`, or point TEMPORAL_ADDRESS at your cluster)"
        )


async def open_client(
    settings: Settings,
    *,
    data_converter: DataConverter,
    plugins: Sequence[Plugin],
    address: str | None = None,
    namespace: str | None = None,
    embedded: bool = False,
) -> Client:
    """`Client.connect` with `connect_config(settings, ...)`, the data converter and the plugins."""
    cfg = connect_config(settings, address=address, namespace=namespace, embedded=embedded)
    return await Client.connect(**cfg, data_converter=data_converter, plugins=plugins)
