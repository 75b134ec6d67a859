"""Where a command's reflections run (`runtime`): the configured server or this home's embedded one (leased),
a connected client, and an in-process worker when no worker polls the task queue."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client, WorkflowHandle

from reflector.client.runs import waiting_for_worker
from reflector.client.temporal import (
    FIRST_TASK_WAIT_S,
    ReflectError,
    agent_plugins,
    check_namespace,
    has_pollers,
)
from reflector.runtime import telemetry
from reflector.runtime.connection import describe_target, open_client
from reflector.runtime.homeserver import HomeServer
from reflector.runtime.settings import Settings, env_number, usable_dir
from reflector.runtime.storage.payloads import data_converter

InProcessWorker = Callable[[Client, Settings, AsyncExitStack, Callable[[str], None]], Awaitable[None]]
"""Starts a worker inside this process on `client` and registers its shutdown on the exit stack."""


@dataclass
class Runtime:
    client: Client
    address: str
    embedded_server: bool
    local_worker: bool
    ui_url: str | None = None
    task_queue: str = ""
    _start_worker: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)
    _announce: Callable[[str], None] = field(default=lambda _msg: None, repr=False)

    async def ensure_worker(
        self, handle: WorkflowHandle[Any, Any], wait_s: float = FIRST_TASK_WAIT_S
    ) -> None:
        """Make sure a live worker runs the reflection just started: if no worker takes its first task
        within `wait_s`, run an in-process worker.

        Why decide on the reflection's own first task, not on the task queue's poller list: the server
        lists a worker as a poller for about a minute after its last poll, so an exited worker (e.g. the
        in-process worker of the previous `rr reflect`) looks alive; and a live idle worker's
        `last_access_time` is also up to a minute old (polls are long polls), so no recency threshold
        separates the two. Whether a worker *started the task* is true now. A live worker starts it
        within milliseconds, so the wait only costs time when the listed workers are gone. (Starting an
        in-process worker unconditionally would also work, but it would take other clients' queued
        reflections and hand them back half done when this command exits.)
        """
        if self.local_worker or self._start_worker is None:
            return
        if not await has_pollers(self.client, self.task_queue):
            await self._start_worker()
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not await waiting_for_worker(handle):
                return
            await asyncio.sleep(0.1)
        self._announce(
            f"the workers listed on task queue {self.task_queue!r} did not take the reflection "
            f"within {wait_s:g} s (they have exited)"
        )
        await self._start_worker()


async def lease_home_server(
    settings: Settings, stack: AsyncExitStack, announce: Callable[[str], None] = lambda _msg: None
) -> tuple[HomeServer, bool]:
    """Lease the embedded server of `settings.home` (`reflector.runtime.homeserver`), starting it if none runs; the
    lease is released when `stack` closes (or by the kernel when this process dies). Returns (the server,
    whether this call started it)."""
    from reflector.runtime import homeserver

    usable_dir(settings.home, "RR_HOME")
    port = int(env_number("RR_EMBEDDED_PORT", 7233, maximum=65535))
    linger_s = env_number(
        "RR_EMBEDDED_LINGER_S", homeserver.DEFAULT_LINGER_S, integer=False, minimum=0, maximum=7 * 86400
    )
    try:
        server, lease, started = await asyncio.to_thread(
            homeserver.acquire, settings.home, port=port, linger_s=linger_s
        )
    except homeserver.HomeServerError as e:
        raise ReflectError(f"could not start the embedded Temporal server: {e}") from e
    stack.callback(lease.release)
    if started:
        announce(
            f"started the embedded Temporal server of {settings.home} on {server.address} (SQLite "
            f"{settings.db_file}, Web UI {server.ui_url}); it stops {linger_s:g} s after the last rr process "
            "of this home stops using it (RR_EMBEDDED_LINGER_S)"
        )
    else:
        announce(f"using the embedded Temporal server of {settings.home} on {server.address}")
    if settings.temporal.tls is not None or settings.temporal.api_key:
        announce(
            "the TLS / API key settings are for a configured server (TEMPORAL_ADDRESS or a profile's "
            "address), not for the embedded one"
        )
    return server, started


@asynccontextmanager
async def runtime(
    settings: Settings,
    *,
    want_worker: bool | None = None,
    announce: Callable[[str], None] = lambda _msg: None,
    in_process_worker: InProcessWorker | None = None,
) -> AsyncIterator[Runtime]:
    """Connect to Temporal, starting the embedded dev server and an in-process worker when needed.

    - An explicit `TEMPORAL_ADDRESS` that is unreachable is an error (never silently replaced).
    - The default address, unreachable: start the embedded server on the SQLite file in RR_HOME.
    - A namespace (TEMPORAL_NAMESPACE) that does not exist is a `SettingError`.
    - A local worker (`in_process_worker`, from the composition root: `worker.in_process_worker`) runs in
      this process when we started the server or when asked (`want_worker=True`);
      with `want_worker=None` (auto) the caller calls `Runtime.ensure_worker` once it has started its
      reflection, which runs one when no live worker takes it (otherwise it would wait forever).
    """
    from reflector.runtime.devserver import is_reachable

    async with AsyncExitStack() as stack:
        home_server: HomeServer | None = None
        started = False
        address = settings.address
        if settings.address_explicit:  # TEMPORAL_ADDRESS or a config profile's address: never replaced
            if not is_reachable(address):
                raise ReflectError(f"Temporal server at {describe_target(settings)} is not reachable")
        else:
            home_server, started = await lease_home_server(settings, stack, announce)
            address = home_server.address
        # A command that can run no worker here (status, result, list, cancel, export, ...) connects without
        # pydantic-ai's plugin and converter: the same payloads, about 1 s of CPU less (`connect(for_workers=)`).
        for_workers = want_worker is not False and in_process_worker is not None
        # a bad setting is reported as such, not as a connection error
        converter = data_converter(settings, light=not for_workers)
        plugins = [*agent_plugins(for_workers), *telemetry.client_plugins(settings)]  # likewise (RR_OTEL)
        try:
            client = await open_client(
                settings,
                address=address,
                embedded=home_server is not None,
                data_converter=converter,
                plugins=plugins,
            )
        except Exception as e:
            raise ReflectError(
                f"cannot connect to Temporal at {describe_target(settings, address)}: {e}"
            ) from e
        await check_namespace(client, address)
        if started:  # an embedded server on a database older than rr's search attributes
            from reflector.runtime import search_attributes as sa

            with contextlib.suppress(Exception):  # best effort: without them, rr works and `rr list` says so
                await sa.register(client)
        rt = Runtime(
            client,
            address,
            home_server is not None,
            False,
            home_server.ui_url if home_server else None,
            task_queue=settings.task_queue,
            _announce=announce,
        )

        async def start_worker() -> None:
            if rt.local_worker:
                return
            if in_process_worker is None:
                raise ReflectError("no worker takes this reflection and none can run in this process")
            await in_process_worker(client, settings, stack, announce)
            rt.local_worker = True

        rt._start_worker = start_worker
        # On the home's embedded server every `rr reflect` runs its own worker: another process's in-process
        # worker may exit at any time (its half-done tasks then move here, never the other way round).
        if want_worker or (want_worker is None and home_server is not None):
            await start_worker()
        elif want_worker is False or in_process_worker is None:
            rt._start_worker = None
        yield rt
