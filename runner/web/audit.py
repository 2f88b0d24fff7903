"""GET /audit: who did what (requeue, delete, purge, cancel, pause, resume, run now,
trigger), newest first, paged by cursor (or offset). The trail is a capped list (store/audit.py), one
caller's repeats of an action on one target within an hour folded into one entry
(``repeats``, ``last_at``); every action is also a log line. A trail of another Redis type
reads as empty and is named in "damaged_keys" (store/damage.py) until the next action on
it sets it aside."""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.store import damage
from runner.web.body import int_param, only_params, send
from runner.web.offload import Offload
from runner.web.problems import Problem

MAX_PAGE = 500


def _shown(entry: dict[str, object]) -> dict[str, object]:
    """An entry as the API shows it: times in epoch seconds, as everywhere else (a folded
    entry's ``last_at`` too: the time of the last action it stands for)."""
    out = dict(entry)
    at_ms = out.pop("at_ms", None)
    out["at"] = at_ms / 1000 if isinstance(at_ms, int) else None
    if "last_at_ms" in out:
        last_ms = out.pop("last_at_ms")
        out["last_at"] = last_ms / 1000 if isinstance(last_ms, int) else None
    return out


class Audit:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req, "offset", "limit", "cursor")
        offset = int_param(req, "offset", 0, 10_000_000)
        limit = int_param(req, "limit", 1, MAX_PAGE, 50) or 50
        cursor = req.get_param("cursor") or None
        if cursor is not None and offset is not None:
            raise Problem(400, "invalid-parameter", "give a cursor or an offset, not both",
                          title="Invalid parameter", parameter="offset")
        resp.cache_control = ["no-store"]
        if offset:  # an earlier release's way to page: not stable while actions land
            damaged: list[damage.Damaged] = []
            total, entries = await self.offload(self.client.audit, offset, limit, damaged)
            send(resp, {"total": total, "offset": offset, "limit": limit, "entries": [_shown(e) for e in entries],
                        "cursor": None, **damage.views(damaged)})
            return
        try:
            page = await self.offload(self.client.audit_page, limit, cursor)
        except ValueError as exc:
            raise Problem(400, "invalid-parameter", str(exc), title="Invalid parameter", parameter="cursor") from None
        # A cursor's page has no offset (actions landed since the first page).
        where = {"offset": 0} if cursor is None else {}
        send(resp, {"total": page.total, **where, "limit": limit, "entries": [_shown(e) for e in page.entries],
                    "cursor": page.cursor, **damage.views(page.damaged)})
