"""GET /workers: the worker processes alive now, each with its queues, concurrency,
isolation, release and the jobs its handlers run (as of its last heartbeat: the roster,
store/roster.py). A worker that stopped cleanly is gone at once; one that died, once its
entry's time to live passed. A roster of another Redis type lists none and is named in
"damaged_keys" (store/damage.py) until the next heartbeat sets it aside."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.store import damage
from runner.web.body import only_params, send
from runner.web.offload import Offload


class Workers:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        resp.cache_control = ["no-store"]
        damaged: list[damage.Damaged] = []
        rows = await self.offload(self.client.workers, damaged)
        send(resp, {"workers": rows, **damage.views(damaged)})
