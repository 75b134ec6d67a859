"""`rr worker`'s start-up heap is frozen and young collections are rarer (reflector.runtime.lean_gc).

Run in a fresh interpreter: freezing is process-wide, and the test process is an application whose
collector rr must not touch (only `rr worker`, a process of its own, installs it).
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from reflector.runtime import lean_gc
import worker  # what an rr worker process has imported when it installs it
before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
frozen = lean_gc.install()
assert frozen - frozen_before > 10_000, frozen  # the imported libraries' objects
assert gc.get_freeze_count() == frozen
assert gc.get_threshold() == (lean_gc.GEN0_THRESHOLD, *before[1:]), gc.get_threshold()
assert lean_gc.install() == 0  # once per process
garbage = []
garbage.append(garbage)  # a cycle made after the freeze is still collected
del garbage
assert gc.collect() >= 1
print("ok")
"""


def test_install_freezes_the_start_up_heap_and_raises_the_young_threshold_once() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_an_application_that_imports_the_worker_keeps_its_collector() -> None:
    script = (
        "import gc; t, f = gc.get_threshold(), gc.get_freeze_count(); import worker; "
        "assert gc.get_freeze_count() == f; assert gc.get_threshold() == t; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
