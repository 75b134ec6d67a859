"""`python -m reflector.cli ...` is `rr ...`."""

from reflector.cli import run

run()
