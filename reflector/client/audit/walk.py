"""Walking one session's histories for its audit (`reflector.client.audit.build` says what is found): each
event of each run in order, with what spans events and runs (pending tool calls, scheduled activities and
their attempts, children, the budget spent so far)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent

from reflector.client.audit.capture import RequestInput, summarise_messages
from reflector.client.audit.events import (
    _CHILD_END,
    _END_STATUS,
    _WT_EVENTS,
    event_time,
    failure_text,
    first_json,
    local_activity,
    payload_json,
)
from reflector.client.audit.histories import RunHistory
from reflector.client.audit.outcome import fill_reflection
from reflector.client.audit.timeline import (
    BudgetPoint,
    CellItem,
    ChildItem,
    CompactionItem,
    IncidentItem,
    ModelRequestItem,
    RunItem,
    Session,
    ToolCall,
)
from reflector.contract import (
    AGENT_NAME,
    EXECUTE_CODE_TOOL,
    PREFILL_CODE,
    PREPARE_ACTIVITY,
    RECURSE_TOOL,
    RERUN_CELL_ACTIVITY,
    RERUN_CHILD_ACTIVITY,
    RERUN_RESPONSE_ACTIVITY,
    RERUN_SUMMARY_ACTIVITY,
    RUN_CELL_ACTIVITY,
    SUMMARISE_ACTIVITY,
)

__all__ = ["SessionWalk"]


def _agent_of(activity_type: str) -> str:
    parts = activity_type.split("__")
    return parts[1] if len(parts) >= 3 else activity_type


def _is_model_request(activity_type: str) -> bool:
    return "model_request" in activity_type


@dataclass
class SessionWalk:
    """Walks the runs of one session in order; keeps what spans events (and runs)."""

    session: Session
    blob_dir: Path
    step: int = 0
    requests: int = 0
    tokens: int = 0
    seq: int = 0
    pending_code: list[ToolCall] = field(default_factory=list)
    pending_recurse: list[ToolCall] = field(default_factory=list)
    archive_ref: str | None = None  # set by a summary: the next cell is the workflow's archive cell
    children: dict[int, ChildItem] = field(default_factory=dict)
    scheduled: dict[int, tuple[str, Any]] = field(default_factory=dict)  # event id -> (type, input)
    attempts: dict[int, int] = field(default_factory=dict)
    last_worker: str = ""
    last_progress: float | None = None
    captures: list[RequestInput] = field(default_factory=list)
    cap_index: int = 0
    outputs: dict[int, str] = field(default_factory=dict)

    # -------------------------------------------------------------------------------- budget

    def _charge(self, event_id: int, label: str, requests: int, tokens: int) -> None:
        self.requests += requests
        self.tokens += tokens
        self.session.budget.append(
            BudgetPoint(event_id=event_id, label=label, requests=self.requests, tokens=self.tokens)
        )

    # -------------------------------------------------------------------------------- runs

    def run(self, index: int, run: RunHistory, captures: list[RequestInput]) -> None:
        self.captures, self.cap_index = captures, 0
        self.scheduled, self.attempts = {}, {}
        self.session.run_ids.append(run.run_id)
        self.session.events += len(run.history.events)
        for event in run.history.events:
            self._event(event, index, run)

    def _event(self, e: HistoryEvent, index: int, run: RunHistory) -> None:
        et = e.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            self._started(e, index, run)
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            self._task_started(e)
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            wt = e.workflow_task_timed_out_event_attributes
            self._incident(
                e, "workflow task timed out", TimeoutType.Name(wt.timeout_type).removeprefix("TIMEOUT_TYPE_")
            )
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            wf = e.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(wf.cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
            self._incident(
                e, "workflow task failed", f"{cause}: {failure_text(wf.failure)}", worker=wf.identity
            )
        elif et == EventType.EVENT_TYPE_MARKER_RECORDED:
            self._marker(e)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            inputs = [payload_json(p, self.blob_dir) for p in a.input.payloads]
            self.scheduled[e.event_id] = (a.activity_type.name, inputs)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            self._activity_started(e)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            c = e.activity_task_completed_event_attributes
            self._activity_done(e, c.scheduled_event_id, first_json(c.result, self.blob_dir), None)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            f = e.activity_task_failed_event_attributes
            self._activity_done(e, f.scheduled_event_id, None, failure_text(f.failure))
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            t = e.activity_task_timed_out_event_attributes
            self._activity_done(e, t.scheduled_event_id, None, "timed out: " + failure_text(t.failure))
        elif et == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            self._child_started(e)
        elif et in _CHILD_END:
            self._child_ended(e, *_CHILD_END[et])
        elif et in _END_STATUS:
            self._ended(e, _END_STATUS[et])
        if et not in _WT_EVENTS:
            self.last_progress = event_time(e)

    def _started(self, e: HistoryEvent, index: int, run: RunHistory) -> None:
        a = e.workflow_execution_started_event_attributes
        inp = first_json(a.input, self.blob_dir) or {}
        s = self.session
        cont = inp.get("continuation") if isinstance(inp, dict) else None
        if not s.run_ids[:-1] and isinstance(inp, dict):
            s.question = str(inp.get("question", ""))
            s.depth = int(inp.get("depth", 0) or 0)
            s.parent_workflow_id = inp.get("parent_workflow_id")
            s.model = str((inp.get("config") or {}).get("model", ""))
            s.trace = dict(inp.get("trace") or {})
        if isinstance(cont, dict):
            self.seq = int(cont.get("seq", self.seq) or self.seq)
            self.outputs.update({int(k): str(v) for k, v in (cont.get("cell_outputs") or {}).items()})
        reason = "continued as new" if a.continued_execution_run_id or index > 0 or cont else ""
        s.items.append(RunItem(event_id=e.event_id, index=index, run_id=run.run_id, reason=reason))

    def _task_started(self, e: HistoryEvent) -> None:
        worker = e.workflow_task_started_event_attributes.identity
        if self.last_worker and worker and worker != self.last_worker:
            gap = event_time(e) - self.last_progress if self.last_progress is not None else None
            self._incident(
                e,
                "worker changed",
                f"{self.last_worker} -> {worker}",
                worker=worker,
                previous=self.last_worker,
                gap_s=gap,
            )
        if worker:
            self.last_worker = worker

    def _incident(
        self,
        e: HistoryEvent,
        what: str,
        detail: str,
        *,
        worker: str = "",
        previous: str = "",
        gap_s: float | None = None,
    ) -> None:
        self.session.items.append(
            IncidentItem(
                event_id=e.event_id,
                what=what,
                detail=detail,
                worker=worker,
                previous_worker=previous,
                gap_s=None if gap_s is None else round(gap_s, 3),
            )
        )

    # -------------------------------------------------------------------------------- activities

    def _marker(self, e: HistoryEvent) -> None:
        m = local_activity(e, self.blob_dir)
        if m is None:
            return
        if m.attempt > 1:
            self._incident(
                e,
                "local activity retried",
                f"{m.activity_type}: {m.attempt} attempts" + (f"; failed: {m.failure}" if m.failure else ""),
            )
        elif m.failure:
            self._incident(e, "local activity failed", f"{m.activity_type}: {m.failure}")
        self._dispatch(e.event_id, m.activity_type, m.attempt, m.result, m.failure, local=True, inputs=None)

    def _activity_started(self, e: HistoryEvent) -> None:
        a = e.activity_task_started_event_attributes
        self.attempts[a.scheduled_event_id] = a.attempt
        if a.attempt > 1:
            name = self.scheduled.get(a.scheduled_event_id, ("?", None))[0]
            last = failure_text(a.last_failure) if a.HasField("last_failure") else "unknown"
            self._incident(
                e,
                "activity retried",
                f"{name}: attempt {a.attempt} (last failure: {last})",
                worker=a.identity,
            )

    def _activity_done(self, e: HistoryEvent, scheduled_id: int, result: Any, failure: str | None) -> None:
        name, inputs = self.scheduled.get(scheduled_id, ("?", None))
        attempts = self.attempts.get(scheduled_id, 1)
        if failure is not None:
            self._incident(
                e,
                "activity timed out" if failure.startswith("timed out") else "activity failed",
                f"{name} after {attempts} attempt(s): {failure}",
            )
        self._dispatch(e.event_id, name, attempts, result, failure, local=False, inputs=inputs)

    def _dispatch(
        self,
        event_id: int,
        name: str,
        attempts: int,
        result: Any,
        failure: str | None,
        *,
        local: bool,
        inputs: Any,
    ) -> None:
        value = result if isinstance(result, dict) else {}
        if _is_model_request(name) or name == RERUN_RESPONSE_ACTIVITY:
            self._model_request(event_id, name, attempts, result, failure, local, inputs)
        elif name in (RUN_CELL_ACTIVITY, RERUN_CELL_ACTIVITY):
            self._cell(event_id, attempts, value, failure, reused=name == RERUN_CELL_ACTIVITY)
        elif name == PREPARE_ACTIVITY:
            self._prefill(event_id, attempts, value, failure)
        elif name in (SUMMARISE_ACTIVITY, RERUN_SUMMARY_ACTIVITY):
            self._summary(event_id, attempts, value, failure, reused=name == RERUN_SUMMARY_ACTIVITY)
        elif name == RERUN_CHILD_ACTIVITY:
            self._reused_child(event_id, value)

    def _model_request(
        self,
        event_id: int,
        name: str,
        attempts: int,
        response: Any,
        failure: str | None,
        local: bool,
        inputs: Any,
    ) -> None:
        self.step += 1
        given = self.captures[self.cap_index] if self.cap_index < len(self.captures) else None
        self.cap_index += 1
        # a regular activity's input is what was really sent (the replay rebuilds it with today's code)
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict) and "messages" in inputs[0]:
            wire = inputs[0]
            mrp = wire.get("model_request_parameters") or {}
            tools = [
                str(t.get("name"))
                for key in ("function_tools", "output_tools")
                for t in mrp.get(key, []) or []
                if isinstance(t, dict)
            ]
            given = summarise_messages(wire.get("messages") or [], tools, "activity input")
        reused = name == RERUN_RESPONSE_ACTIVITY
        item = ModelRequestItem(
            event_id=event_id,
            step=self.step,
            agent=AGENT_NAME if reused else _agent_of(name),
            path="reused" if reused else "local activity" if local else "activity",
            attempts=attempts,
            given=given,
            failed=failure,
        )
        if isinstance(response, dict):
            item.model = str(response.get("model_name") or "")
            for part in response.get("parts") or []:
                kind = part.get("part_kind")
                if kind == "tool-call":
                    item.tool_calls.append(
                        ToolCall(
                            tool=str(part.get("tool_name", "")),
                            call_id=str(part.get("tool_call_id") or ""),
                            args=part.get("args") if part.get("args") is not None else {},
                        )
                    )
                elif kind == "text":
                    item.text += str(part.get("content", ""))
            usage = response.get("usage") or {}
            item.input_tokens = int(usage.get("input_tokens", 0) or 0)
            item.output_tokens = int(usage.get("output_tokens", 0) or 0)
        self.pending_code = [c for c in item.tool_calls if c.tool == EXECUTE_CODE_TOOL]
        self.pending_recurse = [c for c in item.tool_calls if c.tool == RECURSE_TOOL]
        self.session.items.append(item)
        if (
            failure is None and not reused
        ):  # a reused step was paid by the origin (the ledger does not charge it)
            self._charge(event_id, f"request {self.step}", 1, item.input_tokens + item.output_tokens)

    def _next_call(self) -> ToolCall | None:
        """The `execute_code` call a cell ran for: the next one the loop guard did not refuse (as the
        following request's tool results show)."""
        following = self.captures[self.cap_index] if self.cap_index < len(self.captures) else None
        while self.pending_code:
            call = self.pending_code.pop(0)
            if following is None or call.call_id not in following.refused_calls:
                return call
        return None

    def _cell(
        self, event_id: int, attempts: int, out: dict[str, Any], failure: str | None, *, reused: bool = False
    ) -> None:
        seq = int(out.get("seq") or 0) or self.seq + 1
        self.seq = seq
        item = CellItem(
            event_id=event_id,
            workflow_id=self.session.workflow_id,
            seq=seq,
            attempts=attempts,
            ok=bool(out.get("ok", failure is None)),
            output=str(out.get("output", "")),
            error=out.get("error") or failure,
            duration_ms=float(out.get("duration_ms", 0.0) or 0.0),
            host_restarted=bool(out.get("host_restarted")),
            cells_replayed=int(out.get("cells_replayed", 0) or 0),
            truncated=bool(out.get("truncated")),
            submitted=out.get("submitted") is not None,
            reused=reused,
        )
        if self.archive_ref is not None:
            item.origin, item.code = "compaction", f'history.extend(ARCHIVE("{self.archive_ref}"))'
            self.archive_ref = None
        else:
            call = self._next_call()
            if call is not None:
                item.call_id = call.call_id
                item.code = str(call.args.get("code", "")) if isinstance(call.args, dict) else call.args
            self.outputs[seq] = item.output
        self.session.items.append(item)

    def _prefill(self, event_id: int, attempts: int, prep: dict[str, Any], failure: str | None) -> None:
        seq = 1  # the prefill is cell 1; the workflow's own cells start after `next_seq - 1`
        self.seq = int(prep.get("next_seq", 2) or 2) - 1
        shown = str(
            prep.get("preview", "")
        )  # what the prefill printed (the task prompt shows its first 4,000 chars)
        self.outputs[seq] = shown
        self.session.items.append(
            CellItem(
                event_id=event_id,
                workflow_id=self.session.workflow_id,
                seq=seq,
                code=PREFILL_CODE,
                origin="prefill",
                ok=failure is None and prep.get("context_error") is None,
                output=shown,
                attempts=attempts,
                error=failure or prep.get("context_error"),
            )
        )

    def _summary(
        self, event_id: int, attempts: int, res: dict[str, Any], failure: str | None, *, reused: bool = False
    ) -> None:
        item = CompactionItem(
            event_id=event_id,
            summary=str(res.get("summary", failure or "")),
            archive_ref=str(res.get("archive_ref", "")),
            model=str(res.get("model", "")),
            input_tokens=int(res.get("input_tokens", 0) or 0),
            output_tokens=int(res.get("output_tokens", 0) or 0),
            attempts=attempts,
            reused=reused,
        )
        self.session.items.append(item)
        if failure is None:
            self.archive_ref = item.archive_ref
            if not reused:
                self._charge(event_id, "summary", 1, item.input_tokens + item.output_tokens)

    # -------------------------------------------------------------------------------- children

    def _child_started(self, e: HistoryEvent) -> None:
        a = e.start_child_workflow_execution_initiated_event_attributes
        inp = first_json(a.input, self.blob_dir) or {}
        call = self.pending_recurse.pop(0) if self.pending_recurse else None
        item = ChildItem(
            event_id=e.event_id,
            workflow_id=a.workflow_id,
            call_id=call.call_id if call else "",
            prompt=str(inp.get("question", "")) if isinstance(inp, dict) else "",
            context_code=str(inp.get("context_code", "")) if isinstance(inp, dict) else "",
        )
        self.children[e.event_id] = item
        self.session.items.append(item)

    def _reused_child(self, event_id: int, value: dict[str, Any]) -> None:
        """`rr rerun`: the origin's child, answered from the prefix (no child workflow runs)."""
        out = value.get("output") or {}
        raw = out.get("raw", {}) if isinstance(out, dict) else {}
        call = self.pending_recurse.pop(0) if self.pending_recurse else None
        usage = raw.get("usage", {}) or {}
        self.session.items.append(
            ChildItem(
                event_id=event_id,
                workflow_id=str(value.get("workflow_id", "")),
                call_id=call.call_id if call else "",
                prompt=str((value.get("call") or {}).get("prompt", "")),
                status="reused",
                stop_reason=(raw.get("rr_trace") or {}).get("stop_reason"),
                key_insight=str(out.get("key_insight", "")),
                requests=int(usage.get("requests", 0) or 0),
                tokens=int(usage.get("total_tokens", 0) or 0),
                reused=True,
            )
        )

    def _child_ended(self, e: HistoryEvent, status: str, attr: str) -> None:
        a = getattr(e, attr)
        item = self.children.get(a.initiated_event_id)
        if item is None:
            return
        item.status = status
        if status == "completed":
            out = first_json(a.result, self.blob_dir) or {}
            raw = out.get("raw", {}) if isinstance(out, dict) else {}
            usage = raw.get("usage", {}) or {}
            item.stop_reason = (raw.get("rr_trace") or {}).get("stop_reason")
            item.key_insight = str(out.get("key_insight", "")) if isinstance(out, dict) else ""
            item.requests = int(usage.get("requests", 0) or 0)
            item.tokens = int(usage.get("total_tokens", 0) or 0)
            self._charge(e.event_id, f"child {item.workflow_id}", item.requests, item.tokens)
        elif hasattr(a, "failure") and a.HasField("failure"):
            item.stop_reason = failure_text(a.failure)

    # -------------------------------------------------------------------------------- the end

    def _ended(self, e: HistoryEvent, status: str) -> None:
        r = self.session.reflection
        r.status = status
        if status == "completed":
            out = first_json(e.workflow_execution_completed_event_attributes.result, self.blob_dir)
            if isinstance(out, dict):
                fill_reflection(self.session, out, self.outputs)
        elif status == "failed":
            r.failure = failure_text(e.workflow_execution_failed_event_attributes.failure)
