"""History size of a 60-request reflection, with and without compaction, with and without external storage.

The scripted reflection runs 59 cells that print ~2,000 characters each, then answers (60 model
requests). "No compaction" uses the default 128k context window (the whole run fits); "compaction"
uses a 12k window so microcompaction and summaries (and a continue-as-new after each) happen.
History size is the server's `history_size_bytes` summed over every run of the workflow id
(continue-as-new chains), and the blob bytes written by external storage are shown beside it.

    python -m bench.history_size
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import bench.scripts  # noqa: F401  (registers bench-long-59)
from bench.common import bench_home, table, upload_bench_trace
from reflector import client as rr
from reflector.client import connect
from reflector.contract import ReflectionConfig
from reflector.runtime.devserver import DevServer
from reflector.runtime.settings import Settings
from worker import build_worker


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


async def main() -> None:
    home = bench_home()
    server = DevServer(home / "temporal.sqlite", ui=False, log_file=home / "server.log")
    address = await server.astart()
    rows = []
    try:
        for threshold in ("0", "16384"):
            os.environ["RR_PAYLOAD_THRESHOLD_BYTES"] = threshold
            os.environ["RR_BLOB_DIR"] = str(home / f"blobs-{threshold}")
            settings = Settings.from_env()
            trace = upload_bench_trace(settings)
            client = await connect(address, settings=settings)
            tq = f"hist-{uuid.uuid4().hex[:6]}"
            async with build_worker(client, tq):
                for label, window in (
                    ("no compaction", 128_000),
                    ("micro (12k window)", 12_000),
                    ("micro+summaries (3k window)", 3_000),
                ):
                    payload_dir = Path(settings.blob_dir) / "sha256"
                    blobs_before = _dir_bytes(payload_dir)
                    cfg = ReflectionConfig(
                        model="bench-long-59",
                        max_requests=80,
                        max_tokens=5_000_000,
                        context_window=window,
                        max_compactions=30,
                    )
                    inp = rr.build_input(trace, config=cfg)
                    handle = await rr.start_reflection(client, inp, tq, f"hist-{uuid.uuid4().hex[:8]}")
                    out = await handle.result()
                    size = events = runs = 0
                    async for wf in client.list_workflows(f"WorkflowId = '{handle.id}'"):
                        d = await client.get_workflow_handle(handle.id, run_id=wf.run_id).describe()
                        size += d.raw_description.workflow_execution_info.history_size_bytes
                        events += d.raw_description.workflow_execution_info.history_length
                        runs += 1
                    rt = out.raw["rr_trace"]
                    rows.append(
                        [
                            "external (16 KiB)" if threshold != "0" else "inline",
                            label,
                            out.raw["usage"]["requests"],
                            out.raw["usage"]["total_tokens"],
                            rt["compactions"],
                            rt["microcompactions"],
                            runs,
                            events,
                            f"{size / 1e6:.2f}",
                            f"{(_dir_bytes(payload_dir) - blobs_before) / 1e6:.2f}",
                        ]
                    )
        print("60-request scripted reflection (59 cells x ~2,000 chars), one run each")
        print(
            table(
                [
                    "payloads",
                    "context",
                    "requests",
                    "tokens",
                    "summaries",
                    "microcompactions",
                    "runs",
                    "events",
                    "history MB",
                    "blobs written MB",
                ],
                rows,
            )
        )
    finally:
        await server.astop()


if __name__ == "__main__":
    asyncio.run(main())
