"""The live feed behind GET /events: one read loop per web process, shared by every
connected page.

Each tick the loop reads the queue figures once (as GET /queues shows them) and the jobs
that the connected pages watch, in one round trip for all of them, then hands each
stream what changed for it: a new stream gets the whole figures first, later ticks only
the queues whose figures changed, and a watched job whenever its view changed. Nothing
is read for jobs nobody watches, and nothing at all while no page is connected: the loop
runs only while a stream is open.

Each event is encoded once per tick, on the pool's thread, and the same bytes go to every
stream that gets it: a tick's cost grows with the jobs watched, not with the streams.

A stream is a bounded queue of events read by its request (events.py). A page too slow
to keep up is dropped rather than buffered without end; it reconnects and starts over
with the whole figures. ``drain`` ends every stream (the server is shutting down: an
open stream would hold the graceful shutdown to its timeout). The watched ids are
bounded per process and shared fairly between tokens: a stream of a token over its fair
part ends when a token within its part needs the room (``too_many``, ``_make_room``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
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
# They are shared fairly between the tokens watching (Hub.too_many): a token may take
# more than its fair part only while the others leave room, and one that needs its part
# gets it, so no token (a read-only one, or a leaked one) can lock the others' job views
# out. The open API (no token) has one caller: the whole bound is its own.
MAX_WATCHED = 200
# Streams one token holds open (each holds a connection of the process's
# [api] max_connections): past it, a 429 (events.py). The open API counts as one token.
STREAMS_PER_TOKEN = 32
# Events waiting for one stream: a page that far behind is dropped (it reconnects).
BACKLOG = 64

Event = tuple[str, bytes]  # (event name, its data as JSON)


class TooManyWatched(Exception):
    """Opening this stream would take its token past its fair share of MAX_WATCHED job
    ids while the process has no room for them; the message says so."""


class TooManyStreams(TooManyWatched):
    """The token holds STREAMS_PER_TOKEN streams open already."""


@dataclass(eq=False)
class Stream:
    """One connected page: the jobs it watches and the events not yet sent to it."""

    jobs: frozenset[str]
    owner: str = ""  # the token's name ("" for the open API)
    events: asyncio.Queue[Event | None] = field(default_factory=lambda: asyncio.Queue(BACKLOG))
    primed: bool = False                              # has had the whole figures
    seen: dict[str, bytes] = field(default_factory=dict)  # job id -> the view last sent, as JSON
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
    jobs: dict[str, bytes]  # each watched job's view, encoded once for every stream
    redis: str  # "ok" | "unreachable"


class Hub:
    def __init__(self, client: Client, offload: Offload, tick_s: float = TICK_S) -> None:
        self.client = client
        self.offload = offload
        self.tick_s = tick_s
        self.streams: set[Stream] = set()
        # The process's bound on every request holding its connection (holding.Waits.full),
        # and a token's streams: STREAMS_PER_TOKEN, or its part of a small process's room.
        self.full: Callable[[], str | None] = lambda: None
        self.room_cap = 1 << 30  # (create_app: a token's part of the process's room)
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._queues: dict[str, dict[str, Any]] = {}  # the figures of the last tick, by queue
        self._redis = "ok"

    @property
    def per_token(self) -> int:
        return min(STREAMS_PER_TOKEN, self.room_cap)

    def open(self, jobs: Iterable[str], owner: str = "") -> Stream:
        """A stream for a request (on the event loop); ends at once while draining."""
        stream = Stream(frozenset(jobs), owner)
        if self.draining:
            stream.end()
            return stream
        crowded = self.too_many_streams(owner)
        if crowded:
            raise TooManyStreams(crowded)
        refused = self.too_many(stream.jobs, owner)
        if refused:
            raise TooManyWatched(refused)
        self._make_room(stream.jobs, owner)
        self.streams.add(stream)
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop, self._wake = loop, asyncio.Event()
            self._queues = {}
            self._task = loop.create_task(self._run(), name="runner-events")
        assert self._wake is not None
        self._wake.set()  # a new page gets its first figures now, not at the next tick
        return stream

    def too_many_streams(self, owner: str = "") -> str | None:
        """Why one more stream of this token is refused (it holds STREAMS_PER_TOKEN), or None."""
        if sum(1 for s in self.streams if s.owner == owner) >= self.per_token:
            return (f"this token already holds {self.per_token} event streams open on this web process (the "
                    "most one token may): close a page or tab that shows live updates, or use another token")
        return self.full()

    def too_many(self, jobs: Iterable[str], owner: str = "") -> str | None:
        """Why watching these too is refused, or None. A token may watch more than its
        fair part (fair_part) while the process has room; within its part it is always
        admitted, as opening the stream ends streams of tokens over theirs to make room
        (_make_room). A token's count is each of its streams' ids (each costs a view per
        tick), the process's the distinct ids (each costs a read per tick); the open API's
        only the distinct ids, as it has the whole bound."""
        wanted = frozenset(jobs)
        mine = self._count(owner) + len(wanted)
        if len(self._watched() | wanted) <= MAX_WATCHED and (not owner or mine <= MAX_WATCHED):
            return None
        if not owner:  # the open API: one caller, no one to share with
            return f"this web process already watches {MAX_WATCHED} jobs for its event streams; try again later"
        fair = self.fair_part(owner)
        if mine <= fair:
            return None
        return (f"this web process watches {MAX_WATCHED} jobs for its event streams, shared fairly by the "
                f"tokens watching: this token's fair share is {fair} now, and it would watch {mine}; close a "
                "page that watches jobs first, or try again later")

    def fair_part(self, owner: str) -> int:
        """MAX_WATCHED split evenly between the tokens that watch jobs, this one counted."""
        return MAX_WATCHED // len({s.owner for s in self.streams if s.jobs} | {owner})

    def _make_room(self, wanted: frozenset[str], owner: str) -> None:
        """End streams of the tokens most over their fair part until these ids fit: a
        token took more only while nobody needed it. Its page reconnects (the stream's
        retry) and gets what its fair part, or the room left, allows."""
        while len(self._watched() | wanted) > MAX_WATCHED:
            fair = self.fair_part(owner)
            over = {o: n for o in {s.owner for s in self.streams} - {owner} if (n := self._count(o)) > fair}
            if not over:
                return
            greedy = max(over, key=lambda o: over[o])
            victim = max((s for s in self.streams if s.owner == greedy), key=lambda s: len(s.jobs))
            victim.end()
            self.streams.discard(victim)

    def _count(self, owner: str) -> int:
        return sum(len(s.jobs) for s in self.streams if s.owner == owner)

    def close(self, stream: Stream) -> None:
        stream.ended = True
        self.streams.discard(stream)

    def drain(self) -> None:
        """End every stream and refuse new ones: the server is shutting down."""
        self.draining = True
        for stream in list(self.streams):
            stream.end()

    def _watched(self, owner: str | None = None) -> frozenset[str]:
        return frozenset().union(*(s.jobs for s in self.streams if owner is None or s.owner == owner))

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
            figures = read_queues(rt)
            jobs = self.client.get_many(ids) if ids else {}
        except UNAVAILABLE:
            return _Reading([], {}, "unreachable")
        except RedisUnavailable:
            return _Reading([], {}, "unreachable")
        views = [queue_view(q, rt.config.queues[q.name]) for q in figures if q.name in rt.config.queues]
        return self._reading(views, jobs)

    @staticmethod
    def _reading(views: list[dict[str, Any]], jobs: dict[str, records.Job]) -> _Reading:
        """A tick's reading, each job's view encoded here, once (on the pool's thread)."""
        return _Reading(views, {i: codec.dumpb_view(j.as_dict()) for i, j in jobs.items()}, "ok")

    def _fan_out(self, reading: _Reading) -> None:
        health_changed = reading.redis != self._redis
        self._redis = reading.redis
        health: Event = ("health", codec.dumpb_view({"redis": reading.redis}))
        if reading.redis != "ok":
            for s in self.streams:
                if health_changed or not s.primed:
                    s.put(health)
            return
        changed = [q for q in reading.queues if self._queues.get(q["name"]) != q]
        self._queues = {q["name"]: q for q in reading.queues}
        # Each event encoded once per tick, when a first stream needs it.
        full: Event | None = None
        delta: Event | None = ("queues", codec.dumpb_view({"queues": changed, "full": False})) if changed else None
        gone: dict[str, Event] = {}
        for s in list(self.streams):
            if not s.primed:
                s.primed = True
                s.put(health)
                if full is None:
                    full = ("queues", codec.dumpb_view({"queues": reading.queues, "full": True}))
                s.put(full)
            else:
                if health_changed:
                    s.put(health)
                if delta is not None:
                    s.put(delta)
            for job_id in s.jobs:
                text = reading.jobs.get(job_id, b"")
                if s.seen.get(job_id) != text:
                    s.seen[job_id] = text
                    if text:
                        s.put(("job", text))
                    else:
                        if job_id not in gone:
                            gone[job_id] = ("job-gone", codec.dumpb_view({"id": job_id}))
                        s.put(gone[job_id])
