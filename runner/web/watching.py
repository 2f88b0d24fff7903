"""GET /jobs/{id}/logs: a job's own log, and GET /jobs/{id}/stream: its ctx.stream
output (``read`` scope, as reading the job).

    200 {"id", "status", "lines": [{"n", "ts", "level", "src", "msg"}, ...]}, oldest first;
        "damaged_keys": [{"key", "type", "detail"}] when the log's key holds another Redis
        type (no line read; store/damage.py)
    ?follow=1: server-sent events instead, each line as it lands, until the job ends:
        event: line   one line (JSON), the lines kept so far first; its id: the line's n
        event: damaged {"key", "type", "detail"}: the key holds another Redis type (once;
                      the job's next write sets it aside, and its lines follow)
        event: end    {"id", "status"}: the job has ended (or the stream's time is up,
                      status then as it was: a client follows again; status null: the
                      job was deleted meanwhile)
    ?after=N: only the lines after the one numbered N (a reader coming back).

GET /jobs/{id}/stream: server-sent events, the chunks kept first, then each as it lands:
        event: chunk  {"a": attempt, "i": its number in the attempt, "ts", "data"}; its
                      id: its place, A.I (R.A.I for a requeued job's later run, which
                      carries "r")
        event: damaged as the log's
        event: end    {"id", "status"}: the job has ended (or the stream's time is up)
    ?after=A.I (R.A.I): only the chunks after that place (a reader coming back).

A reconnect resumes where the last one left off: the Last-Event-ID header a client sends
back (an EventSource does, with the id of the last event it read) counts as ?after=, and
wins over it (a client reconnects to the URL it opened). A line's number is its place
among every line written to the log, so a resume is exact however many lines were
trimmed off the front meanwhile (lua/joblog.lua).

A stream lasts at most events.STREAM_S; a comment line every HEARTBEAT_S keeps proxies
from timing it out. Redis away (a restart, a failover) does not end it: a comment line
says so, and it follows on once Redis answers. A log line is data from a producer: it is sent as JSON, never markup.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import falcon
import falcon.asgi

from runner.client import Client, watching
from runner.errors import JobNotFound, RedisUnavailable
from runner.store import records
from runner.web.body import only_params, send
from runner.web.events import HEARTBEAT_S, RETRY_MS, STREAM_S, _owner
from runner.web.hub import STREAMS_PER_TOKEN
from runner.web.offload import Offload
from runner.web.problems import Problem

# How often a follower's log is read again (lines land with a renewal or a settlement).
FOLLOW_POLL_S = 0.25


class Followers:
    """The follow streams (logs, output) each token holds open on this process, held to
    STREAMS_PER_TOKEN as the event streams are: each one holds a connection and polls
    Redis, so one token must not fill the server's connections with them."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        # The process's bound on every request holding its connection (holding.Waits.full),
        # and a token's follows: STREAMS_PER_TOKEN, or its part of a small process's room.
        self.full: Callable[[], str | None] = lambda: None
        self.room_cap = 1 << 30  # (create_app: a token's part of the process's room)

    @property
    def per_token(self) -> int:
        return min(STREAMS_PER_TOKEN, self.room_cap)

    def admit(self, req: falcon.asgi.Request) -> str:
        """The stream's owner, or a 429 when it holds its share already (or the process
        holds its bound of open requests)."""
        owner = _owner(req)
        if self.open.get(owner, 0) >= self.per_token:
            raise Problem(429, "too-many-streams", f"this token already holds {self.per_token} follow streams "
                          "open on this web process; close one (a page or a `runner logs --follow`) and retry",
                          title="Too many follow streams", headers={"Retry-After": "30"},
                          max_streams=self.per_token)
        full = self.full()
        if full is not None:
            raise Problem(429, "too-many-streams", full, title="Too many open requests",
                          headers={"Retry-After": "30"}, max_streams=self.per_token)
        return owner

    async def held(self, owner: str, body: AsyncIterator[falcon.asgi.SSEvent | None]
                   ) -> AsyncIterator[falcon.asgi.SSEvent | None]:
        # Counted from the stream's first event: only a generator that started runs its
        # finally, so only from here is every stream counted sure to be let go.
        self.open[owner] = self.open.get(owner, 0) + 1
        try:
            async for event in body:
                yield event
        finally:
            self.open[owner] -= 1
            if not self.open[owner]:
                del self.open[owner]


