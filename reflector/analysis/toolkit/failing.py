"""The agent's failing tool calls, grouped by tool: what it tried, what it changed between tries.

Why: "the agent kept retrying" is a common reflection, and often a false one. Whether the retries were
identical (the same canonical arguments) or changed something (which argument, from what to what), and
whether a later call of the same tool succeeded, is read off the calls here, so a reflection says "it
repeated the same call" only when it did.
"""

from __future__ import annotations

from typing import Any

from reflector.analysis.toolkit.calls import check_run, tool_calls
from reflector.analysis.toolkit.diff import diff_values

__all__ = ["failing_calls"]


def failing_calls(run: Any) -> list[dict[str, Any]]:
    """Failing calls grouped by tool, in order of the first failure:
    `[{"tool", "attempts": [{"step", "args", "error"}], "identical_retries", "changes": [{"from_step",
    "to_step", "differences"}], "recovered", "recovered_step"}]`.

    `identical_retries`: consecutive failed attempts with the same canonical arguments as the one
    before; `changes`: what differed between consecutive failed attempts (`diff_values(previous,
    next)`); `recovered`: a call of the same tool succeeded after its last failure (at `recovered_step`).
    """
    run = check_run(run, "failing_calls")
    calls = tool_calls(run)
    groups: dict[str, dict[str, Any]] = {}
    last_failure: dict[str, int] = {}
    for pos, c in enumerate(calls):
        if not c["is_error"]:
            continue
        g = groups.setdefault(
            c["name"],
            {
                "tool": c["name"],
                "attempts": [],
                "identical_retries": 0,
                "changes": [],
                "recovered": False,
                "recovered_step": None,
            },
        )
        if g["attempts"]:
            prev = g["attempts"][-1]
            diffs = diff_values(prev["args"], c["args"])
            if diffs:
                g["changes"].append({"from_step": prev["step"], "to_step": c["step"], "differences": diffs})
            else:
                g["identical_retries"] += 1
        g["attempts"].append({"step": c["step"], "args": c["args"], "error": c["result"]})
        last_failure[c["name"]] = pos
    for name, g in groups.items():
        later = next(
            (
                c
                for c in calls[last_failure[name] + 1 :]
                if c["name"] == name and not c["is_error"] and c["result_step"] is not None
            ),
            None,
        )
        if later is not None:
            g["recovered"], g["recovered_step"] = True, later["step"]
    return list(groups.values())
