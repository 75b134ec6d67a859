"""The toolkit in a real sandbox host: cells call it on `traces`, get plain data, and cannot subvert it.

The helpers are trusted host code registered in the scaffold (`sandbox.host.namespace`): restored after
every cell, protected from attribute writes, and handing out fresh plain copies only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reflector.analysis.traces.index import build_index, index_path
from sandbox.executor import SubprocessExecutor
from tests.sandbox.conftest import CONTAINED, TEST_LIMITS, attempt

BOOK: dict[str, Any] = {
    "user_id": "mia",
    "passengers": [{"first_name": "Mia", "dob": "1990-04-05"}],
    "payment_methods": [{"payment_id": "certificate_1", "amount": 250}],
}


def _tau_run(task_id: int, amount: float) -> dict[str, Any]:
    """Steps: 0 system, 1 user, 2 read call, 3 its result, 4 booking call, 5 its result, 6 last message."""
    actual = json.loads(json.dumps(BOOK))
    actual["payment_methods"][0]["amount"] = amount

    def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        }

    traj = [
        {"role": "system", "content": "policy"},
        {"role": "user", "content": "book it"},
        call("c1", "get_user_details", {"user_id": "mia"}),
        {"role": "tool", "tool_call_id": "c1", "name": "get_user_details", "content": '{"name": "Mia"}'},
        call("c2", "book_reservation", actual),
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "book_reservation",
            "content": '{"reservation_id": "R1"}',
        },
        {"role": "assistant", "content": "Booked: R1."},
    ]
    return {
        "task_id": task_id,
        "trial": 0,
        "reward": 1.0 if amount == 250 else 0.0,
        "traj": traj,
        "info": {
            "task": {
                "user_id": "mia",
                "instruction": "book",
                "outputs": [],
                "actions": [{"name": "book_reservation", "kwargs": BOOK}],
            }
        },
    }


@pytest.fixture
async def tau_session(tmp_path: Path) -> AsyncIterator[SubprocessExecutor]:
    path = tmp_path / "tau-run.json"
    path.write_text(json.dumps(_tau_run(7, 300.0)))
    ex = SubprocessExecutor(TEST_LIMITS, index_data=True)
    await ex.start(str(path), "auto", {"task": {"question": "q"}})
    yield ex
    await ex.close()


async def test_a_cell_prints_the_first_divergence(tau_session: SubprocessExecutor) -> None:
    r = await tau_session.run_cell("print(json.dumps(first_divergence(traces)))")
    assert r.ok, r
    d = json.loads(r.stdout)
    assert (d["kind"], d["step"], d["tool"], d["argument"], d["actual"], d["expected"]) == (
        "wrong_arguments",
        4,
        "book_reservation",
        "payment_methods[0].amount",
        300,
        250,
    )
    r = await tau_session.run_cell(
        "calls = tool_calls(traces)\n"
        "print([(c['step'], c['name'], c['result_step']) for c in calls])\n"
        "print(diff_actions(expected_actions(traces), calls)['wrong_arguments'][0]['differences'])\n"
        "print(failing_calls(traces), search_steps(traces, 'booked')[0]['step'], is_write('book_reservation'))"
    )
    assert r.ok, r
    assert r.stdout.splitlines() == [
        "[(2, 'get_user_details', 3), (4, 'book_reservation', 5)]",
        "[{'path': 'payment_methods[0].amount', 'expected': 250, 'actual': 300}]",
        "[] 6 True",
    ]


async def test_the_results_are_plain_data_that_reach_nothing(tau_session: SubprocessExecutor) -> None:
    r = await tau_session.run_cell(
        "def kinds(v, seen):\n"
        "    seen.add(type(v).__name__)\n"
        "    for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else []):\n"
        "        kinds(x, seen)\n"
        "    return seen\n"
        "out = [tool_calls(traces), expected_actions(traces), first_divergence(traces), failing_calls(traces),\n"
        "       search_steps(traces, 'mia'), diff_actions(expected_actions(traces), tool_calls(traces))]\n"
        "print(sorted(kinds(out, set())))\n"
        "calls = tool_calls(traces)\n"
        "calls[1]['args']['user_id'] = 'changed'\n"
        "d = first_divergence(traces)\n"
        "d['agent_call']['args']['passengers'].append('x')\n"
        "print(tool_calls(traces)[1]['args']['user_id'], traces['actions'][1]['arguments']['user_id'],\n"
        "      len(first_divergence(traces)['agent_call']['args']['passengers']))"
    )
    assert r.ok, r
    kinds, after = r.stdout.splitlines()
    assert set(json.loads(kinds.replace("'", '"'))) <= {
        "dict",
        "list",
        "str",
        "int",
        "float",
        "bool",
        "NoneType",
    }
    assert after == "mia mia 1"


async def test_rebinding_the_helpers_does_not_outlive_the_cell(tau_session: SubprocessExecutor) -> None:
    r = await tau_session.run_cell(
        "first_divergence = None\ntool_calls = lambda run: 'hijacked'\ndel search_steps\nprint(tool_calls(traces))"
    )
    assert r.ok, r
    assert r.stdout == (
        "hijacked\nnote: tool_calls, first_divergence, search_steps: toolkit function name(s), "
        "restored after this cell; keep your own data under another name\n"
    )
    r = await tau_session.run_cell(
        "print(first_divergence(traces)['kind'], tool_calls(traces)[0]['name'], callable(search_steps))"
    )
    assert r.ok and r.stdout == "wrong_arguments get_user_details True\n", r


async def test_the_helpers_cannot_be_changed_or_opened(tau_session: SubprocessExecutor) -> None:
    await attempt(tau_session, "tool_calls.limit = 3", CONTAINED)
    await attempt(tau_session, "first_divergence.__globals__")
    await attempt(tau_session, "import functools\nfunctools.wraps(tool_calls).args", CONTAINED)
    r = await tau_session.run_cell("print(first_divergence(traces)['step'])")
    assert r.ok and r.stdout == "4\n"


async def test_model_made_objects_are_read_without_calling_their_methods(
    tau_session: SubprocessExecutor,
) -> None:
    r = await tau_session.run_cell(
        "class D(dict):\n"
        "    def get(self, *a):\n"
        "        raise RuntimeError('override called')\n"
        "    def items(self):\n"
        "        raise RuntimeError('override called')\n"
        "    def __iter__(self):\n"
        "        raise RuntimeError('override called')\n"
        "class S(str):\n"
        "    def startswith(self, *a):\n"
        "        raise RuntimeError('override called')\n"
        "print(diff_values(D(a=1), D(a=2)), is_write(S('get_user')), len(tool_calls(D(traces))))"
    )
    assert r.ok, r
    assert r.stdout == "[{'path': 'a', 'expected': 1, 'actual': 2}] False 2\n"
    r = await tau_session.run_cell("tool_calls(traces['steps'])")
    assert not r.ok and "pass one run" in (r.error or "")
    r = await tau_session.run_cell("diff_values({'s': {1}}, {})")
    assert not r.ok and "not JSON-like data" in (r.error or "")


async def test_describe_traces_and_show_vars_mention_the_toolkit(tau_session: SubprocessExecutor) -> None:
    r = await tau_session.run_cell("describe_traces()")
    assert r.ok, r
    assert "toolkit: functions of one run" in r.stdout
    assert r.stdout.index("first_divergence(run)") < r.stdout.index("schema:")  # before the long parts
    r = await tau_session.run_cell("SHOW_VARS()")
    assert r.ok and "toolkit: tool_calls() expected_actions()" in r.stdout, r
    assert "first_divergence" not in r.stdout.split("your variables")[1].split("preloaded")[0]


async def test_snapshots_refer_to_the_helpers(tau_session: SubprocessExecutor, tmp_path: Path) -> None:
    r = await tau_session.run_cell("f = first_divergence\nd = f(traces)")
    assert r.ok, r
    snap, meta = await tau_session.snapshot()
    assert snap is not None, meta
    fresh = SubprocessExecutor(TEST_LIMITS, index_data=True)
    await fresh.start(str(tmp_path / "tau-run.json"), "auto", {"task": {"question": "q"}})
    try:
        assert await fresh.restore(snap)
        r = await fresh.run_cell("print(f is first_divergence, d['argument'])")
        assert r.ok and r.stdout == "True payment_methods[0].amount\n", r
    finally:
        await fresh.close()


async def test_a_lazy_batch_run(tmp_path: Path) -> None:
    path = tmp_path / "tau-batch.json"
    path.write_text(json.dumps([_tau_run(1, 250), _tau_run(2, 300.0)]))
    with open(path, "rb") as fh:
        _fmt, index = build_index(fh, str(path))
    assert index is not None
    Path(index_path(str(path))).write_bytes(index.to_bytes())
    ex = SubprocessExecutor(TEST_LIMITS, index_data=True)
    await ex.start(str(path), "auto", {})
    try:
        r = await ex.run_cell(
            "print(type(traces['runs']).__name__, [first_divergence(r) is None for r in traces['runs']],\n"
            "      first_divergence(traces['runs'][1])['step'])"
        )
        assert r.ok and r.stdout == "Runs [True, False] 4\n", r
        r = await ex.run_cell("first_divergence(traces)")
        assert not r.ok and "pass one run: first_divergence(traces['runs'][i])" in (r.error or ""), r
    finally:
        await ex.close()