FOLLOWERS = Followers()  # one per process: its event loop's


class JobLogs:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req, "follow", "after")
        follow = req.get_param("follow")
        if follow not in (None, "0", "1", "true", "false"):
            raise Problem(400, "invalid-parameter", "query parameter 'follow' must be 1 or 0",
                          title="Invalid parameter", parameter="follow")
        raw = resumed(req, "after")
        if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) < 20):
            raise _bad_resume(req, "a line's number n, as the id of its event (41)")
        after = None if raw is None else int(raw)
        got = await self.offload(self.client.logs, name, after)  # 404 for no such job, before a stream opens
        if follow not in ("1", "true"):
            send(resp, got)
            return
        owner = FOLLOWERS.admit(req)
        resp.cache_control = ["no-store"]
        resp.set_header("X-Accel-Buffering", "no")
        resp.sse = FOLLOWERS.held(owner, self._emit(name, got, after))

    async def _emit(self, job_id: str, first: dict[str, Any], after: int | None
                    ) -> AsyncIterator[falcon.asgi.SSEvent | None]:
        yield falcon.asgi.SSEvent(retry=RETRY_MS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAM_S
        quiet_since = loop.time()
        seen: list[dict[str, Any]] = [] if after is None else [{"n": after}]
        got, mark = first, None
        away = False  # Redis did not answer the last poll
        told: set[str] = set()
        while True:
            for event in _damaged(got, told):
                yield event
            fresh = watching.new_lines(seen, got["lines"]) if got["lines"] is not None else []
            for line in fresh:
                yield falcon.asgi.SSEvent(event="line", data=json.dumps(line, ensure_ascii=True).encode(),
                                          event_id=_line_id(line))
            if fresh:
                seen = got["lines"]
                quiet_since = loop.time()
            if got["status"] in records.ENDED or loop.time() >= deadline:
                yield falcon.asgi.SSEvent(event="end", data=json.dumps(
                    {"id": job_id, "status": got["status"]}, ensure_ascii=True).encode())
                return
            if loop.time() - quiet_since >= HEARTBEAT_S:
                quiet_since = loop.time()
                yield None  # a comment line (": ping")
            await asyncio.sleep(FOLLOW_POLL_S)
            try:
                got, mark = await self.offload(watching.logs_if_changed, self.client, job_id, mark)
                away = False
            except JobNotFound:  # gone meanwhile (its retention): the stream ends
                yield _gone(job_id)
                return
            except Exception as exc:  # Redis away (RedisUnavailable), or a read that failed once
                got = {"id": job_id, "status": got["status"], "lines": None}
                if not away:
                    away = True
                    yield _away(exc)


class JobStream:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req, "after")
        after: tuple[int, ...] = (-1, -1)
        raw = resumed(req, "after")
        if raw is not None:
            parts = raw.split(".")
            if not (len(parts) in (2, 3) and all(p.isascii() and p.isdigit() for p in parts) and len(raw) < 32):
                raise _bad_resume(req, "ATTEMPT.NUMBER or RUN.ATTEMPT.NUMBER, as a chunk's a and i, and its r "
                                  "when it has one, as the id of its event (1.41, 1.1.41)")
            after = tuple(int(p) for p in parts)
        got = await self.offload(watching.stream_chunks, self.client, name, after)  # 404 before a stream opens
        owner = FOLLOWERS.admit(req)
        resp.cache_control = ["no-store"]
        resp.set_header("X-Accel-Buffering", "no")
        resp.sse = FOLLOWERS.held(owner, self._emit(name, got, after))

    async def _emit(self, job_id: str, first: dict[str, Any], after: tuple[int, ...]
                    ) -> AsyncIterator[falcon.asgi.SSEvent | None]:
        yield falcon.asgi.SSEvent(retry=RETRY_MS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAM_S
        quiet_since = loop.time()
        got, mark = first, None
        away = False
        told: set[str] = set()
        while True:
            for event in _damaged(got, told):
                yield event
            for chunk in got["chunks"]:
                yield falcon.asgi.SSEvent(event="chunk", data=json.dumps(chunk, ensure_ascii=True).encode(),
                                          event_id=_chunk_id(chunk))
            if got["chunks"]:
                after = watching.position(got["chunks"][-1])
                quiet_since = loop.time()
            if got["status"] in records.ENDED or loop.time() >= deadline:
                yield falcon.asgi.SSEvent(event="end", data=json.dumps(
                    {"id": job_id, "status": got["status"]}, ensure_ascii=True).encode())
                return
            if loop.time() - quiet_since >= HEARTBEAT_S:
                quiet_since = loop.time()
                yield None
            await asyncio.sleep(FOLLOW_POLL_S)
            try:
                got, mark = await self.offload(watching.stream_if_changed, self.client, job_id, after, mark)
                away = False
            except JobNotFound:  # gone meanwhile (its retention): the stream ends
                yield _gone(job_id)
                return
            except Exception as exc:  # Redis away (RedisUnavailable), or a read that failed once
                got = {"id": job_id, "status": got["status"], "chunks": []}
                if not away:
                    away = True
                    yield _away(exc)


def resumed(req: falcon.asgi.Request, param: str) -> str | None:
    """Where a follow resumes: the Last-Event-ID a reconnecting client sent (the id of the
    last event it read), else the query parameter; None: from the start."""
    header = req.get_header("Last-Event-ID")
    return header if header else req.get_param(param)


def _bad_resume(req: falcon.asgi.Request, what: str) -> Problem:
    if req.get_header("Last-Event-ID"):
        return Problem(400, "invalid-header", f"header Last-Event-ID must be {what}", title="Invalid header",
                       header="Last-Event-ID")
    return Problem(400, "invalid-parameter", f"query parameter 'after' must be {what}", title="Invalid parameter",
                   parameter="after")


def _line_id(line: dict[str, Any]) -> str | None:
    """A line's event id: its number (none for a line written before lines were numbered,
    or another writer's without one: a client's last id stays the line's before it)."""
    n = line.get("n")
    return str(n) if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _chunk_id(chunk: dict[str, Any]) -> str | None:
    """A chunk's event id: its place as ?after= takes it, A.I, or R.A.I in a later run."""
    r, a, i = watching.position(chunk)
    if min(r, a, i) < 0:
        return None
    return f"{r}.{a}.{i}" if r else f"{a}.{i}"


def _damaged(got: dict[str, Any], told: set[str]) -> list[falcon.asgi.SSEvent]:
    """An event per damaged key a read named (store/damage.py), each once per follow."""
    out = []
    for d in got.get("damaged_keys", ()):
        if d["key"] not in told:
            told.add(d["key"])
            out.append(falcon.asgi.SSEvent(event="damaged", data=json.dumps(d, ensure_ascii=True).encode()))
    return out


def _away(exc: Exception) -> falcon.asgi.SSEvent:
    """A comment line: Redis is away (a restart, a failover). The follow goes on, polling as
    before, and picks up where it was once Redis answers: a job's end is never made up
    from an outage."""
    what = "Redis unavailable" if isinstance(exc, RedisUnavailable) else f"a read failed ({type(exc).__name__})"
    return falcon.asgi.SSEvent(comment=f"{what}; following on once it answers")


def _gone(job_id: str) -> falcon.asgi.SSEvent:
    """The end of a job deleted meanwhile (its retention passed): status null."""
    return falcon.asgi.SSEvent(event="end", data=json.dumps({"id": job_id, "status": None},
                                                            ensure_ascii=True).encode())
