"""Process-level settings read from the environment (never from workflow code)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandbox.isolation import ISOLATION_ENV, IsolationMode, parse_mode
from sandbox.protocol import MAX_LIVE_HOSTS

__all__ = [
    "Settings",
    "SettingError",
    "env_number",
    "env_flag",
    "usable_dir",
    "DEFAULT_ADDRESS",
    "DEFAULT_TASK_QUEUE",
    "DEFAULT_NO_WORKER_WARN_S",
    "WORKER_MODELS_ENV",
    "OTEL_ENV",
    "OtelMode",
    "parse_otel",
]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_TASK_QUEUE = "rr-reflections"
DEFAULT_MAX_TRACE_BYTES = 64 * 1024**3  # large traces are read lazily; the host memory formula decides what fits
DEFAULT_LAZY_TRACE_BYTES = 16 * 1024**2  # traces at least this big are indexed and read lazily (RR_LAZY_TRACE_BYTES)
DEFAULT_SANDBOX_MAX_MEMORY = 16 * 1024**3  # the largest host address space a trace may need (RR_SANDBOX_MAX_MEMORY_BYTES)
# `rr reflect` says so on the terminal when its reflection's next step has waited this long for a
# worker (env RR_NO_WORKER_WARN_S; tests use a short value).
DEFAULT_NO_WORKER_WARN_S = 15.0
WORKER_MODELS_ENV = "RR_WORKER_MODELS"
WORKFLOW_TASKS_ENV = "RR_MAX_CONCURRENT_WORKFLOW_TASKS"
ACTIVITIES_ENV = "RR_MAX_CONCURRENT_ACTIVITIES"
# After a worker dies, its sticky queue holds the next workflow task until this expires (default 10 s):
# a short value is what makes recovery fast.
DEFAULT_STICKY_TIMEOUT_S = 1.0
# The provider SDK clients' HTTP timeout (RR_PROVIDER_TIMEOUT_S): shorter than the model-request activity's
# 5-minute limit, so a provider that never answers fails one attempt, which Temporal retries with backoff.
DEFAULT_PROVIDER_TIMEOUT_S = 120.0
# OpenTelemetry tracing (reflector/telemetry.py): off, OTLP from the standard OTEL_EXPORTER_OTLP_* variables, or logfire
OTEL_ENV = "RR_OTEL"
OtelMode = Literal["off", "otlp", "logfire"]


class SettingError(ValueError):
    """An environment variable that cannot be used; the message says which and why (the CLI prints it)."""


def env_number(name: str, default: float, *, integer: bool = True, minimum: float = 1) -> float:
    """`name` from the environment as a number >= `minimum` (unset or blank: `default`)."""
    raw = os.environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SettingError(f"{name} must be {kind}, got {raw!r}") from None
    if value < minimum:
        raise SettingError(f"{name} must be >= {minimum:g}, got {raw!r}")
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


@dataclass(frozen=True)
class Settings:
    home: Path
    address: str
    address_explicit: bool
    namespace: str
    task_queue: str
    model: str | None
    max_trace_bytes: int
    sandbox_isolation: IsolationMode = "auto"
    journal_fsync: bool = False
    no_worker_warn_s: float = DEFAULT_NO_WORKER_WARN_S
    # live sandbox hosts per worker process (RR_MAX_LIVE_SANDBOXES; LRU ones are stopped)
    max_live_sandboxes: int = MAX_LIVE_HOSTS
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

    @property
    def blob_dir(self) -> Path:
        return Path(os.environ.get("RR_BLOB_DIR") or self.home / "blobs")

    @property
    def blob_dir_setting(self) -> str:
        """The variable that decides `blob_dir` (for messages)."""
        return "RR_BLOB_DIR" if os.environ.get("RR_BLOB_DIR") else "RR_HOME"

    @property
    def db_file(self) -> Path:
        return self.home / "temporal.sqlite"

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        home = Path(env.get("RR_HOME") or Path.home() / ".rr").expanduser()
        address = env.get("TEMPORAL_ADDRESS")
        return cls(
            home=home,
            address=address or DEFAULT_ADDRESS,
            address_explicit=bool(address),
            namespace=env.get("TEMPORAL_NAMESPACE", "default"),
            task_queue=env.get("RR_TASK_QUEUE", DEFAULT_TASK_QUEUE),
            model=env.get("RR_MODEL") or None,
            max_trace_bytes=int(env_number("RR_MAX_TRACE_BYTES", DEFAULT_MAX_TRACE_BYTES)),
            sandbox_isolation=_isolation(env.get(ISOLATION_ENV)),
            journal_fsync=env_flag("RR_JOURNAL_FSYNC"),
            no_worker_warn_s=env_number("RR_NO_WORKER_WARN_S", DEFAULT_NO_WORKER_WARN_S, integer=False,
                                        minimum=0.1),
            max_live_sandboxes=int(env_number("RR_MAX_LIVE_SANDBOXES", MAX_LIVE_HOSTS)),
            sandbox_zygote=env.get("RR_SANDBOX_ZYGOTE", "1") != "0",
            worker_models=_names(env.get(WORKER_MODELS_ENV, "")),
            plugins=_names(env.get("RR_PLUGINS", "")),
            max_concurrent_workflow_tasks=_optional_count(WORKFLOW_TASKS_ENV),
            max_concurrent_activities=_optional_count(ACTIVITIES_ENV),
            sticky_timeout_s=env_number("RR_STICKY_TIMEOUT_S", DEFAULT_STICKY_TIMEOUT_S, integer=False,
                                        minimum=0.1),
            lazy_trace_bytes=int(env_number("RR_LAZY_TRACE_BYTES", DEFAULT_LAZY_TRACE_BYTES)),
            sandbox_max_memory=int(env_number("RR_SANDBOX_MAX_MEMORY_BYTES", DEFAULT_SANDBOX_MAX_MEMORY)),
            provider_timeout_s=env_number("RR_PROVIDER_TIMEOUT_S", DEFAULT_PROVIDER_TIMEOUT_S, integer=False,
                                          minimum=0.1),
            otel=parse_otel(env.get(OTEL_ENV)),
        )


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
