"""ACE's Pipeline with rr's RRStep as its reflector on the embedded default (issue 27), run by
tests/e2e/test_ace_dropin.py in a subprocess: `python -m tests.support.ace_script N` reflects on N contexts
with N workers and prints each one's stop reason."""

from __future__ import annotations

import sys

from ace.core.context import ACEStepContext, SkillbookView
from ace.core.skillbook import Skillbook
from pipeline import Pipeline

from reflector import RRConfig, RRStep

TRACE = {
    "question": "What is 15 x 24?",
    "ground_truth": "360",
    "steps": [{"role": "agent", "reasoning": "310 + 60 = 370", "answer": "370", "skill_ids": ["math-001"]}],
}


def main(n: int) -> None:
    sb = Skillbook()
    sb.add_skill("math", "Multiply the tens first, then the units", skill_id="math-001")
    contexts = [
        ACEStepContext(trace={**TRACE, "id": f"run-{i}"}, skillbook=SkillbookView(sb)) for i in range(n)
    ]
    results = Pipeline([RRStep("heuristic", config=RRConfig(max_requests=20))]).run(contexts, workers=n)
    errors = [r.error for r in results if r.error is not None]
    if errors:
        raise SystemExit(f"failed: {errors}")
    print(
        "stop reasons:",
        " ".join(str(r.output.reflections[0].raw["rr_trace"]["stop_reason"]) for r in results),
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
