"""Every command and code block of README.md and docs/*.md runs, as written, so the docs stay true.

The shell blocks run with `rr` on PATH in one fresh RR_HOME on the embedded default with the offline
`heuristic` model, in document order (README first, then the manual's nav order), in a scratch directory
where `reflector/` (its examples), `tests/` and `.venv` are at hand as in a clone; identical blocks run once, so the
pages can repeat the tour's commands. They share one reflection, `tour`, made by the README's tour. Python
blocks run in a subprocess in the same place. `OPENAI_BASE_URL` points every block at a scripted OpenAI
server on loopback (`reflector.testing.openai_server`), so no block reaches a provider, and the AWS
variables at a local S3 server (`tests/support/s3_server.py`) holding the bucket the docs name. Long-running
commands (`<!-- background: ... -->`) start first, and are stopped by PID once the others ran. Blocks
that cannot run here say why in the markdown (`<!-- norun: REASON -->`) and are listed by a test.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from tests.docs.blocks import REPO, Block, all_blocks, blocks_of, markdown_files
from tests.support import prefork
from tests.support.user_env import SUITE_SETTINGS

pytestmark = pytest.mark.docs  # `pytest -m docs`: the tests that keep README.md and docs/ true

BLOCK_TIMEOUT_S = 240
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
PAGES_AT_ONCE = 3
S3_BUCKET = "my-bucket"  # the bucket docs/operations.md names
SCRUBBED = (
    "RR_",
    "TEMPORAL_",
    "OPENAI_",
    "ANTHROPIC_",
    "GEMINI_",
    "GOOGLE_",
    "AWS_",
    "OTEL_",
    "LOGFIRE_",
    "PYTEST_",
)


def test_every_block_runs_or_says_why() -> None:
    """A runnable block is run, unless its markdown says why not; the list is printed (`-s`, `-rA`)."""
    blocks = all_blocks()
    runnable = [b for b in blocks if b.kind]
    assert runnable, "no runnable blocks found"
    skipped = [b for b in runnable if b.norun is not None]
    for b in skipped:
        assert len(b.norun or "") >= 20, f"{b.where}: say why the block does not run"
        print(f"not run: {b.where}: {b.norun}")
    for b in blocks:
        if b.lang in ("console", "shell", "zsh", "py", "python3", "sh-session"):
            pytest.fail(f"{b.where}: use ```bash or ```python, which the docs test runs")
        if b.kind is None:
            assert b.norun is None and b.ready is None, f"{b.where}: a note on a block that is not run"
    assert len(skipped) <= 10, "keep the blocks that cannot run here few: " + ", ".join(
        b.where for b in skipped
    )


def test_setup_commands_are_what_ci_runs() -> None:
    """The README's set-up block does not run here; what it says is what .ci/run does."""
    setup = next(b for b in blocks_of(REPO / "README.md") if b.kind and "pip install" in b.text)
    ci = (REPO / ".ci" / "run").read_text()
    assert ".venv/bin/pip install -e '.[dev]'" in setup.text and "install --quiet -e '.[dev]'" in ci
    commands = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert commands[-1] == ".venv/bin/pytest -q"
    assert setup.text.rstrip().splitlines()[-1] == commands[-1]


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    for target in re.findall(r"\]\(([^)\s]+)\)", readme.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / path) if path else readme
        assert file.exists(), f"README links to {target}: no such file"
        if anchor:
            headings = [slugify(h, "-") for h in re.findall(r"^#+\s+(.*)$", file.read_text(), re.M)]
            assert anchor in headings, f"README links to {target}: no such heading in {path}"


# ---------------------------------------------------------------------------------------------------
# Running them
# ---------------------------------------------------------------------------------------------------


@dataclass
class Place:
    cwd: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def place() -> Iterator[Place]:
    from reflector.testing.openai_server import OpenAIServer
    from tests.support.s3_server import s3_server

    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rr-docs-")))
        openai = stack.enter_context(OpenAIServer())
        s3 = stack.enter_context(s3_server(root / "s3.log"))
        s3.client().create_bucket(Bucket=S3_BUCKET)
        cwd = root / "work"
        cwd.mkdir()
        venv_bin = Path(sys.executable).parent
        for name in ("reflector", "tests", "pyproject.toml"):  # a clone's files the blocks use
            (cwd / name).symlink_to(REPO / name)
        (cwd / ".venv").symlink_to(venv_bin.parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}
        # `rr` on PATH is this venv's, forked by the suite's fork server (tests/support/prefork.py) unless
        # RR_TESTS_EXEC=1: the blocks' commands as written, without each paying the worker stack's imports
        shims = [] if not prefork.available() else [prefork.write_rr_shim(root / "bin").parent]
        env.update(
            PATH=os.pathsep.join([*map(str, shims), str(venv_bin), env.get("PATH", "")]),
            RR_HOME=str(root / "home"),
            **SUITE_SETTINGS,
            OPENAI_BASE_URL=openai.base_url,
            OPENAI_API_KEY="sk-docs-test",
        )
        env.update(
            {k: v for k, v in s3.env().items() if k.startswith("AWS_")}
        )  # not RR_BLOB_URL: blocks say it
        yield Place(cwd, env)


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float  # user + system time of the block's processes (waited for; not the forked `rr`s of a shell block)


