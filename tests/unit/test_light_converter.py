"""The light payload converter (clients that host no worker) reads and writes what pydantic-ai's does.

`rr status`, `result`, `list`, `cancel`, `export` connect with `LightPayloadConverter` and without pydantic-ai's
plugin (`reflector.runtime.storage.light_converter`). These tests hold it to pydantic-ai's converter (rr's
`SharedPayloadConverter`): the same bytes for rr's inputs and outputs and for pydantic-ai's message types, the
same values back from each other's bytes, and the same values from every payload of the committed replay
histories decoded with the types their workflow and activities declare.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadConverter

from reflector.contract import (
    BatchInput,
    BatchOutput,
    BatchProgress,
    BatchSynthesis,
    CellCitation,
    CellOutcome,
    ExtractedLearning,
    FailedRun,
    FailureMode,
    ManifestRef,
    Progress,
    ReflectionConfig,
    ReflectionInput,
    ReflectorOutput,
    SkillTag,
    TraceRef,
)
from reflector.runtime.settings import Settings
from reflector.runtime.storage.converter import SharedPayloadConverter
from reflector.runtime.storage.light_converter import JOURNAL_CONTEXT, LightPayloadConverter
from reflector.runtime.storage.payloads import data_converter

HISTORIES = sorted((Path(__file__).parents[1] / "replay" / "histories").glob("*.json"))
WHEN = datetime(2026, 12, 6, 4, 30, 15, 123456, tzinfo=UTC)
TRACE = TraceRef(uri="blob:sha256:" + "a" * 64, sha256="a" * 64, size=509, format="ace")


def _same_payload(a: Payload, b: Payload) -> None:
    assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


def _messages() -> list[ModelMessage]:
    """A conversation with every kind of part rr's agent records, files in a prompt and in a tool result."""
    return [
        ModelRequest(
            parts=[
                SystemPromptPart("You reflect on agent traces.", timestamp=WHEN),
                UserPromptPart(
                    [
                        "Reflect on this trace.",
                        ImageUrl("https://example.com/a.png"),
                        BinaryContent(b"\x89PNG", media_type="image/png"),
                    ],
                    timestamp=WHEN,
                ),
            ],
            timestamp=WHEN,
            instructions="Use execute_code.",
            run_id="run-1",
        ),
        ModelResponse(
            parts=[
                ThinkingPart("the trace has 4 steps", signature="sig"),
                TextPart("Looking at the trace."),
                ToolCallPart("execute_code", {"code": "print(len(traces))"}, tool_call_id="call-1"),
            ],
            usage=RequestUsage(input_tokens=120, output_tokens=30, cache_read_tokens=7),
            model_name="heuristic",
            timestamp=WHEN,
            provider_name="rr",
            provider_response_id="resp-1",
            finish_reason="tool_call",
        ),
        ModelRequest(
            parts=[
                ToolReturnPart(
                    "execute_code", {"stdout": "4\n", "ok": True}, tool_call_id="call-1", timestamp=WHEN
                ),
                ToolReturnPart(
                    "look_at",
                    [BinaryContent(b"%PDF-1.7", media_type="application/pdf"), "a file and a text"],
                    tool_call_id="call-2",
                    timestamp=WHEN,
                ),
                ToolReturnPart(
                    "execute_code", "bad arguments", tool_call_id="call-3", outcome="retried", timestamp=WHEN
                ),
            ],
            timestamp=WHEN,
        ),
        ModelResponse(parts=[TextPart("done")], timestamp=WHEN, model_name="heuristic"),
    ]


def _output() -> ReflectorOutput:
    return ReflectorOutput(
        reasoning="The calculator timed out at step 2 and the agent guessed.",
        error_identification="guessed after a tool failure",
        root_cause_analysis="no retry of the failed tool call",
        correct_approach="retry the calculator",
        key_insight="retry failed tools before answering",
        extracted_learnings=[
            ExtractedLearning(learning="retry once", atomicity_score=0.9, evidence="step 2")
        ],
        skill_tags=[SkillTag(id="s-1", tag="harmful")],
        cell_citations=[CellCitation(learning=0, cell=3, exists=True, quote="Error: calculator timed out")],
        raw={"workflow_id": "wf-1", "thoughts": ["a", "b"], "usage": {"requests": 3}},
    )


def _batch_output() -> BatchOutput:
    synthesis = BatchSynthesis(
        method="computed",
        n_runs=3,
        reflected=2,
        failed=1,
        outcomes={"success": 1, "failure": 2},
        mean_reward=0.5,
        failure_modes=[
            FailureMode(
                key="answer_mismatch",
                label="wrong answer",
                runs=2,
                failing_runs=2,
                share=1.0,
                run_ids=["a", "b"],
            )
        ],
        failed_runs=[FailedRun(index=2, run_id="c", error="trace unreadable")],
    )
    return BatchOutput(
        batch_id="batch-1",
        model="heuristic",
        n_runs=3,
        reflected=2,
        failed=1,
        synthesis=synthesis,
        records=TRACE,
        llm_synthesis=_output(),
    )


