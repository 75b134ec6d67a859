"""The reflector's tools. All run in workflow code (`temporal: False`).

`execute_code` runs a cell as a local activity on the worker that owns the session's sandbox host,
`recurse` starts a child workflow with a share of the budget, `think` and the skillbook tools are pure.
Their names and the toolset id are durable (`reflector.contract`): pydantic-ai records them in every
model request and response.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import FunctionToolset
from temporalio import workflow
from temporalio.workflow import ParentClosePolicy

from reflector.analysis.citations import cell_header
from reflector.analysis.ledger import UsageRecord
from reflector.analysis.limits import MAX_CONTEXT_CODE_CHARS, MAX_SKILL_QUERY_CHARS, MAX_TASK_TEXT_CHARS
from reflector.analysis.skillbook import parse_skillbook
from reflector.contract import (
    EXECUTE_CODE_TOOL,
    RECURSE_TOOL,
    SKILL_LOOKUP_ACTIVITY,
    SKILL_TOOLS,
    THINK_TOOL,
    TOOL_ARG_CAPS_PATCH,
    TOOLSET_ID,
    WORKFLOW_NAME,
    ReflectionDraft,
    ReflectionInput,
    ReflectorDeps,
    ReflectorOutput,
    SkillLookupInput,
)
from reflector.runtime import search_attributes as sa
from workflows.activity_options import CELL_RETRY
from workflows.patches import patch_on
from workflows.rerun import reused_child, reusing_child
from workflows.state import SessionEnded, SessionState, await_cancel_safe, current_state

__all__ = ["toolset", "recurse_offered"]

toolset: FunctionToolset[ReflectorDeps] = FunctionToolset(id=TOOLSET_ID)


def recurse_offered(deps: ReflectorDeps) -> bool:
    """`recurse` is offered below max_depth, where the strategy lets the session split (`may_recurse`)."""
    return deps.may_recurse and deps.depth < deps.max_depth


# ------------------------------------------------------------------------------------ sandbox tools


@toolset.tool(name=EXECUTE_CODE_TOOL, metadata={"temporal": False})
async def execute_code(ctx: RunContext[ReflectorDeps], code: str) -> str:
    """Run Python in the sandbox where the trace is the variable `traces`; variables persist.

    Args:
        code: Python source. Print what you want to see; output is truncated (head and tail).
    """
    state = current_state()
    limit = state.inp.config.max_consecutive_cell_errors
    refusal = state.loop_guard(code)
    if refusal is not None:
        state.consecutive_failures += 1
        if state.consecutive_failures >= limit:
            raise SessionEnded("error", f"the model kept repeating a failing cell: {refusal}")
        return refusal
    outcome = await state.run_cell(code)
    seq = state.counters.seq
    state.cell_outputs[seq] = outcome.output
    if outcome.ok and outcome.submitted is not None:
        return _accept_submission(outcome.submitted, outcome.output)
    if state.consecutive_failures >= limit:
        raise SessionEnded("error", f"{limit} consecutive cells failed; last error: {outcome.error}")
    if outcome.ok and not outcome.output.strip():
        return f"{cell_header(seq)}\n(cell ran; it printed nothing - print() what you want to see)"
    return f"{cell_header(seq)}\n{outcome.output}"


def _accept_submission(value: object, output: str) -> str:
    """A final answer submitted from code ends the run if it validates; else the model sees why."""
    try:
        draft = ReflectionDraft.model_validate(value)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:8])
        return (output + "\n" if output else "") + (
            f"FINAL_ANSWER was not accepted ({errors}). Fix the value (fields: reasoning, "
            "error_identification, root_cause_analysis, correct_approach, key_insight, "
            "extracted_learnings[{learning, atomicity_score, evidence, justification}], skill_tags) and submit again."
        )
    raise SessionEnded("completed", "final answer submitted from code", draft=draft)


@toolset.tool(name=THINK_TOOL, metadata={"temporal": False})
async def think(ctx: RunContext[ReflectorDeps], thought: str, evidence_refs: list[str] | None = None) -> str:
    """Record a reasoning note (kept for the audit trail; never turned into a learning).

    Args:
        thought: What you concluded or plan next.
        evidence_refs: Where it comes from, e.g. ["cell 3", "step 12"].
    """
    state = current_state()
    state.thoughts.append(
        {"thought": thought, "evidence_refs": list(evidence_refs or []), "after_cell": state.counters.seq}
    )
    return "noted"


# ------------------------------------------------------------------------------------ recursion


async def _may_recurse(ctx: RunContext[ReflectorDeps], tool_def: ToolDefinition) -> ToolDefinition | None:
    return tool_def if recurse_offered(ctx.deps) else None


@toolset.tool(name=RECURSE_TOOL, metadata={"temporal": False}, prepare=_may_recurse)
async def recurse(ctx: RunContext[ReflectorDeps], prompt: str, context_code: str = "") -> str:
    """Delegate a sub-question to a child reflection session with a share of the remaining budget.

    The child's sandbox starts with a copy of your variables and helpers (changes it makes never
    reach yours), then runs `context_code` there (e.g. to narrow `traces` to a slice).

    Args:
        prompt: The sub-question for the child.
        context_code: Python run in the child's sandbox before its first turn.
    """
    state = current_state()
    too_big = _over_cap(prompt, context_code)
    if too_big is not None and patch_on(TOOL_ARG_CAPS_PATCH):
        raise ModelRetry(too_big)
    async with state.recurse_lock:  # one child at a time: at most one request of the tree in flight
        return await _run_child(state, prompt, context_code)


def _over_cap(prompt: str, context_code: str) -> str | None:
    """Why `recurse`'s arguments cannot become a child's input (`reflector.analysis.limits`), or None."""
    if len(prompt) > MAX_TASK_TEXT_CHARS:
        return (
            f"`prompt` is {len(prompt):,} characters, over the limit of {MAX_TASK_TEXT_CHARS:,}: ask a short "
            "sub-question (the child sees your variables; put data there, or slice it in `context_code`)"
        )
    if len(context_code) > MAX_CONTEXT_CODE_CHARS:
        return (
            f"`context_code` is {len(context_code):,} characters, over the limit of {MAX_CONTEXT_CODE_CHARS:,}: "
            "compute the data in a cell first (the child inherits your variables) and keep `context_code` short"
        )
    return None


async def _run_child(state: SessionState, prompt: str, context_code: str) -> str:
    cfg = state.inp.config
    if reusing_child(state, state.counters.recursions + 1):
        return await _reused_child(state, prompt)
    alloc = state.ledger.child_allocation(cfg.child_budget_fraction)
    if alloc is None:
        return "REFUSED: the budget is spent; no child session can be started. Give your final answer."
    export = await state.export_namespace()
    state.counters.recursions += 1
    child_id = f"{state.session_id}.r{state.counters.recursions}"
    child_inp = state.inp.model_copy(
        update={
            "question": prompt,
            "config": cfg.model_copy(update={"max_tokens": alloc.tokens, "max_requests": alloc.requests}),
            "depth": state.inp.depth + 1,
            "parent_workflow_id": state.session_id,
            "inherit_ref": export.export_ref,
            "context_code": context_code,
            "continuation": None,
            "rerun": None,
        }
    )
    state.phase, state.last_event = "waiting for child", child_id
    handle = await workflow.start_child_workflow(
        WORKFLOW_NAME,
        child_inp,
        id=child_id,
        result_type=ReflectorOutput,
        parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
        task_timeout=workflow.info().task_timeout,
        **child_visibility(child_inp, state.session_id),
    )
    out: ReflectorOutput = await await_cancel_safe(handle)
    state.phase = "thinking"
    records = [UsageRecord.model_validate(r) for r in out.raw.get("usage_records", [])]
    state.ledger.charge(*records)
    rt = out.raw.get("rr_trace", {})
    state.subagent_calls.append(
        {
            "prompt": prompt,
            "child_workflow_id": child_id,
            "depth": state.inp.depth + 1,
            "allocation": alloc.model_dump(),
            "usage": out.raw.get("usage", {}),
            "cut_short": bool(rt.get("timed_out")),
            "stop_reason": rt.get("stop_reason"),
            "skipped_variables": export.skipped,
        }
    )
    if out.raw.get("context_error"):
        raise ModelRetry(f"context_code failed in the child session: {out.raw['context_error']}")
    rendered = _render_child(child_id, out)
    too_big = [name for name in export.skipped if " " in name]  # size refusals carry their reason
    if too_big:
        rendered += "\n(not handed down to the child: " + "; ".join(too_big) + ")"
    return rendered


async def _reused_child(state: SessionState, prompt: str) -> str:
    """`rr rerun`: the origin's child of this recursion number and what its session was told (no new child,
    nothing charged: the origin paid for it)."""
    state.counters.recursions += 1
    child = await reused_child(state, state.counters.recursions)
    out, rt = child.output, child.output.raw.get("rr_trace", {})
    call = dict(child.call) or {
        "prompt": prompt,
        "child_workflow_id": child.workflow_id,
        "depth": state.inp.depth + 1,
        "usage": out.raw.get("usage", {}),
        "cut_short": bool(rt.get("timed_out")),
        "stop_reason": rt.get("stop_reason"),
    }
    state.subagent_calls.append({**call, "reused_from": child.workflow_id})
    if out.raw.get("context_error"):
        raise ModelRetry(f"context_code failed in the child session: {out.raw['context_error']}")
    rendered = _render_child(child.workflow_id, out)
    too_big = [name for name in call.get("skipped_variables") or [] if " " in name]
    if too_big:
        rendered += "\n(not handed down to the child: " + "; ".join(too_big) + ")"
    return rendered


def child_visibility(child: ReflectionInput, parent_id: str) -> dict[str, Any]:
    """A child's search attributes and memo (only where the namespace has rr's attributes: the input says so).

    The child shows its parent's trace name and belongs to its parent's batch, if any."""
    if not child.search_attributes:
        return {}
    shown = sa.memo_of(workflow.memo())
    batch = workflow.info().typed_search_attributes.get(sa.BATCH_ID)
    return {
        "search_attributes": sa.start_attributes(
            child.config.model, trace_sha256=child.trace.sha256, parent=parent_id, batch_id=batch
        ),
        "memo": sa.memo(child.trace, str(shown.get("trace", ""))),
    }


def _render_child(child_id: str, out: ReflectorOutput) -> str:
    rt, usage = out.raw.get("rr_trace", {}), out.raw.get("usage", {})
    lines = [
        f"Child reflection {child_id} (stop: {rt.get('stop_reason')}, requests {usage.get('requests', 0)}, "
        f"tokens {usage.get('total_tokens', 0)}):",
        f"- what went wrong: {out.error_identification}",
        f"- root cause: {out.root_cause_analysis}",
        f"- key insight: {out.key_insight}",
    ]
    for i, learning in enumerate(out.extracted_learnings, 1):
        lines.append(f"- learning {i}: {learning.learning} (evidence: {learning.evidence})")
    return "\n".join(lines)[:6_000]


# ------------------------------------------------------------------------------------ skillbook


async def _has_skillbook(ctx: RunContext[ReflectorDeps], tool_def: ToolDefinition) -> ToolDefinition | None:
    return tool_def if ctx.deps.has_skillbook else None


async def _look_up(tool: str, arg: str = "") -> str | None:
    """A skillbook blob's answer (`SkillbookRef`: a local activity parses it, never workflow code); None for an
    inline skillbook (inputs recorded before the blob: the tools parse it here, as they did)."""
    state = current_state()
    ref = state.inp.skillbook_ref
    if ref is None:
        return None
    if len(arg) > MAX_SKILL_QUERY_CHARS:
        raise ModelRetry(
            f"the argument is {len(arg):,} characters, over the limit of {MAX_SKILL_QUERY_CHARS:,}: "
            "pass one skill id or a few words"
        )
    answer: str = await await_cancel_safe(
        workflow.start_local_activity(
            SKILL_LOOKUP_ACTIVITY,
            SkillLookupInput(skillbook=ref, tool=tool, arg=arg),
            result_type=str,
            start_to_close_timeout=timedelta(seconds=120),
            retry_policy=CELL_RETRY,
            summary=tool,
        )
    )
    return answer


@toolset.tool(name=SKILL_TOOLS[0], metadata={"temporal": False}, prepare=_has_skillbook)
async def list_skill_sections(ctx: RunContext[ReflectorDeps]) -> str:
    """List the skillbook's sections with their skill ids."""
    answer = await _look_up(SKILL_TOOLS[0])
    if answer is not None:
        return answer
    sections: dict[str, list[str]] = {}
    for skill in parse_skillbook(current_state().inp.skillbook):
        sections.setdefault(skill.section or "(no section)", []).append(skill.id)
    return "\n".join(f"{name}: {', '.join(ids)}" for name, ids in sections.items()) or "(no skills)"


