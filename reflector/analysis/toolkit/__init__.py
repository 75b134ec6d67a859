"""The trace-analysis toolkit: pure functions over the canonical view that say where an agent went wrong.

Why a toolkit: the model reflecting on a trace writes sandbox cells, and the comparisons that matter
(which call, which argument, which step) are easy to get subtly wrong in ad-hoc code. These functions
do them once, deterministically (no I/O, no clock, no randomness), and return plain JSON-like data
(dict/list/str/int/float/bool/None, fresh copies), so a cell cannot reach or change the trace through
what they return. They are registered in every sandbox namespace under the names of `SANDBOX_HELPERS`
(names recorded in cells: a durable contract) and described to the model by `TOOLKIT_DOC`.

Every function takes one run's view first (`traces`, or `traces['runs'][i]` of a batch: see
`reflector.analysis.traces.view`); anything else raises a TypeError / ValueError that says what to pass.

- `calls`: `tool_calls` (calls paired with results), `expected_actions`, `is_write`;
- `diff`: `diff_values` (argument-level differences with paths like `passengers[1].dob`);
- `divergence`: `diff_actions` (expected vs taken), `first_divergence` (the decisive step);
- `failing`: `failing_calls` (failures by tool: identical or changed retries, recovery);
- `search`: `search_steps`;
- multi-agent traces: `actor_views`: `actors`, `timeline`; `actors`: `suspect_mistake`;
- `trace_back` (from the symptom to the root cause): `provenance`, `contradictions`, `requirements`;
- `root` : `root_cause` (the symptom, and the root cause those tools trace back to, with the rule that placed it);
- `answer`: `compare_answer` (a final answer against a text ground truth).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reflector.analysis.toolkit.actors import actors, suspect_mistake, timeline
from reflector.analysis.toolkit.answer import compare_answer
from reflector.analysis.toolkit.calls import expected_actions, is_write, tool_calls
from reflector.analysis.toolkit.diff import diff_values
from reflector.analysis.toolkit.divergence import diff_actions, first_divergence
from reflector.analysis.toolkit.failing import failing_calls
from reflector.analysis.toolkit.policy import requirements
from reflector.analysis.toolkit.root import root_cause
from reflector.analysis.toolkit.search import search_steps
from reflector.analysis.toolkit.trace_back import contradictions, provenance

__all__ = [
    "tool_calls",
    "expected_actions",
    "is_write",
    "diff_values",
    "diff_actions",
    "first_divergence",
    "failing_calls",
    "search_steps",
    "actors",
    "timeline",
    "suspect_mistake",
    "compare_answer",
    "provenance",
    "contradictions",
    "requirements",
    "root_cause",
    "SANDBOX_HELPERS",
    "TOOLKIT_DOC",
]

SANDBOX_HELPERS: dict[str, Callable[..., Any]] = {
    "tool_calls": tool_calls,
    "expected_actions": expected_actions,
    "diff_actions": diff_actions,
    "diff_values": diff_values,
    "first_divergence": first_divergence,
    "failing_calls": failing_calls,
    "search_steps": search_steps,
    "actors": actors,
    "timeline": timeline,
    "suspect_mistake": suspect_mistake,
    "compare_answer": compare_answer,
    "is_write": is_write,
    "provenance": provenance,
    "contradictions": contradictions,
    "requirements": requirements,
    "root_cause": root_cause,
}

_DOC_LINES = (
    "toolkit: functions of one run (traces, or traces['runs'][i]), plain data out:",
    "tool_calls(run, limit=None) -> [{step,name,args,result,result_step,is_error,actor}]",
    "expected_actions(run) -> [{name,args}] | None (the task's)",
    "diff_actions(expected, actual, writes_only=True) -> {matched,wrong_arguments,missing,extra,equal}",
    "diff_values(expected, actual) -> [{path,expected,actual}]",
    "first_divergence(run) -> {kind,step,tool,argument,actual,expected,where,...} | None",
    "failing_calls(run) -> [{tool,attempts,identical_retries,changes,recovered}]",
    "search_steps(run, pattern, limit=20, regex=False) -> [{step,role,actor,snippet}]",
)
_ACTOR_DOC = {
    "actors": "actors(run), timeline(run, actor=None): who did what",
    "suspect_mistake": "suspect_mistake(run): a lead (no tool calls)",
}
_TRACE_BACK_DOC = (  # one line: cell 1's output is cut, and the schema after it must stay in the cut
    "provenance(run, value), contradictions(run), requirements(run), root_cause(run): trace back",
)
TOOLKIT_DOC: str = "\n  ".join(
    [
        *_DOC_LINES,
        *_ACTOR_DOC.values(),
        *_TRACE_BACK_DOC,
        "compare_answer(final, truth) -> {matches,missing}",
        "is_write(name) -> bool",
    ]
)
