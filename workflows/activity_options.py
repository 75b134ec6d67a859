"""Timeouts and retry policies of every activity the workflow schedules (one place to read them)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig

__all__ = [
    "MODEL_RETRY",
    "MODEL_HEARTBEAT",
    "MODEL_ACTIVITY",
    "BASE_ACTIVITY",
    "SUMMARISE_TIMEOUT",
    "CELL_RETRY",
    "REBUILD_ALLOWANCE_S",
    "BATCH_ACTIVITY_TIMEOUT",
    "BATCH_RETRY",
]

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
)
# pydantic-ai heartbeats model requests in the background (every half of this); a dead worker's in-flight
# provider request is retried elsewhere once this expires. Not shorter: the clock starts when the worker
# polls the task, and a loaded Python worker begins the activities it polled one event-loop turn at a
# time, so a burst of them can wait seconds before their first heartbeat; a timed-out attempt whose
# request is already on the wire is then paid twice (3 s: 35 paid twice at 500 reflections in flight
# with a 3 s model; 10 s: 10 at 500 with a 200 ms model, start delays up to 13 s; bench/throughput.py).
# 30 s is pydantic-ai's default. In-process models run as local activities and never heartbeat.
MODEL_HEARTBEAT = timedelta(seconds=30)
MODEL_ACTIVITY = ActivityConfig(
    start_to_close_timeout=timedelta(minutes=5), heartbeat_timeout=MODEL_HEARTBEAT
)
BASE_ACTIVITY = ActivityConfig(start_to_close_timeout=timedelta(minutes=5), retry_policy=MODEL_RETRY)
SUMMARISE_TIMEOUT = timedelta(minutes=5)

CELL_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)
# Rebuilding a namespace after a crash replays the journal: allow time for it beyond the cell's own limit.
REBUILD_ALLOWANCE_S = 120.0

# The batch workflow's local activities (manifest pages, run records, the synthesis) only read and write
# the blob store: seconds at most (the synthesis of 10,000 records reads ~10 MB). Retried a few times
# for a transient file-system fault; a store that stays unusable fails the batch (not one run's fault).
BATCH_ACTIVITY_TIMEOUT = timedelta(minutes=2)
BATCH_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)
