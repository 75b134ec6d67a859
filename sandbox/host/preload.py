"""What a host imports before its lockdown (the trace reader, the stdlib modules whose first use reads more
from disk, every allowed module) and what it may still read after it (the Python installation and this
project's `sandbox` and `reflector` packages)."""

from __future__ import annotations

import os
import sys

from sandbox.host.guards import ALLOWED_MODULES

# Modules whose first use imports more from disk: imported before the lockdown, after which the
# host (as nobody, under Landlock) may no longer be able to read the Python installation.
PRELOAD_IMPORTS = (
    "reflector.analysis.traces",
    "reflector.analysis.traces.lazy",
    "linecache",
    "traceback",
    "hashlib",
    "pickle",
    "_strptime",
    "locale",
    "calendar",
    "unicodedata",
    "encodings.latin_1",
    "encodings.ascii",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.cp1252",
    "encodings.utf_8_sig",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
    "encodings.idna",
    "encodings.hex_codec",
    "encodings.base64_codec",
)


def _preload(names: tuple[str, ...] = ()) -> None:
    import importlib

    for name in names or (*PRELOAD_IMPORTS, *sorted(ALLOWED_MODULES)):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _readable_paths() -> list[str]:
    """What a locked-down host may still read: the Python installation and this project's packages."""
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for entry in sys.path:
        full = os.path.abspath(entry) if entry else ""
        if full and full != project and os.path.isdir(full) and full != os.getcwd():
            paths.add(full)
    paths.update(os.path.join(project, pkg) for pkg in ("sandbox", "reflector"))
    return sorted(paths)
