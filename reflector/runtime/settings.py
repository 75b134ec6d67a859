"""Process-level settings read from the environment (never from workflow code)."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from reflector.runtime.event_loop import EVENT_LOOP_ENV, EventLoopSetting, uvloop_installed
from sandbox.capacity import host_budget
from sandbox.isolation import ISOLATION_ENV, IsolationMode, parse_mode
from sandbox.protocol import MAX_LIVE_HOSTS

__all__ = [
    "Settings",
    "SettingError",
    "env_number",
    "env_flag",
    "usable_dir",
    "DEFAULT_ADDRESS",
    "DEFAULT_NO_WORKER_WARN_S",
    "WORKER_MODELS_ENV",
    "OTEL_ENV",
    "OtelMode",
    "parse_otel",
    "TemporalConnect",
    "TemporalTLS",
    "load_temporal",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_MAX_TRACE_BYTES = (
    64 * 1024**3
)  # large traces are read lazily; the host memory formula decides what fits
DEFAULT_LAZY_TRACE_BYTES = (
    16 * 1024**2
)  # traces at least this big are indexed and read lazily (RR_LAZY_TRACE_BYTES)
DEFAULT_SANDBOX_MAX_MEMORY = (
    16 * 1024**3
)  # the largest host address space a trace may need (RR_SANDBOX_MAX_MEMORY_BYTES)
# `rr reflect` says so on the terminal when its reflection's next step has waited this long for a
# worker (env RR_NO_WORKER_WARN_S; tests use a short value).
DEFAULT_NO_WORKER_WARN_S = 15.0
WORKER_MODELS_ENV = "RR_WORKER_MODELS"
WORKFLOW_TASKS_ENV = "RR_MAX_CONCURRENT_WORKFLOW_TASKS"
ACTIVITIES_ENV = "RR_MAX_CONCURRENT_ACTIVITIES"
# How long a reflection's next workflow task waits on the sticky queue of the worker that caches it before
# it goes back to the shared queue (temporalio's default). Shorter values fail over sooner after a worker is
# killed, but a saturated worker (hundreds of reflections whose model requests end together) then sends
# waves of tasks back to the shared queue, where another worker replays them (docs/operations.md).
DEFAULT_STICKY_TIMEOUT_S = 10.0
# The provider SDK clients' HTTP timeout (RR_PROVIDER_TIMEOUT_S): shorter than the model-request activity's
# 5-minute limit, so a provider that never answers fails one attempt, which Temporal retries with backoff.
DEFAULT_PROVIDER_TIMEOUT_S = 120.0
# OpenTelemetry tracing (reflector/runtime/telemetry.py): off, OTLP from the standard OTEL_EXPORTER_OTLP_* variables, or logfire
OTEL_ENV = "RR_OTEL"
OtelMode = Literal["off", "otlp", "logfire"]


class SettingError(ValueError):
    """An environment variable that cannot be used; the message says which and why (the CLI prints it)."""


def env_number(
    name: str, default: float, *, integer: bool = True, minimum: float = 1, maximum: float | None = None
) -> float:
    """`name` from the environment as a number >= `minimum` (and <= `maximum`; unset or blank: `default`)."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # also nan and inf, which every comparison below would let through
        kind = "a whole number" if integer else "a number"
        raise SettingError(f"{name} must be {kind}, got {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{name} must be >= {minimum:g}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise SettingError(f"{name} must be <= {maximum:g}, got {raw!r}")
    return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """`name` from the environment as a boolean: 1/0, true/false, yes/no, on/off (any case).

    Unset or blank: `default`; anything else is a `SettingError` (never silently read as off).
    """
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value == "":
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"{name} must be one of 1/0, true/false, yes/no, on/off, got {raw!r}")


