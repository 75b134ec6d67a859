"""The suite's fork server (`tests.support.prefork`): a forked child is a process of its own with the argv,
environment, directory, streams, session and exit status a `subprocess` child would have; what it cannot
honour runs through `subprocess`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import prefork

PROBE = """
import json, os, sys
line = sys.stdin.readline()
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "env": os.environ.get("PROBE_VAR"),
    "absent": "PROBE_ABSENT" in os.environ, "stdin": line, "ppid": os.getppid(), "pid": os.getpid(),
    "sid": os.getsid(0), "main": __name__, "stdout_encoding": sys.stdout.encoding,
    "stderr_errors": sys.stderr.errors, "stderr_line_buffering": sys.stderr.line_buffering,
    "pythonpath": sys.path[1],
}))
sys.stderr.write("to stderr\\n")
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture(autouse=True)
def _fork_server_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of the fork server itself: they run it even in a suite run with RR_TESTS_EXEC=1."""
    monkeypatch.delenv("RR_TESTS_EXEC", raising=False)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RR_TESTS_EXEC"))}
    return {**env, **extra}


def test_a_forked_script_gets_its_argv_env_cwd_streams_and_exit_code(probe: Path, tmp_path: Path) -> None:
    os.environ["PROBE_ABSENT"] = "1"  # in this process only: the child's env is the one passed
    try:
        work = tmp_path / "work"
        work.mkdir()
        extra = tmp_path / "extra"
        p = prefork.run(
            [sys.executable, str(probe), "a", "b c"],
            cwd=work,
            env={
                k: v
                for k, v in _env(PROBE_VAR="x", PROBE_EXIT="3", PYTHONPATH=str(extra)).items()
                if k != "PROBE_ABSENT"
            },  # fmt: skip
            input="from stdin\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        del os.environ["PROBE_ABSENT"]
    assert p.returncode == 3, p.stderr
    assert p.stderr == "to stderr\n"
    got = json.loads(p.stdout)
    assert got["argv"] == [str(probe), "a", "b c"]
    assert got["cwd"] == str(work)
    assert got["path0"] == str(tmp_path)  # a script's directory, as `python SCRIPT` puts it
    assert got["pythonpath"] == str(extra)
    assert got["env"] == "x" and got["absent"] is False
    assert got["stdin"] == "from stdin\n"
    assert got["main"] == "__main__"
    assert (got["stdout_encoding"], got["stderr_errors"], got["stderr_line_buffering"]) == (
        "utf-8",
        "backslashreplace",
        True,
    )
    assert got["ppid"] != os.getpid()  # forked by the server, not exec'd by this process
    assert got["sid"] == os.getsid(0)  # no new session unless asked


def _run_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` through the fork server in `cwd`, its output captured as text."""
    return prefork.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=60
    )


def test_a_module_runs_as_main_with_the_working_directory_first_on_its_path(tmp_path: Path) -> None:
    p = _run_in(tmp_path, "-m", "reflector.cli", "--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("rr ")
    (tmp_path / "probe_mod.py").write_text("import sys\nprint(__name__, sys.path[0])\n")
    p = _run_in(tmp_path, "-m", "probe_mod")
    assert (p.returncode, p.stdout) == (0, f"__main__ {tmp_path}\n"), p.stderr  # importable from the cwd only


def test_code_runs_as_python_c_runs_it(tmp_path: Path) -> None:
    code = "import os, sys; print(os.getppid(), sys.argv, repr(sys.path[0]), __name__, __file__ if '__file__' in dir() else None)"
    p = _run_in(tmp_path, "-c", code, "x")
    assert p.returncode == 0, p.stderr
    ppid, rest = p.stdout.split(" ", 1)
    assert int(ppid) != os.getpid()
    assert rest == "['-c', 'x'] '' __main__ None\n"


def test_signals_sessions_and_timeouts_reach_the_forked_child(probe: Path, tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import os, time\nprint(os.getpid(), os.getsid(0), flush=True)\ntime.sleep(60)\n")
    proc = prefork.Popen(
        [sys.executable, str(sleeper)],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    pid, sid = map(int, proc.stdout.readline().split())
    assert pid == proc.pid and sid == proc.pid  # its own session and process group
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    proc.stdout.close()

    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        prefork.run([sys.executable, str(sleeper)], env=_env(), capture_output=True, timeout=1)
    assert time.monotonic() - started < 30


def test_what_the_server_cannot_honour_is_exec_d(probe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for args, env in (
        ([sys.executable, "-I", str(probe)], _env()),  # an interpreter option
        ([sys.executable, "-X", "dev", str(probe)], _env()),
        ([sys.executable, str(probe)], _env(PYTHONDEVMODE="1")),  # sys.flags are fixed at the server's start
    ):
        p = prefork.run(args, env=env, input="\n", capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["ppid"] == os.getpid(), args
    monkeypatch.setenv("RR_TESTS_EXEC", "1")  # asked for: the suite with no fork server
    p = prefork.run(
        [sys.executable, str(probe)], env=_env(), input="\n", capture_output=True, text=True, timeout=60
    )
    assert json.loads(p.stdout)["ppid"] == os.getpid()


def test_a_forked_childs_cpu_time_is_reported(tmp_path: Path) -> None:
    burner = tmp_path / "burn.py"
    burner.write_text("import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n")
    proc = prefork.Popen([sys.executable, str(burner)], env=_env())
    assert proc.wait(60) == 0
    assert proc.cpu_s is not None and proc.cpu_s >= 0.3


def test_the_rr_shim_runs_rr_forked_and_ends_as_it_ended(tmp_path: Path) -> None:
    shim = prefork.write_rr_shim(tmp_path / "bin")
    env = _env(PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(["bash", "-c", "rr --version; rr no-such-command"], env=env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert p.returncode == 2, p.stderr  # argparse's exit code, through the shim
    assert p.stdout.startswith("rr ") and "invalid choice: 'no-such-command'" in p.stderr
    # signals forwarded: the docs test stops its background `rr server` through the shim with SIGTERM and expects 0


def test_without_a_fork_server_commands_are_exec_d_after_one_warning(
    probe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot_start(self: object) -> None:
        raise OSError("pidfd_open: function not implemented")

    monkeypatch.setattr(prefork, "_server", None)
    monkeypatch.setattr(prefork, "_unavailable", None)
    monkeypatch.setattr(prefork._Server, "__init__", cannot_start)
    with pytest.warns(UserWarning, match="no fork server, every process is exec'd: pidfd_open"):
        assert not prefork.available()
    p = prefork.run(
        [sys.executable, str(probe)], env=_env(), input="\n", capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and json.loads(p.stdout)["ppid"] == os.getpid()
