"""The worker <-> host channel (issue 25, points 3 and 6): a frame is all or nothing, a reply is
bounded field by field, and a host's snapshot / export bytes never sit whole in worker memory.

Host side: a frame that breaks off half-way (a MemoryError or a signal handler between its reads, a
short or malformed frame) ends the host with `CHANNEL_BROKEN_EXIT`, so bytes meant as data (an
archived transcript) are never read as a request. The raw-host tests play the worker on a real
`sandbox.host` process; the fault-injection ones patch the host's `read_exact` to fail where a full
memory would (the realistic guarded cell is `test_a_cell_that_fills_memory_then_reads_an_archive`).

Worker side: every reply is checked against the bound the host's side states; anything else stops
that host and fails that request only (`_ProtocolError` / `_HostDied`), fuzzed below.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox import hostproc as executor_mod
from sandbox.executor import SubprocessExecutor
from sandbox.hostproc import _exchange, _HostDied, _ProtocolError, _read_reply
from sandbox.protocol import SandboxLimits
from sandbox.sessions import SessionManager
from sandbox.wire import (
    CHANNEL_BROKEN_EXIT,
    FINAL_ANSWER_MAX_BYTES,
    MAX_ERROR_CHARS,
    NOTE_MAX_CHARS,
    encode,
    host_env,
)
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(sys.platform != "linux", reason="Linux hosts")]

SHA = "ab" * 32
CRAFTED = 4242  # the `n` of a request hidden in data: a reply carrying it means the host acted on data


# -- a raw host, driven by the test as the worker ------------------------------------------------------
def _spawn_raw(tmp_path: Path, driver: str = "") -> subprocess.Popen[bytes]:
    """A real `sandbox.host` main loop (language-only isolation: the channel is the subject), with
    `driver` run first inside it (fault injection: `m` is `sandbox.host.main`)."""
    limits = json.dumps(dataclasses.asdict(TEST_LIMITS))
    code = f"import sys\nimport sandbox.host.main as m\n{driver}\nsys.exit(m.main(['host', {limits!r}]))\n"
    workdir = tmp_path / f"host-{time.monotonic_ns()}"
    workdir.mkdir()
    return subprocess.Popen(
        [sys.executable, "-S", "-s", "-B", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
        env=host_env(str(workdir), "language-only"),
        start_new_session=True,
    )


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.flush()
    except BrokenPipeError:  # the host is gone: what it did is in its exit status and its frames
        pass


def _read_exactly(fd: int, n: int, deadline: float) -> bytes | None:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("the host neither answered nor exited")
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _frame(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> dict[str, Any] | None:
    """The host's next frame, or None at EOF (it exited); TimeoutError if it hangs."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    header = _read_exactly(proc.stdout.fileno(), 4, deadline)
    if header is None:
        return None
    body = _read_exactly(proc.stdout.fileno(), struct.unpack(">I", header)[0], deadline)
    assert body is not None, "the host sent half a frame"
    frame: dict[str, Any] = json.loads(body)
    return frame


