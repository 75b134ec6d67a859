"""One payload walk per activation (reflector.runtime.lean_visits) gives what temporalio's three walks give.

Activations and completions with payloads in many places (workflow arguments, headers, activity results,
signals, commands), some over the external-storage threshold, through rr's blob-store external storage
with and without a payload codec: the library's functions and the one-walk versions must leave the same
protos behind and store the same blobs, in one walk without a codec and the library's three with one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import temporalio.bridge.worker as bridge_worker
from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import (
    InitializeWorkflow,
    ResolveActivity,
    SignalWorkflow,
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.bridge.proto.workflow_commands import (
    CompleteWorkflowExecution,
    ScheduleActivity,
    WorkflowCommand,
)
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.worker._command_aware_visitor import CommandAwarePayloadVisitor

from reflector.runtime import lean_visits
from reflector.runtime.storage.payloads import external_storage

_MARKER = "__temporal_external_storage_reference"  # temporalio.converter._extstore._REFERENCE_MARKER_KEY

# temporalio's own (an in-process worker of another test may have installed the one-walk versions)
ORIGINAL_DECODE, ORIGINAL_ENCODE = lean_visits._originals or (
    bridge_worker.decode_activation,
    bridge_worker.encode_completion,
)


class _Xor(PayloadCodec):
    """A codec that changes every byte (so a missed or doubled step shows)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self._flip(p, b"xor") for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            assert p.metadata.get("encoding") == b"xor", p.metadata
            out.append(self._flip(p, None))
        return out

    @staticmethod
    def _flip(p: Payload, encoding: bytes | None) -> Payload:
        q = Payload()
        q.CopyFrom(p)
        q.data = bytes(b ^ 0x5A for b in p.data)
        if encoding is None:
            q.metadata["encoding"] = p.metadata["inner"]
            del q.metadata["inner"]
        else:
            q.metadata["inner"] = p.metadata.get("encoding", b"")
            q.metadata["encoding"] = encoding
        return q


def _p(text: str, size: int = 0) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=(f'"{text}' + "x" * size + '"').encode())


def _completion() -> WorkflowActivationCompletion:
    c = WorkflowActivationCompletion(run_id="r1")
    cmds = c.successful.commands
    cmds.append(
        WorkflowCommand(
            schedule_activity=ScheduleActivity(
                seq=1,
                activity_id="1",
                activity_type="a",
                arguments=[_p("small"), _p("big", 40_000)],
                headers={"h": _p("header", 20_000)},
            )
        )
    )
    cmds.append(
        WorkflowCommand(complete_workflow_execution=CompleteWorkflowExecution(result=_p("done", 20_000)))
    )
    return c


def _activation() -> WorkflowActivation:
    a = WorkflowActivation(run_id="r1")
    a.jobs.append(
        WorkflowActivationJob(
            initialize_workflow=InitializeWorkflow(
                workflow_type="w",
                workflow_id="w1",
                arguments=[_p("arg"), _p("arg2", 30_000)],
                headers={"h": _p("hd", 20_000)},
            )
        )
    )
    res = ResolveActivity(seq=1)
    res.result.completed.result.CopyFrom(_p("result", 50_000))
    a.jobs.append(WorkflowActivationJob(resolve_activity=res))
    a.jobs.append(WorkflowActivationJob(signal_workflow=SignalWorkflow(signal_name="s", input=[_p("sig")])))
    return a


