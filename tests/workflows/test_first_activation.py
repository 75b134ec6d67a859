"""Workflow code never imports a module or loads data: a fresh worker's first activations import nothing.

A fresh worker under load logged TMPRL1101 "Potential deadlock detected" (a workflow activation over
2 s) because the workflow-side model was built on first use inside workflow code, importing the
provider SDK and genai-prices' data there. `build_worker` now prepares all of it before polling, for
the models the worker serves (the heuristic, registered models, RR_MODEL, RR_WORKER_MODELS).
The check runs in a fresh process (this one has imported everything long ago).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def test_first_activation_of_each_model_imports_nothing(temporal_server, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    models = [
        "heuristic",  # the process's very first workflow activation
        "scripted-stateful",  # a FunctionModel registered by a plugin
        f"openai-chat:rr-first-{tag}",  # names never seen before: resolved in workflow code, not prebuilt
        f"openai:rr-first-{tag}",
    ]
    env = user_env(("RR_", "OPENAI_"))
    # the worker serves the OpenAI families (any model name of them), the heuristic and the plugin's models
    env.update(
        {
            "RR_HOME": str(tmp_path / "rr-home"),
            "RR_PLUGINS": "reflector.testing.scripted",
            "RR_WORKER_MODELS": "openai-chat,openai",
        }
    )
    p = subprocess.run(
        [sys.executable, "-m", "tests.support.first_activation", temporal_server.address, *models],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.loads(line[len("RESULT ") :])
    for model in models:
        assert results[model]["stop_reason"] == "completed", (model, results[model])
    assert {m: r["imports"] for m, r in results.items()} == {m: [] for m in models}, results
