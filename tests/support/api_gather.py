"""Two `areflect` calls at once under `asyncio.gather` on the embedded default (issue 26), run by
tests/e2e/test_home_server.py in a subprocess: prints each call's stop reason, and `tokio threads: B -> A`, the
Temporal core threads alive before the calls and once they returned, while this event loop goes on (as ACE's
pipeline's does): nothing of the calls' core runtime may be left running."""

from __future__ import annotations

import asyncio

import reflector
from tests.support.api_script import TRACE, settled_tokio_threads, tokio_threads


async def main() -> None:
    from temporalio.runtime import Runtime

    Runtime.default()  # what a program using temporalio has; its threads are not the calls'
    before = settled_tokio_threads()
    calls = [
        reflector.areflect(question=str(TRACE["question"]), agent_output=TRACE, ground_truth="408")
        for _ in range(2)
    ]
    outs = await asyncio.gather(*calls)
    print("stop reasons:", " ".join(str(o.raw["rr_trace"]["stop_reason"]) for o in outs))
    print(f"tokio threads: {before} -> {tokio_threads()}")


if __name__ == "__main__":
    asyncio.run(main())
