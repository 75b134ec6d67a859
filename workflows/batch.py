"""`BatchReflectionWorkflow`: one child `ReflectionWorkflow` per run of a batch, then a synthesis.

Deterministic orchestration only; every read and write of the blob store is a local activity
(`activities/batch.py`). Within Temporal's limits at any batch size:

- the list of runs is a manifest blob, read page by page (`page_size` runs per activity) from a byte
  offset carried in the cursor; the workflow input holds only its reference;
- children run `concurrency` at a time; each one's id is `<batch id>.run<index>`, so after a crash the
  replayed parent finds every child it started in its history and never starts one again;
- each finished child's compact record goes to the blob store (`record_run`, a local activity: the
  child's reflection is handed over in process, the history keeps the record's sha256), and at the end of
  a chunk the chunk's records become one page blob;
- every `children_per_run` children (or earlier when the server suggests it) the workflow waits for the
  children in flight, writes the page and continues as new with the cursor (next run, manifest offset,
  counters, page references): one run's history holds at most `children_per_run` children;
- the synthesis is computed from the records by an activity (never from reflections in a prompt); for
  an LLM model one more child `ReflectionWorkflow` (`<batch id>.synthesis`) reflects on all the records,
  uploaded as one JSON blob, with code.

A run that cannot be reflected on (its trace was broken, or its child failed) is recorded as failed;
the batch goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from reflector.analysis.batch.synthesis import llm_feedback, llm_question
    from reflector.contract import (
        BATCH_WORKFLOW_NAME,
        CANCEL_PATCH,
        PROGRESS_QUERY,
        READ_MANIFEST_ACTIVITY,
        RECORD_RUN_ACTIVITY,
        SEARCH_ATTRIBUTES_PATCH,
        SYNTHESISE_BATCH_ACTIVITY,
        WORKFLOW_NAME,
        WRITE_RECORDS_ACTIVITY,
        BatchCursor,
        BatchInput,
        BatchOutput,
        BatchProgress,
        BatchRun,
        ManifestPage,
        ReadManifestInput,
        RecordRunInput,
        ReflectionInput,
        ReflectorOutput,
        SynthesiseBatchInput,
        SynthesiseBatchResult,
        WriteRecordsInput,
    )
    from reflector.runtime import search_attributes as sa
    from reflector.runtime.models import is_llm
    from workflows.activity_options import BATCH_ACTIVITY_TIMEOUT, BATCH_RETRY
    from workflows.patches import begin, patch_on
    from workflows.state import await_cancel_safe, clear_cancellation

__all__ = ["BatchReflectionWorkflow", "child_id"]

T = TypeVar("T")


def child_id(batch_id: str, index: int) -> str:
    """The workflow id of the reflection of run `index` of a batch (deterministic: a replay finds it)."""
    return f"{batch_id}.run{index}"


def _failure_text(e: BaseException) -> str:
    """The chain of a failure's causes, innermost last, on one line."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None and len(parts) < 5:
        parts.append(f"{type(cause).__name__}: {getattr(cause, 'message', None) or cause}")
        cause = getattr(cause, "cause", None) or cause.__cause__
    return " <- ".join(parts)[:1_000]


