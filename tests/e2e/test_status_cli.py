"""`rr status` and the live progress of `rr reflect`, as subprocesses (stderr is a pipe: plain lines).

A worker subprocess with the gated scripted model (`tests.support.gated_models`) holds a reflection tree
still (the root waiting for its child, the child at its gate) while `rr status` looks at it; `rr status
--follow` and `rr reflect` are read line by line while they run, and the gate is opened once the line
the test waits for is there (no timing assumption: a bound on the wait, never on how fast).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.support.gated_models as gated
from tests.support import prefork
from tests.support.blob_dirs import EXTRA_BLOB_DIRS
from tests.support.procs import REPO_ROOT, WorkerProcess
from tests.support.user_env import user_env

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = REPO_ROOT / "reflector" / "examples" / "failed_math.json"
PLUGINS = "reflector.testing.scripted,tests.support.gated_models"


def _env(env: dict[str, str]) -> dict[str, str]:
    base = user_env()
    return {**base, "PYTHONPATH": str(REPO_ROOT), **env}


def rr(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return prefork.run(
        [sys.executable, "-m", "reflector.cli", *args],
        env=_env(env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Running:
    """`rr ARGS` in a subprocess; stderr is read line by line in a thread (to wait for a line)."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = prefork.Popen(
            [sys.executable, "-m", "reflector.cli", *args],
            env=_env(env),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, *needles: str, bound_s: float = 120) -> str:
        """The first stderr line containing every needle."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            found = next((ln for ln in list(self.lines) if all(n in ln for n in needles)), None)
            if found is not None:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"{needles!r} not seen on stderr:\n" + "\n".join(self.lines))

    def wait(self, timeout: float = 120) -> int:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def live(temporal_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private rr home and task queue on the session server, with a worker subprocess on them."""
    root = tmp_path_factory.mktemp("status-cli")
    home = root / "rr-home"
    EXTRA_BLOB_DIRS.append(home / "blobs")  # the suite's final replay reads these histories' payloads
    env = {
        "RR_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RR_TASK_QUEUE": f"status-cli-{uuid.uuid4().hex[:6]}",
        "RR_PLUGINS": PLUGINS,
    }
    worker = WorkerProcess({**env, "PYTHONPATH": str(REPO_ROOT)}, root / "worker.log")
    try:
        worker.wait_ready(60)
        yield env
    finally:
        worker.stop()


def _tree_question(gate: Path) -> str:
    child = {"code": ["print('child cell')"], "children": [], "after": [], "wait": str(gate), "wait_after": 1}
    tree = {"code": ["x = 1\nprint('root cell', x)"], "children": [child], "after": ["print('after', x)"]}
    return f"PLAN:{json.dumps(tree)}"


def _start_tree(env: dict[str, str], gate: Path, wf_id: str) -> Running:
    return Running(
        "reflect",
        str(EXAMPLE),
        "--model",
        gated.MODEL,
        "--question",
        _tree_question(gate),
        "--recursion",
        "always",
        "--id",
        wf_id,
        "--max-requests",
        "20",
        "--json",
        env=env,
    )


