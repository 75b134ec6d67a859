"""The environment a user's shell gives `rr` in a test: the caller's, without its rr / Temporal settings.

One thing is added back: the suite's homes' embedded servers stop with their last user
(`RR_EMBEDDED_LINGER_S=0`) instead of lingering for the default 5 minutes after it, so that the ~100 homes
a run creates do not leave ~100 idle servers behind. A test of the linger sets its own value.
"""

from __future__ import annotations

import os

SUITE_SETTINGS = {"RR_EMBEDDED_LINGER_S": "0"}


def user_env(strip: tuple[str, ...] = ("RR_", "TEMPORAL_")) -> dict[str, str]:
    """`os.environ` without the variables whose names start with `strip`, plus `SUITE_SETTINGS`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(strip)}
    env.update(SUITE_SETTINGS)
    return env
