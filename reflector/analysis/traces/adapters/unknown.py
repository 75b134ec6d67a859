"""An unrecognised shape: an empty view that points the model at the raw data."""

from __future__ import annotations

from typing import Any

from reflector.analysis.traces.view import _run_view


def _norm_unknown(data: Any) -> dict[str, Any]:
    keys = sorted(data)[:50] if isinstance(data, dict) else []
    return _run_view(
        "unknown", data, [], metadata={"note": "unrecognised shape: explore raw", "raw_keys": keys}
    )
