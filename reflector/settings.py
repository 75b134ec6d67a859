"""Process-level settings read from the environment (never from workflow code)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sandbox.isolation import ISOLATION_ENV, IsolationMode, parse_mode

__all__ = ["Settings", "SettingError", "env_number", "DEFAULT_ADDRESS", "DEFAULT_TASK_QUEUE"]

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_TASK_QUEUE = "rr-reflections"
DEFAULT_MAX_TRACE_BYTES = 512 * 1024**2


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

    @property
    def blob_dir(self) -> Path:
        return Path(os.environ.get("RR_BLOB_DIR") or self.home / "blobs")

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
        )


def _isolation(raw: str | None) -> IsolationMode:
    try:
        return parse_mode(raw)
    except ValueError as exc:
        raise SettingError(str(exc)) from None
