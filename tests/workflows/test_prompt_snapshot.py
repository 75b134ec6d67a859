"""What a real model receives: the first request of a reflection, through the real OpenAI-protocol path.

A reflection of a committed example (`reflector/examples/failed_math.json`, no question or ground truth
given: the trace carries both) runs against the local Chat Completions server
(`reflector.testing.openai_server`), and the body of the first request (system prompt, task prompt,
tools with their JSON schemas and descriptions) is compared with a committed snapshot, so every change
to what the model reads shows up in review as a diff. Ids, ports, hashes and the model name are
normalised. Besides the snapshot, the properties the snapshot is meant to keep are asserted outright:
every schema property is described, the system prompt lists exactly the tools offered, no "(not given)"
when the trace has the value, no `recurse` on a small trace (offered on a large one), and the preview
names `raw` by type and size only.

It lives with the workflow tests because it needs their Temporal server and in-process worker.
Regenerate the snapshot after an intended change: `RR_UPDATE_SNAPSHOTS=1 .venv/bin/pytest -q -n 0
tests/workflows/test_prompt_snapshot.py`, then review `git diff tests/workflows/snapshots/`.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from reflector import client as rr
from reflector.analysis import prompts
from reflector.contract import OUTPUT_TOOL, RECURSE_TOOL, ReflectionConfig
from reflector.runtime.settings import Settings
from reflector.testing.openai_server import OpenAIServer
from tests.support.fixtures import ACE_TRACE, write_trace

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "reflector" / "examples" / "failed_math.json"
SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "openai_chat_first_request.txt"
UPDATE_ENV = "RR_UPDATE_SNAPSHOTS"
REGENERATE = f"{UPDATE_ENV}=1 .venv/bin/pytest -q -n 0 tests/workflows/test_prompt_snapshot.py"

# what legitimately differs between two runs of the same reflection
_NORMALISE = [
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\brr-[0-9a-f]{8}-[0-9a-f]{8}\b"), "<workflow-id>"),
    (re.compile(r"\bt-snap-[0-9a-f]{10}\b"), "<workflow-id>"),
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+"), r"\1:<port>"),
    (re.compile(r"\brr-snapshot-[0-9a-f]{8}\b"), "<model>"),
    (re.compile(r"\brr-[0-9a-f]{32}\b"), "<prompt-cache-key>"),
]


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


async def _first_request(
    client: Client, tq: str, settings: Settings, server: OpenAIServer, trace: Path, **given: Any
) -> dict[str, Any]:
    """The body of the first model request of a reflection of `trace` (a fresh model name: models are cached)."""
    before = len(server.requests)
    ref = rr.upload_trace(trace, settings)
    model = f"openai-chat:rr-snapshot-{uuid.uuid4().hex[:8]}"
    inp = rr.build_input(ref, config=ReflectionConfig(model=model), **given)
    handle = await rr.start_reflection(client, inp, tq, f"t-snap-{uuid.uuid4().hex[:10]}")
    out = await handle.result()
    assert out.raw["rr_trace"]["stop_reason"] == "completed", out.raw
    return server.requests[before].body


def _messages(body: dict[str, Any]) -> tuple[str, str]:
    """The system messages (the static prompt, then the budget: one message per instruction) and the user's."""
    system = "\n\n".join(str(m["content"]) for m in body["messages"] if m["role"] == "system")
    [user] = [str(m["content"]) for m in body["messages"] if m["role"] == "user"]
    return system, user


def _tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in body["tools"]}


def _render(body: dict[str, Any]) -> str:
    """The request as a reviewable text: the prompts verbatim, then the tools and the other settings as JSON."""
    system, user = _messages(body)
    rest = {k: v for k, v in body.items() if k not in ("messages", "tools")}
    text = "\n".join(
        [
            "# system",
            system,
            "",
            "# user",
            user,
            "",
            "# tools",
            json.dumps(body["tools"], indent=1, ensure_ascii=False),
            "",
            "# settings",
            json.dumps(rest, indent=1, sort_keys=True),
            "",
        ]
    )
    for pattern, repl in _NORMALISE:
        text = pattern.sub(repl, text)
    return text


