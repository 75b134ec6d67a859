"""The worker's build id: which code a workflow task ran on, as the history records it.

Why not temporalio's default: it hashes the bytecode of every loaded module (`load_default_build_id`), about
1,300 modules once pydantic-ai is imported, 0.28 s of CPU at every worker start (every `rr worker`, every
`rr reflect` on the embedded default, every Python API call that runs its own worker). rr's id says the
same thing for a fraction of that: a digest of rr's own sources (the packages this distribution ships) and
the versions of the libraries whose code runs in the workflow (temporalio, pydantic-ai, pydantic) and of
Python. The id is informational here (no worker versioning): it does not route tasks.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import sys
from pathlib import Path

__all__ = ["build_id", "digest"]

# rr's top-level packages and modules (pyproject's `packages`): what a worker runs of ours
_PACKAGES = ("reflector", "workflows", "activities", "sandbox")
_MODULES = ("worker.py",)
_LIBRARIES = ("temporalio", "pydantic-ai-slim", "pydantic", "pydantic-core")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _sources(root: Path) -> list[Path]:
    files = [path for package in _PACKAGES for path in (root / package).rglob("*.py")]
    files += [root / name for name in _MODULES if (root / name).is_file()]
    return sorted(files)


def digest(root: Path) -> str:
    """`rr-<digest>` of the sources under `root` (the directory holding rr's packages) and the library versions."""
    hashed = hashlib.sha256()
    for name in _LIBRARIES:
        hashed.update(f"{name}=={_version(name)}\n".encode())
    hashed.update(f"python {sys.version_info[:3]}\n".encode())
    for path in _sources(root):
        hashed.update(path.relative_to(root).as_posix().encode() + b"\0")
        hashed.update(path.read_bytes())
        hashed.update(b"\0")
    return f"rr-{hashed.hexdigest()[:32]}"


@functools.cache
def build_id() -> str:
    """This installation's id: the same for the same sources and library versions, different when either
    changes (computed once per process)."""
    return digest(Path(__file__).resolve().parents[2])  # the directory holding the `reflector` package
