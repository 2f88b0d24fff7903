"""GET /audit: who did what (requeue, delete, purge, cancel, pause, resume), newest first, paginated. The
trail is a capped list (store/audit.py); every entry is also a log line."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.web.body import int_param, only_params, send
from runner.web.offload import Offload

MAX_PAGE = 500


def _shown(entry: dict[str, object]) -> dict[str, object]:
    """An entry as the API shows it: times in epoch seconds, as everywhere else."""
    out = dict(entry)
    at_ms = out.pop("at_ms", None)
    out["at"] = at_ms / 1000 if isinstance(at_ms, int) else None
    return out


class Audit:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req, "offset", "limit")
        offset = int_param(req, "offset", 0, 10_000_000, 0) or 0
        limit = int_param(req, "limit", 1, MAX_PAGE, 50) or 50
        total, entries = await self.offload(self.client.audit, offset, limit)
        resp.cache_control = ["no-store"]
        send(resp, {"total": total, "offset": offset, "limit": limit, "entries": [_shown(e) for e in entries]})
