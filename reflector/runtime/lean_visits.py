"""One walk over a workflow activation's payloads instead of three (worker CPU per workflow task).

Before the workflow code sees an activation, temporalio's worker decodes its payloads, and before it
sends the completion it encodes them (`temporalio.bridge.worker.decode_activation` / `encode_completion`):
each runs the payload visitor over the whole activation three times, one function per walk (decode:
codec-decode external-storage references, retrieve externally stored payloads, codec-decode; encode the
reverse). The visitor is Python walking protobuf messages field by field, and rr's workers pay it at
every workflow task because they use external storage: 6.7% of the worker process's GIL time at 0.2 s x
50 (py-spy, `bench/throughput.py`), most of it the walks rather than the functions, two of which change
nothing without a payload codec.

`install()` makes each of them one walk applying the three functions in the same order to each payload
sequence it reaches. That is the same result: each function maps one sequence to a new one without
looking at any other, and all three walks reach the same sequences (same visitor, same skip options);
the storage walk's concurrency limit and metrics are kept. Only without a payload codec (rr configures
none): the library runs codec calls one at a time, and a codec (a plugin's) is left to exactly that, so
with one the library's own three walks run. It is installed only when the library's two functions have
the signature this module replaces (another temporalio keeps its own); `tests/unit/test_lean_visits.py`
compares the two on activations and completions with rr's external storage, with and without a codec.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

__all__ = ["install", "decode_activation", "encode_completion", "chained", "unchanged_skipped"]

_PARAMS = ("data_converter", "storage_concurrency_limit")
_installed = False
_originals: tuple[Any, Any] | None = (
    None  # temporalio's (decode_activation, encode_completion), once replaced
)

SequenceFn = Callable[[Sequence[Any]], Awaitable[list[Any]]]


def chained(*steps: SequenceFn) -> SequenceFn:
    """The payload-sequence functions applied one after the other."""

    async def run(payloads: Sequence[Any]) -> list[Any]:
        out: Sequence[Any] = payloads
        for step in steps:
            out = await step(out)
        return list(out)

    return run


def unchanged_skipped(which: int, dc: Any, full: SequenceFn) -> SequenceFn:
    """`full`, except on a sequence it would leave as it is (only without a payload codec): encoding (1), no
    payload reaches the external storage's size threshold (or there is no external storage); decoding (0),
    no payload is a storage reference or carries the reference marker. The functions would return such a
    sequence unchanged, but the workflow worker's converter first resolves the command's serialization
    context into a new converter for each of them (`_get_current_dc`: clones of the converters), which is
    most of what the walks cost per workflow task once the three walks are one (~3% of the worker's GIL
    time at 0.2 s x 50)."""
    from temporalio.converter._data_converter import _has_reference_marker, _is_reference_payload

    storage = dc.external_storage
    threshold = None if storage is None else storage.payload_size_threshold

    async def run(payloads: Sequence[Any]) -> list[Any]:
        if which == 1:
            if threshold is None or all(p.ByteSize() < threshold for p in payloads):
                return list(payloads)
        elif not any(_is_reference_payload(p) or _has_reference_marker(p) for p in payloads):
            return list(payloads)
        return await full(payloads)

    return run


# the data converter's payload-sequence functions of each walk, in temporalio's order
_DECODE = (
    "_decode_reference_payload_sequence",
    "_external_retrieve_payload_sequence",
    "_decode_payload_sequence",
)
_ENCODE = (
    "_encode_payload_sequence",
    "_external_store_payload_sequence",
    "_encode_reference_payload_sequence",
)


def _library(which: int) -> Any:
    """temporalio's own `decode_activation` (0) or `encode_completion` (1)."""
    if _originals is not None:
        return _originals[which]
    import temporalio.bridge.worker as bridge_worker

    return (bridge_worker.decode_activation, bridge_worker.encode_completion)[which]


async def _one_walk(which: int, root: Any, dc: Any, headers: bool, concurrency: int) -> Any:
    """Walk `root` once applying the functions of `_DECODE` (0) or `_ENCODE` (1); the library's own
    walks when the converter has a payload codec."""
    if dc.payload_codec is not None:
        return await _library(which)(root, dc, headers, concurrency)
    from temporalio.bridge.worker import _Visitor
    from temporalio.converter._extstore import StorageOperationMetrics
    from temporalio.worker._command_aware_visitor import CommandAwarePayloadVisitor

    fn = unchanged_skipped(which, dc, chained(*(getattr(dc, name) for name in (_DECODE, _ENCODE)[which])))
    metrics = StorageOperationMetrics()
    with metrics.track():
        await CommandAwarePayloadVisitor(
            skip_search_attributes=True, skip_headers=not headers, concurrency_limit=concurrency
        ).visit(_Visitor(fn), root)
    return metrics


async def decode_activation(
    activation: Any, data_converter: Any, decode_headers: bool, storage_concurrency_limit: int
) -> Any:
    """`temporalio.bridge.worker.decode_activation` in one walk (the library's with a payload codec)."""
    return await _one_walk(0, activation, data_converter, decode_headers, storage_concurrency_limit)


async def encode_completion(
    completion: Any, data_converter: Any, encode_headers: bool, storage_concurrency_limit: int
) -> Any:
    """`temporalio.bridge.worker.encode_completion` in one walk (the library's with a payload codec)."""
    return await _one_walk(1, completion, data_converter, encode_headers, storage_concurrency_limit)


def _replaceable(fn: Any, headers: str) -> bool:
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) == 4 and params[1:] == (_PARAMS[0], headers, _PARAMS[1])


def install() -> bool:
    """Use the one-walk versions in this process's workflow workers (once); False when this temporalio's
    functions are not the ones replaced (its own are kept)."""
    global _installed, _originals
    if _installed:
        return True
    import temporalio.bridge.worker as bridge_worker

    if not (
        _replaceable(bridge_worker.decode_activation, "decode_headers")
        and _replaceable(bridge_worker.encode_completion, "encode_headers")
    ):
        return False
    _originals = (bridge_worker.decode_activation, bridge_worker.encode_completion)
    bridge_worker.decode_activation = decode_activation
    bridge_worker.encode_completion = encode_completion
    _installed = True
    return True
