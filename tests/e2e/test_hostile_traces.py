"""`rr reflect` on hostile trace files: one `rr: error:` line, no traceback, in bounded time.

These traces are refused while the trace is validated, before the CLI connects to Temporal or writes a
blob, so no server is needed: `TEMPORAL_ADDRESS` points at a closed port, and a refusal that came
after connecting would read "not reachable" instead of the expected message.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from reflector.analysis.traces import MAX_NESTING
from tests.e2e.test_cli import _one_line_error, rr

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["whole", "streamed"])
def env(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """Both client paths: a small trace parsed whole, and the streaming scan large traces take (forced
    here by a lazy threshold of 1 byte)."""
    lazy = {"RR_LAZY_TRACE_BYTES": "1"} if request.param == "streamed" else {}
    return {"RR_HOME": str(tmp_path / "rr-home"), "TEMPORAL_ADDRESS": "127.0.0.1:1", **lazy}


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bomb.json", "[" * 200_000),
        ("deep.json", "[" * 5_000 + "]" * 5_000),
        ("deep-dicts.json", '{"a":' * 5_000 + "1" + "}" * 5_000),
        ("deep.jsonl", '{"type": "session"}\n{"type": "message", "x": ' + "[" * 5_000 + "]" * 5_000 + "}\n"),
    ],
    ids=["bomb", "valid-5000-lists", "valid-5000-dicts", "jsonl-deep-line"],
)
def test_deep_json_is_one_line_error(env: dict[str, str], tmp_path: Path, name: str, text: str) -> None:
    trace = tmp_path / name
    trace.write_text(text)
    start = time.perf_counter()
    p = rr("reflect", str(trace), env=env, timeout=60)
    elapsed = time.perf_counter() - start
    _one_line_error(p, f"nests deeper than {MAX_NESTING} levels")
    assert "RecursionError" not in p.stderr, p.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert not (tmp_path / "rr-home" / "blobs").exists() or not any(
        (tmp_path / "rr-home" / "blobs").rglob("*.*")
    )
