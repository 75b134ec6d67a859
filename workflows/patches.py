"""Patch decisions of a workflow run, taken before its first command.

Workflow code never calls `workflow.patched` itself: it asks `patch_on(NAME)`, and every run calls `begin()`
first thing (tests/unit/test_layout.py checks both).

Why: Temporal's core SDK (temporalio 1.35) answers a *first* `workflow.patched(id)` during replay from the
patch markers of the current workflow task only. A local activity that outlasts 80% of the task timeout makes
core heartbeat the task; when it finishes around that heartbeat, core can record its marker in one task while
the code sees the result only in the next, and the code's next first `patched()` then records its marker one
task after the local activity's. On replay core hands the result over in the marker's task, the code asks
`patched()` one task early, finds no marker and the history no longer replays (TMPRL1100 "patch marker ...
but there is no corresponding change command"; seen on loaded machines after a slow `prepare_session`). Every
reflection runs local activities (prefill, cells, in-process model requests), so no patch may be asked for the
first time after one.

How: `begin()` asks one umbrella patch (`PATCHES_FIRST_PATCH`) before any command, so its marker is in the
first task (the heartbeat completions of core carry it). A run that has it implies every patch recorded before
it (`IMPLIED`): one marker instead of one per patch, none asked later. A run recorded before it (no umbrella
marker: `begin()` answers False during replay) asks each patch where it is used, as it was recorded. A patch
added after this one goes into `ASKED_AT_START`, asked by `begin()` as well.
"""

from __future__ import annotations

from temporalio import workflow

from reflector.contract import (
    CANCEL_PATCH,
    FORGET_ONLY_CACHED_PATCH,
    INLINE_SKILLBOOK_PATCH,
    LOCAL_MODEL_PATCH,
    PATCHES_FIRST_PATCH,
    PROMPT_CACHE_PATCH,
    PROVIDER_MODEL_PATCH,
    RECURSE_BY_STRATEGY_PATCH,
    SEARCH_ATTRIBUTES_PATCH,
    TOOL_ARG_CAPS_PATCH,
)

__all__ = ["ASKED_AT_START", "IMPLIED", "LIBRARY_PATCHES", "begin", "patch_on"]

IMPLIED: frozenset[str] = frozenset(
    {
        LOCAL_MODEL_PATCH,
        PROVIDER_MODEL_PATCH,
        CANCEL_PATCH,
        SEARCH_ATTRIBUTES_PATCH,
        RECURSE_BY_STRATEGY_PATCH,
        TOOL_ARG_CAPS_PATCH,
        INLINE_SKILLBOOK_PATCH,
        PROMPT_CACHE_PATCH,
    }
)
"""The patches recorded before `PATCHES_FIRST_PATCH`: on in every run that has its marker."""

ASKED_AT_START: tuple[str, ...] = (FORGET_ONLY_CACHED_PATCH,)
"""Patches added after `PATCHES_FIRST_PATCH`, in the order `begin()` asks them (append only)."""

LIBRARY_PATCHES: tuple[str, ...] = ("pydantic_ai:stable_default_run_id",)
"""Patches the libraries ask in rr's workflow code (pydantic-ai's Temporal durability, when an agent run starts:
after the prefill's local activity). `begin()` asks them first, so the library's own call finds the memoised
answer and adds no marker after a local activity. A library upgrade that asks a new one: add it here (the
late-delivery replay of the suite's histories fails until then)."""


def begin() -> None:
    """Decide the run's patches: the first statement of every workflow's run method (before any command)."""
    if workflow.patched(PATCHES_FIRST_PATCH):
        for patch_id in (*LIBRARY_PATCHES, *ASKED_AT_START):
            workflow.patched(patch_id)


def patch_on(patch_id: str) -> bool:
    """Whether this run takes the behaviour `patch_id` guards (see the module doc)."""
    # `workflow.patched` is memoised per run: after `begin()` these calls add no command
    if workflow.patched(PATCHES_FIRST_PATCH):
        if patch_id in IMPLIED:
            return True
        if patch_id not in ASKED_AT_START:
            raise RuntimeError(
                f"patch {patch_id!r} is neither implied nor asked at start (workflows.patches)"
            )
    return workflow.patched(patch_id)
