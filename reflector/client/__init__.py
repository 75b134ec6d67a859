"""The Python client: upload a trace, start a reflection, follow it, fetch or replay it.

The CLI is a thin shell over these functions. Nothing here runs inside a workflow. The workflow client
is `connect` (Temporal, timeouts, exit codes, `ReflectError`), `upload` (trace, skillbook, input),
`runs` (start, follow, fetch), `session` (where a command's reflections run: `runtime`) and `batch`,
all re-exported here; the other modules of this room are the Python API (`api`), `status`, `ops`
(list, cancel), `render`, `progress_view`, `rerun`, `trace_sandbox` and `audit/`.
"""

from __future__ import annotations

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
from reflector.client.connect import (
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
