"""What the commands share: the one-line error, notices on stderr, the live progress of a reflection or
batch being followed, what an interrupted command prints, and the exit code of a result."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from reflector.runtime.settings import Settings


def _err(msg: str, code: int = 2) -> int:
    _stop_progress()
    print(f"rr: error: {msg}", file=sys.stderr)
    return code


def _stop_progress() -> None:
    """End a live progress view before a message is printed under it (a no-op unless one was shown)."""
    view = sys.modules.get("reflector.client.progress_view")
    if view is not None:
        view.stop_all()


def _say(msg: str) -> None:
    print(f"rr: {msg}", file=sys.stderr, flush=True)


def _finished(out: object) -> int:
    from reflector import client as c
    from reflector.contract import ReflectorOutput

    assert isinstance(out, ReflectorOutput)
    if c.is_complete(out):
        return 0
    if c.is_cancelled(out):
        _say(
            f"the reflection was CANCELLED (rr cancel): the text is built from its findings so far: "
            f"exit code {c.EXIT_CANCELLED}"
        )
        return c.EXIT_CANCELLED
    stop = out.raw.get("rr_trace", {}).get("stop_reason")
    error = (
        " ".join(str(out.raw.get("error") or "").split()) if stop == "error" else ""
    )  # e.g. the provider's complaint
    _say(
        f"the reflection is INCOMPLETE (stop reason: {stop}{': ' + error if error else ''}): "
        f"exit code {c.EXIT_INCOMPLETE}"
    )
    return c.EXIT_INCOMPLETE


def _batch_finished(out: object) -> int:
    from reflector import client as c
    from reflector.contract import BatchOutput

    assert isinstance(out, BatchOutput)
    if out.cancelled:
        _say(
            f"the batch was CANCELLED ({out.reflected} runs reflected, {out.failed} failed before it stopped): "
            f"exit code {c.EXIT_CANCELLED}"
        )
        return c.EXIT_CANCELLED
    if c.is_batch_complete(out):
        return 0
    _say(
        f"the batch is INCOMPLETE ({out.failed} runs could not be reflected on, "
        f"{out.synthesis.incomplete_reflections} reflections stopped early): exit code {c.EXIT_INCOMPLETE}"
    )
    return c.EXIT_INCOMPLETE


class _Follower:
    """The live progress (`reflector.client.progress_view`) and the no-worker notices `rr reflect` shows while it
    waits for a `noun` ("reflection" or "batch"); `wf_id` and `address` are filled in once it has started
    (setting `wf_id` starts the elapsed clock), `client` to show the running children's progress too."""

    def __init__(self, noun: str, render: Callable[..., str], settings: Settings) -> None:
        from reflector.client.progress_view import ProgressDisplay

        self.noun, self.render, self.settings = noun, render, settings
        self.display = ProgressDisplay(render, title=noun)
        self.tty = self.display.tty
        self._wf_id = self.address = ""
        self.client: Any = None
        self._chain: Any = None  # a `reflector.client.status.ChainFollower` once there is a client

    @property
    def wf_id(self) -> str:
        return self._wf_id

    @wf_id.setter
    def wf_id(self, value: str) -> None:
        self._wf_id = value
        self.display.title = f"{self.noun} {value}"
        self.display.start_clock()

    async def progress(self, p: object) -> None:
        from reflector.client.status import ChainFollower
        from reflector.contract import BatchProgress, Progress

        assert isinstance(p, Progress | BatchProgress)
        if isinstance(p, Progress) and self.client is not None:
            self._chain = self._chain or ChainFollower(self.client)
            self.display.update(p, await self._chain(p))
        else:
            self.display.update(p)

    def end_line(self) -> None:
        self.display.stop()

    def finish(self, out: object, config: object = None) -> None:
        """The summary line (the final numbers, from the result), shown also when no poll saw any progress."""
        from reflector import client as c
        from reflector.client.progress_view import summary_line
        from reflector.client.status import final_progress
        from reflector.contract import BatchOutput, BatchProgress, ReflectionConfig, ReflectorOutput

        elapsed = self.display.elapsed
        if isinstance(out, BatchOutput):
            p = BatchProgress(
                phase="done",
                total=out.n_runs,
                done=out.reflected,
                failed=out.failed,
                continued_as_new=out.continued_as_new,
            )
            outcome = (
                "CANCELLED" if out.cancelled else "completed" if c.is_batch_complete(out) else "INCOMPLETE"
            )
            self.display.finish(summary_line(self.noun, self.wf_id, outcome, elapsed, p))
            return
        assert isinstance(out, ReflectorOutput)
        stop = out.raw.get("rr_trace", {}).get("stop_reason")
        outcome = (
            "CANCELLED"
            if c.is_cancelled(out)
            else "completed"
            if c.is_complete(out)
            else f"INCOMPLETE ({stop})"
        )
        cfg = config if isinstance(config, ReflectionConfig) else None
        self.display.finish(summary_line(self.noun, self.wf_id, outcome, elapsed, final_progress(out, cfg)))

    def no_worker(self, waited: float) -> None:
        self.display.note(
            f"rr: no worker is polling task queue {self.settings.task_queue!r} on {self.address}: {self.noun} "
            f"{self.wf_id} has waited {waited:.0f} s for one; start `rr worker` (same TEMPORAL_ADDRESS, "
            f"RR_TASK_QUEUE and RR_BLOB_DIR), or press Ctrl-C (the {self.noun} stays; `rr result {self.wf_id}` "
            "follows it later)"
        )

    def worker_back(self) -> None:
        self.display.note(f"rr: a worker took {self.noun} {self.wf_id}")


def _interrupted(wf_id: str, rt: object, settings: Settings, tty: bool, noun: str = "reflection") -> int:
    from reflector.client import Runtime

    assert isinstance(rt, Runtime)
    _stop_progress()  # (`tty`: kept for callers; the live view ends itself)
    ns = settings.namespace
    print(
        f"rr: error: interrupted: {noun} {wf_id} was not stopped; it goes on durably on {rt.address} "
        f"(namespace {ns!r})",
        file=sys.stderr,
    )
    _say(f"  follow it: rr result {wf_id}")
    _say(f"  cancel it: rr cancel {wf_id}")
    if rt.local_worker:
        _say(
            f"  this process ran its only worker: the {noun} continues when a worker runs (`rr worker` "
            f"with TEMPORAL_ADDRESS={rt.address} RR_TASK_QUEUE={settings.task_queue})"
        )
    if rt.embedded_server:
        _say(
            f"  the embedded server of this RR_HOME stops a while after no rr process of it runs "
            f"(RR_EMBEDDED_LINGER_S); the {noun} is saved in {settings.db_file}: the commands above (same "
            "RR_HOME) start it again"
        )
    return 130