def _run(argv: list[str], place: Place) -> Ran:
    """Run one block; its CPU time is read from wait4's rusage (other threads' children do not mix in), or the
    fork server's for a Python block it forked."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = prefork.Popen(
            argv,
            cwd=place.cwd,
            env=place.env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if proc.forked:
            try:
                proc.wait(BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.seek(0)
            err.seek(0)
            return Ran(proc.returncode, out.read().decode(errors="replace"),
                       err.read().decode(errors="replace"), proc.cpu_s or 0.0)  # fmt: skip
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Ran(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            usage.ru_utime + usage.ru_stime,
        )


def _shell(block: Block, place: Place) -> Ran:
    return _run(["bash", "-e", "-o", "pipefail", "-c", block.text], place)


def _python(block: Block, place: Place) -> Ran:
    script = place.cwd / f"block_{Path(block.file).stem}_{block.line}.py"
    script.write_text(block.text)
    return _run([sys.executable, script.name], place)


@dataclass
class Background:
    block: Block
    proc: subprocess.Popen[bytes]
    log: Path


def _start(block: Block, place: Place) -> Background:
    """Start a background block (one command, exec'd, so its PID is the command's) and wait until ready."""
    command = [line for line in block.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(command) == 1, f"{block.where}: a background block is one command"
    log = place.cwd / f"background_{block.line}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec env {command[0]}"],  # env: the command may start with VAR=value
            cwd=place.cwd,
            env=place.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    assert block.ready is not None
    while block.ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(Background(block, proc, log))
            pytest.fail(f"{block.where}: {command[0]!r} did not print {block.ready!r}:\n{log.read_text()}")
        time.sleep(0.2)
    return Background(block, proc, log)


def _stop(bg: Background) -> int:
    if bg.proc.poll() is None:
        bg.proc.send_signal(signal.SIGTERM)
        try:
            bg.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            bg.proc.kill()
            bg.proc.wait()
    return bg.proc.returncode


@pytest.mark.slow
def test_the_blocks_run_as_written(place: Place) -> None:
    blocks = [b for b in all_blocks() if b.kind and b.norun is None]
    background = [b for b in blocks if b.ready]
    foreground: list[Block] = []
    seen: set[str] = set()
    for b in blocks:
        if not b.ready and b.text not in seen:
            seen.add(b.text)
            foreground.append(b)

    failures: list[str] = []
    started: list[Background] = []
    timings: list[tuple[float, float, str]] = []

    def run_page(page: list[Block]) -> None:
        for b in page:
            t0 = time.monotonic()
            p = _shell(b, place) if b.kind == "shell" else _python(b, place)
            timings.append((time.monotonic() - t0, p.cpu_s, b.where))
            if p.returncode != 0:
                failures.append(
                    f"{b.where} exited {p.returncode}:\n{b.text}--- stdout:\n{p.stdout[-3000:]}"
                    f"--- stderr:\n{p.stderr[-3000:]}"
                )

    # The README's first block makes the tour's reflection, which the other blocks use: it runs alone first.
    first, rest = foreground[0], foreground[1:]
    assert first.file == "README.md" and "--id tour" in first.text, first.where
    pages: dict[str, list[Block]] = {}
    for b in rest:
        pages.setdefault(b.file, []).append(b)
    try:
        for b in background:
            started.append(_start(b, place))
        run_page([first])
        with ThreadPoolExecutor(PAGES_AT_ONCE) as pool:  # pages in parallel, each page's blocks in order
            list(pool.map(run_page, pages.values()))
    finally:
        for bg in reversed(started):
            code = _stop(bg)
            if code != 0:
                failures.append(
                    f"{bg.block.where}: {bg.block.text.strip()!r} exited {code} on SIGTERM:\n"
                    f"{bg.log.read_text(errors='replace')[-3000:]}"
                )
    print(
        f"{len(timings)} blocks, {sum(t[1] for t in timings):.1f} s CPU in their processes (not counting the `rr`s "
        "a shell block ran through the fork server); the longest:"
    )
    for seconds, cpu, where in sorted(timings, reverse=True)[:8]:
        print(f"{seconds:6.1f} s wall {cpu:6.1f} s CPU  {where}")
    assert not failures, "\n\n".join(failures)


def test_the_runner_sees_every_page() -> None:
    """The nav lists every page under docs/ (so none escapes the docs test), and each is in the nav once."""
    files = markdown_files()
    assert len(files) == len(set(files))
    on_disk = {p for p in (REPO / "docs").glob("*.md")}
    assert on_disk == set(files[1:]), f"pages missing from mkdocs.yml's nav: {sorted(on_disk - set(files))}"
