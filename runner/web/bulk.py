"""POST /bulk: one operator action (requeue, delete, cancel) on up to MAX_BULK_JOBS jobs
in one request, on the audit trail as one entry per queue it acted in (its count and
first ids), not one per job, and none for a queue where it acted on no job (ids that name
none): a bulk run of the dashboard, sent a chunk at a time, cannot push the earlier
operator actions out of the trail, nor can requests that do nothing. Requeue and delete
use the store's batched operations (Client.requeue_many, delete_many); a cancel goes job
by job and is recorded once (an entry Redis does not take stops no cancel: the answer
says it was not written). A job named twice in one request is acted on once; its later
mentions answer "duplicate". On Redis Cluster, a cancel of a job whose partition's master
did not answer (stalled, down) is refused, saying so and to retry, and the others go on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import falcon.asgi

from runner.catalog.listing import one_request
from runner.client import Client
from runner.errors import FieldError, JobEnded, JobNotFound, RedisUnavailable, RunnerError
from runner.web.auth import caller
from runner.web.body import only_params, read_json, send
from runner.web.offload import Offload
from runner.web.problems import Problem, invalid, unanswered

# Jobs per request: the dashboard's page of a list; a run of 10,000 is 20 requests, so at
# most 20 audit entries per queue (none for a request that acted on no job).
MAX_BULK_JOBS = 500
log = logging.getLogger("runner.web")
ACTIONS = ("requeue", "delete", "cancel")


def parse(body: Any, queues: Any) -> tuple[str, list[tuple[str, str]]]:
    """(action, [(queue, id)]) of a bulk body, or a 400 (its shape) / 422 (its members)."""
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) \
            or not 1 <= len(body["jobs"]) <= MAX_BULK_JOBS:
        raise Problem(400, "invalid-bulk", f"send {{\"action\": one of {', '.join(ACTIONS)}, \"jobs\": "
                      f"[{{\"queue\": ..., \"id\": ...}}, ...]}} with 1 to {MAX_BULK_JOBS} jobs",
                      title="Invalid bulk request")
    errors = [FieldError(f"$.{k}", "unknown member; expected action and jobs") for k in body
              if k not in ("action", "jobs")]
    action = body.get("action")
    if action not in ACTIONS:
        errors.append(FieldError("$.action", f"must be one of {', '.join(ACTIONS)}"))
    jobs: list[tuple[str, str]] = []
    for n, job in enumerate(body["jobs"]):
        queue = job.get("queue") if isinstance(job, dict) else None
        job_id = job.get("id") if isinstance(job, dict) else None
        if not isinstance(job, dict) or set(job) - {"queue", "id"}:
            errors.append(FieldError(f"$.jobs[{n}]", "must be an object of queue and id"))
        elif not isinstance(queue, str) or queue not in queues:
            errors.append(FieldError(f"$.jobs[{n}].queue", f"must be a configured queue ({', '.join(queues)})"))
        elif not isinstance(job_id, str) or not job_id:
            errors.append(FieldError(f"$.jobs[{n}].id", "must be a job id"))
        else:
            jobs.append((queue, job_id))
    if errors:
        raise invalid("the bulk request is malformed; nothing was done", errors[:100])
    return str(action), jobs


class Bulk:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """200 {"action", "done", "jobs": [{"queue", "id", "outcome"[, "error"]}]} in the
        order sent. outcome: requeued, deleted, cancelled, requested (a running job told
        to stop), gone (no such job in that state: nothing left to do) or refused (the
        job stays as it was; ``error`` says why). "audited": false when the action's
        audit entry could not be written (a cancel's, its trail's master not answering
        on Redis Cluster), and "audit_error" says which; the outcomes stand."""
        only_params(req)
        body = await read_json(req, self.client.runtime.config.api.max_body_bytes)
        action, jobs = parse(body, self.client.runtime.keys)
        by = caller(req)
        outcomes, unwritten = await self.offload(self._run, action, jobs, by)
        seen: set[tuple[str, str]] = set()
        answers: list[dict[str, Any]] = []
        for q, i in jobs:  # a job named twice is acted on once, and counted once
            answers.append({"queue": q, "id": i, **({"outcome": "duplicate"} if (q, i) in seen
                                                    else outcomes.get((q, i), {"outcome": "gone"}))})
            seen.add((q, i))
        send(resp, {"action": action, "done": sum(a["outcome"] not in ("gone", "refused", "duplicate")
                                                  for a in answers),
                    "jobs": answers, "audited": not unwritten,
                    **({"audit_error": "; ".join(unwritten)} if unwritten else {})})

    def _run(self, action: str, jobs: list[tuple[str, str]], by: str
             ) -> tuple[dict[tuple[str, str], dict[str, str]], list[str]]:
        # One request, one pattern budget for all the payloads a requeue validates, over
        # every queue it names (a budget each let 500 near-budget payloads hold a thread
        # for two minutes).
        with one_request():
            return self._each_queue(action, jobs, by)

    def _each_queue(self, action: str, jobs: list[tuple[str, str]], by: str
                    ) -> tuple[dict[tuple[str, str], dict[str, str]], list[str]]:
        by_queue: dict[str, list[str]] = {}
        for q, i in jobs:
            if i not in by_queue.setdefault(q, []):
                by_queue[q].append(i)
        out: dict[tuple[str, str], dict[str, str]] = {}
        # Redis Cluster: the cancels of jobs on a master that did not answer (stalled, down),
        # each refused while the others go on; none reached at all is the outage's 503.
        unreached: list[RedisUnavailable] = []
        unwritten: list[str] = []  # the audit entries not written, in words
        for q, ids in by_queue.items():
            if action == "requeue":
                done, refused = self.client.requeue_many(q, ids, by=by)
                out.update(((q, i), {"outcome": "requeued"}) for i in done)
                for i, exc in refused:
                    out[(q, i)] = {"outcome": "gone"} if isinstance(exc, JobNotFound) else \
                        {"outcome": "refused", "error": str(exc)}
            elif action == "delete":
                done, _ = self.client.delete_many(q, ids, by=by)
                out.update(((q, i), {"outcome": "deleted"}) for i in done)
            else:
                # One entry for the queue's cancels, written at the first that acts (as requeue
                # and delete write theirs), so a web process killed half-way leaves it on record.
                self._cancels(q, ids, by, out, unreached, unwritten)
        if unreached and len(unreached) == sum(len(ids) for ids in by_queue.values()):
            raise unreached[0]
        return out, unwritten

    def _cancels(self, q: str, ids: list[str], by: str, out: dict[tuple[str, str], dict[str, str]],
                 unreached: list[RedisUnavailable], unwritten: list[str]) -> None:
        """One queue's cancels, job by job. One entry for them all, written at the first
        that acts (as requeue and delete write theirs), so a web process killed half-way
        leaves it on record. An entry Redis does not take (Redis Cluster: the trail's
        master did not answer within a reader's bound) stops no cancel: it is written
        again at the end, and if that fails too the answer says so (``unwritten``)."""
        record = self.client.bulk_entry(by, "cancel", q, len(ids))
        cancelled: list[str] = []
        missed: list[RedisUnavailable] = []
        try:
            for i in ids:
                try:
                    out[(q, i)] = {"outcome": self.client.cancel(i, by=by, audited=False, queue=q)}
                except (JobNotFound, JobEnded):
                    continue
                except RedisUnavailable as exc:
                    if not exc.left_out:
                        raise
                    unreached.append(exc)
                    out[(q, i)] = {"outcome": "refused", "error": f"{unanswered(exc.left_out)}: the job "
                                   "may be there and was not cancelled; retry shortly"}
                    continue
                except RunnerError as exc:
                    out[(q, i)] = {"outcome": "refused", "error": str(exc)}
                    continue
                cancelled.append(i)
                if not record.written and not missed:
                    _unwritten(lambda: record.progress(cancelled), missed)
        except BaseException:
            record.end(cancelled, False)
            raise
        missed.clear()
        _unwritten(lambda: record.end(cancelled, True), missed)
        if missed:
            log.warning("bulk cancel by %s in queue %s: %d job(s) acted on, its audit entry not written: %s",
                        by, q, len(cancelled), missed[0])
            unwritten.append(f"the audit entry of the cancel of {len(cancelled)} job(s) in queue {q} was not "
                             "written (nor confirmed): the Redis master that holds the audit trail did not answer "
                             "(stopped, hung or down); the outcomes listed stand, and each cancelled job's history "
                             "names who")


def _unwritten(write: Callable[[], None], missed: list[RedisUnavailable]) -> None:
    """``write()``, an audit entry of an action that landed: Redis not taking it (the
    ``acted`` outage) is added to ``missed``; any other error is raised."""
    try:
        write()
    except RedisUnavailable as exc:
        if not getattr(exc, "acted", False):
            raise
        missed.append(exc)
