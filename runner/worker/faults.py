"""Named fault points for crash tests.

``fault("after_claim")`` is a no-op unless the environment variable RUNNER_FAULT names
that point; then the process kills itself with SIGKILL right there, so a test can crash
a worker exactly between two steps. RUNNER_FAULT_AFTER=N lets N passes through first.
"""

from __future__ import annotations

import os
import signal

_POINT = os.environ.get("RUNNER_FAULT", "")
_after = int(os.environ.get("RUNNER_FAULT_AFTER", "0") or 0)

POINTS = ("before_claim", "after_claim", "mid_handler", "after_handler", "after_ack")
# Off a job's path: the relay of follow-ups to other queues (worker/relay.py).
RELAY_POINTS = ("before_relay", "after_relay")


def fault(point: str) -> None:
    global _after
    if _POINT and point == _POINT:
        if _after > 0:
            _after -= 1
            return
        os.kill(os.getpid(), signal.SIGKILL)
