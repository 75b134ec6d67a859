"""`rr rerun`'s local activities: answer a reused step from the origin's recorded prefix.

A rerun (`reflector.contract.RerunOf`) starts with the origin's prefix stored as one blob
(`RerunPrefix`, written by `reflector.client.rerun`). While the new session is inside that prefix the
workflow asks these activities instead of the model, the sandbox or a child workflow; each answer is
recorded in the new history as a local-activity marker, so the rerun is itself durable and replays
from its own history. Nothing here calls a model or runs a cell.

`reused_cell` also journals the cell's code for the new session (`sandbox.journal`), exactly as the
origin's sandbox journaled it, without running it: the session's first live cell then finds its
host behind the journal and rebuilds it by replaying the journal in a fresh host (the crash-recovery
path of `sandbox.sessions`), so the live cells see the variables the reused cells built. That replay
re-executes the reused cells' code in the sandbox host; it is no model request and no paid cell.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelResponse
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import sandbox as sandbox_activities
from reflector.contract import (
    RERUN_CELL_ACTIVITY,
    RERUN_CHILD_ACTIVITY,
    RERUN_RESPONSE_ACTIVITY,
    RERUN_SUMMARY_ACTIVITY,
    CellOutcome,
    RerunPrefix,
    ReusedCellInput,
    ReusedChild,
    ReusedItemInput,
    SummariseResult,
    session_key,
)
from sandbox.sessions import _DISCARD_KINDS

__all__ = ["ACTIVITIES", "reused_response", "reused_cell", "reused_child", "reused_summary", "load_prefix"]

MISSING_ERROR = "RerunPrefixMissing"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)


@lru_cache(maxsize=16)  # blobs are immutable: a sha256 always names the same prefix
def _prefix(sha256: str) -> RerunPrefix:
    return RerunPrefix.model_validate_json(sandbox_activities._rt().store.get_bytes(sha256))


def load_prefix(sha256: str) -> RerunPrefix:
    """The prefix blob, parsed; a non-retryable error if it is not in the store."""
    try:
        return _prefix(sha256)
    except FileNotFoundError as e:
        raise ApplicationError(
            f"the rerun's prefix blob {sha256[:12]} is not in the blob store ({e})",
            type=MISSING_ERROR,
            non_retryable=True,
        ) from None


def _missing(kind: str, key: object, prefix: RerunPrefix) -> ApplicationError:
    return ApplicationError(
        f"the prefix of the rerun of {prefix.origin} from step {prefix.from_step} holds no {kind} {key}",
        type=MISSING_ERROR,
        non_retryable=True,
    )


@activity.defn(name=RERUN_RESPONSE_ACTIVITY)
async def reused_response(inp: ReusedItemInput) -> ModelResponse:
    """The origin's recorded response of step `index + 1`."""
    prefix = load_prefix(inp.prefix_sha256)
    if not 0 <= inp.index < len(prefix.responses):
        raise _missing("response of step", inp.index + 1, prefix)
    return _RESPONSE.validate_json(prefix.responses[inp.index])


@activity.defn(name=RERUN_CELL_ACTIVITY)
async def reused_cell(inp: ReusedCellInput) -> CellOutcome:
    """The origin's recorded outcome of cell `seq`; its code is journaled for the new session, unless the
    origin's sandbox discarded the cell (timeout, crash, memory: not journaled there either)."""
    prefix = load_prefix(inp.prefix_sha256)
    outcome = prefix.cells.get(inp.seq)
    if outcome is None:
        raise _missing("cell", inp.seq, prefix)
    if outcome.error_kind not in _DISCARD_KINDS:
        sessions = sandbox_activities._rt().sessions
        sessions.journal.write_entry(session_key(inp.session_id), inp.seq, inp.code)
        await _grant_reused_archives(inp.session_id, prefix)
    return outcome


async def _grant_reused_archives(session_id: str, prefix: RerunPrefix) -> None:
    """The new session reuses the origin's summaries, so its (reused or replayed) archive cells read the
    origin's archived transcripts: grant them (worker-trusted: the prefix was built from the origin's history)."""
    sessions = sandbox_activities._rt().sessions
    own = sessions.archive_grants(session_key(session_id)).own()
    for summary in prefix.summaries:
        if summary.archive_ref not in own and _SHA256.fullmatch(summary.archive_ref):
            await sessions.grant_archive(session_key(session_id), summary.archive_ref)


@activity.defn(name=RERUN_CHILD_ACTIVITY)
async def reused_child(inp: ReusedItemInput) -> ReusedChild:
    """The origin's child reflection number `index` and its recorded output."""
    prefix = load_prefix(inp.prefix_sha256)
    child = prefix.children.get(inp.index)
    if child is None:
        raise _missing("child", inp.index, prefix)
    return child


@activity.defn(name=RERUN_SUMMARY_ACTIVITY)
async def reused_summary(inp: ReusedItemInput) -> SummariseResult:
    """The origin's recorded summary number `index + 1`."""
    prefix = load_prefix(inp.prefix_sha256)
    if not 0 <= inp.index < len(prefix.summaries):
        raise _missing("summary", inp.index + 1, prefix)
    return prefix.summaries[inp.index]


ACTIVITIES: list[Callable[..., Any]] = [reused_response, reused_cell, reused_child, reused_summary]
