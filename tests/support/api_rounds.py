"""`python -m tests.support.api_rounds N`: N `reflect()` calls one after the other on the embedded default of
RR_HOME (issue 26), run by tests/e2e/test_home_server.py in several processes of one home and of two homes at
once. Each call leases the home's server for its duration, so between calls the server may stop (no lease
left) and the next call, or another process's, starts it again: every start/stop race is on the path."""

from __future__ import annotations

import sys

import reflector
from tests.support.api_script import TRACE


def main(rounds: int) -> None:
    for i in range(rounds):
        out = reflector.reflect(question=str(TRACE["question"]), agent_output=TRACE, ground_truth="408")
        print(f"round {i + 1}: {out.raw['rr_trace']['stop_reason']}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