def _child_at_gate(env: dict[str, str], child_id: str, bound_s: float = 120) -> dict[str, Any]:
    """`rr status --json` of the child, polled until it waits at its gate."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        p = rr("status", child_id, "--json", env=env)
        if p.returncode == 0:
            st = json.loads(p.stdout)
            prog = st.get("progress") or {}
            if prog.get("cells") == 1 and prog.get("phase") == "waiting for the model":
                return st
        # not faster: a child holding its workflow task (its in-process model request waits at the gate)
        # answers queries only when the task is renewed, and piled-up queries fill the server's query buffer
        time.sleep(1.0)
    raise AssertionError(f"{child_id} never reached its gate")


def test_status_of_a_running_tree_then_of_the_finished_reflection(
    live: dict[str, str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wf_id = f"status-{uuid.uuid4().hex[:8]}"
    run = _start_tree(live, gate, wf_id)
    try:
        child = _child_at_gate(live, f"{wf_id}.r1")
        assert child["parent_workflow_id"] == wf_id and child["progress"]["depth"] == 1

        # a child answers its query when its workflow task completes or is renewed (seconds apart while its
        # model request runs): under load one `rr status` can miss it, and says so; ask again
        for _ in range(20):
            p = rr("status", wf_id, "--json", env=live)
            assert p.returncode == 0, p.stderr
            st = json.loads(p.stdout)  # one object
            if all(k.get("progress") for k in st.get("running_children", [])):
                break
            time.sleep(1.0)
        assert st["status"] == "running" and st["kind"] == "reflection" and st["elapsed_s"] > 0
        prog = st["progress"]
        assert prog["phase"] == "waiting for child" and prog["child_running"] == f"{wf_id}.r1"
        assert (prog["max_requests"], prog["depth"], prog["last_tool"], prog["last_cell"]) == (
            20,
            0,
            "recurse",
            3,
        )
        [kid] = st["running_children"]
        assert kid["workflow_id"] == f"{wf_id}.r1" and kid["progress"]["cells"] == 1
        assert st["tree_requests"] == prog["requests"] + kid["progress"]["requests"] == 3

        for _ in range(20):  # likewise: until the running child answered this one too
            text = rr("status", wf_id, env=live)
            assert text.returncode == 0, text.stderr
            if "(tree total)" in text.stdout:
                break
            time.sleep(1.0)
        assert f"reflection {wf_id}: running for " in text.stdout
        assert "phase: waiting for child" in text.stdout and "requests: 3/20 (tree total)" in text.stdout
        assert f"children: 0 done, 1 running ({wf_id}.r1)" in text.stdout
        assert f"reflection {wf_id}.r1: running for " in text.stdout

        # the reflecting CLI's own plain lines show the same tree while it waits
        run.wait_for("  … ", "waiting for child", f"1 running: {wf_id}.r1 (depth 1", "requests 3/20 (tree)")
    finally:
        gate.write_text("open")
    assert run.wait() == 0, "\n".join(run.lines)
    out = json.loads(run.stdout)
    usage = out["raw"]["usage"]
    summary = run.wait_for(f"rr: reflection {wf_id} completed after ")
    assert f"requests {usage['requests']}/20 · tokens {usage['total_tokens']:,}/500,000" in summary
    assert "cells 2 by the model (0 failed) · children 1 · compactions 0" in summary
    progress_lines = [ln for ln in run.lines if ln.startswith("  … ")]
    # one line per change: no two consecutive lines say the same thing (elapsed time aside)
    said = [ln.split("] ", 1)[1] for ln in progress_lines]
    assert all(a != b for a, b in zip(said, said[1:], strict=False)), progress_lines

    done = rr("status", wf_id, env=live)
    assert done.returncode == 0, done.stderr
    assert f"reflection {wf_id}: completed after " in done.stdout and "stop reason completed" in done.stdout
    assert f"requests: {usage['requests']}/20" in done.stdout and "children: 1 done" in done.stdout
    assert f"{wf_id}.r1: done, stop reason completed, requests 2" in done.stdout
    js = json.loads(rr("status", wf_id, "--json", env=live).stdout)
    assert js["status"] == "completed" and js["complete"] is True
    assert (
        js["progress"]["requests"] == usage["requests"]
        and js["progress"]["cells"] == out["raw"]["rr_trace"]["cells"]
    )


def test_status_follow_shows_plain_progress_lines_then_the_final_status(
    live: dict[str, str], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wf_id = f"follow-{uuid.uuid4().hex[:8]}"
    run = _start_tree(live, gate, wf_id)
    run.wait_for(f"started reflection {wf_id}")
    follow = Running("status", wf_id, "--follow", env=live)
    try:
        line = follow.wait_for("  … ", "waiting for child", "(tree)")
        assert "cells 1 by the model (0 failed), latest [cell 3]" in line and "last tool recurse" in line
        assert line.startswith("  … [")  # the elapsed time comes first
    finally:
        gate.write_text("open")
    assert follow.wait() == 0, "\n".join(follow.lines)
    assert run.wait() == 0, "\n".join(run.lines)
    assert follow.wait_for(f"rr: reflection {wf_id} completed after ", "requests ", "/20")
    assert f"reflection {wf_id}: completed after " in follow.stdout
    assert "\x1b[" not in "\n".join(follow.lines)  # not a terminal: no control sequences


def test_status_of_an_unknown_id_is_one_error_line_and_exit_2(live: dict[str, str]) -> None:
    for args in (
        ("status", "no-such-reflection-zz"),
        ("status", "no-such-reflection-zz", "--follow", "--json"),
    ):
        p = rr(*args, env=live)
        assert p.returncode == 2, p.stderr
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("rr: error:")]
        assert errors == ["rr: error: no reflection or batch with id 'no-such-reflection-zz'"], p.stderr
        assert "Traceback" not in p.stderr and p.stdout == ""


def test_status_without_a_worker_says_so_and_follow_reports_it(live: dict[str, str]) -> None:
    nobody = {**live, "RR_TASK_QUEUE": f"nobody-{uuid.uuid4().hex[:6]}"}
    # started by the client API on a queue no worker polls (`rr reflect` would run its own worker)
    code = (
        "import asyncio, sys\n"
        "from reflector import client as c\n"
        "from reflector.runtime.settings import Settings\n"
        "async def main():\n"
        "    s = Settings.from_env()\n"
        "    cl = await c.connect(s.address, settings=s)\n"
        "    h = await c.start_reflection(cl, c.build_input(c.upload_trace(sys.argv[1], s)), s.task_queue, sys.argv[2])\n"
        "    print(h.id, flush=True)\n"
        "asyncio.run(main())\n"
        # the Temporal client's native threads can abort interpreter finalization (issue 16): the CLI
        # exits with os._exit for this reason, and so does this script
        "import os; os._exit(0)\n"
    )
    wf_id = f"idle-{uuid.uuid4().hex[:8]}"
    started = prefork.run(
        [sys.executable, "-c", code, str(EXAMPLE), wf_id],
        env=_env(nobody),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    follow = None
    try:
        p = rr("status", wf_id, env=nobody)
        assert p.returncode == 0, p.stderr
        assert "running" in p.stdout and "no worker is running it right now" in p.stdout
        assert nobody["RR_TASK_QUEUE"] in p.stdout
        js = json.loads(rr("status", wf_id, "--json", env=nobody).stdout)
        assert js["waiting_for_worker"] is True and js["progress"] is None

        follow = Running("status", wf_id, "--follow", env=nobody)
        notice = follow.wait_for(f"rr: reflection {wf_id}: no worker is running it right now")
        assert "rr worker" in notice
    finally:
        rr_term = prefork.run(
            [
                sys.executable,
                "-c",
                "import asyncio, sys\nfrom reflector import client as c\nfrom reflector.runtime.settings "
                "import Settings\nasync def m():\n    s = Settings.from_env()\n    cl = await c.connect(s.address, "
                "settings=s)\n    await cl.get_workflow_handle(sys.argv[1]).terminate('test cleanup')\nasyncio.run(m())\n"
                "import os; os._exit(0)\n",  # as above: no interpreter finalization
                wf_id,
            ],
            env=_env(nobody),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rr_term.returncode == 0, rr_term.stderr
    assert follow.wait() == 1, "\n".join(follow.lines)  # it ended, but not completed
    assert follow.wait_for(f"rr: reflection {wf_id} terminated after ")
    assert f"reflection {wf_id}: terminated after " in follow.stdout


def test_a_fast_reflection_still_ends_with_a_summary_line(live: dict[str, str]) -> None:
    wf_id = f"fast-{uuid.uuid4().hex[:8]}"
    p = rr("reflect", str(EXAMPLE), "--id", wf_id, "--json", env=live)
    assert p.returncode == 0, p.stderr
    usage = json.loads(p.stdout)["raw"]["usage"]
    [summary] = [
        ln for ln in p.stderr.splitlines() if ln.startswith(f"rr: reflection {wf_id} completed after ")
    ]
    assert f"requests {usage['requests']}/50 · tokens {usage['total_tokens']:,}/500,000" in summary


def test_a_batch_ends_with_a_summary_line_and_has_a_status(live: dict[str, str], tmp_path: Path) -> None:
    from reflector.testing.tau_runs import tau_run

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(tau_run(1, errors={"get_user_details": 1}, book=False)))
    b.write_text(json.dumps(tau_run(2)))
    batch_id = f"batch-{uuid.uuid4().hex[:8]}"
    p = rr("reflect", str(a), str(b), "--id", batch_id, env=live)
    assert p.returncode == 0, p.stderr
    assert any(
        ln.startswith(f"rr: batch {batch_id} completed after ") and ln.endswith(": 2/2 reflected, 0 failed")
        for ln in p.stderr.splitlines()
    ), p.stderr
    st = rr("status", batch_id, env=live)
    assert st.returncode == 0, st.stderr
    assert (
        f"batch {batch_id}: completed after " in st.stdout
        and "runs: 2/2 reflected, 0 running, 0 failed" in st.stdout
    )
    js = json.loads(rr("status", batch_id, "--json", env=live).stdout)
    assert js["kind"] == "batch" and js["batch"]["done"] == 2 and js["complete"] is True
