"""Blob stores used by tests other than the session's (so the final replay test can read them)."""

from __future__ import annotations

from pathlib import Path

EXTRA_BLOB_DIRS: list[Path] = []
