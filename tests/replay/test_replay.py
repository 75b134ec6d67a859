"""Committed histories replay against the current code, and a changed workflow is caught.

The second test proves the check itself: a workflow that makes one different decision (it skips
the prefill cell) must fail replay with a non-determinism error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

import reflector.testing.scripted  # noqa: F401  (the recorded runs used the scripted models)
from reflector.contract import PATCHES_FIRST_PATCH, ReflectionInput, ReflectorOutput
from reflector.runtime.models import prepare_workflow_side
from tests.support.late_resolution import deliver_local_results_late, late_deliveries, patch_ids
from workflows.reflection import WORKFLOW_NAME, ReflectionWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
# provider_v1 was recorded with an OpenAI model (its requests as local activities, before the
# rr-provider-model-activities patch): prepared here as a worker would, so replay imports nothing
prepare_workflow_side(["openai-chat"])


def _load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"recorded-{path.stem}", path.read_text())


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_committed_history_replays(path: Path) -> None:
    result = await Replayer(workflows=[ReflectionWorkflow], plugins=[PydanticAIPlugin()]).replay_workflow(
        _load(path)
    )
    assert result.replay_failure is None


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)  # like ReflectionWorkflow
class AlteredReflectionWorkflow(ReflectionWorkflow):
    """Same name, one changed decision: no prefill cell before the agent loop."""

    @workflow.run
    async def run(self, inp: ReflectionInput) -> ReflectorOutput:
        self.state.init_ref = "0" * 64
        return self._output(None, [], "error", "altered")


async def test_altered_workflow_fails_replay() -> None:
    assert HISTORIES
    replayer = Replayer(workflows=[AlteredReflectionWorkflow], plugins=[PydanticAIPlugin()])
    with pytest.raises(workflow.NondeterminismError):
        await replayer.replay_workflow(_load(HISTORIES[0]))


LATE_SAFE = [p for p in HISTORIES if PATCHES_FIRST_PATCH in patch_ids(json.loads(p.read_text()))]


@pytest.mark.parametrize("path", LATE_SAFE, ids=[p.stem for p in LATE_SAFE])
async def test_committed_history_replays_with_local_results_delivered_late(path: Path) -> None:
    """Histories recorded with every patch decided first also replay in the shape core's heartbeat race
    writes (tests/support/late_resolution.py; workflows/patches.py)."""
    data = json.loads(path.read_text())
    assert late_deliveries(data) > 0
    late = WorkflowHistory.from_json(f"recorded-{path.stem}-late", deliver_local_results_late(data))
    result = await Replayer(workflows=[ReflectionWorkflow], plugins=[PydanticAIPlugin()]).replay_workflow(
        late
    )
    assert result.replay_failure is None
