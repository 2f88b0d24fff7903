"""Waiting out a Redis outage: capped exponential backoff with full jitter, one log line
when it starts and one when it ends (no flood, no busy loop). ``Away`` does it per
partition, for a loop that goes on with the others while one shard is down."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from redis.exceptions import RedisClusterException

from runner.errors import password_line
from runner.store import urls
from runner.store.connection import UNAVAILABLE

K = TypeVar("K", bound=Hashable)

# A node away: redis-py's cluster client raises RedisClusterException when a node it was
# sent to is gone and no node answered its look at the layout at that moment: an outage of
# that shard, not a bug.
OUTAGE: tuple[type[BaseException], ...] = (*UNAVAILABLE, RedisClusterException)


def checked(replies: Sequence[Any]) -> list[Any]:
    """A pipeline's replies read with ``raise_on_error=False``, the first outage among them
    raised (BUSY, a read-only replica, maxmemory...): a caller that takes an error reply for
    "absent" would otherwise answer "not found" (or a 500) for what Redis could not say."""
    for reply in replies:
        if isinstance(reply, UNAVAILABLE):
            raise reply
    return list(replies)


def _went_away(log: logging.Logger, what: str, exc: BaseException, more: str = "") -> None:
    """The line a loop logs when Redis stops answering it. A refused password is no outage
    to wait out (it lasts until the URL or the server changes): an error that says so, in
    the words every command uses (errors.password_line), and what to do."""
    refused = password_line(exc)
    if refused is not None:
        log.error("%s: %s; %sretrying with backoff", what, refused, more)
    else:
        log.warning("%s: Redis unavailable (%s); %sretrying with backoff", what, urls.scrub(str(exc)), more)


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
            _went_away(self.log, self.name, exc)
        self.failures += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures, 10))
        stop.wait(ceiling / 2 + random.random() * ceiling / 2)

    def ok(self) -> None:
        if self.failures:
            self.log.warning("%s: Redis reachable again after %d failed tries", self.name, self.failures)
            self.failures = 0


class Away(Generic[K]):
    """Partitions whose node is away, each skipped until its own backoff ends (capped
    exponential, with jitter), so a loop goes on with the others and waits only when every
    one is away. One warning when a partition goes away and one when it is back."""

    BASE_S, CAP_S = 0.05, 2.0

    def __init__(self, name: str, label: Callable[[K], str], log: logging.Logger | None = None) -> None:
        self.name = name
        self.label = label  # how the log names a partition ('' for the only one)
        self.log = log or logging.getLogger("runner.worker")
        self.until: dict[K, float] = {}  # partition -> monotonic time it is tried again
        self.fails: dict[K, int] = {}

    def _what(self, p: K) -> str:
        label = self.label(p)
        return f"{self.name}, {label}" if label else self.name

    def failed(self, p: K, exc: BaseException) -> None:
        n = self.fails.get(p, 0) + 1
        self.fails[p] = n
        if n == 1:
            _went_away(self.log, self._what(p), exc, "the other partitions go on; " if self.label(p) else "")
        ceiling = min(self.CAP_S, self.BASE_S * 2 ** min(n, 10))
        self.until[p] = time.monotonic() + ceiling / 2 + random.random() * ceiling / 2

    def ok(self, p: K) -> None:
        if self.fails:
            n = self.fails.pop(p, 0)
            self.until.pop(p, None)
            if n:
                self.log.warning("%s: Redis reachable again after %d failed tries", self._what(p), n)

    def away(self, p: K) -> bool:
        """Whether ``p`` is waiting out its backoff now."""
        return bool(self.until) and self.until.get(p, 0.0) > time.monotonic()

    def live(self, n: int) -> int:
        """How many of ``n`` partitions are not away now (at least 1)."""
        if not self.until:
            return n
        now = time.monotonic()
        return max(1, n - sum(1 for t in self.until.values() if t > now))

    def pick(self, start: int, n: int, stop: threading.Event) -> int | None:
        """Of partitions 0..n-1 (ints), the first from ``start`` on that is not away; with
        every one away, the one back first, after waiting for it (None when ``stop`` is set
        meanwhile)."""
        if not self.until:
            return start
        now = time.monotonic()
        until: dict[int, float] = self.until  # type: ignore[assignment]
        for i in range(n):
            p = (start + i) % n
            if until.get(p, 0.0) <= now:
                return p
        p = min(range(n), key=lambda i: until.get(i, 0.0))
        if stop.wait(max(0.0, until[p] - now)):
            return None
        return p