@toolset.tool(name=SKILL_TOOLS[1], metadata={"temporal": False}, prepare=_has_skillbook)
async def get_skill(ctx: RunContext[ReflectorDeps], skill_id: str) -> str:
    """Get one skill by its exact id (e.g. `section-00001`, without brackets).

    Args:
        skill_id: The exact skill id.
    """
    answer = await _look_up(SKILL_TOOLS[1], skill_id)
    if answer is not None:
        return answer
    wanted = skill_id.strip().strip("[]")
    for skill in parse_skillbook(current_state().inp.skillbook):
        if skill.id == wanted:
            return f"[{skill.id}] ({skill.section}) {skill.text}"
    return f"NOT FOUND: no skill has the exact id {wanted!r}."


@toolset.tool(name=SKILL_TOOLS[2], metadata={"temporal": False}, prepare=_has_skillbook)
async def search_skills(ctx: RunContext[ReflectorDeps], query: str) -> str:
    """Search skills whose text contains every word of `query` (case-insensitive).

    Args:
        query: Words to look for.
    """
    answer = await _look_up(SKILL_TOOLS[2], query)
    if answer is not None:
        return answer
    words = query.lower().split()
    hits = [
        f"[{s.id}] {s.text}"
        for s in parse_skillbook(current_state().inp.skillbook)
        if all(w in s.text.lower() for w in words)
    ]
    return "\n".join(hits[:20]) or "(no skill matches)"