PYDANTIC_AI_HINTS = (MESSAGES := list[ModelMessage], ModelResponse)
VALUES: list[tuple[Any, Any]] = [
    (
        ReflectionInput(
            trace=TRACE, question="What is 17 * 24?", ground_truth="408", config=ReflectionConfig()
        ),
        ReflectionInput,
    ),
    (_output(), ReflectorOutput),
    (Progress(), Progress),
    (BatchProgress(), BatchProgress),
    (_batch_output(), BatchOutput),
    (CellOutcome(ok=True, output="4\n", submitted={"answer": 408}), CellOutcome),
    (_messages(), MESSAGES),
    (_messages()[1], ModelResponse),
    ({"nested": [1, 2.5, None, "x"], "when": "2026-12-06T04:30:15Z"}, dict[str, Any]),
    ("a plain string", str),
    (None, type(None)),
    (b"\x00\x01 bytes", bytes),
]


def test_the_journal_context_is_pydantic_ais() -> None:
    from pydantic_ai.messages import _JOURNAL_CONTEXT

    assert JOURNAL_CONTEXT == _JOURNAL_CONTEXT


def test_one_instance_each_and_not_a_pydantic_ai_class() -> None:
    assert LightPayloadConverter() is LightPayloadConverter()
    assert SharedPayloadConverter() is SharedPayloadConverter()
    assert not any(c.__module__.startswith("pydantic_ai") for c in LightPayloadConverter.__mro__)


@pytest.mark.parametrize(("value", "hint"), VALUES, ids=[type(v).__name__ for v, _ in VALUES])
def test_the_same_bytes_and_values_both_ways(value: Any, hint: Any) -> None:
    light, shared = LightPayloadConverter(), SharedPayloadConverter()
    [by_light] = light.to_payloads([value])
    [by_shared] = shared.to_payloads([value])
    _same_payload(by_light, by_shared)
    # each reads what either wrote as the same value (for rr's models: the value written; pydantic-ai's message
    # types come back as pydantic-ai's own converter gives them, e.g. an image's BinaryContent as BinaryImage)
    decoded = [conv.from_payloads([p], [hint])[0] for conv in (shared, light) for p in (by_shared, by_light)]
    assert all(d == decoded[0] for d in decoded)
    if hint not in PYDANTIC_AI_HINTS:
        assert decoded[0] == value
    [again_light] = light.to_payloads([decoded[0]])
    [again_shared] = shared.to_payloads([decoded[0]])
    _same_payload(again_light, again_shared)


def test_a_tool_result_recorded_before_file_records_decodes_with_pydantic_ais_journal_context() -> None:
    """pydantic-ai decodes its journal with a context that rebuilds the files of tool results written before results
    recorded their files; without it, such a file stays a plain mapping. The light converter uses that context too."""
    msgs = [
        ModelRequest(
            parts=[
                ToolReturnPart(
                    "look_at",
                    [
                        ImageUrl("s3://bucket/a.png"),
                        ImageUrl("https://example.com/b.png", force_download=True),
                    ],
                    tool_call_id="call-1",
                    timestamp=WHEN,
                )
            ],
            timestamp=WHEN,
        )
    ]
    [payload] = SharedPayloadConverter().to_payloads([msgs])
    old = json.loads(payload.data)
    for part in old[0]["parts"]:
        part.pop("content_file_digests")  # as written before pydantic-ai recorded them
    payload = Payload(metadata=payload.metadata, data=json.dumps(old).encode())
    [by_shared] = SharedPayloadConverter().from_payloads([payload], [MESSAGES])
    [by_light] = LightPayloadConverter().from_payloads([payload], [MESSAGES])
    assert by_light == by_shared
    assert [type(c) for c in by_light[0].parts[0].content] == [ImageUrl, ImageUrl]  # rebuilt, not mappings


