"""The sandbox host process: one namespace, model-written cells, length-prefixed JSON over pipes.

Run as `python -m sandbox.host '<limits json>'` by `sandbox.executor.SubprocessExecutor`, never in the
worker. Requests: `{"op": "start", trace_path, trace_format, extra_vars, limits?, index_data?}`,
`{"op": "cell", code}`, `{"op": "warm"}` (import what `start` needs: pooled idle hosts),
`{"op": "snapshot"}` (response frame `{"ok", "size"}` followed by `size` raw pickle bytes),
`{"op": "restore", "size"}` (followed by `size` raw bytes), `{"op": "export"}` (like snapshot, plus
`skipped`: a copy of the namespace for a child session, see `sandbox.host.snapshot.take_export`),
`{"op": "inherit", "size"}` (followed by an export's raw bytes; only right after `start`),
`{"op": "ping"}`; one response frame per request, carrying the request's `n`. `start` may carry
`archive_root` (truthy: `ARCHIVE()` is offered; the worker reads the blobs). A host spawned without a
limits argument (a pooled host) applies the OS limits from the `start` request, and every host applies
the OS isolation at `start`, before it runs any model code.

Two layers, and the second is the one that must hold
  * The OS layer (`sandbox.isolation`), applied before any model code: its own PID/mount/network/IPC/
    UTS (and user) namespaces, a root worker's host drops to nobody, no capabilities, no-new-privs,
    Landlock (read-only Python installation and project packages; the trace comes as an fd opened
    before the lockdown; `ARCHIVE` asks the worker through an `{"ask": ...}` frame), and a seccomp
    filter (no sockets, exec, fork, ptrace, foreign signals, mounts, namespaces, keyrings, bpf,
    io_uring). A required layer that fails makes the host refuse every request (fail closed).
  * The language layer: cells cannot name interpreter internals (the AST check refuses dunder /
    `_`-prefixed / frame and code attributes, `getattr`/`eval`/`exec`/`open`/`__import__` & co., and
    imports outside a small allowlist; dynamic string->attribute routes are checked or removed, see
    `sandbox.host.guards`, `sandbox.host.safe_modules`); modules are proxies that do not leak what they import.
  * Cells cannot write to the protocol channel through Python: the real stdin/stdout are dup'ed to
    private fds, fds 0/1 point at /dev/null, cell output goes to a per-cell capture object. Code that
    got past the language layer *can* write frames; the worker matches every reply to its request
    (`n`), bounds and type-checks every field, and stops a host that breaks the protocol.
  * A frame is all or nothing: any failure in the middle of one (reading a request or its payload,
    writing a reply, an `ask` exchange; a MemoryError, a malformed frame, a signal handler) ends the
    host at once with `sandbox.wire.CHANNEL_BROKEN_EXIT`, never resumes, so the rest of a frame (an
    archived transcript's bytes) is never read as a request; the session rebuilds from its journal.
    Asynchronous signals are held while a frame is read or written (`sandbox.wire.held_signals`).
  * Resource exhaustion is bounded by OS limits (RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_CORE=0)
    and a per-cell CPU budget (soft RLIMIT_CPU raised before each cell); the executor adds a hard
    wall-clock timeout that SIGKILLs the process group.
  * The environment is built from scratch by the executor (no inherited secrets); hash seed fixed,
    no clock or randomness visible, so replaying cells rebuilds identical state.

Not covered: denial of service within the limits; kernel bugs behind the syscalls that remain
allowed; object reprs with memory addresses (not replay-deterministic). A stronger boundary (gVisor, a
container with cgroup limits) drops in behind the same `Executor` interface: only
`SubprocessExecutor._spawn` changes.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

from sandbox.archive import check_archive_name, decode_archive
from sandbox.confinement import lockdown
from sandbox.host.frames import _answer_size, _channel_broken, _read_request, _within_bounds, _write_reply
from sandbox.host.guards import ALLOWED_MODULES, GuardError
from sandbox.host.namespace import SandboxNamespace, format_exception
from sandbox.host.output import truncate
from sandbox.host.preload import _preload as _preload  # the zygote preloads through this module
from sandbox.host.preload import _readable_paths
from sandbox.host.rlimits import _arm_cpu_budget, apply_rlimits
from sandbox.host.snapshot import (
    DataIndex,
    SnapshotRefused,
    restore_export,
    restore_snapshot,
    take_export,
    take_snapshot,
)
from sandbox.host.trace_fds import _index_path, _load_trace_fd, _open_lazy
from sandbox.isolation import (
    ISOLATION_ENV,
    IsolationMode,
    IsolationReport,
    IsolationUnavailable,
    parse_mode,
)
from sandbox.namespaces import enter_namespaces
from sandbox.wire import (
    MAX_ERROR_CHARS,
    TEST_MISSING_ENV,
    TEST_UNGUARDED_ENV,
    held_signals,
    hold_signals,
    read_exact,
    read_frame_fd,
    released_signals,
    write_frame_fd,
)

__all__ = ["main", "apply_rlimits"]


MAX_ASKS_PER_REQUEST = 64  # ARCHIVE() calls one cell may make (each is a round trip to the worker)


class _Null:
    """Stream for sys.stdout/sys.stderr between cells (unraisable hooks, stray writes)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class Host:
    """Request dispatcher holding the session's namespace."""

    def __init__(
        self,
        limits: dict[str, Any] | None,
        *,
        isolation: IsolationReport | None = None,
        proto: tuple[int, int] | None = None,
        unguarded: bool = False,
        missing: tuple[str, ...] = (),
    ) -> None:
        self.limits = limits or {}
        self.pretend_missing = missing
        self.limits_applied = limits is not None
        self.ns = _BrokeredNamespace(self, int(self.limits.get("max_output_chars", 50_000)))
        self.isolation = isolation or IsolationReport(mode="language-only")
        self.proto = proto
        self.unguarded_allowed = unguarded
        self.locked = False
        self.refusal: str | None = None  # set when a required isolation layer failed: no cell runs
        self.asks = 0
        self.started = False
        self.index: DataIndex | None = None
        self.pristine = False  # started, and no cell, restore or inherit yet
        self._null = _Null()

    def handle(
        self, req: dict[str, Any], payload: bytes | None = None
    ) -> tuple[dict[str, Any], bytes | None]:
        op = req.get("op")
        self.asks = 0
        if self.refusal is not None and op != "ping":
            return {
                "ok": False,
                "error": self.refusal,
                "error_kind": "crash",
                "isolation_refused": True,
            }, None
        if op in ("cell", "snapshot", "restore", "export", "inherit", "unguarded") and not self.started:
            return {"ok": False, "error": "host not started", "error_kind": "crash"}, None
        if op == "cell":
            self.pristine = False
            return self.run_cell(str(req.get("code", ""))), None
        if op == "unguarded" and self.unguarded_allowed:
            self.pristine = False
            return self.unguarded(str(req.get("code", ""))), None
        if op == "snapshot":
            return self.snapshot()
        if op == "export":
            return self.export()
        if op == "restore":
            self.pristine = False
            return self.restore(payload or b""), None
        if op == "inherit":
            return self.inherit(payload or b""), None
        if op == "start":
            return self.start(req), None
        if op == "warm":
            return self.warm(), None
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "isolation": self.isolation.as_dict()}, None
        return {"ok": False, "error": f"unknown op {op!r}", "error_kind": "crash"}, None

    def warm(self) -> dict[str, Any]:
        """Import what `start` needs (the trace normaliser, every allowlisted module) so a pooled host
        starts in milliseconds."""
        t0 = time.perf_counter()
        _preload()
        return {"ok": True, "pid": os.getpid(), "warm_ms": (time.perf_counter() - t0) * 1000}

    def lock_down(self) -> None:
        """Apply the OS layer once, before any model code (see `sandbox.isolation`).

        Raises `IsolationUnavailable` when a required layer fails; the host then refuses every request.
        """
        if self.locked:
            return
        _preload()
        if self.unguarded_allowed:  # the simulated attacker gets the modules a real one would want
            _preload(("socket", "subprocess", "ctypes", "signal", "select"))
        for name in sorted(ALLOWED_MODULES):  # build every proxy now: their imports read from disk
            try:
                self.ns.importer.proxy(name)
            except ImportError:
                pass
        try:
            lockdown(
                self.isolation.mode,
                self.isolation,
                readable=_readable_paths(),
                unavailable=self.pretend_missing,
            )
        except IsolationUnavailable as exc:
            self.refusal = (
                f"sandbox isolation unavailable: {exc}. The OS layer (Landlock, seccomp) is required to run "
                "model-written code; set RR_SANDBOX_ISOLATION=language-only to run without it (unsafe for "
                "traces you did not write)"
            )
            raise
        except OSError as exc:  # a syscall wrapper that raised instead of reporting: fail closed
            self.refusal = f"sandbox isolation failed: {type(exc).__name__}: {exc}"
            raise IsolationUnavailable(self.refusal) from None
        self.locked = True

    def start(self, req: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.started:
            return {"ok": False, "error": "host already started"}
        limits = req.get("limits")
        if not self.limits_applied and isinstance(limits, dict):
            apply_rlimits(limits)  # pooled host: limits arrive with its session, before any cell
            self.limits, self.limits_applied = limits, True
            self.ns = _BrokeredNamespace(self, int(limits.get("max_output_chars", 50_000)))
        trace_path = req.get("trace_path")
        index_fd: int | None = None
        try:
            # The trace (and its index, when it has one: a large trace, read lazily) is opened while the
            # host can still reach it; afterwards only these fds are.
            trace_fd = os.open(str(trace_path), os.O_RDONLY | os.O_CLOEXEC) if trace_path else None
            if trace_path and os.path.exists(_index_path(str(trace_path))):
                index_fd = os.open(_index_path(str(trace_path)), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            return {
                "ok": False,
                "error": f"could not start the sandbox: cannot open the trace: {exc.strerror}",
            }
        try:
            self.lock_down()
        except IsolationUnavailable:
            return {"ok": False, "error": self.refusal, "isolation": self.isolation.as_dict()}
        try:
            roots: dict[str, Any] = {}
            if index_fd is not None and trace_fd is not None:
                traces, roots = _open_lazy(trace_fd, index_fd)
            else:
                traces = _load_trace_fd(trace_fd, str(trace_path), str(req.get("trace_format", "auto")))
            archive = "worker" if req.get("archive_root") else None
            self.ns.start(traces, dict(req.get("extra_vars") or {}), archive, lazy_roots=roots)
            if req.get("index_data"):
                self.index = DataIndex([self.ns._scaffold[n] for n in self.ns._data_names])
        except Exception as exc:  # reported to the executor
            return {"ok": False, "error": f"could not start the sandbox: {type(exc).__name__}: {exc}"}
        self.started = self.pristine = True
        return {
            "ok": True,
            "pid": os.getpid(),
            "load_ms": (time.perf_counter() - t0) * 1000,
            "isolation": self.isolation.as_dict(),
        }

    def export(self) -> tuple[dict[str, Any], bytes | None]:
        """A self-contained copy of the user's state for a child session (never refused)."""
        t0 = time.perf_counter()
        try:
            blob, skipped = take_export(self.ns)
        except MemoryError:
            return {"ok": False, "error": "MemoryError while exporting the namespace"}, None
        except Exception as exc:  # reported to the executor
            return {
                "ok": False,
                "error": f"could not export the namespace: {type(exc).__name__}: {exc}",
            }, None
        resp = {
            "ok": True,
            "size": len(blob),
            "skipped": skipped,
            "host_ms": (time.perf_counter() - t0) * 1000,
        }
        return resp, blob

    def inherit(self, blob: bytes) -> dict[str, Any]:
        """Load a parent's export: part of this host's starting point, so only right after `start`."""
        t0 = time.perf_counter()
        if not self.pristine:
            return {"ok": False, "error": "an inherited namespace can only be loaded right after start"}
        self.pristine = False
        try:
            info = restore_export(self.ns, blob)
        except BaseException as exc:  # the executor discards this host
            return {
                "ok": False,
                "error": f"could not load the inherited namespace: {type(exc).__name__}: {exc}",
            }
        finally:
            sys.stdout = sys.stderr = self._null
            self.ns.restore()
        return {"ok": True, **info, "host_ms": (time.perf_counter() - t0) * 1000}

    def snapshot(self) -> tuple[dict[str, Any], bytes | None]:
        """Pickle the user's state (see `sandbox.host.snapshot`); refused states answer ok=False."""
        t0 = time.perf_counter()
        if self.index is None:
            return {"ok": False, "error": "snapshots need index_data at start"}, None
        try:
            blob = take_snapshot(self.ns, self.index)
        except SnapshotRefused as exc:
            return {"ok": False, "error": str(exc), "refused": True}, None
        except MemoryError:
            return {"ok": False, "error": "MemoryError while taking the snapshot", "refused": True}, None
        return {"ok": True, "size": len(blob), "host_ms": (time.perf_counter() - t0) * 1000}, blob

    def restore(self, blob: bytes) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            count = restore_snapshot(self.ns, self.index, blob)
        except BaseException as exc:  # the executor discards this host
            return {"ok": False, "error": f"could not restore the snapshot: {type(exc).__name__}: {exc}"}
        finally:
            sys.stdout = sys.stderr = self._null
            if self.ns._scaffold:
                self.ns.restore()
        return {"ok": True, "vars": count, "host_ms": (time.perf_counter() - t0) * 1000}

    def run_cell(self, code: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        ns = self.ns
        ns.begin_cell()
        error: str | None = None
        kind: str | None = None
        try:
            compiled = ns.compile_cell(code)
        except SyntaxError as exc:
            kind = "syntax"
            where = f" (line {exc.lineno}" + (f", column {exc.offset})" if exc.offset else ")")
            text = f"\n    {exc.text.rstrip()}" if exc.text else ""
            error = f"SyntaxError: {exc.msg}{where}{text}"
        except GuardError as exc:
            kind, error = "guard", str(exc)
        else:
            _arm_cpu_budget(int(self.limits.get("cpu_seconds_per_cell", 120)))
            ns.normalise_recursion()  # the same recursion budget in a zygote's fork and a direct host
            sys.stdout = sys.stderr = ns.capture
            try:
                exec(compiled, ns.ns)  # checked code, restricted builtins
            except MemoryError:
                kind = "memory"
                error = (
                    "MemoryError: the cell exceeded the sandbox memory limit; work on slices or "
                    "aggregates instead of materialising large copies"
                )
            except GuardError as exc:
                kind, error = "guard", f"GuardError: {exc}"
            except BaseException as exc:  # SystemExit/KeyboardInterrupt included
                kind = "runtime"
                error = _describe(exc)
            finally:
                sys.stdout = sys.stderr = self._null
                ns.restore()
        stdout, truncated = ns.capture.getvalue(ns.max_output_chars)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "ok": error is None,
            "stdout": stdout,
            "error": error,
            "error_kind": kind,
            "truncated": truncated,
            "submitted": ns.submitted,
            "has_submission": ns.has_submission,
            "host_ms": (time.perf_counter() - t0) * 1000,
            "maxrss_kb": ru.ru_maxrss,
        }

    def unguarded(self, code: str) -> dict[str, Any]:
        """Tests only: run `code` with the real builtins and no AST check, i.e. a breached language
        layer, so tests can prove what the OS layer still stops. Offered only when the executor
        spawned the host with `TEST_UNGUARDED_ENV` set (never in production)."""
        import builtins
        import io

        out = io.StringIO()
        error = None
        sys.stdout = sys.stderr = out
        try:
            exec(compile(code, "<unguarded>", "exec"), {"__builtins__": builtins, "__name__": "__breach__"})
        except BaseException as exc:  # reported to the test
            error = f"{type(exc).__name__}: {exc}"
        finally:
            sys.stdout = sys.stderr = self._null
        return {
            "ok": error is None,
            "stdout": out.getvalue()[-20_000:],
            "error": error,
            "error_kind": None if error is None else "runtime",
        }

    def ask(self, question: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Ask the worker for something the host cannot reach itself (an archived transcript).

        One frame out, one frame (and its raw bytes) back, in the middle of the current request;
        the worker answers only the questions it knows and validates every one. The exchange is
        all or nothing: any failure inside it (a MemoryError while the answer's bytes are read, a
        signal handler that raises, a malformed answer) ends the host at once (`_channel_broken`),
        because the rest of the answer would otherwise be read as the next request.
        """
        if self.proto is None:
            raise OSError("no worker channel")
        self.asks += 1
        if self.asks > MAX_ASKS_PER_REQUEST:
            raise OSError(f"at most {MAX_ASKS_PER_REQUEST} archive reads per cell")
        proto_in, proto_out = self.proto
        with held_signals():  # a held signal's handler runs after the exchange, in the cell
            try:
                write_frame_fd(proto_out, {"ask": question})
                reply = read_frame_fd(proto_in)
                data = read_exact(proto_in, _answer_size(reply)) if reply.get("ok") is True else b""
            except BaseException:  # mid-frame: nothing after this point may read the channel
                _channel_broken()
        return reply, data


class _BrokeredNamespace(SandboxNamespace):
    """The namespace of a locked-down host: `ARCHIVE` reads through the worker, never by path."""

    def __init__(self, host: Host, max_output_chars: int) -> None:
        super().__init__(max_output_chars)
        self._host = host

    def archive(self, sha256_hex: str) -> list[Any]:
        name = check_archive_name(sha256_hex)
        if not self.archive_root:
            raise FileNotFoundError("ARCHIVE: no transcript archive is configured for this session")
        reply, data = self._host.ask({"what": "archive", "sha256": name})
        if not reply.get("ok"):
            raise FileNotFoundError(f"ARCHIVE: {str(reply.get('error'))[:300]}")
        return decode_archive(name, data)


def _describe(exc: BaseException) -> str:
    try:
        text = format_exception(exc)
    except BaseException:  # a hostile __str__ must not kill the host
        text = f"{type(exc).__name__} (message could not be rendered)"
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        text += "\n(exiting is not possible from a cell; the session continues)"
    elif isinstance(exc, RecursionError):
        text += "\n(hint: recursion too deep; use an explicit stack or loop)"
    return truncate(text, MAX_ERROR_CHARS)[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point: lock down fds and limits, then serve frames until the channel closes."""
    argv = sys.argv if argv is None else argv
    limits: dict[str, Any] | None = json.loads(argv[1]) if len(argv) > 1 else None
    unguarded = os.environ.pop(TEST_UNGUARDED_ENV, "") == "1"
    missing = tuple(filter(None, os.environ.pop(TEST_MISSING_ENV, "").split(",")))
    try:
        mode: IsolationMode = parse_mode(os.environ.get(ISOLATION_ENV))
    except ValueError:
        mode = "auto"  # the worker validated it; never weaken on a value we do not know
    isolation = IsolationReport(mode=mode)
    enter_namespaces(
        mode, isolation, unavailable=missing
    )  # first: the rlimits below would stop the forks it needs
    if limits is not None:
        apply_rlimits(limits)
    proto_in, proto_out = os.dup(0), os.dup(1)  # private, non-inheritable copies
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    host = Host(
        limits, isolation=isolation, proto=(proto_in, proto_out), unguarded=unguarded, missing=missing
    )
    sys.stdout = sys.stderr = host._null
    sys.stdin = None
    hold_signals()  # while frames pass and between requests; released only while one is handled
    while True:
        try:
            req, payload = _read_request(proto_in)
        except EOFError:
            return 0
        try:  # between frames: the request is whole, the reply not begun
            with released_signals():
                resp, out = host.handle(req, payload)
            _within_bounds(resp)
        except MemoryError:
            resp, out = {"ok": False, "error": "MemoryError in the host", "error_kind": "memory"}, None
        payload = None
        if "n" in req:
            resp["n"] = req["n"]  # the worker matches every reply to its request
        _write_reply(proto_out, resp, out)
        out = None
