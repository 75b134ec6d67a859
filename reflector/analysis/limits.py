"""Caps on the inputs a user (or a model) sizes: one place, one one-line error each (issue 26).

Nothing in workflow code grows with user input. What can be large lives in the blob store (the trace,
a batch's manifest and runs, the skillbook: `reflector.client.upload_skillbook`) and is parsed in
activities or the sandbox; what the workflow carries is capped here, and refused with one line before
anything starts (the CLI prints it as `rr: error: ...` and exits 2; the Python API raises it as
`reflector.client.ReflectError`; a model's tool argument over its cap is a tool error the model can
act on). Temporal refuses a payload over 2 MB and a workflow task whose activity input is too large
fails for ever, so no capped value comes near that.

| input | cap | why |
|---|---|---|
| `--question`, `--ground-truth`, `--feedback` | `MAX_TASK_TEXT_CHARS` each | workflow input, prompts, every child's input |
| skillbook file | `MAX_SKILLBOOK_BYTES` (as the sandbox receives it) | a sandbox variable, sent to every host start |
| skill ids in a skillbook | `MAX_SKILL_IDS`, each id at most `MAX_SKILL_ID_CHARS` | the prompt lists them; the look-up tools scan them |
| `--id` (a reflection's or batch's workflow id) | `MAX_WORKFLOW_ID_CHARS` | children's ids extend it (`<id>.r1`, `<id>.run7`) |
| `recurse(prompt, context_code)` (model-written) | `MAX_TASK_TEXT_CHARS`, `MAX_CONTEXT_CODE_CHARS` | the child's workflow input |
| skill look-up tool arguments (model-written) | `MAX_SKILL_QUERY_CHARS` | a look-up activity's input |
| runs of a batch | `MAX_BATCH_RUNS` | the batch's record pages are named in its cursor |
"""

from __future__ import annotations

__all__ = [
    "MAX_TASK_TEXT_CHARS",
    "MAX_SKILLBOOK_BYTES",
    "MAX_SKILL_IDS",
    "MAX_SKILL_ID_CHARS",
    "SKILL_IDS_SHOWN",
    "MAX_INLINE_SKILLBOOK_CHARS",
    "MAX_WORKFLOW_ID_CHARS",
    "MAX_CONTEXT_CODE_CHARS",
    "MAX_SKILL_QUERY_CHARS",
    "MAX_SKILL_TOOL_CHARS",
    "MAX_BATCH_RUNS",
    "InputTooLarge",
    "check_task_text",
    "check_workflow_id",
]

MAX_TASK_TEXT_CHARS = 64 * 1024
"""`question`, `ground_truth`, `feedback` (and a child's sub-question): long text belongs in the trace, whose
own `question` / `ground_truth` / `feedback` fields the sandbox reads (a blob, any size)."""
MAX_SKILLBOOK_BYTES = 128 * 1024**2
"""The skillbook as the sandbox host receives it (UTF-8 JSON; a host's start message is at most 256 MiB)."""
MAX_SKILL_IDS = 50_000
"""Skill ids (`[section-00001]` occurrences) in one skillbook."""
MAX_SKILL_ID_CHARS = 100
"""The longest skill id (without brackets)."""
SKILL_IDS_SHOWN = 200
"""Ids the online task prompt lists (the rest are counted; the look-up tools reach every skill)."""
MAX_INLINE_SKILLBOOK_CHARS = 256 * 1024
"""`ReflectionInput.skillbook` (inline text, parsed in workflow code: inputs recorded before `skillbook_ref`);
the client never sends it, and a reflection started with a longer one ends with an error at once."""
MAX_WORKFLOW_ID_CHARS = 200
MAX_CONTEXT_CODE_CHARS = 64 * 1024
MAX_SKILL_QUERY_CHARS = 1_000
MAX_SKILL_TOOL_CHARS = 8_000
"""What one skill look-up returns to the model (longer answers are cut with a note)."""
MAX_BATCH_RUNS = 100_000


class InputTooLarge(ValueError):
    """An input over its cap; the message is the one-line error."""


def check_task_text(name: str, value: str | None) -> None:
    """Refuse a question / ground truth / feedback over `MAX_TASK_TEXT_CHARS` (`name`: `question`, `ground_truth`
    or `feedback`)."""
    if value is not None and len(value) > MAX_TASK_TEXT_CHARS:
        raise InputTooLarge(
            f"the {name.replace('_', ' ')} (--{name.replace('_', '-')}) is {len(value):,} characters, over the limit of {MAX_TASK_TEXT_CHARS:,} "
            "(reflector.analysis.limits.MAX_TASK_TEXT_CHARS): put long text in the trace (its question / ground_truth / "
            "feedback fields), which the sandbox reads from the blob store"
        )


def check_workflow_id(value: str | None) -> None:
    if value is not None and len(value) > MAX_WORKFLOW_ID_CHARS:
        raise InputTooLarge(
            f"--id is {len(value):,} characters, over the limit of {MAX_WORKFLOW_ID_CHARS:,} "
            "(reflector.analysis.limits.MAX_WORKFLOW_ID_CHARS)"
        )