def test_a_batch_input_and_the_external_storage_reference_are_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the whole data converter (blob offloading included): a payload over the threshold becomes the same
    reference to the same blob either way."""
    import asyncio

    monkeypatch.setenv("RR_HOME", str(tmp_path))
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    monkeypatch.delenv("RR_BLOB_URL", raising=False)
    monkeypatch.setenv("RR_PAYLOAD_THRESHOLD_BYTES", "1024")
    settings = Settings.from_env()
    big = _output().model_copy(update={"reasoning": "why " * 2000})
    batch = BatchInput(manifest=ManifestRef(sha256="b" * 64, size=2048, n_runs=3), concurrency=2)
    full, light = data_converter(settings), data_converter(settings, light=True)
    assert full.payload_converter_class is SharedPayloadConverter
    assert light.payload_converter_class is LightPayloadConverter

    async def both() -> None:
        for value, hint in ((big, ReflectorOutput), (batch, BatchInput)):
            a, b = await full.encode([value]), await light.encode([value])
            assert len(a) == len(b) == 1
            _same_payload(a[0], b[0])
            assert await light.decode(a, [hint]) == await full.decode(b, [hint]) == [value]
        stored = await full.encode([big])
        assert stored[0].metadata["encoding"] == b"json/protobuf"  # a reference, not the value

    asyncio.run(both())


# ----------------------------------------------------------------------------------------------------------
# every payload of the committed histories, decoded with the types their workflow and activities declare
# ----------------------------------------------------------------------------------------------------------


def _declared_types() -> tuple[dict[str, tuple[list[Any], Any]], dict[str, tuple[list[Any], Any]]]:
    """(activity name -> (argument types, return type), workflow name -> the same), as a worker registers them
    (rr's activities and workflows, and the activities pydantic-ai's plugin adds for the agents)."""
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    from activities import batch as batch_activities
    from activities import model_requests
    from activities import rerun as rerun_activities
    from activities import sandbox as sandbox_activities
    from activities.summarise import summarise
    from worker import WORKFLOWS
    from workflows.agents import MODEL_ACTIVITIES

    acts: list[Callable[..., Any]] = [  # as worker.build_worker registers them
        *sandbox_activities.ACTIVITIES,
        *MODEL_ACTIVITIES,
        model_requests.forget_responses,
        summarise,
        *batch_activities.ACTIVITIES,
        *rerun_activities.ACTIVITIES,
    ]
    config = PydanticAIPlugin().configure_worker(
        {
            "workflows": list(WORKFLOWS),
            "activities": acts,
            "workflow_runner": SandboxedWorkflowRunner(),
        }
    )
    activities = {}
    for fn in config.get("activities", []):
        a = activity._Definition.must_from_callable(fn)
        activities[str(a.name)] = (list(a.arg_types or []), a.ret_type)
    workflows = {}
    for cls in config.get("workflows", []):
        w = workflow._Definition.must_from_class(cls)
        workflows[str(w.name)] = (list(w.arg_types or []), w.ret_type)
    return activities, workflows


def _payloads(value: dict[str, Any] | None) -> list[Payload]:
    out = []
    for p in (value or {}).get("payloads", []):
        out.append(
            Payload(
                metadata={k: base64.b64decode(v) for k, v in p.get("metadata", {}).items()},
                data=base64.b64decode(p.get("data", "")),
            )
        )
    return out


def _typed(history: dict[str, Any]) -> Iterator[tuple[str, list[Payload], list[Any]]]:
    """(where, payloads, their declared types) for each recorded input and result of the history."""
    activities, workflows = _declared_types()
    events = history["events"]
    wf_type = events[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"]
    scheduled: dict[str, str] = {}
    for e in events:
        eid = str(e["eventId"])
        if a := e.get("workflowExecutionStartedEventAttributes"):
            yield f"{eid} workflow input", _payloads(a.get("input")), workflows[wf_type][0]
        elif a := e.get("workflowExecutionCompletedEventAttributes"):
            yield f"{eid} workflow result", _payloads(a.get("result")), [workflows[wf_type][1]]
        elif a := e.get("activityTaskScheduledEventAttributes"):
            name = a["activityType"]["name"]
            scheduled[eid] = name
            yield f"{eid} {name} input", _payloads(a.get("input")), activities[name][0]
        elif a := e.get("activityTaskCompletedEventAttributes"):
            name = scheduled[str(a["scheduledEventId"])]
            yield f"{eid} {name} result", _payloads(a.get("result")), [activities[name][1]]
        elif (a := e.get("markerRecordedEventAttributes")) and a["markerName"] == "core_local_activity":
            data = json.loads(base64.b64decode(a["details"]["data"]["payloads"][0]["data"]))
            name = data["activity_type"]
            yield f"{eid} {name} result", _payloads(a["details"].get("result")), [activities[name][1]]


def _all_payloads(node: Any) -> Iterator[Payload]:
    """Every `{"metadata": ..., "data": ...}` payload anywhere in a JSON history (memos, markers, headers, ...)."""
    if isinstance(node, dict):
        if "metadata" in node and "encoding" in node["metadata"]:
            yield from _payloads({"payloads": [node]})
            return
        for v in node.values():
            yield from _all_payloads(v)
    elif isinstance(node, list):
        for v in node:
            yield from _all_payloads(v)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_every_payload_of_the_committed_histories_decodes_alike(path: Path) -> None:
    history = json.loads(path.read_text())
    light: PayloadConverter = LightPayloadConverter()
    shared: PayloadConverter = SharedPayloadConverter()
    typed = 0
    kinds: set[str] = set()
    for where, payloads, hints in _typed(history):
        if not payloads:
            continue
        a = shared.from_payloads(payloads, hints)
        b = light.from_payloads(payloads, hints)
        assert a == b, where
        for x, y in zip(shared.to_payloads(a), light.to_payloads(b), strict=True):
            _same_payload(x, y)  # and written back, the same bytes
        typed += len(payloads)
        kinds.update(type(v).__module__.split(".")[0] for v in a)
    assert typed >= 5
    assert "reflector" in kinds  # rr's own models were among them
    assert "pydantic_ai" in kinds  # and pydantic-ai's (model responses, request parameters)
    untyped = list(_all_payloads(history))
    assert len(untyped) >= typed
    for p in untyped:
        assert shared.from_payloads([p]) == light.from_payloads([p])
