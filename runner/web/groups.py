"""POST /groups (fan-out/fan-in; scope enqueue), GET /groups/{id} (its progress) and GET
/groups/{id}/members (a page of its members, each with the outcome the group counted).

The body names every job as ``{"type", "payload", "version"?, "delay"?, "run_at"?,
"priority"?}``: ``{"members": [job, ...], "then": job}``. Everything is validated before
anything is written (422 with every problem, each with its path into the body); the
answer is 202 with the group id, the member ids in order and the then-job's id."""

from __future__ import annotations

import math
from typing import Any

import falcon
import falcon.asgi

from runner.client import Client, Request
from runner.errors import MAX_DELAY_S, FieldError, GroupNotFound, InvalidGroup, RedisUnavailable
from runner.store.groups import MEMBERS_PAGE_MAX, OUTCOMES
from runner.web.body import int_param, only_params, read_json, seconds_param, send
from runner.web.holding import Waits
from runner.web.jobs import part_way
from runner.web.offload import Offload
from runner.web.problems import Problem

JOB_FIELDS = ("type", "payload", "version", "delay", "run_at", "priority")


def _number(value: Any, lo: float, hi: float, integral: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if integral and not isinstance(value, int):
        return False
    return math.isfinite(value) and lo <= value <= hi


def request_of(obj: Any, path: str, errors: list[FieldError]) -> Request | None:
    """One job of the body as a Request, or None with its problems in ``errors``."""
    if not isinstance(obj, dict):
        errors.append(FieldError(path, "must be an object {\"type\", \"payload\", ...}"))
        return None
    before = len(errors)
    for name in sorted(set(obj) - set(JOB_FIELDS)):
        errors.append(FieldError(f"{path}.{name}", f"unknown field (expected: {', '.join(JOB_FIELDS)})"))
    if not isinstance(obj.get("type"), str) or not obj["type"]:
        errors.append(FieldError(f"{path}.type", "must name a function"))
    if "payload" not in obj:
        errors.append(FieldError(f"{path}.payload", "is required"))
    checks = (("version", 1, 1_000_000, True), ("delay", 0, MAX_DELAY_S, False), ("run_at", 0, 1e11, False),
              ("priority", 0, 9, True))
    for name, lo, hi, integral in checks:
        if obj.get(name) is not None and not _number(obj[name], lo, hi, integral):
            errors.append(FieldError(f"{path}.{name}", f"must be {'an integer' if integral else 'a number'} "
                                     f"from {lo:g} to {hi:g}"))
    if obj.get("delay") is not None and obj.get("run_at") is not None:
        errors.append(FieldError(f"{path}.run_at", "give either delay or run_at, not both"))
    if len(errors) > before:
        return None
    return Request(obj["type"], obj["payload"], version=obj.get("version"), delay_s=obj.get("delay"),
                   run_at=obj.get("run_at"), priority=obj.get("priority"))


class Groups:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req)
        body = await read_json(req, self.client.runtime.config.api.max_body_bytes)
        if not isinstance(body, dict):
            raise Problem(400, "invalid-group", 'send a JSON object {"members": [...], "then": {...}}',
                          title="Invalid group")
        errors: list[FieldError] = [FieldError(f"$.{name}", "unknown field (expected: members, then)")
                                    for name in sorted(set(body) - {"members", "then"})]
        raw = body.get("members")
        members: list[Request] = []
        if not isinstance(raw, list) or not raw:
            errors.append(FieldError("$.members", "must be a non-empty array of jobs"))
        else:
            for i, obj in enumerate(raw):
                r = request_of(obj, f"$.members[{i}]", errors)
                if r is not None:
                    members.append(r)
        then = request_of(body.get("then"), "$.then", errors)
        if errors or then is None:
            raise InvalidGroup(errors)
        # Up to thousands of validations and a round trip: on a thread, not the loop.
        try:
            group = await self.offload(self.client.group, members, then)
        except RedisUnavailable as exc:
            if exc.results:  # members written from some chunk on: they run, the group never completes
                raise part_way(req, exc, "members", "member", "the group",
                               {"then": "never runs: the group was not sealed; send the whole group again "
                                        "(without the members written)"}) from exc
            raise
        resp.location = f"/groups/{group.id}"
        send(resp, group.as_dict(), 202)


class GroupItem:
    def __init__(self, client: Client, offload: Offload, waits: Waits) -> None:
        self.client = client
        self.offload = offload
        self.waits = waits

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, group_id: str) -> None:
        only_params(req, "wait")
        wait = seconds_param(req, "wait", self.client.runtime.config.api.max_wait_s) if req.query_string else None
        try:
            if wait is None:
                view = await self.offload(self.client.get_group, group_id)
            else:  # once its then-job ended (or the wait passed), as a job's ?wait= answers
                then = await self.offload(self.client.then_of, group_id)
                if then:  # (none when the group's record is damaged: its view says so)
                    with self.waits.admit(req):  # held to its bound, as a job's ?wait=
                        await self.client.await_job(then, wait)
                view = await self.offload(self.client.get_group, group_id)
        except GroupNotFound:
            raise Problem(404, "group-not-found", f"no group {group_id!r}", title="Group not found",
                          group_id=group_id) from None
        send(resp, view)


class GroupMembers:
    """GET /groups/{id}/members?status=&limit=&cursor=: the members in member order, a page
    at a time, each {"member", "id", "status"} (done, dead, cancelled as the group counted
    it; pending until then); ?status= (comma-separated) lists those of these only."""

    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, group_id: str) -> None:
        only_params(req, "status", "limit", "cursor")
        limit = int_param(req, "limit", 1, MEMBERS_PAGE_MAX, 100) or 100
        raw = req.get_param("status")
        outcomes = raw.split(",") if raw else []
        if any(o not in OUTCOMES for o in outcomes):
            raise Problem(400, "invalid-parameter", f"query parameter 'status' must name outcomes among "
                          f"{', '.join(OUTCOMES)}, comma-separated", title="Invalid parameter", parameter="status")
        try:
            page = await self.offload(self.client.group_members, group_id, req.get_param("cursor"), limit, outcomes)
        except GroupNotFound:
            raise Problem(404, "group-not-found", f"no group {group_id!r}", title="Group not found",
                          group_id=group_id) from None
        except ValueError as exc:
            raise Problem(400, "invalid-parameter", str(exc), title="Invalid parameter", parameter="cursor") from None
        send(resp, page)
