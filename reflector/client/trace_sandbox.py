"""`TraceSandbox`: ACE's sandbox API (`inject`, `execute(code, timeout)` -> `ExecutionResult`) on rr's own
sandbox host, for code that drives a sandbox directly (ACE's tests, notebooks).

rr's reflections never use this class: their cells run in the worker's durable sessions
(`sandbox.sessions`). Here one `sandbox.executor.SubprocessExecutor` host runs the cells, with the same
layers (language guards, the OS layer of `RR_SANDBOX_ISOLATION`) and the trace preloaded as `traces`
(normalised, as a reflection's model sees it). The host starts at the first `execute`; variables injected
before it are preloaded with it, later ones are set by a cell (their JSON). Unlike ACE's in-process sandbox
the namespace lives in another process: there is no `namespace` dict and no `llm_query_fn`.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["TraceSandbox", "ExecutionResult", "ExecutionTimeoutError"]

T = TypeVar("T")


class ExecutionTimeoutError(TimeoutError):
    """A cell ran past its timeout (ACE's name); the host was stopped and the next cell starts a fresh one."""


@dataclass
class ExecutionResult:
    """ACE's `ExecutionResult`: what a cell printed, the value it submitted (`final_value`), and the error it
    raised (`exception`: `ExecutionTimeoutError` for a timeout, else a `RuntimeError` with the host's message)."""

    stdout: str = ""
    stderr: str = ""
    final_value: Any = None
    exception: Exception | None = None

    @property
    def success(self) -> bool:
        return self.exception is None


class TraceSandbox:
    """rr's sandbox host for one trace, with ACE's `TraceSandbox` methods. Close it (or use `with`)."""

    def __init__(self, trace: Any = None, llm_query_fn: Any = None) -> None:
        if llm_query_fn is not None:
            raise TypeError(
                "TraceSandbox: llm_query_fn is ACE's in-process hook; rr's sandbox cannot call back "
                "into the caller (a reflection's model explores the trace instead)"
            )
        self._trace = trace
        self._vars: dict[str, Any] = {}
        self._executor: Any = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rr-trace-sandbox", daemon=True)
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def inject(self, name: str, value: Any) -> None:
        """Make `value` (JSON-able data) the variable `name` in the sandbox."""
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"TraceSandbox.inject: {name!r} is not a public variable name")
        text = json.dumps(value, default=str)
        if self._executor is None:
            self._vars[name] = json.loads(text)
            return
        result = self.execute(f"import json\n{name} = json.loads({text!r})")
        if result.exception is not None:
            raise ValueError(f"TraceSandbox.inject({name!r}): {result.exception}")

    def execute(self, code: str, timeout: float = 30.0) -> ExecutionResult:
        """Run `code` in the sandbox (its variables persist across calls); `timeout` applies from the first
        call (the host's per-cell limit is set when it starts)."""
        if self._executor is None:
            self._call(self._start(timeout))
        cell = self._call(self._executor.run_cell(code))
        error: Exception | None = None
        if not cell.ok:
            message = cell.error or "the cell failed"
            error = ExecutionTimeoutError(message) if cell.error_kind == "timeout" else RuntimeError(message)
        return ExecutionResult(stdout=cell.stdout, final_value=cell.submitted, exception=error)

    async def _start(self, timeout: float) -> None:
        from reflector.analysis.traces import detect_format
        from reflector.client.api_traces import _dump, _plain_trace
        from reflector.runtime.settings import Settings
        from sandbox.executor import SubprocessExecutor
        from sandbox.protocol import SandboxLimits

        self._dir = tempfile.TemporaryDirectory(prefix="rr-trace-sandbox-")
        path = Path(self._dir.name) / "trace.json"
        data = (
            self._trace
            if isinstance(self._trace, (dict, list, str)) or self._trace is None
            else (_plain_trace(self._trace))
        )
        text = _dump({} if data is None else data)
        path.write_text(text, encoding="utf-8")
        executor = SubprocessExecutor(
            SandboxLimits(cell_timeout_s=timeout), isolation=Settings.from_env().sandbox_isolation
        )
        await executor.start(str(path), detect_format(json.loads(text)), dict(self._vars))
        self._executor = executor

    def close(self) -> None:
        """Stop the host and the sandbox's event loop thread."""
        if self._executor is not None:
            self._call(self._executor.close())
            self._executor = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> TraceSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
