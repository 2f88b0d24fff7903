"""GET /schedules: every schedule of the loaded functions with its next tick, last tick
and last job (the same view as `runner schedules --json`, from Client.schedules); POST
/schedules/{id}/trigger: one run of it now (as `runner schedules trigger`), on the audit
trail."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.errors import UnknownSchedule
from runner.web.auth import caller
from runner.web.body import only_params, send
from runner.web.offload import Offload
from runner.web.problems import Problem


class Schedules:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        resp.cache_control = ["no-store"]
        send(resp, {"schedules": await self.offload(self.client.schedules)})


class ScheduleTrigger:
    """202 with the run's job ({"id", "type", "version", "queue", "status", "schedule"});
    404 for no such schedule. The schedule's own ticks go on as before."""

    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req)
        try:
            job = await self.offload(lambda: self.client.trigger_schedule(name, by=caller(req)))
        except UnknownSchedule as exc:
            raise Problem(404, "unknown-schedule", str(exc), title="Unknown schedule", schedule=name) from None
        resp.location = f"/jobs/{job.id}"
        send(resp, {**job.as_dict(), "schedule": name}, 202)
