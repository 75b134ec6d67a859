"""Synthetic tau-bench-style runs (tests and `bench/batch.py`): tool errors, expected actions, a reward.

A run is a dict shaped like a tau-bench trajectory (`task_id`, `trial`, `reward`, `info.task.actions`,
`traj` of OpenAI-style messages), so the tau-bench adapter reads it like a real one.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tau_run", "synthetic_runs"]

BOOKING = {"user_id": "mia_li_3668", "origin": "JFK", "destination": "SEA", "cabin": "economy"}


def tau_run(
    task_id: int,
    *,
    trial: int = 0,
    errors: dict[str, int] | None = None,
    book: bool = True,
    wrong_cabin: bool = False,
    reward: float | None = None,
) -> dict[str, Any]:
    """A run whose agent calls each tool of `errors` that many times, each call failing, then books (or not:
    `book=False`) the expected reservation (with the wrong cabin: `wrong_cabin=True`). The reward is 1 when
    the booking is the expected one, else 0, unless given."""
    traj: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an airline agent. Follow the policy."},
        {"role": "user", "content": "I want to fly from New York to Seattle on May 20, economy."},
    ]
    n = 0
    for tool, count in (errors or {}).items():
        for _ in range(count):
            n += 1
            traj.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"c{n}",
                            "type": "function",
                            "function": {"name": tool, "arguments": json.dumps({"id": n})},
                        }
                    ],
                }
            )
            traj.append(
                {
                    "role": "tool",
                    "tool_call_id": f"c{n}",
                    "name": tool,
                    "content": f"Error: {tool} failed: record {n} not found",
                }
            )
    if book:
        args = dict(BOOKING, cabin="business") if wrong_cabin else dict(BOOKING)
        traj.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "book",
                        "type": "function",
                        "function": {"name": "book_reservation", "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        traj.append(
            {
                "role": "tool",
                "tool_call_id": "book",
                "name": "book_reservation",
                "content": '{"reservation_id": "ZFA04Y", "status": "booked"}',
            }
        )
    traj.append(
        {"role": "assistant", "content": "Your reservation is done." if book else "I could not book it."}
    )
    ok = book and not wrong_cabin
    return {
        "task_id": task_id,
        "trial": trial,
        "reward": (1.0 if ok else 0.0) if reward is None else reward,
        "info": {
            "task": {
                "user_id": BOOKING["user_id"],
                "instruction": "Book JFK to SEA on May 20, economy.",
                "actions": [{"name": "book_reservation", "kwargs": BOOKING}],
                "outputs": [],
            }
        },
        "traj": traj,
    }


def synthetic_runs(n: int) -> list[dict[str, Any]]:
    """`n` runs with a fixed mix of outcomes: a third succeed, the others fail in one of four ways."""
    out = []
    for i in range(n):
        kind = i % 6
        if kind in (0, 1):
            out.append(tau_run(i))
        elif kind == 2:
            out.append(tau_run(i, errors={"get_user_details": 1}, book=False))
        elif kind == 3:
            out.append(tau_run(i, wrong_cabin=True))
        elif kind == 4:
            out.append(tau_run(i, errors={"search_direct_flight": 2}))
        else:
            out.append(tau_run(i, errors={"get_user_details": 1, "search_direct_flight": 1}, book=False))
    return out
