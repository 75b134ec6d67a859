"""Worker entry point: `python worker.py` (same as `rr worker`)."""

from reflector.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["worker"]))
