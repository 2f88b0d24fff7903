"""Named fault points for crash tests.

``fault("after_claim")`` is a no-op unless the environment variable RUNNER_FAULT names
that point; then the process kills itself with SIGKILL right there, so a test can crash
a worker exactly between two steps. RUNNER_FAULT_AFTER=N lets N passes through first.
RUNNER_FAULT_MODE=raise raises an unexpected error there instead (InjectedFault), as a
bug would: how a worker meets the death of one of its threads (lifeline.py).
"""

from __future__ import annotations

import os
import signal

_POINT = os.environ.get("RUNNER_FAULT", "")
_after = int(os.environ.get("RUNNER_FAULT_AFTER", "0") or 0)
_RAISE = os.environ.get("RUNNER_FAULT_MODE", "") == "raise"
ARMED = bool(_POINT)  # for a point on a job's path: `if ARMED: fault(...)` costs no call when off

POINTS = ("before_claim", "after_claim", "mid_handler", "after_handler", "after_ack")
# Off a job's path: the relay of follow-ups to other queues (worker/relay.py).
RELAY_POINTS = ("before_relay", "after_relay")
# The relay's telling of an event's waiters (worker/relay.py, client/waking.py).
WAKE_POINTS = ("before_wake", "after_wake")
# The ticker (worker/ticker.py): before and after a batch of tick scripts, and after it
# placed the jobs its ticks sent to another partition, before it took them off the outbox.
TICK_POINTS = ("before_tick", "after_tick", "tick_placed")
# In the loops of the settler, the lease renewer and an executor, outside their handling
# of errors.
THREAD_POINTS = ("settle_loop", "renew_loop", "exec_loop")


class InjectedFault(RuntimeError):
    """An error a test injected (RUNNER_FAULT_MODE=raise): a stand-in for a bug."""


def fault(point: str) -> None:
    global _after
    if _POINT and point == _POINT:
        if _after > 0:
            _after -= 1
            return
        if _RAISE:
            raise InjectedFault(f"injected fault at {point}")
        os.kill(os.getpid(), signal.SIGKILL)
