"""The HTTP API and dashboard: ``create_app(runtime)`` returns a Falcon ASGI app.

`runner web` serves it from gunicorn's uvicorn workers, and ``runner.web.asgi:app`` is
the same app for any ASGI server; `runner dev` builds it around its own runtime. Routes
read ``runtime.registry`` on every request, never a cached copy, as a reload swaps it.
Every error is problem+json (problems.py).

ASGI rather than WSGI for the cost of a request: under gunicorn's threaded WSGI worker
the server's own work per request (parsing in Python, a thread hand-off per request)
cost as much CPU as the app. On the event loop the enqueue route validates inline and
joins the client's group commit; anything else that blocks (Redis reads, dead-letter
operations, batches, the metrics scrape) runs on a small thread pool (offload.py).
GET /events streams to every connected page from one read loop per process (hub.py).
The server that runs it (gunicorn with uvicorn workers, or uvicorn on a thread for dev)
is server.py.

May import: runner.config, runner.errors, runner.client, runner.runtime, the store, the
catalog, observe and itself; never the worker, the CLI or dev.
"""

from __future__ import annotations

import logging
from typing import Any

import falcon
import falcon.asgi

from runner.client import Client
from runner.config import Config, short_secrets
from runner.errors import ConfigError
from runner.runtime import Runtime
from runner.web import auth, problems
from runner.web.audit import Audit
from runner.web.bulk import Bulk
from runner.web.catalog import FunctionItem, Functions, Health, Queues, Throughput
from runner.web.dashboard import Static
from runner.web.dead import DeadItem, DeadList, DeadRequeue
from runner.web.emits import Emit
from runner.web.events import Events
from runner.web.exposition import Metrics
from runner.web.fastlane import FastLane
from runner.web.groups import GroupItem, GroupMembers, Groups
from runner.web.holding import Waits
from runner.web.hub import Hub
from runner.web.jobs import JobBatch, JobList, JobRunNow, Jobs, JobSignal
from runner.web.offload import Offload
from runner.web.openapi import OpenApi
from runner.web.pauses import FunctionPause, QueuePause
from runner.web.schedules import Schedules, ScheduleTrigger
from runner.web.watching import FOLLOWERS, JobLogs, JobStream
from runner.web.workers import Workers

log = logging.getLogger("runner.web")


# Threads per process for blocking work (see offload.py); the enqueue route needs none.
DEFAULT_THREADS = 8


async def _no_body() -> dict[str, object]:
    return {"type": "http.request", "body": b"", "more_body": False}


class _AnnouncedTooLarge:
    """A body whose Content-Length is over the limit gets its 413 at once. falcon.asgi
    waits for the body's first chunk before it routes, so a client that sends the headers
    and then waits (``Expect: 100-continue``, or a slow one) would hold the request open;
    here such a request goes on as if its body were empty, and read_raw refuses it by its
    announced length. The body itself is never read.

    ``drain()`` is what the server calls as its graceful shutdown begins (server.py): the
    event streams end, as they would otherwise hold the shutdown to its timeout."""

    def __init__(self, app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response], limit: int,
                 hub: Hub) -> None:
        self.app = app
        self.limit = limit
        self.hub = hub

    def drain(self) -> None:
        self.hub.drain()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            # Any iterable of iterable pairs, by the spec: what is read here is kept.
            headers = scope["headers"]
            if type(headers) is not list:
                headers = scope["headers"] = list(headers)
            for i, pair in enumerate(headers):
                if type(pair) is not tuple:
                    pair = headers[i] = tuple(pair)
                if pair[0] == b"content-length":
                    if pair[1].isdigit() and int(pair[1]) > self.limit:
                        receive = _no_body
                    break
        await self.app(scope, receive, send)


class _Headers:
    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               req_succeeded: bool) -> None:
        resp.set_header("X-Content-Type-Options", "nosniff")


