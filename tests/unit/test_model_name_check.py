"""The client's model-name check: syntax and provider, never credentials (only workers call the provider).

`check_model_name` runs before a workflow starts (`reflector.client.build_input` / `build_batch_input`).
A name no worker can use fails there, with the reason; a name whose provider key (or base URL,
endpoint, region) the client lacks passes, and the worker that lacks it still fails clearly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_ai.models import Model, infer_model

from reflector.client import ReflectError, build_input
from reflector.contract import ReflectionConfig, TraceRef
from reflector.runtime import models
from tests.support import prefork

REPO_ROOT = Path(__file__).resolve().parents[2]
PROVIDER_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OLLAMA_BASE_URL",
    "AZURE_OPENAI_ENDPOINT",
    "AZURE_OPENAI_API_KEY",
    "OPENAI_API_VERSION",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "RR_PLUGINS",
)
TRACE = TraceRef(uri="blob:sha256:" + "0" * 64, sha256="0" * 64, size=1, format="ace")


@pytest.fixture(autouse=True)
def no_provider_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    # nothing built earlier in this process (with a key) may answer for the check
    monkeypatch.setattr(models, "_instances", {})
    monkeypatch.setattr(models, "_factories", dict(models._factories))


@pytest.mark.parametrize(
    "name",
    [
        "openai:gpt-4o",
        "openai-chat:gpt-4o-mini",
        "anthropic:claude-sonnet-4-0",
        "google:gemini-2.5-flash",
        "openrouter:openai/gpt-4o",
    ],
)
def test_a_provider_model_passes_without_its_key(name: str) -> None:
    models.check_model_name(name)
    assert build_input(TRACE, config=ReflectionConfig(model=name)).config.model == name


def test_the_worker_still_refuses_it_without_the_key() -> None:
    models.check_model_name("openai:gpt-4o")
    with pytest.raises(models.UnknownModelError, match=r"'openai:gpt-4o' cannot be used: .*OPENAI_API_KEY"):
        models.resolve_model("openai:gpt-4o")  # what the worker's model-request activity builds


@pytest.mark.parametrize("name", ["ollama:llama3.2", "azure:gpt-4o", "bedrock:anthropic.claude-3-5-sonnet"])
def test_provider_configuration_beyond_a_key_is_the_workers(name: str) -> None:
    with pytest.raises(Exception):  # noqa: B017  (proof: this provider cannot even be built here)
        infer_model(name)
    models.check_model_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("nosuch:model", "Unknown provider: nosuch"),
        ("", "the model name is empty"),
        ("   ", "the model name is empty"),
        ("openai:", "expected provider:model with both parts"),
        (":gpt-4o", "expected provider:model with both parts"),
        ("gpt-4o", "Unknown model: gpt-4o"),
        ("nonexistent-model-xyz", "Unknown model: nonexistent-model-xyz"),
        ("openrouter:gpt-4o", "OpenRouter model names must be prefixed"),  # a name the provider refuses
    ],
)
def test_a_name_no_worker_can_use_fails_with_the_reason(name: str, why: str) -> None:
    with pytest.raises(models.UnknownModelError) as info:
        models.check_model_name(name)
    assert why in str(info.value)
    with pytest.raises(ReflectError, match=why.replace("(", r"\(")):
        build_input(TRACE, config=ReflectionConfig(model=name))


def test_registered_names_are_checked_by_name_only() -> None:
    built: list[str] = []

    def factory() -> Model:  # e.g. a plugin's model that needs credentials only workers have
        built.append("x")
        raise RuntimeError("no credentials here")

    models.register_model("rr-test-registered", factory)
    models.check_model_name("rr-test-registered")
    models.check_model_name(models.HEURISTIC)
    assert built == []


def test_cli_refuses_a_malformed_name_before_anything_starts(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RR_", "TEMPORAL_")) and k not in PROVIDER_ENV
    }
    env.update(RR_HOME=str(tmp_path / "home"), TEMPORAL_ADDRESS="127.0.0.1:1")  # nothing to connect to
    exe = Path(sys.executable).parent / "rr"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]
    p = prefork.run(
        [*cmd, "reflect", str(REPO_ROOT / "reflector/examples/failed_math.json"), "--model", "openai:"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        "rr: error: model 'openai:': expected provider:model with both parts, e.g. openai:gpt-4o"
    ]