def usable_dir(path: Path, name: str) -> Path:
    """Create `path` (named by the setting `name` in messages) and check that a file can be written in it.

    Raises `SettingError` with the reason (not a directory, read-only file system, no space, ...).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".rr-probe-"):
            pass
    except OSError as exc:
        raise SettingError(f"{name}: cannot use the directory {path}: {exc.strerror or exc}") from None
    return path


# -- Temporal connection (temporalio's envconfig) --------------------------------------------------
_CONFIG_FILE_ENV = "TEMPORAL_CONFIG_FILE"
_PROFILE_ENV = "TEMPORAL_PROFILE"
# TLS material: (ClientConfigTLS attribute, the variables that set it, the profile's TOML key)
_TLS_SOURCES = (
    (
        "server_root_ca_cert",
        ("TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_DATA"),
        "server_ca_cert",
    ),
    ("client_cert", ("TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_CERT_DATA"), "client_cert"),
    ("client_private_key", ("TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_CLIENT_KEY_DATA"), "client_key"),
)


@dataclass(frozen=True)
class TemporalTLS:
    """TLS to the Temporal server: the PEM bytes read from the configured files (None: not set; no CA:
    the system roots). Secrets stay out of `repr`."""

    server_root_ca_cert: bytes | None = None
    client_cert: bytes | None = None
    client_private_key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None  # SNI and the name the server certificate is checked against


@dataclass(frozen=True)
class TemporalConnect:
    """How clients reach Temporal beyond address and namespace, resolved by temporalio's envconfig from
    the standard variables (TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_GRPC_META_*) over a profile of the
    TOML config file (TEMPORAL_CONFIG_FILE / TEMPORAL_PROFILE). `reflector.runtime.connection` turns it into
    `Client.connect` arguments. The API key and the gRPC metadata never appear in `repr` or messages."""

    tls: TemporalTLS | None = None  # None: plain gRPC
    api_key: str | None = field(default=None, repr=False)
    rpc_metadata: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # where the address came from, for messages: "TEMPORAL_ADDRESS", "profile 'prod' in FILE", "" (the default)
    address_source: str = ""
    config_file: Path | None = None  # the TOML file read (None: none)
    profile: str = "default"


def default_temporal_config_file() -> Path:
    """Where temporalio looks for the TOML config file when TEMPORAL_CONFIG_FILE is unset (its
    `dirs::config_dir()`/temporalio/temporal.toml)."""
    env = os.environ
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(env.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    else:
        xdg = env.get("XDG_CONFIG_HOME", "")
        base = Path(xdg) if xdg.startswith("/") else Path.home() / ".config"
    return base / "temporalio" / "temporal.toml"


def load_temporal(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None, TemporalConnect]:
    """The Temporal address (None: not configured), namespace (None: not configured) and the rest of the
    connection, through `temporalio.envconfig` with `env` (default: this process's environment).

    A profile is read from the TOML file (TEMPORAL_CONFIG_FILE, else the default file if it exists;
    TEMPORAL_PROFILE, else "default"), then the TEMPORAL_* variables override it. Anything that cannot be
    used (missing or unreadable file, unknown profile, malformed TOML, conflicting variables) is a
    `SettingError` naming the variable or file. The certificate files are read here.
    """
    from temporalio.envconfig import ClientConfigProfile

    env = dict(os.environ if env is None else env)
    for flag in ("TEMPORAL_TLS", "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"):
        raw = env.get(flag, "").strip().lower()
        if raw and raw not in ("true", "false", "1", "0"):
            raise SettingError(f"{flag} must be true/false (or 1/0), got {env[flag]!r}")
    if env.get("TEMPORAL_TLS_DISABLE_HOST_VERIFICATION", "").strip().lower() in ("true", "1"):
        raise SettingError(
            "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION is not supported by the Temporal Python SDK: "
            "give the server's CA (TEMPORAL_TLS_SERVER_CA_CERT_PATH) or its certificate's name "
            "(TEMPORAL_TLS_SERVER_NAME) instead"
        )
    config_file: Path | None
    named = env.get(_CONFIG_FILE_ENV, "").strip()
    if named:
        config_file = Path(named).expanduser()
        if not config_file.is_file():
            raise SettingError(f"{_CONFIG_FILE_ENV}: no such file: {config_file}")
        env[_CONFIG_FILE_ENV] = str(config_file)
        where = f"{_CONFIG_FILE_ENV}={config_file}"
    else:
        default = default_temporal_config_file()
        config_file = default if default.is_file() else None
        where = f"the Temporal config file {default}" if config_file else "the TEMPORAL_* variables"
    profile_name = env.get(_PROFILE_ENV, "").strip() or "default"
    try:
        prof = ClientConfigProfile.load(override_env_vars=env)
    except OSError as exc:
        raise SettingError(f"{where}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # the SDK's ConfigError: TOML syntax, unknown profile, conflicting variables
        msg = _one_line(str(exc))
        if msg.startswith("Profile ") and msg.endswith("not found"):
            known = (
                f"in {config_file}"
                if config_file
                else (f"(no config file: set {_CONFIG_FILE_ENV} or create {default_temporal_config_file()})")
            )
            raise SettingError(f"{_PROFILE_ENV}: no profile {profile_name!r} {known}") from None
        raise SettingError(f"{where}: {msg}") from None
    in_profile = f"profile {profile_name!r} in {config_file}"
    address = prof.address or None
    if env.get("TEMPORAL_ADDRESS", "").strip():
        source = "TEMPORAL_ADDRESS"
    else:
        source = in_profile if address else ""
    tls: TemporalTLS | None = None
    if prof.tls is not None and prof.tls.disabled is not True:
        material: dict[str, bytes | None] = {}
        for attr, variables, key in _TLS_SOURCES:
            setting = next((v for v in variables if env.get(v)), f"tls.{key}_path of {in_profile}")
            material[attr] = _tls_bytes(getattr(prof.tls, attr), setting)
        if (material["client_cert"] is None) != (material["client_private_key"] is None):
            raise SettingError(
                "a TLS client certificate needs its private key and the other way round "
                "(TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH, or the profile's "
                "tls.client_cert_path and tls.client_key_path)"
            )
        tls = TemporalTLS(server_name=prof.tls.server_name or None, **material)
    elif prof.tls is None and prof.api_key is not None:
        tls = (
            TemporalTLS()
        )  # an API key implies TLS (the server's certificate checked against the system roots)
    return (
        address,
        prof.namespace or None,
        TemporalConnect(
            tls=tls,
            api_key=prof.api_key or None,
            rpc_metadata=tuple(sorted(prof.grpc_meta.items())),
            address_source=source,
            config_file=config_file,
            profile=profile_name,
        ),
    )


def _tls_bytes(source: Path | str | bytes | None, setting: str) -> bytes | None:
    """A certificate or key of the TLS configuration: a file read now, or inline data."""
    if source is None:
        return None
    if isinstance(source, Path):
        path = source.expanduser()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SettingError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None
        if not data.strip():
            raise SettingError(f"{setting}: the file {path} is empty")
        return data
    return source.encode() if isinstance(source, str) else bytes(source)


def _one_line(msg: str) -> str:
    """The SDK's configuration error on one line (a TOML error points at the text over several)."""
    lines = [ln.strip() for ln in msg.splitlines()]
    kept = [
        ln for ln in lines if ln and not ln.startswith("|") and not ln.lstrip("0123456789 ").startswith("|")
    ]
    return "; ".join(kept) or msg.strip()


@dataclass(frozen=True)
class Settings:
    home: Path
    address: str
    address_explicit: bool
    namespace: str
    # RR_TASK_QUEUE, or "" (unset): the queue is then derived from the blob store (`task_queue`)
    task_queue_setting: str
    model: str | None
    max_trace_bytes: int
    # TLS, API key, gRPC metadata of the Temporal connection, and where the address came from (`load_temporal`)
    temporal: TemporalConnect = TemporalConnect()
    sandbox_isolation: IsolationMode = "auto"
    journal_fsync: bool = False
    no_worker_warn_s: float = DEFAULT_NO_WORKER_WARN_S
    # live sandbox hosts per worker process (RR_MAX_LIVE_SANDBOXES, default sized from the machine: sandbox.capacity;
    # those whose next cell is furthest off are stopped: sandbox.eviction)
    max_live_sandboxes: int = MAX_LIVE_HOSTS
    max_live_sandboxes_set: bool = False  # RR_MAX_LIVE_SANDBOXES given (else the machine's budget)
    # fork sandbox hosts from the worker's fork server (RR_SANDBOX_ZYGOTE; "0": start each directly)
    sandbox_zygote: bool = True
    # models this worker prepares before polling (RR_WORKER_MODELS: names, provider prefixes or `*`)
    worker_models: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()  # modules imported at start (RR_PLUGINS: they register models or tools)
    # fixed slot counts (RR_MAX_CONCURRENT_WORKFLOW_TASKS / RR_MAX_CONCURRENT_ACTIVITIES); None: admission control
    max_concurrent_workflow_tasks: int | None = None
    max_concurrent_activities: int | None = None
    sticky_timeout_s: float = DEFAULT_STICKY_TIMEOUT_S  # RR_STICKY_TIMEOUT_S
    lazy_trace_bytes: int = DEFAULT_LAZY_TRACE_BYTES
    sandbox_max_memory: int = DEFAULT_SANDBOX_MAX_MEMORY
    provider_timeout_s: float = DEFAULT_PROVIDER_TIMEOUT_S  # RR_PROVIDER_TIMEOUT_S
    otel: OtelMode = "off"  # RR_OTEL: 1/otlp (OTLP exporter), logfire, unset/0 (off)
    # RR_BLOB_URL: the shared blob store. None (or file://PATH): the local directory `blob_dir`;
    # s3://bucket/prefix: S3 (any S3-compatible endpoint: AWS_ENDPOINT_URL), `blob_dir` is this process's cache
    blob_url: str | None = None
    # how boto3 addresses buckets (RR_S3_ADDRESSING_STYLE): "path" when an endpoint is set (MinIO, moto), else "auto"
    s3_addressing_style: str = "auto"
    # the S3 client's region: AWS_REGION, else AWS_DEFAULT_REGION (boto3 itself reads only the latter), else boto3's
    s3_region: str | None = None
    # the S3 endpoint (AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL; None: AWS's): passed to the client explicitly,
    # so that a client is never reused for another endpoint
    s3_endpoint: str | None = None
    # the event loop of `rr worker` (RR_EVENT_LOOP: auto, uvloop, asyncio; reflector/runtime/event_loop.py)
    event_loop: EventLoopSetting = "auto"

    @property
    def blob_dir(self) -> Path:
        """The local blob directory: the store itself, or (S3) this process's cache of it."""
        if os.environ.get("RR_BLOB_DIR"):
            return Path(os.environ["RR_BLOB_DIR"])
        if self.blob_url and self.blob_url.startswith("file://"):
            return Path(self.blob_url[len("file://") :])
        if self.s3_url is not None:  # one cache per bucket and prefix: a local file always has its S3 copy
            return self.home / "s3-cache" / self.s3_url[len("s3://") :].rstrip("/")
        return self.home / "blobs"

    @property
    def s3_url(self) -> str | None:
        """RR_BLOB_URL when it names S3."""
        return self.blob_url if self.blob_url and self.blob_url.startswith("s3://") else None

    @property
    def blob_dir_setting(self) -> str:
        """The variable that decides `blob_dir` (for messages)."""
        if os.environ.get("RR_BLOB_DIR"):
            return "RR_BLOB_DIR"
        return "RR_BLOB_URL" if self.blob_url else "RR_HOME"

    @property
    def task_queue(self) -> str:
        """RR_TASK_QUEUE, else `rr-<store id>` (`reflector.runtime.storage.identity`): a client and a worker of two
        different blob stores never share a queue, so work only reaches workers that can read its blobs."""
        if self.task_queue_setting:
            return self.task_queue_setting
        from reflector.runtime.storage.identity import store_queue

        try:
            return store_queue(self)
        except OSError as exc:
            raise SettingError(
                f"cannot read or create the blob store's id ({self.blob_dir_setting}): {exc}"
            ) from None

    @property
    def db_file(self) -> Path:
        return self.home / "temporal.sqlite"

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        home = Path(env.get("RR_HOME") or Path.home() / ".rr").expanduser()
        address, namespace, temporal = load_temporal(env)  # temporalio's envconfig: TEMPORAL_* and profiles
        return cls(
            home=home,
            # nothing configured: the embedded default, on RR_EMBEDDED_PORT (another local rr may hold 7233)
            address=address or f"localhost:{int(env_number('RR_EMBEDDED_PORT', 7233, maximum=65535))}",
            address_explicit=bool(address),
            namespace=namespace or "default",
            temporal=temporal,
            task_queue_setting=env.get("RR_TASK_QUEUE", "").strip(),
            model=env.get("RR_MODEL") or None,
            max_trace_bytes=int(env_number("RR_MAX_TRACE_BYTES", DEFAULT_MAX_TRACE_BYTES)),
            sandbox_isolation=_isolation(env.get(ISOLATION_ENV)),
            journal_fsync=env_flag("RR_JOURNAL_FSYNC"),
            no_worker_warn_s=env_number(
                "RR_NO_WORKER_WARN_S", DEFAULT_NO_WORKER_WARN_S, integer=False, minimum=0.1
            ),
            max_live_sandboxes=_live_hosts(),
            max_live_sandboxes_set=bool(env.get("RR_MAX_LIVE_SANDBOXES", "").strip()),
            sandbox_zygote=env.get("RR_SANDBOX_ZYGOTE", "1") != "0",
            worker_models=_names(env.get(WORKER_MODELS_ENV, "")),
            plugins=_names(env.get("RR_PLUGINS", "")),
            max_concurrent_workflow_tasks=_optional_count(WORKFLOW_TASKS_ENV),
            max_concurrent_activities=_optional_count(ACTIVITIES_ENV),
            sticky_timeout_s=env_number(
                "RR_STICKY_TIMEOUT_S", DEFAULT_STICKY_TIMEOUT_S, integer=False, minimum=0.1
            ),
            lazy_trace_bytes=int(env_number("RR_LAZY_TRACE_BYTES", DEFAULT_LAZY_TRACE_BYTES)),
            sandbox_max_memory=int(env_number("RR_SANDBOX_MAX_MEMORY_BYTES", DEFAULT_SANDBOX_MAX_MEMORY)),
            provider_timeout_s=env_number(
                "RR_PROVIDER_TIMEOUT_S", DEFAULT_PROVIDER_TIMEOUT_S, integer=False, minimum=0.1
            ),
            otel=parse_otel(env.get(OTEL_ENV)),
            blob_url=_blob_url(env.get("RR_BLOB_URL")),
            s3_addressing_style=_addressing_style(env),
            s3_region=(env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "").strip() or None,
            s3_endpoint=(env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or "").strip() or None,
            event_loop=_event_loop(env.get(EVENT_LOOP_ENV)),
        )


def _blob_url(raw: str | None) -> str | None:
    """RR_BLOB_URL: unset/blank, file:///absolute/path or s3://bucket[/prefix] (checked here, once)."""
    value = (raw or "").strip()
    if not value:
        return None
    if value.startswith("file://"):
        if not value[len("file://") :].startswith("/"):
            raise SettingError(
                f"RR_BLOB_URL: a file:// URL needs an absolute path (file:///srv/rr), got {raw!r}"
            )
        return value
    if value.startswith("s3://"):
        from reflector.runtime.storage.s3 import parse_s3_url

        try:
            return parse_s3_url(value).url
        except ValueError as exc:
            raise SettingError(f"RR_BLOB_URL: {exc}") from None
    raise SettingError(f"RR_BLOB_URL must be s3://bucket/prefix or file:///path, got {raw!r}")


def _addressing_style(env: Mapping[str, str]) -> str:
    raw = env.get("RR_S3_ADDRESSING_STYLE", "").strip().lower()
    if raw and raw not in ("auto", "path", "virtual"):
        raise SettingError(f"RR_S3_ADDRESSING_STYLE must be auto, path or virtual, got {raw!r}")
    if raw:
        return raw
    return "path" if env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") else "auto"


def _event_loop(raw: str | None) -> EventLoopSetting:
    value = (raw or "").strip().lower() or "auto"
    if value not in ("auto", "uvloop", "asyncio"):
        raise SettingError(f"{EVENT_LOOP_ENV} must be auto, uvloop or asyncio, got {raw!r}")
    if value == "uvloop" and not uvloop_installed():
        raise SettingError(
            f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed here (pip install uvloop, or set "
            f"{EVENT_LOOP_ENV}=auto to use it only where it is)"
        )
    return value  # type: ignore[return-value]


def _isolation(raw: str | None) -> IsolationMode:
    try:
        return parse_mode(raw)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


def parse_otel(raw: str | None) -> OtelMode:
    """RR_OTEL: unset, blank or 0/false/no/off: off; 1/true/yes/on/otlp: OTLP; logfire: logfire."""
    value = (raw or "").strip().lower()
    if value in ("", *_FALSE):
        return "off"
    if value in (*_TRUE, "otlp"):
        return "otlp"
    if value == "logfire":
        return "logfire"
    raise SettingError(f"{OTEL_ENV} must be 1 (OpenTelemetry over OTLP), logfire, or 0 (off), got {raw!r}")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def _optional_count(name: str) -> int | None:
    return int(env_number(name, 1)) if os.environ.get(name, "").strip() else None


def _live_hosts() -> int:
    """`RR_MAX_LIVE_SANDBOXES`, or (unset) the machine's budget (`sandbox.capacity`: memory, open files,
    processes)."""
    if os.environ.get("RR_MAX_LIVE_SANDBOXES", "").strip():
        return int(env_number("RR_MAX_LIVE_SANDBOXES", MAX_LIVE_HOSTS))
    return host_budget().hosts
