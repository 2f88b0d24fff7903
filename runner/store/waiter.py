"""Waiting for jobs to end, pushed: one pub/sub connection per process for every wait.

The scripts that end a waited-for job (ack, bury, reclaim) publish its id on its queue's
``ended`` channel (see ``waited`` in lua/_lib.lua). One thread here subscribes to the
channels of every queue and pokes the waits registered for each id it hears of; a wait
then reads the job to see how it ended. Every (re)subscription pokes every wait too:
an end published while the connection was down (a Redis restart) is never heard, so each
wait reads its job again once the subscription is back.

A worker process uses the same subscriber with ``on_message`` for the queues' cancels
channels (a cancel of a job it claimed ahead).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from runner.errors import RedisUnavailable
from runner.store.connection import UNAVAILABLE

log = logging.getLogger("runner.waiter")

Poke = Callable[[], None]
RETRY_S = 0.2  # between reconnection attempts while Redis is away
READ_S = 1.0  # a read's timeout, so a stop is seen


class Waiter:
    """The waits of one process: job id -> the pokes of its waits."""

    def __init__(self, redis: Any, channels: Sequence[str],
                 on_message: Callable[[list[str]], None] | None = None) -> None:
        self.redis = redis
        self.channels = tuple(channels)
        self.on_message = on_message  # every message's words, instead of poking waits
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._waits: dict[str, set[Poke]] = {}
        self._subscribed = threading.Event()
        self._more: list[str] = []  # channels to add, subscribed by the listening thread
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, job_id: str, poke: Poke) -> None:
        with self._lock:
            self._waits.setdefault(job_id, set()).add(poke)

    def extend(self, channels: Sequence[str]) -> None:
        """Listen to these channels too (a draining partition found after the start)."""
        with self._lock:
            new = [c for c in channels if c not in self.channels]
            self.channels += tuple(new)
            self._more += new

    def discard(self, job_id: str, poke: Poke) -> None:
        with self._lock:
            pokes = self._waits.get(job_id)
            if pokes is not None:
                pokes.discard(poke)
                if not pokes:
                    del self._waits[job_id]

    def ready(self, timeout_s: float) -> bool:
        """Start the subscriber if needed; True once it listens (a wait registered before
        this returns hears of every end published after it)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="runner-waiter", daemon=True)
                self._thread.start()
        return self._subscribed.wait(timeout_s)

    def stop(self, wait: bool = True) -> None:
        """Stop listening; ``wait`` for the thread (up to a read's timeout), or leave it
        to end on its own (a daemon thread, gone with the process)."""
        self._stopped.set()
        if wait and self._thread is not None:
            self._thread.join(timeout=READ_S + 1)

    def _poke(self, job_ids: Sequence[str] | None) -> None:
        """Poke the waits of these ids (None: of every id)."""
        with self._lock:
            if job_ids is None:
                pokes = [p for ps in self._waits.values() for p in ps]
            else:
                pokes = [p for i in job_ids for p in self._waits.get(i, ())]
        for p in pokes:
            p()

    def _run(self) -> None:
        while not self._stopped.is_set():
            pubsub = None
            try:
                pubsub = self.redis.pubsub()
                with self._lock:
                    channels, self._more = self.channels, []
                pubsub.subscribe(*channels)
                self._listen(pubsub)
            except UNAVAILABLE as exc:
                log.debug("waiter: Redis unreachable, subscribing again: %s", exc)
            except Exception:  # a stray error must not leave every wait to its timeout
                log.exception("waiter: subscription failed, subscribing again")
            finally:
                self._subscribed.clear()
                if pubsub is not None:
                    with contextlib.suppress(*UNAVAILABLE):
                        pubsub.close()
            # What ends while we are away is published to nobody: the waits read their jobs
            # again once the subscription is back (see _listen), not before.
            self._stopped.wait(RETRY_S)

    def _listen(self, pubsub: Any) -> None:
        confirmed = 0
        while not self._stopped.is_set():
            if self._more:  # a pubsub connection is this thread's alone: it subscribes
                with self._lock:
                    more, self._more = self._more, []
                pubsub.subscribe(*more)
            msg = pubsub.get_message(timeout=READ_S)
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "subscribe":
                confirmed += 1
                if confirmed == len(self.channels):
                    self._subscribed.set()
                    # An end published before this subscription was heard by nobody.
                    self._poke(None)
            elif kind == "message":
                data = msg.get("data")
                if isinstance(data, bytes):
                    data = data.decode()
                if isinstance(data, str):
                    if self.on_message is not None:
                        self.on_message(data.split())
                    else:
                        self._poke(data.split())


def wait_until(waiter: Waiter, deadline: float, check: Callable[[], bool], watch: Callable[[], None] | None,
               job_id: str) -> None:
    """Block until ``check()`` is true or the deadline (time.monotonic) passes. ``check``
    runs after subscribing (closing the race with an end just before), after each poke,
    and once at the deadline; ``watch`` (marking the job as waited for) runs first. Redis
    going away after that does not end the wait: the subscription coming back pokes it."""
    event = threading.Event()
    waiter.add(job_id, event.set)
    try:
        waiter.ready(max(0.0, deadline - time.monotonic()))
        if watch is not None:
            watch()
        ended = check()
        while not ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            event.wait(left)
            event.clear()
            with contextlib.suppress(RedisUnavailable):
                ended = check()
    finally:
        waiter.discard(job_id, event.set)