def _undescribed(schema: Any, where: str = "") -> list[str]:
    """Paths of the object properties in a JSON schema (nested and `$defs` included) without a description."""
    missing: list[str] = []
    if isinstance(schema, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if not (isinstance(prop, dict) and str(prop.get("description", "")).strip()):
                missing.append(f"{where}.{name}")
            missing += _undescribed(prop, f"{where}.{name}")
        for key, sub in schema.items():
            if key != "properties":
                missing += _undescribed(sub, f"{where}/{key}" if key == "$defs" else where)
    elif isinstance(schema, list):
        for item in schema:
            missing += _undescribed(item, where)
    return missing


async def test_first_request_matches_the_snapshot(
    client, task_queue, settings, openai_server: OpenAIServer
) -> None:
    body = await _first_request(client, task_queue, settings, openai_server, EXAMPLE)
    system, user = _messages(body)
    tools = _tools(body)

    # every property of every tool's schema says what it is for
    undescribed = {name: _undescribed(t["parameters"]) for name, t in tools.items()}
    assert not any(undescribed.values()), f"schema properties without a description: {undescribed}"
    assert (
        "deliberately absent" not in tools[OUTPUT_TOOL]["description"]
    )  # a developer note, not for the model
    assert tools[OUTPUT_TOOL]["description"] == prompts.OUTPUT_TOOL_DESCRIPTION
    # the system prompt is the static one every session shares (a provider's cache holds it), then the budget;
    # it lists no tools (their definitions describe them), so it cannot name one the request does not offer
    assert system.startswith(prompts.SYSTEM.rstrip()) and "\nBudget: at most 50 model requests" in system
    assert body.get("prompt_cache_key", "").startswith("rr-")  # OpenAI's prompt cache: a key per session
    # no skillbook, nothing to tag: the output schema leaves `skill_tags` out (each request would pay for it)
    assert "skill_tags" not in tools[OUTPUT_TOOL]["parameters"]["properties"]
    assert "SkillTag" not in json.dumps(tools[OUTPUT_TOOL]["parameters"])
    assert RECURSE_TOOL not in tools and "recurse" not in system + user  # a small trace: no children
    # the trace's own question and ground truth, said to come from the trace
    example = json.loads(EXAMPLE.read_text())
    assert "(not given)" not in user and "(see traces)" not in user
    assert f"Question given to the agent: {example['question']} (from the trace)" in user
    assert f"Ground truth: {example['ground_truth']} (from the trace)" in user
    # the preview shows the view's fields and first steps, and names `raw` only by type and size
    assert '"raw": "dict (6 keys;' in user and '"reasoning":' not in user
    assert "[cell 1]" in user and '"index": 0' in user

    got = _render(body)
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(got, encoding="utf-8")
        return
    want = SNAPSHOT.read_text(encoding="utf-8") if SNAPSHOT.exists() else ""
    if got != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), got.splitlines(True), "snapshot", "request", n=2)
        )
        pytest.fail(
            f"The first model request differs from {SNAPSHOT.relative_to(REPO)}.\n"
            f"If the change is intended, regenerate it with\n    {REGENERATE}\nand review the diff.\n\n"
            + (diff[:12_000] or "(no snapshot yet)"),
            pytrace=False,
        )


def _tau_run() -> dict[str, Any]:
    """A tiny tau-bench run: the ground truth is the expected actions, not a text."""
    traj = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "Please cancel Z7GOZK."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0",
                    "function": {
                        "name": "cancel_reservation",
                        "arguments": '{"reservation_id": "Z7GOZK", "refund": 0}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c0",
            "name": "cancel_reservation",
            "content": '{"status": "cancelled"}',
        },
        {"role": "assistant", "content": "Done."},
    ]
    expected = [{"name": "cancel_reservation", "kwargs": {"reservation_id": "Z7GOZK", "refund": 250}}]
    return {
        "task_id": 7,
        "trial": 0,
        "reward": 0.0,
        "traj": traj,
        "info": {
            "task": {"user_id": "u7", "instruction": "Cancel Z7GOZK", "actions": expected, "outputs": []},
            "reward_info": {"reward": 0.0, "info": {"r_actions": 0.0}},
        },
    }


async def test_tau_bench_truth_is_the_expected_actions(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer
) -> None:
    body = await _first_request(
        client, task_queue, settings, openai_server, write_trace(tmp_path, _tau_run())
    )
    _, user = _messages(body)
    assert "(not given)" not in user
    assert (
        "Ground truth: none as text: the trace carries the task's expected actions (see expected_actions(traces))"
        in user
    )
    assert "Question given to the agent: Cancel Z7GOZK (from the trace)" in user


async def test_large_trace_offers_recurse_and_says_so(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer
) -> None:
    big = dict(
        ACE_TRACE, steps=[*ACE_TRACE["steps"], {"role": "tool", "content": "x" * prompts.LARGE_TRACE_BYTES}]
    )
    body = await _first_request(
        client,
        task_queue,
        settings,
        openai_server,
        write_trace(tmp_path, big),
        question="What is 17 * 24?",
        ground_truth="408",
    )
    system, user = _messages(body)
    tools = _tools(body)
    assert RECURSE_TOOL in tools and "its child sessions spend" in system  # the budget says children share it
    assert "recurse(prompt, context_code)" in user  # the large-trace strategy offers children
    assert "Question given to the agent: What is 17 * 24?\nGround truth: 408\n" in user  # the caller's


async def test_skill_tags_are_asked_for_with_a_skillbook(
    client, task_queue, settings, tmp_path, openai_server: OpenAIServer
) -> None:
    body = await _first_request(
        client,
        task_queue,
        settings,
        openai_server,
        write_trace(tmp_path),
        skillbook="[math-00001] Check a product by estimating it.",
        mode="online",
    )
    tools = _tools(body)
    assert "skill_tags" in tools[OUTPUT_TOOL]["parameters"]["properties"]
    assert "SkillTag" in tools[OUTPUT_TOOL]["parameters"]["$defs"]
    assert "get_skill" in tools
