"""Longest test files first, so that both pytest-xdist workers stay busy to the end of the suite.

`--dist loadfile` hands each worker whole files; by default xdist orders them by their number of tests, so
the few-test files that take longest (the end-to-end crash, clean-exit, wheel and S3 files: one to three
tests, a minute each on a loaded machine) came last and one worker ran them alone while the other idled.
With `--no-loadscope-reorder` (pyproject's addopts) xdist keeps the collection order, which
`tests/conftest.py` sorts here by each file's measured cost, longest first (each file's tests stay together
and in their order): the greedy longest-first assignment that ends both workers within about the
longest file of each other.

`COSTS` is a file's wall time in seconds (setup, call and teardown of its tests, from a `--junitxml` report
of the whole suite on two workers); only the order matters, so it needs regenerating only when a file's
cost changes much:

    .venv/bin/pytest -p no:randomly --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.support.file_costs /tmp/suite.xml   # prints COSTS to paste here

A file not listed counts `UNLISTED_S` per test.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import pytest

UNLISTED_S = 0.1

# measured 2026-12-06 on two xdist workers, a shared 2-core machine at load ~15 (so about 3.7x CI's times)
COSTS: dict[str, float] = {
    "tests/e2e/test_ace_dropin.py": 585.6,
    "tests/e2e/test_home_server.py": 571.7,
    "tests/e2e/test_api_clean_exit.py": 377.0,
    "tests/e2e/test_status_cli.py": 344.1,
    "tests/e2e/test_hostile_cli.py": 339.4,
    "tests/e2e/test_cli.py": 248.8,
    "tests/e2e/test_export_cli.py": 223.4,
    "tests/e2e/test_crash.py": 205.2,
    "tests/e2e/test_input_caps.py": 170.7,
    "tests/e2e/test_s3_workers.py": 151.0,
    "tests/e2e/test_ops_cli.py": 140.8,
    "tests/e2e/test_python_api.py": 135.2,
    "tests/e2e/test_rerun_cli.py": 120.9,
    "tests/e2e/test_hostile_traces.py": 119.3,
    "tests/unit/test_telemetry.py": 111.7,
    "tests/workflows/test_otel.py": 97.1,
    "tests/e2e/test_cli_stdin.py": 91.1,
    "tests/e2e/test_batch_crash.py": 86.3,
    "tests/e2e/test_tls_server.py": 86.2,
    "tests/workflows/test_audit.py": 79.1,
    "tests/unit/test_s3_store.py": 72.1,
    "tests/e2e/test_batch_cli.py": 65.3,
    "tests/sandbox/test_channel.py": 65.2,
    "tests/e2e/test_chaos.py": 60.8,
    "tests/e2e/test_gc.py": 56.7,
    "tests/workflows/test_provider_faults.py": 53.2,
    "tests/e2e/test_wheel.py": 51.4,
    "tests/workflows/test_budget_property.py": 49.8,
    "tests/e2e/test_supervisor.py": 49.2,
    "tests/workflows/test_reflection.py": 46.0,
    "tests/workflows/test_first_activation.py": 38.4,
    "tests/unit/test_layout.py": 32.2,
    "tests/workflows/test_openai_protocol.py": 31.8,
    "tests/unit/test_trace_index.py": 30.0,
    "tests/workflows/test_cancel.py": 27.5,
    "tests/sandbox/test_guard_hooks.py": 24.4,
    "tests/e2e/test_provider_error_cli.py": 23.4,
    "tests/ace_upstream/test_rr_step_upstream.py": 21.8,
    "tests/workflows/test_batch.py": 21.3,
    "tests/workflows/test_rerun.py": 20.4,
    "tests/workflows/test_compaction.py": 19.9,
    "tests/workflows/test_progress.py": 17.5,
    "tests/unit/test_model_name_check.py": 16.7,
    "tests/sandbox/test_snapshot_trust.py": 13.6,
    "tests/sandbox/test_host.py": 13.4,
    "tests/sandbox/test_escapes.py": 12.8,
    "tests/workflows/test_export_replay.py": 12.4,
    "tests/sandbox/test_isolation.py": 11.9,
    "tests/workflows/test_recursion.py": 11.0,
    "tests/unit/test_devserver.py": 10.1,
    "tests/unit/test_ace_compat.py": 8.9,
    "tests/workflows/test_search_attributes.py": 7.8,
    "tests/unit/test_supervisor.py": 6.3,
    "tests/workflows/test_skillbook_blob.py": 4.8,
    "tests/sandbox/test_children_history.py": 4.8,
    "tests/unit/test_scripted_servers.py": 4.5,
    "tests/sandbox/test_gadgets.py": 4.3,
    "tests/sandbox/test_zygote.py": 4.1,
    "tests/sandbox/test_pool_snapshots.py": 3.9,
    "tests/workflows/test_prompt_snapshot.py": 3.7,
    "tests/unit/test_toolkit_search.py": 3.6,
    "tests/sandbox/test_sessions.py": 3.3,
    "tests/workflows/test_payload_storage.py": 3.3,
    "tests/workflows/test_session_guards.py": 3.1,
    "tests/sandbox/test_host_trust.py": 2.8,
    "tests/workflows/test_citations.py": 2.8,
    "tests/workflows/test_lazy_traces.py": 2.7,
    "tests/workflows/test_skills.py": 2.6,
    "tests/unit/test_traces.py": 2.3,
    "tests/sandbox/test_toolkit_sandbox.py": 1.8,
    "tests/unit/test_heuristic.py": 1.8,
    "tests/e2e/test_worker_scope.py": 1.8,
    "tests/sandbox/test_lazy_trace.py": 1.8,
    "tests/replay/test_replay.py": 1.7,
    "tests/unit/test_admission.py": 1.6,
    "tests/unit/test_session_policies.py": 1.0,
    "tests/unit/test_provider_retries.py": 0.9,
    "tests/unit/test_retry_after.py": 0.7,
    "tests/unit/test_model_requests.py": 0.6,
    "tests/sandbox/test_facts.py": 0.5,
    "tests/unit/test_compose.py": 0.4,
    "tests/unit/test_workflow_side_models.py": 0.3,
    "tests/unit/test_toolkit_calls.py": 0.2,
    "tests/unit/test_gc.py": 0.2,
    "tests/unit/test_whowhen_adapter.py": 0.2,
    "tests/unit/test_quality_labels.py": 0.1,
    "tests/unit/test_findings_cell.py": 0.1,
    "tests/unit/test_citation_check.py": 0.1,
    "tests/unit/test_connection.py": 0.1,
    "tests/unit/test_progress_view.py": 0.1,
    "tests/unit/test_agents_adapter.py": 0.1,
    "tests/unit/test_actors.py": 0.1,
    "tests/unit/test_toolkit_divergence.py": 0.1,
    "tests/unit/test_toolkit_failing_calls.py": 0.0,
    "tests/unit/test_toolkit_trace_back.py": 0.0,
    "tests/unit/test_ops.py": 0.0,
    "tests/unit/test_prompts.py": 0.0,
    "tests/unit/test_batch_rules.py": 0.0,
    "tests/unit/test_toolkit_diff.py": 0.0,
    "tests/unit/test_status_render.py": 0.0,
    "tests/unit/test_provider_errors.py": 0.0,
    "tests/unit/test_toolkit_tau_bench.py": 0.0,
    "tests/e2e/test_audit_html.py": 0.0,
}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """Sort `items` in place: files by cost, longest first; the tests of a file together, in their order."""
    per_file = collections.Counter(_file(i) for i in items)

    def cost(item: pytest.Item) -> float:
        f = _file(item)
        return COSTS.get(f, UNLISTED_S * per_file[f])

    items.sort(key=lambda i: -cost(i))  # stable: a file's tests keep their order


def costs_from_junit(paths: Sequence[str]) -> dict[str, float]:
    """Seconds per test file in junit reports (pytest's `--junitxml`: setup + call + teardown per test)."""
    total: dict[str, float] = collections.defaultdict(float)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname = case.get("classname", "")
            # `tests.e2e.test_crash` or `tests.e2e.test_crash.TestClass`: the file is the part that names a module
            parts = classname.split(".")
            while parts and not parts[-1].startswith("test_"):
                parts.pop()
            if parts:
                total["/".join(parts) + ".py"] += float(case.get("time", 0))
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    print("COSTS: dict[str, float] = {")
    for name, seconds in costs_from_junit(sys.argv[1:]).items():
        print(f'    "{name}": {seconds:.1f},')
    print("}")