def _converter(tmp: Path, codec: bool) -> DataConverter:
    return DataConverter(
        payload_codec=_Xor() if codec else None, external_storage=external_storage(tmp, threshold=16 * 1024)
    )


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("headers", [True, False])
@pytest.mark.parametrize("codec", [False, True])
async def test_one_walk_encodes_and_decodes_as_three(
    tmp_path: Path, headers: bool, codec: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[str] = []
    visit = CommandAwarePayloadVisitor.visit

    async def counted(self: Any, fs: Any, root: Any) -> None:
        walks.append(type(root).__name__)
        await visit(self, fs, root)

    monkeypatch.setattr(CommandAwarePayloadVisitor, "visit", counted)
    results: dict[str, Any] = {}
    counts: dict[str, int] = {}
    pairs: list[tuple[str, Any, Any]] = [
        ("library", ORIGINAL_ENCODE, ORIGINAL_DECODE),
        ("lean", lean_visits.encode_completion, lean_visits.decode_activation),
    ]
    for name, encode, decode in pairs:
        root = tmp_path / name
        dc = _converter(root, codec)
        walks.clear()
        completion = _completion()
        await encode(completion, dc, headers, 4)
        # what the library's encode left is what goes to the server; decoding an activation built from
        # it must give the original payloads back
        activation = _activation()
        await encode(activation, dc, headers, 4)  # the same walk encodes an activation's payloads too
        encoded_activation = copy.deepcopy(activation)
        await decode(activation, dc, headers, 4)
        results[name] = (completion, encoded_activation, activation, _files(root))
        counts[name] = len(walks)
    lib, lean = results["library"], results["lean"]
    assert lean[0] == lib[0]
    assert lean[1] == lib[1]
    assert lean[2] == lib[2]
    assert lean[3] == lib[3] and lib[3]  # the same blobs, and some were stored
    assert lib[2] == _activation() or not headers  # decoding undid the encoding
    assert counts == {"library": 9, "lean": 9 if codec else 3}  # encode, encode, decode: 3 walks each
    stored = [p for p in lib[0].successful.commands[0].schedule_activity.arguments]
    assert stored[0].metadata.get("encoding") == (b"xor" if codec else b"json/plain")  # small: inline
    assert stored[1].metadata.get("encoding") != b"xor" and len(stored[1].data) < 40_000  # big: a reference


def test_install_replaces_only_the_signature_it_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    async def other(activation: Any, data_converter: Any) -> None: ...

    monkeypatch.setattr(lean_visits, "_installed", False)
    monkeypatch.setattr(lean_visits, "_originals", lean_visits._originals)
    monkeypatch.setattr(bridge_worker, "decode_activation", other)
    assert lean_visits.install() is False
    assert cast(object, bridge_worker.decode_activation) is other
    monkeypatch.setattr(bridge_worker, "decode_activation", ORIGINAL_DECODE)
    monkeypatch.setattr(bridge_worker, "encode_completion", ORIGINAL_ENCODE)
    assert lean_visits.install() is True
    assert bridge_worker.decode_activation is lean_visits.decode_activation
    assert bridge_worker.encode_completion is lean_visits.encode_completion


async def test_sequences_left_unchanged_skip_the_converter(tmp_path: Path) -> None:
    # only the sequences the functions would change reach them: one with a payload over the threshold when
    # encoding, one with a storage reference when decoding (each call resolves a converter per command)
    dc = _converter(tmp_path, codec=False)
    seen: list[int] = []

    async def full(payloads: Sequence[Payload]) -> list[Payload]:
        seen.append(len(payloads))
        return await lean_visits.chained(
            *(getattr(dc, name) for name in lean_visits._ENCODE if name != "_encode_payload_sequence")
        )(payloads)

    encode = lean_visits.unchanged_skipped(1, dc, full)
    small = [_p("a"), _p("b", 1000)]
    assert await encode(small) == small and seen == []
    stored = await encode([_p("a"), _p("big", 40_000)])
    assert seen == [2] and stored[0] == _p("a") and stored[1].ByteSize() < 1000  # a reference
    decode = lean_visits.unchanged_skipped(0, dc, lambda ps: dc._external_retrieve_payload_sequence(ps))
    assert await decode(small) == small
    assert await decode(stored) == [_p("a"), _p("big", 40_000)]
    marked = Payload(metadata={"encoding": b"json/plain", _MARKER: b"true"}, data=b"x")
    with pytest.raises(RuntimeError):  # a marker on what is no reference: the library's error, not skipped
        await lean_visits.unchanged_skipped(0, dc, dc._decode_reference_payload_sequence)([marked])