def _drain(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> list[dict[str, Any]]:
    """Every frame until the host exits; then its exit status must come within the timeout."""
    frames = []
    while (frame := _frame(proc, timeout)) is not None:
        frames.append(frame)
    proc.wait(timeout)
    return frames


def _started(proc: subprocess.Popen[bytes]) -> None:
    _send(proc, encode({"op": "start", "n": 1, "archive_root": "worker", "extra_vars": {}}))
    reply = _frame(proc)
    assert reply is not None and reply["ok"] and reply["n"] == 1, reply


def _archive_answer(half: int) -> bytes:
    """An ARCHIVE answer whose second half starts with a request frame (`ping`, n=CRAFTED)."""
    crafted = encode({"op": "ping", "n": CRAFTED})
    data = b"x" * half + crafted + b"\0" * (half - len(crafted))
    return encode({"ok": True, "size": len(data)}) + data


_ARCHIVE_CELL = (
    f"try:\n    ARCHIVE({SHA!r})\nexcept Exception as exc:\n    print('caught', type(exc).__name__)\n"
)


def test_a_memory_error_half_way_through_an_answer_ends_the_host(tmp_path: Path) -> None:
    """The issue's case: the cell catches the MemoryError raised while the answer's bytes are read;
    before, the host then read the rest of the answer as its next request and acted on it."""
    proc = _spawn_raw(
        tmp_path,
        (
            "real = m.read_exact\n"
            "def read_exact(fd, n):\n"
            "    if n >= 1000:\n"
            "        real(fd, n // 2)\n"
            "        raise MemoryError('(injected) half-way through the answer')\n"
            "    return real(fd, n)\n"
            "m.read_exact = read_exact\n"
        ),
    )
    try:
        _started(proc)
        _send(proc, encode({"op": "cell", "n": 2, "code": _ARCHIVE_CELL}))
        ask = _frame(proc)
        assert ask is not None and ask["ask"] == {"what": "archive", "sha256": SHA}, ask
        _send(proc, _archive_answer(2048))
        _send(proc, encode({"op": "ping", "n": 3}))
        frames = _drain(proc)
        assert CRAFTED not in [f.get("n") for f in frames], f"the host acted on the answer's bytes: {frames}"
        assert frames == [] and proc.returncode == CHANNEL_BROKEN_EXIT, (frames, proc.returncode)
    finally:
        proc.kill()


def test_a_signal_handler_cannot_raise_in_the_middle_of_a_frame(tmp_path: Path) -> None:
    """A handler that raises (a CPU budget, an alarm) while an answer is being read runs after the
    frame is whole: the cell sees the exception, the channel stays in step."""
    proc = _spawn_raw(
        tmp_path,
        (
            "import signal\n"
            "def on_alarm(*_):\n"
            "    raise TimeoutError('(injected) the budget ran out')\n"
            "signal.signal(signal.SIGALRM, on_alarm)\n"
            "real = m.read_exact\n"
            "def read_exact(fd, n):\n"
            "    if n >= 1000:\n"
            "        signal.setitimer(signal.ITIMER_REAL, 0.3)\n"
            "    return real(fd, n)\n"
            "m.read_exact = read_exact\n"
        ),
    )
    try:
        _started(proc)
        _send(proc, encode({"op": "cell", "n": 2, "code": _ARCHIVE_CELL}))
        ask = _frame(proc)
        assert ask is not None and "ask" in ask, ask
        answer = _archive_answer(2048)
        _send(proc, answer[: len(answer) // 2])
        time.sleep(1.0)  # the alarm fires while the host waits for the second half
        _send(proc, answer[len(answer) // 2 :])
        _send(proc, encode({"op": "ping", "n": 3}))
        frames = [_frame(proc), _frame(proc)]
        assert CRAFTED not in [f and f.get("n") for f in frames], (
            f"the host acted on the answer's bytes: {frames}"
        )
        cell, ping = frames
        assert cell is not None and cell["n"] == 2 and "caught TimeoutError" in cell["stdout"], cell
        assert ping is not None and ping["n"] == 3 and ping["ok"], ping
    finally:
        proc.kill()


def _random_cases() -> list[bytes]:
    rng = random.Random(25)
    cases = [rng.randbytes(rng.randint(1, 64)) for _ in range(6)]
    # a plausible header (small size) over random bytes: the body is never a JSON object
    cases += [struct.pack(">I", n) + rng.randbytes(n) for n in (1, 7, 40)]
    return cases


_PING = encode({"op": "ping", "n": CRAFTED})
_HOST_CASES: dict[str, bytes] = {
    "half a header": b"\0\0",
    "a header only": struct.pack(">I", 50),
    "a truncated body": struct.pack(">I", 50) + b'{"op": "ping", "n": 1',
    "a huge claimed size": struct.pack(">I", 0xFFFF_FFFF) + _PING,
    # a frame whose body is another frame: its bytes parse as a header, never as a request
    "a desynchronised frame": struct.pack(">I", len(_PING)) + _PING,
    "a garbage header": b"GET / HTTP/1.1\r\n\r\n" + _PING,
    "a body that is not JSON": struct.pack(">I", 5) + b"\xff\xfe\0ab" + _PING,
    "a body that is a JSON list": encode([{"op": "ping", "n": CRAFTED}]) + _PING,
    "a payload shorter than claimed": encode({"op": "restore", "n": CRAFTED, "size": 10_000}) + b"short",
    "a payload size that is not a count": encode({"op": "restore", "n": CRAFTED, "size": "9"}) + _PING,
    "a negative payload size": encode({"op": "inherit", "n": CRAFTED, "size": -4}) + _PING,
    **{f"random bytes {i}": case for i, case in enumerate(_random_cases())},
}


@pytest.mark.parametrize("data", list(_HOST_CASES.values()), ids=list(_HOST_CASES))
def test_the_host_frame_reader_ends_on_any_broken_frame(tmp_path: Path, data: bytes) -> None:
    """Fuzz the host's request reader: each case ends the host with the channel-broken status within
    the timeout, and no frame after the breakage (the crafted ping hidden in it) is answered."""
    proc = _spawn_raw(tmp_path)
    try:
        _started(proc)
        _send(proc, data)
        assert proc.stdin is not None
        proc.stdin.close()  # after the case: EOF, so a reader waiting for more bytes sees the end
        frames = _drain(proc)
        assert frames == [], f"the host answered a broken frame: {frames}"
        assert proc.returncode == CHANNEL_BROKEN_EXIT, proc.returncode
    finally:
        proc.kill()


def test_a_clean_close_between_frames_is_a_clean_exit(tmp_path: Path) -> None:
    proc = _spawn_raw(tmp_path)
    try:
        _started(proc)
        assert proc.stdin is not None
        proc.stdin.close()
        assert _drain(proc) == [] and proc.returncode == 0
    finally:
        proc.kill()


# -- the realistic guarded cell, through a session ---------------------------------------------------
async def test_a_cell_that_fills_memory_then_reads_an_archive(tmp_path: Path) -> None:
    """Guarded path: fill memory, read a large archived transcript, catch the MemoryError. The host
    ends itself mid-answer; the cell fails with a message saying so, and the session continues from
    its journal (earlier cells' variables intact)."""
    data = json.dumps([{"role": "user", "content": "y" * 1000}] * 60_000).encode()  # ~60 MB
    sha = hashlib.sha256(data).hexdigest()
    blob = tmp_path / "blobs" / "sha256" / sha[:2] / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    limits = dataclasses.replace(TEST_LIMITS, cell_timeout_s=30.0)
    sessions = SessionManager(
        tmp_path / "journal", pool_size=0, snapshot_every=0, archive_root=tmp_path / "blobs"
    )
    kw: dict[str, Any] = {"trace_path": None, "trace_format": "auto", "extra_vars": {}, "limits": limits}
    try:
        assert (await sessions.run_cell("s", 1, "kept = 41", **kw)).ok
        grant = getattr(sessions, "grant_archive", None)  # the session's own archive (issue 25, point 5)
        if grant is not None:
            await grant("s", sha)
        cell = (
            "hog = []\n"
            "try:\n"
            "    while True:\n"
            "        hog.append(bytearray(4 << 20))\n"
            "except MemoryError:\n"
            "    pass\n"
            "hog.pop()\n"
            "hog.pop()\n"
            "try:\n"
            f"    history.extend(ARCHIVE({sha!r}))\n"
            "except MemoryError:\n"
            "    print('caught')\n"
            "hog = None\n"
        )
        result = await sessions.run_cell("s", 2, cell, **kw)
        assert not result.ok and result.error_kind == "crash", result
        assert "broke off half-way" in (result.error or "") and result.meta.get("channel_broken"), result
        follow = await sessions.run_cell("s", 2, "print(kept + 1)", **kw)
        assert follow.ok and follow.stdout == "42\n", follow
    finally:
        await sessions.close_all()


# -- worker side: a breached host's replies ------------------------------------------------------------
@pytest.fixture
async def breached(trace_file: str) -> AsyncIterator[SubprocessExecutor]:
    ex = SubprocessExecutor(TEST_LIMITS, isolation="language-only", unguarded_for_tests=True, zygote=False)
    await ex.start(trace_file, "auto", {})
    yield ex
    await ex.close()


_FIND_HOST = "import gc, os\nhost = [o for o in gc.get_objects() if type(o).__name__ == 'Host'][0]\n"


def _next_cell_reply(fields: dict[str, str]) -> str:
    """Unguarded code: the next cell reply claims success with `fields` (name -> Python expression),
    written straight to the channel (past the host's own cuts, as a breached host would)."""
    sets = "".join(f"        resp[{k!r}] = {v}\n" for k, v in fields.items())
    return _FIND_HOST + (
        "from sandbox.wire import encode\n"
        "orig = host.handle\n"
        "def handle(req, payload=None):\n"
        "    resp, out = orig(req, payload)\n"
        "    if req.get('op') == 'cell':\n"
        "        resp['ok'] = True\n"
        f"{sets}"
        "        host.handle = orig\n"
        "        data = encode({**resp, 'n': req['n']})\n"
        "        while data:\n"
        "            data = data[os.write(host.proto[1], data):]\n"
        "    return resp, out\n"
        "host.handle = handle\n"
    )


_LIES: dict[str, dict[str, str]] = {
    # the case: a FINAL_ANSWER of 12 MiB against the host's 1 MiB
    "submitted": {"submitted": "'s' * (12 << 20)", "has_submission": "True"},
    "submitted-dict": {"submitted": "{'k': ['v' * 1000] * 1050}", "has_submission": "True"},
    "stdout": {"stdout": "'o' * 100_000"},
    "error": {"error": "'e' * 1_000_000"},
    "host_ms": {"host_ms": "float('nan')"},
    "maxrss_kb": {"maxrss_kb": "-5"},
    "truncated": {"truncated": "'yes'"},
    "error_kind": {"error_kind": "'root'"},
    "unknown-field": {"extra": "['a'] * 100_000"},
}


@pytest.mark.parametrize("field", list(_LIES))
async def test_a_reply_field_over_its_bound_stops_the_host(breached: SubprocessExecutor, field: str) -> None:
    """Every field of a cell reply is checked against its stated bound: a breached host's oversized
    or mistyped field is a protocol error (host stopped, this cell fails, the next one restarts)."""
    assert (await breached.run_unguarded(_next_cell_reply(_LIES[field]))).ok
    result = await breached.run_cell("print('hi')")
    brief = f"ok={result.ok} error={(result.error or '')[:200]!r} submitted={str(result.submitted)[:100]!r}"
    assert not result.ok and result.submitted is None and "protocol_error" in result.meta, brief
    assert len(result.stdout) <= TEST_LIMITS.max_output_chars + NOTE_MAX_CHARS
    assert len(result.error or "") <= MAX_ERROR_CHARS + NOTE_MAX_CHARS
    assert not breached.alive
    follow = await breached.run_cell("print(1 + 1)")
    assert follow.ok and follow.stdout == "2\n" and follow.host_restarted, follow


@pytest.mark.parametrize("unit", ["z", "\ud800"])
async def test_a_final_answer_at_its_bound_is_accepted(breached: SubprocessExecutor, unit: str) -> None:
    """The bound is the host's own: the largest value FINAL_ANSWER takes passes the worker's check
    (lone surrogates, which the wire spells out, included)."""
    count = (FINAL_ANSWER_MAX_BYTES - 2) // len(json.dumps(unit)[1:-1])  # plus the two quotes
    result = await breached.run_cell(f"FINAL_ANSWER({unit!r} * {count})")
    assert result.ok, result.error
    assert isinstance(result.submitted, str) and len(result.submitted) >= count, result.error


async def test_a_reply_written_ahead_never_answers_a_later_request(breached: SubprocessExecutor) -> None:
    """A breached host writes its reply and then a forged one for the next request number (before,
    numbers were a counter: the forged reply answered the next cell)."""
    patch = _FIND_HOST + (
        "from sandbox.wire import encode\n"
        "orig = host.handle\n"
        "def handle(req, payload=None):\n"
        "    resp, out = orig(req, payload)\n"
        "    if req.get('op') == 'cell':\n"
        "        host.handle = orig\n"
        "        data = encode({**resp, 'n': req['n']}) + encode({'ok': True, 'stdout': 'forged\\n', 'n': req['n'] + 1})\n"
        "        while data:\n"
        "            data = data[os.write(host.proto[1], data):]\n"
        "    return resp, out\n"
        "host.handle = handle\n"
    )
    assert (await breached.run_unguarded(patch)).ok
    first = await breached.run_cell("print('A')")
    assert first.stdout == "A\n", first
    second = await breached.run_cell("print('B')")
    assert "forged" not in second.stdout, second
    assert not second.ok and "protocol_error" in second.meta, second
    follow = await breached.run_cell("print('C')")
    assert follow.ok and follow.stdout == "C\n" and follow.host_restarted, follow


async def test_stopping_a_host_that_keeps_writing_does_not_hang_the_worker(
    breached: SubprocessExecutor,
) -> None:
    """A breached host answers, then writes megabytes nobody reads. Stopping it must not wait for an
    EOF its paused stdout reader never sees (before: `close()` hung for good, with the session's lock)."""
    patch = _FIND_HOST + (
        "from sandbox.wire import encode\n"
        "orig = host.handle\n"
        "def handle(req, payload=None):\n"
        "    resp, out = orig(req, payload)\n"
        "    host.handle = orig\n"
        "    data = encode({**resp, 'n': req['n']}) + encode({'ok': True, 'junk': 'j' * (8 << 20)})\n"
        "    while data:\n"
        "        data = data[os.write(host.proto[1], data):]\n"
        "    return resp, out\n"
        "host.handle = handle\n"
    )
    assert (await breached.run_unguarded(patch)).ok
    result = await asyncio.wait_for(breached.run_cell("print('hi')"), 20)
    assert result.stdout == "hi\n", result.error
    await asyncio.wait_for(breached.close(), 20)
    assert not breached.alive


def test_the_final_answer_bound_is_the_hosts() -> None:
    from sandbox.host import namespace

    assert FINAL_ANSWER_MAX_BYTES == namespace.FINAL_ANSWER_MAX_BYTES


async def test_a_long_error_of_an_honest_host_is_cut_to_its_bound(executor: SubprocessExecutor) -> None:
    """A SyntaxError quotes its whole line: the host cuts every error to the bound the worker checks,
    so an honest host never trips the check (and the model never gets an unbounded error)."""
    result = await executor.run_cell("x = 1 +" + " 1 +" * 5000 + " )")
    assert result.error_kind == "syntax" and "protocol_error" not in result.meta, result
    assert len(result.error or "") <= MAX_ERROR_CHARS + NOTE_MAX_CHARS, len(result.error or "")


# -- worker side: snapshot / export bytes stream to a file -------------------------------------------
BIG = 256 * 1024**2


def _stream_zeros(op: str, size: int) -> str:
    """Unguarded code: answer the next `op` with `size` announced bytes, streamed as zeros in 1 MiB
    pieces (the host never holds them), then end the host."""
    return _FIND_HOST + (
        "from sandbox.wire import encode\n"
        "orig = host.handle\n"
        "def write(data):\n"
        "    view = memoryview(data)\n"
        "    while view:\n"
        "        view = view[os.write(host.proto[1], view):]\n"
        "def handle(req, payload=None):\n"
        f"    if req.get('op') != {op!r}:\n"
        "        return orig(req, payload)\n"
        f"    write(encode({{'ok': True, 'size': {size}, 'skipped': [], 'n': req['n']}}))\n"
        "    zeros = bytes(1 << 20)\n"
        f"    for _ in range({size} >> 20):\n"
        "        write(zeros)\n"
        "    os._exit(0)\n"
        "host.handle = handle\n"
    )


def _unguarded_factory(limits: SandboxLimits) -> SubprocessExecutor:
    return SubprocessExecutor(
        limits, isolation="language-only", unguarded_for_tests=True, zygote=False, index_data=True
    )


def _peak_growth(run: Callable[[], Any]) -> Any:
    """Run the coroutine function `run` under tracemalloc: (its result, peak bytes allocated)."""

    async def measured() -> tuple[Any, int]:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            result = await run()
            return result, tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()

    return measured()


async def test_a_huge_snapshot_streams_to_a_file_and_restores_from_it(
    tmp_path: Path, trace_file: str
) -> None:
    """Assume breach: a host announces a snapshot of 256 MiB (its memory limit is 512 MiB) and
    streams zeros. The worker writes it to the journal holding one chunk at a time (before: the
    whole payload twice, ~512 MiB), and a rebuild sends it back from the file in chunks."""
    sessions = SessionManager(tmp_path / "journal", executor_factory=_unguarded_factory, snapshot_every=2)
    kw: dict[str, Any] = {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {},
        "limits": TEST_LIMITS,
    }
    try:
        assert (await sessions.run_cell("s", 1, "x = 1", **kw)).ok
        ex = sessions.executor_for("s")
        assert isinstance(ex, SubprocessExecutor)
        assert (await ex.run_unguarded(_stream_zeros("snapshot", BIG))).ok
        result, peak = await _peak_growth(lambda: sessions.run_cell("s", 2, "y = 2", **kw))
        assert result.ok and result.meta.get("snapshot_bytes") == BIG, result
        assert peak < BIG // 16, f"the worker held {peak:,} bytes of a {BIG:,}-byte snapshot"
        await sessions.close_session("s")  # the next cell rebuilds: restore from the snapshot file
        result, peak = await _peak_growth(lambda: sessions.run_cell("s", 3, "print(x + y)", **kw))
        assert result.ok and result.stdout == "3\n", result  # the zeros do not restore: full replay
        assert peak < BIG // 16, f"the worker held {peak:,} bytes of a {BIG:,}-byte restore"
    finally:
        await sessions.close_all()


async def test_a_huge_export_streams_to_a_file(tmp_path: Path, trace_file: str) -> None:
    sessions = SessionManager(tmp_path / "journal", executor_factory=_unguarded_factory, snapshot_every=0)
    kw: dict[str, Any] = {
        "trace_path": trace_file,
        "trace_format": "auto",
        "extra_vars": {},
        "limits": TEST_LIMITS,
    }
    try:
        assert (await sessions.run_cell("s", 1, "x = 1", **kw)).ok
        ex = sessions.executor_for("s")
        assert isinstance(ex, SubprocessExecutor)
        assert (await ex.run_unguarded(_stream_zeros("export", BIG))).ok
        (path, skipped), peak = await _peak_growth(lambda: sessions.export_to_file("s", 1, tmp_path, **kw))
        assert path.stat().st_size == BIG and skipped == []
        assert peak < BIG // 16, f"the worker held {peak:,} bytes of a {BIG:,}-byte export"
    finally:
        await sessions.close_all()


# -- worker side: fuzz the executor's frame reader ------------------------------------------------------
class _Stdin:
    """The host's stdin as the executor sees it; `respond(n)` gives the bytes the host writes back."""

    def __init__(self, stdout: asyncio.StreamReader, respond: Callable[[int], bytes]) -> None:
        self.stdout, self.respond, self.answered = stdout, respond, False

    def write(self, data: bytes) -> None:
        if not self.answered:  # the request frame: reply to its number
            self.answered = True
            (size,) = struct.unpack(">I", data[:4])
            n = json.loads(data[4 : 4 + size])["n"]
            out = self.respond(n)
            if out:
                self.stdout.feed_data(out)
            self.stdout.feed_eof()

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


class _FakeHost:
    def __init__(self, respond: Callable[[int], bytes], before: bytes = b"") -> None:
        self.stdout = asyncio.StreamReader()
        if before:
            self.stdout.feed_data(before)
        self.stdin = _Stdin(self.stdout, respond)
        self.returncode: int | None = None
        self.pid = 0


def _constant(data: bytes) -> Callable[[int], bytes]:
    return lambda n: data


def _reply(n: int, **fields: Any) -> bytes:
    return encode({"ok": True, "stdout": "", "n": n, **fields})


_WORKER_CASES: dict[str, Callable[[int], bytes]] = {
    "nothing": lambda n: b"",
    "half a header": lambda n: b"\0\0",
    "a truncated body": lambda n: _reply(n)[:-3],
    "an oversized frame": lambda n: struct.pack(">I", 0x7FFF_FFFF) + b"{}",
    "not JSON": lambda n: struct.pack(">I", 3) + b"\xff\xfe\xfd",
    "not an object": lambda n: encode([{"ok": True, "n": n}]),
    "a string": lambda n: encode("ok"),
    "the wrong n": lambda n: _reply(n + 1),
    "no n": lambda n: encode({"ok": True}),
    "a bool n": lambda n: encode({"ok": True, "n": True}),
    "a desynchronised frame": lambda n: struct.pack(">I", len(_reply(n))) + _reply(n),
    "no ok": lambda n: encode({"n": n, "stdout": ""}),
    "a question where none may be asked": lambda n: (
        encode({"ask": {"what": "archive", "sha256": SHA}}) + _reply(n)
    ),
    "stdout over its bound": lambda n: _reply(n, stdout="o" * 5000),
    "a deeply nested reply": lambda n: struct.pack(">I", 200_000) + b"[" * 100_000 + b"]" * 100_000,
    "a submission without has_submission": lambda n: _reply(n, submitted={"a": 1}),
    **{f"random bytes {i}": _constant(c) for i, c in enumerate(_random_cases())},
}


@pytest.mark.parametrize("respond", list(_WORKER_CASES.values()), ids=list(_WORKER_CASES))
async def test_the_worker_frame_reader_refuses_any_broken_reply(respond: Callable[[int], bytes]) -> None:
    host = _FakeHost(respond)
    with pytest.raises(_HostDied):  # _ProtocolError is one: either way the host is stopped
        await asyncio.wait_for(_exchange(host, {"op": "cell", "code": ""}, stdout_max=1000), 5)  # type: ignore[arg-type]


_PAYLOAD_CASES: dict[str, Callable[[int], bytes]] = {
    "a payload shorter than claimed": lambda n: _reply(n, size=1000) + b"z" * 10,
    "a payload size over the cap": lambda n: _reply(n, size=10**12),
    "a negative payload size": lambda n: _reply(n, size=-1),
    "a payload size that is text": lambda n: _reply(n, size="10"),
    "a payload size that is a bool": lambda n: _reply(n, size=True),
    "skipped names that are not names": lambda n: _reply(n, size=0, skipped=[{"x": 1}]),
    "too many skipped names": lambda n: _reply(n, size=0, skipped=["a"] * 20_000),
    "a skipped name too long": lambda n: _reply(n, size=0, skipped=["a" * 5000]),
    "a malformed isolation report": lambda n: _reply(n, size=0, isolation={"mode": "auto", "layers": "all"}),
}


@pytest.mark.parametrize("respond", list(_PAYLOAD_CASES.values()), ids=list(_PAYLOAD_CASES))
async def test_the_worker_payload_reader_refuses_any_broken_payload(
    respond: Callable[[int], bytes], tmp_path: Path
) -> None:
    host = _FakeHost(respond)
    with open(tmp_path / "sink", "wb") as sink, pytest.raises(_HostDied):
        await asyncio.wait_for(_exchange(host, {"op": "snapshot"}, sink=sink, max_payload=1 << 20), 5)  # type: ignore[arg-type]


async def test_the_worker_payload_reader_keeps_one_chunk(tmp_path: Path) -> None:
    """A well-formed payload lands in the sink whole; one chunk at a time in memory."""
    size = 3 * executor_mod.PAYLOAD_CHUNK + 5
    host = _FakeHost(lambda n: _reply(n, size=size) + b"q" * size)
    with open(tmp_path / "sink", "wb") as sink:
        resp = await asyncio.wait_for(_exchange(host, {"op": "snapshot"}, sink=sink), 5)  # type: ignore[arg-type]
    assert resp["size"] == size and (tmp_path / "sink").stat().st_size == size


async def test_a_frame_nobody_asked_for_is_refused() -> None:
    """Bytes the host wrote before the request (a duplicated or unsolicited frame) stop it."""
    host = _FakeHost(lambda n: _reply(n), before=encode({"ok": True, "n": 1}))
    await asyncio.sleep(0)
    with pytest.raises(_ProtocolError, match="nobody asked"):
        await asyncio.wait_for(_exchange(host, {"op": "ping"}), 5)  # type: ignore[arg-type]


async def test_a_duplicated_reply_fails_the_next_request() -> None:
    stdout = asyncio.StreamReader()
    numbers: list[int] = []

    class Stdin(_Stdin):
        def write(self, data: bytes) -> None:
            (size,) = struct.unpack(">I", data[:4])
            n = json.loads(data[4 : 4 + size])["n"]
            numbers.append(n)
            if len(numbers) == 1:
                stdout.feed_data(_reply(n) + _reply(n))  # the reply, twice

    host = _FakeHost(lambda n: b"")
    host.stdout, host.stdin = stdout, Stdin(stdout, lambda n: b"")
    first = await asyncio.wait_for(_exchange(host, {"op": "ping"}), 5)  # type: ignore[arg-type]
    assert first["n"] == numbers[0]
    with pytest.raises(_ProtocolError):
        await asyncio.wait_for(_exchange(host, {"op": "ping"}), 5)  # type: ignore[arg-type]


async def test_random_replies_never_pass(tmp_path: Path) -> None:
    """Random bytes after a valid header, many seeds: never a result, never a hang."""
    rng = random.Random(2025)
    for _ in range(300):
        body = rng.randbytes(rng.randint(0, 48))
        stream = asyncio.StreamReader()
        stream.feed_data(struct.pack(">I", len(body)) + body)
        stream.feed_eof()
        with pytest.raises((_HostDied, asyncio.IncompleteReadError)):
            await asyncio.wait_for(_read_reply(stream), 5)