def create_app(runtime: Runtime, threads: int = DEFAULT_THREADS) -> FastLane:
    api = runtime.config.api
    if not api.secured:
        log.warning("the HTTP API is open: no token (RUNNER_API_TOKEN, [api.tokens]) or auth switched off")
    else:
        for line in short_secrets(runtime.config):
            log.warning("a guessable API token: %s", line)
    access = auth.Access(runtime)
    middleware: list[Any] = [access, _Headers()]
    app = falcon.asgi.App(middleware=middleware)
    problems.install(app)
    client = Client(runtime)
    offload = Offload(threads)
    app.add_route("/jobs", JobList(client, offload))
    hub = Hub(client, offload)
    app.add_route("/events", Events(hub))
    app.add_route("/events/{name}", Emit(client, offload))
    waits = Waits(api.max_connections)
    # One bound on every request that holds its connection, whatever its kind.
    waits.others += [lambda: len(hub.streams), lambda: sum(FOLLOWERS.open.values())]
    hub.full = FOLLOWERS.full = waits.full
    # A token's streams of each kind: 32, or its part of a small process's room (one token
    # filled the process bound with 32 streams of 40 connections).
    hub.room_cap = FOLLOWERS.room_cap = waits.per_token
    app.add_route("/jobs/{name}", Jobs(client, offload, waits))
    app.add_route("/jobs/{name}/batch", JobBatch(client, offload))
    app.add_route("/jobs/{name}/signals/{signal}", JobSignal(client, offload))
    app.add_route("/jobs/{name}/run-now", JobRunNow(client, offload))
    app.add_route("/jobs/{name}/logs", JobLogs(client, offload))
    app.add_route("/jobs/{name}/stream", JobStream(client, offload))
    app.add_route("/groups", Groups(client, offload))
    app.add_route("/groups/{group_id}", GroupItem(client, offload, waits))
    app.add_route("/groups/{group_id}/members", GroupMembers(client, offload))
    app.add_route("/functions", Functions(runtime))
    app.add_route("/functions/{name}", FunctionItem(client, offload))
    app.add_route("/queues", Queues(runtime, offload))
    app.add_route("/queues/{queue}/pause", QueuePause(client, offload, resume=False))
    app.add_route("/queues/{queue}/resume", QueuePause(client, offload, resume=True))
    app.add_route("/functions/{name}/pause", FunctionPause(client, offload, resume=False))
    app.add_route("/functions/{name}/resume", FunctionPause(client, offload, resume=True))
    app.add_route("/throughput", Throughput(runtime, offload))
    app.add_route("/dead/{queue}", DeadList(client, offload))
    app.add_route("/dead/{queue}/{job_id}", DeadItem(client, offload))
    app.add_route("/dead/{queue}/{job_id}/requeue", DeadRequeue(client, offload))
    app.add_route("/audit", Audit(client, offload))
    app.add_route("/bulk", Bulk(client, offload))
    app.add_route("/whoami", auth.WhoAmI(runtime))
    app.add_route("/schedules", Schedules(client, offload))
    app.add_route("/schedules/{name}/trigger", ScheduleTrigger(client, offload))
    app.add_route("/workers", Workers(client, offload))
    app.add_route("/openapi.json", OpenApi(runtime))
    app.add_route("/metrics", Metrics(runtime, offload))
    app.add_route("/healthz", Health(runtime, offload))
    static = Static()
    app.add_route("/", static)
    app.add_route("/static/{name}", static, suffix="file")
    return FastLane(_AnnouncedTooLarge(app, api.max_body_bytes, hub), runtime, client, access, api.max_body_bytes)


def app_for(config: Config, threads: int = DEFAULT_THREADS) -> FastLane:
    """The app of a serving process, around a Runtime of its own (built after any fork:
    Redis connections must not cross one); function files that failed are logged.
    ConfigError when the config leaves the API open by accident (auth.refusal)."""
    refused = auth.refusal(config)
    if refused is not None:
        raise ConfigError(refused)
    runtime = Runtime.create(config)
    for err in runtime.registry.errors.values():
        log.error("function not loaded: %s", err)
    return create_app(runtime, threads)


__all__ = ["app_for", "create_app"]