@workflow.defn(name=BATCH_WORKFLOW_NAME, sandboxed=False)
class BatchReflectionWorkflow:
    """A batch of reflections (see the module docstring).

    Outside Temporal's Python sandbox like `ReflectionWorkflow` (same guards: the lint rule against
    clocks and randomness, tests with `max_cached_workflows=0`, replay of recorded histories).
    """

    @workflow.init
    def __init__(self, inp: BatchInput) -> None:
        self.cursor: BatchCursor = (inp.cursor or BatchCursor()).model_copy(deep=True)
        self.total = inp.manifest.n_runs
        self.running = 0
        self.phase = "starting"
        self.last_event = ""

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> BatchProgress:
        return BatchProgress(
            phase=self.phase,
            total=self.total,
            done=self.cursor.reflected,
            running=self.running,
            failed=self.cursor.failed,
            continued_as_new=self.cursor.runs - 1,
            last_event=self.last_event,
        )

    @workflow.run
    async def run(self, inp: BatchInput) -> BatchOutput:
        begin()  # every patch decided before the first command (workflows.patches)
        cur = self.cursor
        batch_id = workflow.info().workflow_id
        stop = min(self.total, cur.next_index + inp.children_per_run)
        chunk: dict[int, str] = {}
        tasks: list[asyncio.Task[None]] = []
        self.phase = "reflecting"
        cancelled = False
        try:
            while cur.next_index < stop:
                page = await self._local(
                    READ_MANIFEST_ACTIVITY,
                    ReadManifestInput(
                        manifest=inp.manifest,
                        offset=cur.offset,
                        first_index=cur.next_index,
                        limit=min(inp.page_size, stop - cur.next_index),
                    ),
                    ManifestPage,
                    "read manifest page",
                )
                if not page.runs:
                    raise ApplicationError(
                        f"the manifest ends at run {cur.next_index} of {self.total}", non_retryable=True
                    )
                for run in page.runs:
                    await workflow.wait_condition(lambda: self.running < inp.concurrency)
                    self.running += 1
                    tasks.append(asyncio.create_task(self._reflect_run(inp, batch_id, run, chunk)))
                cur.next_index += len(page.runs)
                cur.offset = page.next_offset
                if workflow.info().is_continue_as_new_suggested():  # the server finds the history large
                    stop = cur.next_index
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            # `rr cancel`: start no more runs; each running child is asked to cancel and returns its findings so
            # far (recorded like any reflection); runs not started yet stay unreflected
            if not patch_on(CANCEL_PATCH):
                raise
            clear_cancellation()
            cancelled, self.phase = True, "cancelling"
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
        if chunk:
            records = WriteRecordsInput(batch_id=batch_id, records=[chunk[i] for i in sorted(chunk)])
            cur.record_pages.append(
                await self._local(WRITE_RECORDS_ACTIVITY, records, str, "write record page")
            )
        if cancelled:
            return await self._finish(inp, batch_id, cancelled=True)
        if cur.next_index < self.total:
            self.phase = "continuing as new"
            workflow.continue_as_new(
                inp.model_copy(update={"cursor": cur.model_copy(update={"runs": cur.runs + 1})})
            )
        return await self._finish(inp, batch_id)

    async def _reflect_run(
        self, inp: BatchInput, batch_id: str, run: BatchRun, chunk: dict[int, str]
    ) -> None:
        """Reflect on one run in a child workflow and store its record; a failure is recorded, not raised."""
        wf_id: str | None = None
        out: ReflectorOutput | None = None
        error = run.error
        try:
            if error is None and run.trace is None:
                error = "the manifest lists no trace for this run"
            if error is None and run.trace is not None:
                wf_id = child_id(batch_id, run.index)
                child = ReflectionInput(
                    trace=run.trace,
                    skillbook=inp.skillbook,
                    mode=inp.mode,
                    config=inp.config,
                    parent_workflow_id=batch_id,
                    search_attributes=inp.search_attributes,
                    skillbook_ref=inp.skillbook_ref,
                )
                try:
                    out = await workflow.execute_child_workflow(
                        WORKFLOW_NAME,
                        child,
                        id=wf_id,
                        result_type=ReflectorOutput,
                        parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                        task_timeout=workflow.info().task_timeout,
                        **_child_visibility(child, batch_id, run.source or run.run_id),
                    )
                except ChildWorkflowError as e:
                    error = f"the reflection failed: {_failure_text(e.cause or e)}"
                except WorkflowAlreadyStartedError:
                    error = f"a workflow with id {wf_id} is already running (not started again)"
            record = RecordRunInput(batch_id=batch_id, run=run, workflow_id=wf_id, output=out, error=error)
            chunk[run.index] = await self._local(RECORD_RUN_ACTIVITY, record, str, f"record run {run.index}")
            if out is not None:
                usage = out.raw.get("usage", {})
                self.cursor.requests += int(usage.get("requests", 0))
                self.cursor.total_tokens += int(usage.get("total_tokens", 0))
            if error is None:
                self.cursor.reflected += 1
            else:
                self.cursor.failed += 1
            self.last_event = f"run {run.index} ({run.run_id}) {'reflected' if error is None else 'failed'}"
        finally:
            self.running -= 1

    async def _finish(self, inp: BatchInput, batch_id: str, *, cancelled: bool = False) -> BatchOutput:
        cur = self.cursor
        self.phase = "synthesising"
        res = await self._local(
            SYNTHESISE_BATCH_ACTIVITY,
            SynthesiseBatchInput(batch_id=batch_id, record_pages=list(cur.record_pages), n_runs=self.total),
            SynthesiseBatchResult,
            "synthesise",
        )
        want_llm = inp.llm_synthesis if inp.llm_synthesis is not None else is_llm(inp.config.model)
        llm_out: ReflectorOutput | None = None
        llm_error: str | None = None
        if want_llm and res.synthesis.reflected and not cancelled:
            self.phase = "LLM synthesis over the run records"
            synth = ReflectionInput(
                trace=res.records,
                question=llm_question(self.total),
                feedback=llm_feedback(res.synthesis),
                mode="offline",
                config=inp.config,
                parent_workflow_id=batch_id,
                search_attributes=inp.search_attributes,
            )
            try:
                llm_out = await workflow.execute_child_workflow(
                    WORKFLOW_NAME,
                    synth,
                    id=f"{batch_id}.synthesis",
                    result_type=ReflectorOutput,
                    parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                    task_timeout=workflow.info().task_timeout,
                    **_child_visibility(synth, batch_id, "run records"),
                )
            except ChildWorkflowError as e:
                llm_error = _failure_text(e.cause or e)
        self.phase = "done"
        out = BatchOutput(
            batch_id=batch_id,
            model=inp.config.model,
            n_runs=self.total,
            reflected=cur.reflected,
            failed=cur.failed,
            continued_as_new=cur.runs - 1,
            synthesis=res.synthesis,
            records=res.records,
            llm_synthesis=llm_out,
            llm_synthesis_error=llm_error,
            cancelled=cancelled,
        )
        if inp.search_attributes and patch_on(SEARCH_ATTRIBUTES_PATCH):
            complete = out.failed == 0 and out.synthesis.incomplete_reflections == 0
            workflow.upsert_search_attributes(
                sa.end_updates(
                    "cancelled" if cancelled else "completed" if complete else "incomplete",
                    requests=cur.requests,
                    tokens=cur.total_tokens,
                    children=cur.reflected + cur.failed,
                )
            )
        return out

    async def _local(self, name: str, arg: Any, result_type: type[T], summary: str) -> T:
        # a cancellation (`rr cancel`) arriving meanwhile is raised as such once the activity is resolved
        result: T = await await_cancel_safe(
            workflow.start_local_activity(
                name,
                arg,
                result_type=result_type,
                start_to_close_timeout=BATCH_ACTIVITY_TIMEOUT,
                retry_policy=BATCH_RETRY,
                summary=summary,
            )
        )
        return result


def _child_visibility(child: ReflectionInput, batch_id: str, source: str) -> dict[str, Any]:
    """A run's search attributes and memo (only where the namespace has rr's attributes: the input says so)."""
    if not child.search_attributes or child.trace is None:
        return {}
    return {
        "search_attributes": sa.start_attributes(
            child.config.model, trace_sha256=child.trace.sha256, parent=batch_id, batch_id=batch_id
        ),
        "memo": sa.memo(child.trace, source),
    }
