"""The live feed behind GET /events: one read loop per web process, shared by every
connected page.

Each tick the loop reads the queue figures once (as GET /queues shows them) and the jobs
that the connected pages watch, in one round trip for all of them, then hands each
stream what changed for it: a new stream gets the whole figures first, later ticks only
the queues whose figures changed, and a watched job whenever its view changed. Nothing
is read for jobs nobody watches, and nothing at all while no page is connected: the loop
runs only while a stream is open.

A stream is a bounded queue of events read by its request (events.py). A page too slow
to keep up is dropped rather than buffered without end; it reconnects and starts over
with the whole figures. ``drain`` ends every stream (the server is shutting down: an
open stream would hold the graceful shutdown to its timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runner.client import Client
from runner.errors import RedisUnavailable
from runner.observe.figures import queue_view, read_queues
from runner.store import codec, records
from runner.store.connection import UNAVAILABLE
from runner.web.offload import Offload

log = logging.getLogger("runner.web")

TICK_S = 1.0
# Job ids one process reads per tick over all its streams: each costs a lookup per queue.
MAX_WATCHED = 200
# Events waiting for one stream: a page that far behind is dropped (it reconnects).
BACKLOG = 64

Event = tuple[str, Any]  # (event name, JSON data)


class TooManyWatched(Exception):
    """Opening this stream would take the process past MAX_WATCHED job ids."""


@dataclass(eq=False)
class Stream:
    """One connected page: the jobs it watches and the events not yet sent to it."""

    jobs: frozenset[str]
    events: asyncio.Queue[Event | None] = field(default_factory=lambda: asyncio.Queue(BACKLOG))
    primed: bool = False                              # has had the whole figures
    seen: dict[str, str] = field(default_factory=dict)  # job id -> the view last sent, as JSON
    ended: bool = False

    def put(self, event: Event) -> None:
        if self.ended:
            return
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            self.end()

    def end(self) -> None:
        """No more events; the request ends once it has read the end marker."""
        if self.ended:
            return
        self.ended = True
        while not self.events.empty():  # make room for the marker: what is left is stale anyway
            self.events.get_nowait()
        self.events.put_nowait(None)


@dataclass(frozen=True, slots=True)
class _Reading:
    queues: list[dict[str, Any]]
    jobs: dict[str, dict[str, Any]]
    redis: str  # "ok" | "unreachable"


class Hub:
    def __init__(self, client: Client, offload: Offload, tick_s: float = TICK_S) -> None:
        self.client = client
        self.offload = offload
        self.tick_s = tick_s
        self.streams: set[Stream] = set()
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._queues: dict[str, dict[str, Any]] = {}  # the figures of the last tick, by queue
        self._redis = "ok"

    def open(self, jobs: Iterable[str]) -> Stream:
        """A stream for a request (on the event loop); ends at once while draining."""
        stream = Stream(frozenset(jobs))
        if self.draining:
            stream.end()
            return stream
        if self.too_many(stream.jobs):
            raise TooManyWatched
        self.streams.add(stream)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop, self._wake = loop, asyncio.Event()
            self._queues = {}
            self._task = loop.create_task(self._run(), name="runner-events")
        assert self._wake is not None
        self._wake.set()  # a new page gets its first figures now, not at the next tick
        return stream

    def too_many(self, jobs: Iterable[str]) -> bool:
        """Would watching these too take the process past MAX_WATCHED ids?"""
        return len(self._watched() | frozenset(jobs)) > MAX_WATCHED

    def close(self, stream: Stream) -> None:
        stream.ended = True
        self.streams.discard(stream)

    def drain(self) -> None:
        """End every stream and refuse new ones: the server is shutting down."""
        self.draining = True
        for stream in list(self.streams):
            stream.end()

    def _watched(self) -> frozenset[str]:
        return frozenset().union(*(s.jobs for s in self.streams))

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while self.streams:
            wake.clear()
            ids = sorted(self._watched())
            try:
                self._fan_out(await self.offload(self._read, ids))
            except Exception:  # the feed goes on: the next tick tries again
                log.exception("event feed: a tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.tick_s)

    def _read(self, ids: list[str]) -> _Reading:
        rt = self.client.runtime
        try:
            figures = read_queues(rt, records.now_ms())
            jobs = self.client.get_many(ids) if ids else {}
        except UNAVAILABLE:
            return _Reading([], {}, "unreachable")
        except RedisUnavailable:
            return _Reading([], {}, "unreachable")
        views = [queue_view(q, rt.config.queues[q.name]) for q in figures if q.name in rt.config.queues]
        return _Reading(views, {i: j.as_dict() for i, j in jobs.items()}, "ok")

    def _fan_out(self, reading: _Reading) -> None:
        health_changed = reading.redis != self._redis
        self._redis = reading.redis
        health: Event = ("health", {"redis": reading.redis})
        if reading.redis != "ok":
            for s in self.streams:
                if health_changed or not s.primed:
                    s.put(health)
            return
        changed = [q for q in reading.queues if self._queues.get(q["name"]) != q]
        self._queues = {q["name"]: q for q in reading.queues}
        for s in list(self.streams):
            if not s.primed:
                s.primed = True
                s.put(health)
                s.put(("queues", {"queues": reading.queues, "full": True}))
            else:
                if health_changed:
                    s.put(health)
                if changed:
                    s.put(("queues", {"queues": changed, "full": False}))
            for job_id in s.jobs:
                job = reading.jobs.get(job_id)
                text = codec.dumps(job) if job is not None else ""
                if s.seen.get(job_id) != text:
                    s.seen[job_id] = text
                    s.put(("job", job) if job is not None else ("job-gone", {"id": job_id}))
