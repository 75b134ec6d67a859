"""The Python client: upload a trace, start a reflection, follow it, fetch or replay it.

The CLI is a thin shell over these functions. Nothing here runs inside a workflow. The workflow client
is `temporal` (connecting, timeouts, exit codes, `ReflectError`), `upload` (trace, skillbook, input),
`runs` (start, follow, fetch), `session` (where a command's reflections run: `runtime`) and `batch`,
all re-exported here; the other modules of this room are the Python API (`api`), `status`, `ops`
(list, cancel), `render`, `progress_view`, `rerun`, `trace_sandbox` and `audit/`.

The names are imported on first use (PEP 562): `import reflector.client.api` (the Python API's types)
must not pay for the Temporal client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reflector.client.batch import (
        BATCH_CONCURRENCY_IN_PROCESS,
        BATCH_CONCURRENCY_PROVIDER,
        batch_result,
        build_batch_input,
        default_concurrency,
        fetch_batch_result,
        is_batch_complete,
        load_batch_records,
        reflect_batch,
        start_batch,
        upload_batch,
        wait_for_batch,
    )
    from reflector.client.runs import (
        fetch_result,
        is_cancelled,
        is_complete,
        start_reflection,
        wait_for_result,
        waiting_for_worker,
    )
    from reflector.client.session import (
        InProcessWorker,
        Runtime,
        lease_home_server,
        runtime,
    )
    from reflector.client.temporal import (
        EXIT_CANCELLED,
        EXIT_INCOMPLETE,
        EXIT_NOT_RUNNING,
        FIRST_TASK_WAIT_S,
        PROVIDER_WORKFLOW_TASK_TIMEOUT,
        QUERY_TIMEOUT,
        WORKFLOW_TASK_TIMEOUT,
        ReflectError,
        check_namespace,
        configure_core_logging,
        connect,
        has_pollers,
        task_timeout_for,
    )
    from reflector.client.upload import (
        build_input,
        check_id,
        check_task_texts,
        new_workflow_id,
        upload_skillbook,
        upload_trace,
    )

__all__ = [
    "ReflectError",
    "upload_trace",
    "upload_skillbook",
    "build_input",
    "start_reflection",
    "wait_for_result",
    "fetch_result",
    "runtime",
    "Runtime",
    "check_namespace",
    "is_complete",
    "configure_core_logging",
    "EXIT_INCOMPLETE",
    "EXIT_CANCELLED",
    "EXIT_NOT_RUNNING",
    "is_cancelled",
    "FIRST_TASK_WAIT_S",
    "upload_batch",
    "build_batch_input",
    "start_batch",
    "wait_for_batch",
    "load_batch_records",
    "fetch_batch_result",
    "reflect_batch",
    "is_batch_complete",
    "batch_result",
    "default_concurrency",
    "PROVIDER_WORKFLOW_TASK_TIMEOUT",
    "QUERY_TIMEOUT",
    "WORKFLOW_TASK_TIMEOUT",
    "connect",
    "has_pollers",
    "task_timeout_for",
    "check_id",
    "check_task_texts",
    "new_workflow_id",
    "waiting_for_worker",
    "InProcessWorker",
    "lease_home_server",
    "BATCH_CONCURRENCY_IN_PROCESS",
    "BATCH_CONCURRENCY_PROVIDER",
]

# where each name lives
_HOMES = {
    "BATCH_CONCURRENCY_IN_PROCESS": "reflector.client.batch",
    "BATCH_CONCURRENCY_PROVIDER": "reflector.client.batch",
    "batch_result": "reflector.client.batch",
    "build_batch_input": "reflector.client.batch",
    "default_concurrency": "reflector.client.batch",
    "fetch_batch_result": "reflector.client.batch",
    "is_batch_complete": "reflector.client.batch",
    "load_batch_records": "reflector.client.batch",
    "reflect_batch": "reflector.client.batch",
    "start_batch": "reflector.client.batch",
    "upload_batch": "reflector.client.batch",
    "wait_for_batch": "reflector.client.batch",
    "EXIT_CANCELLED": "reflector.client.temporal",
    "EXIT_INCOMPLETE": "reflector.client.temporal",
    "EXIT_NOT_RUNNING": "reflector.client.temporal",
    "FIRST_TASK_WAIT_S": "reflector.client.temporal",
    "PROVIDER_WORKFLOW_TASK_TIMEOUT": "reflector.client.temporal",
    "QUERY_TIMEOUT": "reflector.client.temporal",
    "WORKFLOW_TASK_TIMEOUT": "reflector.client.temporal",
    "ReflectError": "reflector.client.temporal",
    "check_namespace": "reflector.client.temporal",
    "configure_core_logging": "reflector.client.temporal",
    "connect": "reflector.client.temporal",
    "has_pollers": "reflector.client.temporal",
    "task_timeout_for": "reflector.client.temporal",
    "fetch_result": "reflector.client.runs",
    "is_cancelled": "reflector.client.runs",
    "is_complete": "reflector.client.runs",
    "start_reflection": "reflector.client.runs",
    "wait_for_result": "reflector.client.runs",
    "waiting_for_worker": "reflector.client.runs",
    "InProcessWorker": "reflector.client.session",
    "Runtime": "reflector.client.session",
    "lease_home_server": "reflector.client.session",
    "runtime": "reflector.client.session",
    "build_input": "reflector.client.upload",
    "check_id": "reflector.client.upload",
    "check_task_texts": "reflector.client.upload",
    "new_workflow_id": "reflector.client.upload",
    "upload_skillbook": "reflector.client.upload",
    "upload_trace": "reflector.client.upload",
}


def __getattr__(name: str) -> Any:
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module 'reflector.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
