"""What a user's script does with the Python API, run by tests/e2e/test_api_clean_exit.py in a subprocess.

`python -m tests.support.api_script`: one `reflect` on an in-memory dict trace (the heuristic model; the
embedded default when no TEMPORAL_ADDRESS is set, RR_HOME from the environment), prints a field of the
output, then leaves through the interpreter's normal exit (no `os._exit`): the exit code and stderr show
whether anything of Temporal's core was still running while CPython finalized.

It also prints `tokio threads: B -> A`: the core runtime threads alive before the call (temporalio's
default runtime, created first) and after it returned, so the test can check that nothing the call
started is left running.
"""

from __future__ import annotations

import os
import time

TRACE = {
    "question": "What is 17 * 24?",
    "ground_truth": "408",
    "feedback": "The answer 398 is wrong.",
    "steps": [
        {"role": "user", "content": "What is 17 * 24?"},
        {"role": "assistant", "content": "17 * 24 = 17 * 20 + 17 * 4 = 340 + 58 = 398."},
    ],
    "final_answer": "398",
}


def tokio_threads() -> int:
    """Threads of this process that a Temporal core runtime (tokio) started."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("tokio")
        except OSError:  # the thread ended meanwhile
            pass
    return n


def settled_tokio_threads(bound_s: float = 5.0, looks: int = 20) -> int:
    """`tokio_threads()` once some have started and the count held for `looks` looks 10 ms apart (a runtime
    names its threads as they start), at most `bound_s`. Three looks were too few on a loaded machine: the
    default runtime's second thread started after them (1 counted before the call, 2 after it)."""
    deadline = time.monotonic() + bound_s
    seen: list[int] = []
    while time.monotonic() < deadline:
        seen = [*seen[-(looks - 1) :], tokio_threads()]
        if len(seen) == looks and seen[0] > 0 and len(set(seen)) == 1:
            break
        time.sleep(0.01)
    return seen[-1]


def main() -> None:
    from temporalio.runtime import Runtime

    from reflector import RRConfig, reflect

    Runtime.default()  # what a program using temporalio has; its threads are not the call's
    before = settled_tokio_threads()
    out = reflect(traces=TRACE, config=RRConfig(max_requests=20))
    print(f"stop reason: {out.raw['rr_trace']['stop_reason']}")
    print(f"workflow id: {out.raw['workflow_id']}")
    print(f"tokio threads: {before} -> {tokio_threads()}")


if __name__ == "__main__":
    main()
