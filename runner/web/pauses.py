"""POST /queues/{queue}/pause|resume and POST /functions/{type}/pause|resume (scope
operate): the pause lives in Redis, so every worker obeys at its next claim."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.web.auth import caller
from runner.web.body import only_params, send
from runner.web.offload import Offload
from runner.web.problems import Problem


class QueuePause:
    def __init__(self, client: Client, offload: Offload, resume: bool) -> None:
        self.client, self.offload, self.resume = client, offload, resume

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, queue: str) -> None:
        only_params(req)
        if queue not in self.client.runtime.keys:
            raise Problem(404, "unknown-queue", f"no queue {queue!r} (have: {', '.join(self.client.runtime.keys)})",
                          title="Unknown queue", queue=queue)
        await self.offload(self.client.resume if self.resume else self.client.pause, queue, by=caller(req))
        send(resp, {"queue": queue, **(await self.offload(self.client.paused))[queue]})


class FunctionPause:
    def __init__(self, client: Client, offload: Offload, resume: bool) -> None:
        self.client, self.offload, self.resume = client, offload, resume

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req)
        c = self.client
        moved = await self.offload(c.resume if self.resume else c.pause, None, function=name, by=caller(req))
        queue = c.runtime.registry.get(name).queue
        out = {"function": name, "queue": queue, "paused": name in (await self.offload(c.paused))[queue][
            "paused_functions"]}
        if self.resume:
            out["resumed_jobs"] = moved
        send(resp, out)
