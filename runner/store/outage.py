"""Waiting out a Redis outage: capped exponential backoff with full jitter, one log line
when it starts and one when it ends (no flood, no busy loop)."""

from __future__ import annotations

import logging
import random
import threading


class Outage:
    def __init__(self, name: str, log: logging.Logger, base_s: float = 0.05, cap_s: float = 5.0) -> None:
        self.name = name
        self.log = log
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0

    def failed(self, exc: BaseException, stop: threading.Event) -> None:
        """Record a failure and sleep (interruptible by ``stop``)."""
        if self.failures == 0:
            self.log.warning("%s: Redis unavailable (%s); retrying with backoff", self.name, exc)
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures, 10))
        stop.wait(ceiling / 2 + random.random() * ceiling / 2)

    def ok(self) -> None:
        if self.failures:
            self.log.warning("%s: Redis reachable again after %d failed tries", self.name, self.failures)
            self.failures = 0
