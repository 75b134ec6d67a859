"""A lease's release marks the home server's last use, from which the keeper counts its linger."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reflector.runtime import homeserver


def test_a_released_lease_marks_the_last_use(tmp_path: Path) -> None:
    users = tmp_path / homeserver.USERS_FILE
    users.touch()
    os.utime(users, (1, 1))  # a lease taken and released between two of the keeper's looks ...
    lease = homeserver.Lease(os.open(users, os.O_RDWR))
    lease.release()
    assert not lease.held
    assert abs(time.time() - homeserver._last_use(tmp_path)) < 60  # ... still restarts the linger
    assert homeserver._last_use(tmp_path / "gone") == 0.0
