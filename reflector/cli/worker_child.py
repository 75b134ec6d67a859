"""A child of `rr worker --processes N` (N > 1): the single-process `rr worker`, which gets SIGTERM when
its supervisor (`reflector.runtime.supervisor`) dies. Run as a program, never imported."""

import sys

from reflector.cli import run
from reflector.runtime.supervisor import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    sys.argv = ["rr", "worker", "--processes", "1"]
    run()
