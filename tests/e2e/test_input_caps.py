"""Every user-sized input at 100 MB (issue 26, point 4): the skillbook goes to the blob store and an online
reflection over a 100 MB skillbook completes with the right skill tags; every capped input fails fast with
its one-line error (the CLI: `rr: error:`, exit 2; the Python API: the same message as `ReflectError`).

A command-line argument is at most 128 KiB on Linux (MAX_ARG_STRLEN), so the CLI's text flags are fed just
over their cap and the Python API takes the 100 MB values.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reflector.analysis.limits import MAX_SKILL_IDS, MAX_TASK_TEXT_CHARS, MAX_WORKFLOW_ID_CHARS
from tests.e2e.test_cli import _one_line_error
from tests.e2e.test_hostile_cli import rr

MB = 1024**2
TRACE = {
    "question": "Cancel my trip",
    "ground_truth": "cancel_reservation(reservation_id=Z7GOZK)",
    "steps": [
        {"role": "assistant", "content": "Following [booking-00001] I ask for the id. Also [booking-99999]."},
        {"role": "tool", "tool_name": "cancel_reservation", "content": "Error: reservation not found"},
        {"role": "assistant", "content": "I could not cancel it."},
    ],
    "final_answer": "I could not cancel it.",
}


def _skillbook_100mb(path: Path) -> Path:
    """~100 MB: two skills the prompt lists first (one cited by the trace), then 2,100 long ones."""
    filler = ("Check the fare rules, the cabin class and the passenger list before any change. " * 640)[
        :50_000
    ]
    with path.open("w", encoding="utf-8") as fh:
        fh.write(
            "## Booking\n[booking-00001] Confirm the reservation id before cancelling.\n"
            "[booking-00002] Check the cabin class rules before a change.\n## Long\n"
        )
        for i in range(2_100):
            fh.write(f"[long-{i:05d}] {filler}\n")
    assert path.stat().st_size > 100 * MB - 1
    return path


@pytest.fixture
def env(temporal_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    from reflector.runtime.settings import Settings
    from tests.support.blob_dirs import EXTRA_BLOB_DIRS

    e = {
        "RR_HOME": str(tmp_path / "rr-home"),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"caps-{uuid.uuid4().hex[:8]}",
    }
    monkeypatch.setenv("RR_HOME", e["RR_HOME"])
    monkeypatch.delenv("RR_BLOB_DIR", raising=False)
    EXTRA_BLOB_DIRS.append(Path(Settings.from_env().blob_dir))  # the session's final replay reads it
    yield e


@pytest.mark.slow
def test_online_reflection_over_a_100_mb_skillbook_tags_the_cited_skill(
    env: dict[str, str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(TRACE))
    book = _skillbook_100mb(tmp_path / "sb.txt")
    t0 = time.monotonic()
    p = rr(
        "reflect", str(trace), "--skillbook", str(book), "--mode", "online", "--json", env=env, timeout=240
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["raw"]["rr_trace"]["stop_reason"] == "completed"
    assert [(t["id"], t["tag"]) for t in out["skill_tags"]] == [("booking-00001", "harmful")]
    assert time.monotonic() - t0 < 240


def test_capped_cli_inputs_fail_fast_with_one_line(env: dict[str, str], tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(TRACE))
    over = "q" * (MAX_TASK_TEXT_CHARS + 1)
    for flag, needle in (
        ("--question", "the question (--question) is"),
        ("--ground-truth", "the ground truth (--ground-truth) is"),
        ("--feedback", "the feedback (--feedback) is"),
    ):
        _one_line_error(rr("reflect", str(trace), flag, over, env=env, timeout=60), needle)
    _one_line_error(
        rr("reflect", str(trace), "--id", "i" * (MAX_WORKFLOW_ID_CHARS + 1), env=env, timeout=60), "--id is"
    )
    # a 100 MB skillbook over each of its caps: too many ids; too many bytes as the sandbox receives it
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"[a-001] x\n" * (10 * MB))
    t0 = time.monotonic()
    p = rr("reflect", str(trace), "--skillbook", str(ids), "--mode", "online", env=env, timeout=60)
    _one_line_error(p, f"more than {MAX_SKILL_IDS:,} skill ids")
    assert p.returncode == 2
    ctrl = tmp_path / "ctrl.txt"
    ctrl.write_bytes(b"\x01" * (100 * MB))  # six bytes each in JSON: 600 MB
    p = rr("reflect", str(trace), "--skillbook", str(ctrl), env=env, timeout=60)
    _one_line_error(p, "MAX_SKILLBOOK_BYTES")
    assert p.returncode == 2
    assert time.monotonic() - t0 < 60


def test_capped_python_api_inputs_raise_the_same_line(env: dict[str, str]) -> None:
    from reflector.client import ReflectError
    from reflector.client.api import reflect

    big = "x" * (100 * MB)
    for kwargs, needle in (
        ({"question": big}, "the question (--question) is 104,857,600 characters"),
        ({"ground_truth": big}, "the ground truth (--ground-truth) is"),
        ({"feedback": big}, "the feedback (--feedback) is"),
        ({"workflow_id": big}, "--id is"),
    ):
        t0 = time.monotonic()
        with pytest.raises(ReflectError) as e:
            reflect(traces=TRACE, timeout=60, **kwargs)  # type: ignore[arg-type]
        assert needle in str(e.value) and "\n" not in str(e.value)
        assert time.monotonic() - t0 < 30
    with pytest.raises(ReflectError, match="more than 50,000 skill ids"):
        reflect(traces=TRACE, skillbook="[a-001] x\n" * (10 * MB), mode="online", timeout=60)


def test_a_batch_over_its_run_cap_is_refused() -> None:
    from reflector.analysis.limits import MAX_BATCH_RUNS
    from reflector.client import ReflectError, build_batch_input
    from reflector.contract import ManifestRef

    with pytest.raises(ReflectError, match="MAX_BATCH_RUNS"):
        build_batch_input(ManifestRef(sha256="0" * 64, size=1, n_runs=MAX_BATCH_RUNS + 1))
