"""`rr reflect` in a subprocess against a provider that refuses the key: one clear line, no traceback,
one HTTP request, exit code 4 (INCOMPLETE). Its in-process worker runs on a private task queue of the
session's Temporal server; the provider is the local scripted OpenAI server."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from reflector.testing.openai_server import OpenAIServer
from reflector.testing.scripted_http import Fault
from tests.support import prefork
from tests.support.user_env import user_env

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
EXIT_INCOMPLETE = 4


def _rr_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "rr"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "reflector.cli"]


def test_reflect_with_a_refused_key_says_so_in_one_line(temporal_server, tmp_path: Path) -> None:
    with OpenAIServer() as server:
        server.faults.extend([Fault.unauthorized()] * 6)  # a retry would be refused again, and show
        env = user_env(("RR_", "TEMPORAL_", "OPENAI_"))
        env.update(
            RR_HOME=str(tmp_path / "rr-home"),
            TEMPORAL_ADDRESS=temporal_server.address,
            RR_TASK_QUEUE=f"rr-cli-{uuid.uuid4().hex[:6]}",
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-wrong",
            RR_PROVIDER_TIMEOUT_S="10",
        )
        p = prefork.run(
            [*_rr_cmd(), "reflect", str(EXAMPLE), "--model", "openai-chat:gpt-4o-mini"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    assert p.returncode == EXIT_INCOMPLETE, p.stderr
    assert "Traceback" not in p.stderr and "The above exception" not in p.stderr, p.stderr
    said = [line for line in p.stderr.splitlines() if "authentication failed" in line]
    assert said == [
        "rr: the reflection is INCOMPLETE (stop reason: error: authentication failed (HTTP 401): "
        "Incorrect API key provided [invalid_api_key] (model 'gpt-4o-mini')): exit code 4"
    ], p.stderr
    assert server.statuses() == [401] and not server.completed
    assert "stop: error (INCOMPLETE)  requests: 0  tokens: 0" in p.stdout
