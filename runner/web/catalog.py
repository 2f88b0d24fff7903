"""Read-only views: GET /functions, /functions/{type}, /queues, /throughput and /healthz.

Each request reads ``runtime.registry`` afresh: `runner dev` swaps it on reload.
"""

from __future__ import annotations

import asyncio
from typing import Any

import falcon
import falcon.asgi

from runner.catalog.registry import Function, Registry
from runner.client import Client
from runner.observe.figures import left_out_view, queue_view, read_queues, read_throughput
from runner.runtime import Runtime
from runner.store.connection import UNAVAILABLE, ping
from runner.web.body import int_param, only_params, send
from runner.web.offload import Offload
from runner.web.problems import Problem, password_refused


def describe(fn: Function, with_schemas: bool = False) -> dict[str, Any]:
    out = fn.describe()
    if with_schemas:
        out["schemas"] = [
            {"version": v, "schema": dict(s.document)} for v, s in sorted(fn.versions.schemas.items())
        ]
    return out


def load_errors(reg: Registry) -> list[dict[str, Any]]:
    return [{"path": e.path, "line": e.line, "message": e.message} for e in reg.errors.values()]


class Functions:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req, "schemas")
        reg = self.rt.registry
        schemas = req.get_param_as_bool("schemas", default=False)
        send(resp, {
            "functions": [describe(f, schemas) for _, f in sorted(reg.functions.items())],
            "errors": load_errors(reg),
            "warnings": list(reg.warnings),
        })


class FunctionItem:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req)
        fn = self.client.runtime.registry.get(name)
        send(resp, {**describe(fn, with_schemas=True), "flow": await self.offload(self.client.flow, name)})


class Queues:
    def __init__(self, runtime: Runtime, offload: Offload) -> None:
        self.rt = runtime
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        rt = self.rt
        figures = await self.offload(read_queues, rt)
        out = [queue_view(q, rt.config.queues[q.name]) for q in figures]
        body: dict[str, Any] = {"queues": out}
        if left_out := left_out_view(figures):  # (Redis Cluster: a master away; its partitions' figures are not in)
            body["left_out"] = left_out
        send(resp, body)


class Throughput:
    def __init__(self, runtime: Runtime, offload: Offload) -> None:
        self.rt = runtime
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req, "minutes")
        minutes = int_param(req, "minutes", 1, 360, 60) or 60
        send(resp, await self.offload(read_throughput, self.rt, minutes))


# The longest /healthz waits for Redis's answer to its ping before it answers 503.
HEALTH_WAIT_S = 3.0


class Health:
    """Liveness plus Redis reachability. 503 means the process is alive but cannot reach
    Redis: take it out of rotation, do not restart it (it reconnects by itself). Public;
    the Redis error itself is told only to a caller with a token."""

    def __init__(self, runtime: Runtime, offload: Offload) -> None:
        self.rt = runtime
        self.offload = offload

    def _ping(self) -> bool:
        return ping(self.rt.redis)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        try:
            # Bounded: a Redis that stopped answering (SIGSTOP, a stalled host) is a 503 in
            # HEALTH_WAIT_S, not a probe hung for the socket timeout (15 s), which a load
            # balancer or kubelet with a shorter timeout reads as a dead process.
            await asyncio.wait_for(self.offload.shared(self._ping), HEALTH_WAIT_S)
        except TimeoutError:
            raise Problem(503, "redis-unavailable",
                          f"the web process is up but Redis did not answer within {HEALTH_WAIT_S:g} s",
                          title="Redis unavailable", headers={"Retry-After": "1"},
                          checks={"web": "ok", "redis": "unreachable"}) from None
        except UNAVAILABLE as exc:
            # Why (the server's address, a refused password) only to a caller with a token:
            # the route is public, and that is the inside of the deployment.
            refused = password_refused(req, exc, checks={"web": "ok", "redis": "password-refused"})
            if refused is not None:
                raise refused from None
            why = f": {exc}" if req.context.token is not None else "; send a token for the details"
            raise Problem(503, "redis-unavailable", f"the web process is up but Redis is unreachable{why}",
                          title="Redis unavailable", headers={"Retry-After": "1"},
                          checks={"web": "ok", "redis": "unreachable"}) from None
        resp.cache_control = ["no-store"]
        send(resp, {"status": "ok", "checks": {"web": "ok", "redis": "ok"}})
