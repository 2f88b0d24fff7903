"""The HTTP API and dashboard: ``create_app(runtime)`` returns a Falcon WSGI app.

gunicorn serves it through ``runner.web.wsgi:app``; `runner dev` builds it around its
own runtime. Routes read ``runtime.registry`` on every request, never a cached copy, as
a reload swaps it. Every error is problem+json (problems.py).
"""

from __future__ import annotations

import logging

import falcon

from runner.client import Client
from runner.runtime import Runtime
from runner.web import auth, problems
from runner.web.catalog import FunctionItem, Functions, Health, Queues, Throughput
from runner.web.dashboard import Static
from runner.web.dead import DeadItem, DeadList, DeadRequeue
from runner.web.exposition import Metrics
from runner.web.jobs import JobBatch, Jobs
from runner.web.openapi import OpenApi

log = logging.getLogger("runner.web")


class _Headers:
    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        resp.set_header("X-Content-Type-Options", "nosniff")


def create_app(runtime: Runtime) -> falcon.App[falcon.Request, falcon.Response]:
    api = runtime.config.api
    if not auth.required(api):
        log.warning("the HTTP API is open: no token (RUNNER_API_TOKEN) or auth switched off")
    app = falcon.App(middleware=[*auth.middleware(api), _Headers()])
    problems.install(app)
    client = Client(runtime)
    app.add_route("/jobs/{name}", Jobs(client))
    app.add_route("/jobs/{name}/batch", JobBatch(client))
    app.add_route("/functions", Functions(runtime))
    app.add_route("/functions/{name}", FunctionItem(runtime))
    app.add_route("/queues", Queues(runtime))
    app.add_route("/throughput", Throughput(runtime))
    app.add_route("/dead/{queue}", DeadList(client))
    app.add_route("/dead/{queue}/{job_id}", DeadItem(client))
    app.add_route("/dead/{queue}/{job_id}/requeue", DeadRequeue(client))
    app.add_route("/openapi.json", OpenApi(runtime))
    app.add_route("/metrics", Metrics(runtime))
    app.add_route("/healthz", Health(runtime))
    static = Static()
    app.add_route("/", static)
    app.add_route("/static/{name}", static, suffix="file")
    return app


__all__ = ["create_app"]
