"""The worker's side of the sandbox's OS boundary: the check that a host gets the isolation the settings
ask for (`rr worker` refuses to start otherwise), the warning when it runs without, and the blob store's
directories kept private to the worker (a host runs under another uid)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from reflector.runtime.settings import Settings
from reflector.runtime.storage.blobs import BLOBS_DIR, RESPONSES_DIR, SESSIONS_DIR
from sandbox.executor import SubprocessExecutor
from sandbox.isolation import IsolationReport, IsolationUnavailable
from sandbox.protocol import SandboxLimits

__all__ = ["LANGUAGE_ONLY_WARNING", "check_isolation", "private_store_dirs"]

log = logging.getLogger("rr.sandbox")


LANGUAGE_ONLY_WARNING = (
    "RR_SANDBOX_ISOLATION=language-only: model-written code runs WITHOUT the OS sandbox (no namespaces, "
    "Landlock or seccomp); one gadget past the language guards reaches this worker's files, network and "
    "secrets. Use it only for traces you wrote yourself."
)


async def check_isolation(settings: Settings | None = None) -> IsolationReport:
    """Start one sandbox host the way sessions will, and report the isolation it achieved.

    Raises `IsolationUnavailable` (with the host's reason) when a required layer cannot be applied:
    `rr worker` then refuses to start instead of failing every cell later.
    """
    settings = settings or Settings.from_env()
    executor = SubprocessExecutor(
        SandboxLimits(), isolation=settings.sandbox_isolation, zygote=settings.sandbox_zygote
    )
    try:
        await executor.start(None, "auto", {})
    except RuntimeError as exc:
        raise IsolationUnavailable(str(exc)) from None
    finally:
        await executor.close()
    report = IsolationReport.from_dict(executor.isolation)
    report.mode = settings.sandbox_isolation
    return report


def private_store_dirs(root: Path) -> None:
    """The blob store's top directories (blobs, journals, response caches) are the worker's alone (0700).

    Why: a host runs under another uid (a root worker's hosts are nobody) and Landlock denies it reading
    and listing the store, not stat-ing a path or watching a directory: with these not traversable by
    its uid it can do neither (seccomp denies inotify/fanotify too). A directory of another owner is left
    as it is (a store shared on purpose). A non-root worker's hosts keep its uid: for them the modes
    change nothing, and the Landlock and seccomp layers are what holds.
    """
    for name in (BLOBS_DIR, SESSIONS_DIR, RESPONSES_DIR):
        path = root / name
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = path.stat()
            if info.st_uid == os.geteuid() and info.st_mode & 0o077:
                path.chmod(0o700)
        except OSError as exc:  # a read-only store: the other layers still hold; say so once
            log.warning("sandbox: could not make %s private to the worker (%s)", path, exc.strerror)
