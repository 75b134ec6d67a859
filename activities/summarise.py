"""The summarise activity: archive the transcript, then one LLM request that condenses it.

Charged to the session's budget by the workflow (it returns the usage). The transcript is stored in
the content-addressed blob store first, so the raw history is kept even if the request fails.
"""

from __future__ import annotations

import asyncio

from pydantic_ai.direct import model_request
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelRequest, TextPart
from pydantic_ai.settings import ModelSettings
from temporalio import activity

from activities.sandbox import grant_archive
from activities.scope import current_store
from reflector.analysis.compaction import SUMMARY_MARKER
from reflector.contract import SUMMARISE_ACTIVITY, SummariseInput, SummariseResult
from reflector.runtime.models import resolve_model
from reflector.runtime.storage.stores import blocking

__all__ = ["summarise", "render_transcript"]

MAX_TRANSCRIPT_CHARS = 400_000
INSTRUCTIONS = (
    "Summarise this reflection session so far so that the work can continue from the summary alone. "
    "Keep: what the trace is, every finding with its evidence (step indices, tool names, quoted values), "
    "the variables and helpers created in the sandbox and what they hold, open questions, and the plan. "
    "Drop raw outputs that the variables already hold."
)


def render_transcript(transcript_json: str, limit: int = MAX_TRANSCRIPT_CHARS) -> str:
    messages = ModelMessagesTypeAdapter.validate_json(transcript_json)
    lines = []
    for m in messages:
        for p in m.parts:
            body = getattr(p, "content", None)
            if body is None:
                body = getattr(p, "args", "")
            tool = getattr(p, "tool_name", None)
            lines.append(f"[{type(p).__name__}{' ' + str(tool) if tool else ''}] {body}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + "\n[...]\n" + text[-limit // 2 :]


async def _heartbeat(every_s: float = 1.0) -> None:
    """Heartbeat while the provider answers, so a dead worker is noticed within the heartbeat timeout."""
    while True:
        activity.heartbeat()
        await asyncio.sleep(every_s)


@activity.defn(name=SUMMARISE_ACTIVITY)
async def summarise(inp: SummariseInput) -> SummariseResult:
    store = current_store()
    data = inp.transcript_json.encode()
    archive_ref = await blocking(store.remote, store.put_bytes, data)
    await grant_archive(inp.workflow_id, archive_ref)  # the session (and its children) may now ARCHIVE it
    prompt = f"{SUMMARY_MARKER}\n{INSTRUCTIONS}\n\n{render_transcript(inp.transcript_json)}"
    beat = asyncio.create_task(_heartbeat())
    try:
        response = await model_request(
            resolve_model(inp.model),
            [ModelRequest.user_text_prompt(prompt)],
            model_settings=ModelSettings(max_tokens=inp.max_output_tokens, temperature=0.0),
        )
    finally:
        beat.cancel()
    summary = "".join(p.content for p in response.parts if isinstance(p, TextPart)).strip()
    return SummariseResult(
        summary=summary or "(the summariser returned no text)",
        archive_ref=archive_ref,
        model=response.model_name or inp.model,
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
    )
