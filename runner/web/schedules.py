"""GET /schedules: every schedule of the loaded functions with its next tick, last tick
and last job (the same view as `runner schedules --json`, from Client.schedules)."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.web.body import only_params, send
from runner.web.offload import Offload


class Schedules:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        resp.cache_control = ["no-store"]
        send(resp, {"schedules": await self.offload(self.client.schedules)})
