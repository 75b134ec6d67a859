"""The built-in offline model `heuristic`: a deterministic, rule-based driver of the real tools.

It is NOT an LLM. It exists so that the whole durable pipeline (workflow, LLM activity, sandbox
cells, output validation) runs end to end with no API key, in CI and in the README's first
command, and so that tests have a model whose every decision is predictable.

It is a pydantic-ai `FunctionModel` whose only input is the message history: no counters, no
process state. The workflow may replay it after a worker restart, in another process, and it
must then make exactly the same request. The plan:

1. no `execute_code` result yet -> call `execute_code` with `FINDINGS_CELL`, which inspects
   `traces`/`task` in the sandbox and prints one `RR_FINDINGS <json>` line;
2. that cell failed (its result starts with "ERROR") and no retry happened yet -> retry once
   with `SIMPLE_CELL`;
3. otherwise -> call the output tool with a `ReflectionDraft` built only from the printed
   findings (every statement traceable to a step index, tool name or value printed there).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from reflector.analysis.citations import header_cell
from reflector.analysis.compaction import SUMMARY_MARKER
from reflector.analysis.heuristic.draft import HEURISTIC_NAME, _draft_no_tool, build_draft
from reflector.analysis.skillbook import ids_from_prompt
from reflector.contract import EXECUTE_CODE_TOOL, ReflectionDraft

__all__ = [
    "FINDINGS_CELL",
    "SIMPLE_CELL",
    "FINDINGS_MARKER",
    "heuristic_response",
    "make_heuristic_model",
    "parse_findings",
]

FINDINGS_MARKER = "RR_FINDINGS "
_CELL_CALL_IDS = ("rr-heuristic-cell-1", "rr-heuristic-cell-2")
_FINAL_CALL_ID = "rr-heuristic-final"

# The inspection cell. It runs in the sandbox (imports limited to json/re/math/collections/
# itertools/functools/statistics, no dunder attribute access, no open()), so it is plain code over the
# canonical view documented in reflector/analysis/traces/view.py, and the comparisons are the sandbox's toolkit
# (reflector/analysis/toolkit/: first_divergence, failing_calls, compare_answer, ...), because the draft must only
# restate what a cell printed.
#
# It is kept as a file, `findings_cell.py`, so that it is linted as code, and read as text here. Its first
# line is a stand-in so that the linter knows where its names come from (the sandbox's variables and
# toolkit); the cell starts with the empty line that replaces it. The text is recorded in workflow
# histories (the `execute_code` call's arguments): it must stay byte for byte the same, and under the
# payload threshold (16 KiB) so that the call stays inline in the history.
_CELL_FILE = "findings_cell.py"
_SANDBOX_LINE = (
    "from SANDBOX_VARIABLES import compare_answer, diff_values, failing_calls, first_divergence, root_cause, "
    "search_steps, suspect_mistake, task, traces  # stand-in lines: see reflector/analysis/heuristic/model.py\n"
)


def _load_findings_cell() -> str:
    text = resources.files(__package__).joinpath(_CELL_FILE).read_text(encoding="utf-8")
    if not text.startswith(_SANDBOX_LINE):
        raise RuntimeError(f"{_CELL_FILE}: its stand-in line is not the one {__name__} replaces")
    body = text.removeprefix(_SANDBOX_LINE)
    # comment lines are for readers of the file, not for the sandbox: left out, the call stays well inline
    return "\n" + "".join(ln for ln in body.splitlines(keepends=True) if not ln.lstrip().startswith("#"))


FINDINGS_CELL = _load_findings_cell()

# Fallback when the sandbox refuses or fails the main cell: nothing but the format.
SIMPLE_CELL = (
    "import json\n"
    "fmt = traces.get('format') if isinstance(traces, dict) else 'unknown'\n"
    "print('RR_FINDINGS ' + json.dumps({'format': fmt, 'simple': True}))\n"
)


# --------------------------------------------------------------------------------------------
# Reading the message history
# --------------------------------------------------------------------------------------------


def _cell_results(messages: list[ModelMessage]) -> list[str]:
    """Outputs of every `execute_code` call so far, in order (a retry prompt counts as ERROR)."""
    out: list[str] = []
    for msg in messages:
        if not isinstance(msg, ModelRequest):
            continue
        for part in msg.parts:
            if isinstance(part, ToolReturnPart) and part.tool_name == EXECUTE_CODE_TOOL:
                content = part.content
                out.append(content if isinstance(content, str) else part.model_response_str())
            elif isinstance(part, RetryPromptPart) and part.tool_name == EXECUTE_CODE_TOOL:
                out.append(f"ERROR: {part.model_response()}")
    return out


def _first_prompt(messages: list[ModelMessage]) -> str:
    for msg in messages:
        if isinstance(msg, ModelRequest):
            for part in msg.parts:
                if isinstance(part, UserPromptPart):
                    content = part.content
                    if isinstance(content, str):
                        return content
                    return "\n".join(c for c in content if isinstance(c, str))
    return ""


def _findings_cell(outputs: list[str]) -> int | None:
    """The id of the last cell that printed the findings."""
    for text in reversed(outputs):
        if parse_findings([text]) is not None:
            return header_cell(text)
    return None


def _last_cell(outputs: list[str]) -> int | None:
    return header_cell(outputs[-1]) if outputs else None


def parse_findings(outputs: list[str]) -> dict[str, Any] | None:
    """The last `RR_FINDINGS <json>` line printed by any cell, or None."""
    for text in reversed(outputs):
        for line in reversed(text.splitlines()):
            idx = line.find(FINDINGS_MARKER)
            if idx < 0:
                continue
            try:
                value = json.loads(line[idx + len(FINDINGS_MARKER) :])
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


# --------------------------------------------------------------------------------------------
# The model function
# --------------------------------------------------------------------------------------------


def heuristic_response(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Decide the next step from the message history alone (deterministic, replay-safe)."""
    prompt = _first_prompt(messages)
    if prompt.startswith(SUMMARY_MARKER):
        return ModelResponse(parts=[TextPart(_summary_of(prompt))])
    if EXECUTE_CODE_TOOL not in {t.name for t in info.function_tools}:
        # the workflow's last synthesis request: the findings so far are in the prompt
        findings = parse_findings([prompt])
        if findings is None:
            return _final(info, _draft_no_tool())
        skill_ids = ids_from_prompt(prompt)
        return _final(info, build_draft(findings, skillbook_ids=skill_ids, cell_errors=[]))
    results = _cell_results(messages)
    findings = parse_findings(results)
    if findings is None and len(results) < len(_CELL_CALL_IDS):
        code = FINDINGS_CELL if not results else SIMPLE_CELL
        call = ToolCallPart(EXECUTE_CODE_TOOL, {"code": code}, tool_call_id=_CELL_CALL_IDS[len(results)])
        return ModelResponse(parts=[call])
    skill_ids = ids_from_prompt(_first_prompt(messages))
    draft = build_draft(
        findings or {},
        skillbook_ids=skill_ids,
        cell_errors=[r[:200] for r in results],
        cell=_findings_cell(results) if findings else _last_cell(results),
    )
    return _final(info, draft)


def _summary_of(prompt: str) -> str:
    """A deterministic summary for compaction: the findings lines, verbatim (they carry the evidence)."""
    lines = [ln[ln.index(FINDINGS_MARKER) :] for ln in prompt.splitlines() if FINDINGS_MARKER in ln]
    kept = lines[-1:] if lines else []
    return f"{HEURISTIC_NAME} summary of the session so far.\n" + ("\n".join(kept) or "No findings yet.")


def _final(info: AgentInfo, draft: ReflectionDraft) -> ModelResponse:
    part: ModelResponsePart
    if info.output_tools:
        part = ToolCallPart(info.output_tools[0].name, draft.model_dump(), tool_call_id=_FINAL_CALL_ID)
    else:
        part = TextPart(draft.model_dump_json())
    return ModelResponse(parts=[part])


class HeuristicModel(FunctionModel):
    """`FunctionModel` that also reports itself as rule-based in `system` (seen in OTel/logs)."""

    @property
    def system(self) -> str:
        return HEURISTIC_NAME


def make_heuristic_model() -> FunctionModel:
    """The offline model behind `--model heuristic`."""
    return HeuristicModel(heuristic_response, model_name=HEURISTIC_NAME)
