"""Two `areflect` calls at once under `asyncio.gather` on the embedded default (issue 26), run by
tests/e2e/test_home_server.py in a subprocess: prints each call's stop reason."""

from __future__ import annotations

import asyncio

import reflector
from tests.support.api_script import TRACE


async def main() -> None:
    calls = [
        reflector.areflect(question=str(TRACE["question"]), agent_output=TRACE, ground_truth="408")
        for _ in range(2)
    ]
    outs = await asyncio.gather(*calls)
    print("stop reasons:", " ".join(str(o.raw["rr_trace"]["stop_reason"]) for o in outs))


if __name__ == "__main__":
    asyncio.run(main())
