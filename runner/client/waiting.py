"""Waiting for a job: ONE pushed wait, for threads (``wait``) and event loops
(``await_job``), behind ``result``, ``call``, a group's wait (``wait_group``) and the HTTP
API's ``?wait=``. "Wait" is the one verb for it; "settle" is the worker's write of an
outcome (docs/glossary.md). ``settle``, ``asettle`` and ``settle_group``, the names of
earlier releases, stay as aliases of the same functions.

A wait registers with the process's one subscriber (store/waiter.py) and reads the job
at once: an outage or an id nothing announced raises then, and a job already in a
wanted status is answered without a write. Only a wait that must wait for an end marks
the job as waited for (one round trip; a job enqueued ``waited`` carries the mark
already), so that the script that ends it publishes its end; where Redis refuses the
mark (a read-only replica) the wait polls instead. It reads again after each notice and
once the subscription is confirmed. What nothing publishes is polled: an id announced
but not written yet (a group's then-job, a follow-up before its parent's ack) every
PENDING_POLL_S, a status that is not an end every STATUS_POLL_S. A wait for an end tells
the subscriber where its job lives (``Waiter.place``): where the Redis user may not
subscribe, the subscriber reads the status of every such job of the process on a timer,
in one round trip, and pokes a wait once its job ended (store/waiter.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner.client.inspecting import find, get, get_group, group_state, then_of
from runner.errors import GroupNotFound, JobFailed, JobNotFound, RedisUnavailable, StillRunning
from runner.store import records
from runner.store.connection import UNAVAILABLE, refusal, unreachable
from runner.store.waiter import retry_after, wait_until

if TYPE_CHECKING:
    from runner.client import Client
    from runner.store.keys import QueueKeys

# A waited id announced but not written yet ("pending": a group's then-job, a follow-up
# before its parent's ack) is read again this often (nothing publishes its writing).
PENDING = "pending"
PENDING_POLL_S = 0.1
# A wait for a status that is not an end (nothing publishes it), or whose mark Redis
# refused, reads the job this often: a status that lasts a few tens of ms is still seen.
STATUS_POLL_S = 0.02
# An event loop's wait reads its job on a thread; a read not answered this long past the
# wait's deadline (a Redis that stopped answering: SIGSTOP, a stalled host; the socket
# timeout is 15 s) is given up, and the wait raises RedisUnavailable (HTTP: 503 with
# Retry-After): a wait answers at most about this long after its deadline.
READ_GRACE_S = 2.0


class _Wait:
    """One wait's reads: the job as last read, marked as waited for once it must wait for
    its end."""

    def __init__(self, client: Client, job_id: str, watch: bool, statuses: Sequence[str]) -> None:
        self.client = client
        self.job_id = job_id
        self.statuses = tuple(statuses)
        self.pushed = set(self.statuses) <= set(records.ENDED)  # only an end is published
        self.watch = watch and self.pushed  # a polled wait needs no notice
        self.named: set[str] = set()
        self.job: records.Job | None = None

    def check(self) -> bool:
        """Read the job; whether it reached a status. Marked as waited for when it has
        not (and exists): then read again, as it may have ended before the mark. A job
        still waited for is placed with the subscriber (read on its timer while deaf)."""
        self.job, where = _read_waited(self.client, self.job_id, self.named)
        if self.job.status in self.statuses:
            return True
        if self.watch and self.job.status not in (PENDING, *records.ENDED):
            self.watch = False
            if not _watch(self.client, self.job_id, self.job.queue, where):
                self.pushed = False  # the mark was refused: its end is not published
            self.job, where = _read_waited(self.client, self.job_id, self.named)
        if self.job.status in self.statuses:
            return True
        if self.pushed and where is not None:
            self.client.runtime.waiter.place(self.job_id, where)
        return False

    def poll(self) -> float | None:
        """How soon to read again without a notice (None: only on one)."""
        if self.job is not None and self.job.status == PENDING:
            return PENDING_POLL_S
        return None if self.pushed else STATUS_POLL_S

    def last(self) -> records.Job:
        return self.job if self.job is not None else _read_waited(self.client, self.job_id, self.named)[0]


def wait_for(client: Client, job_id: str, timeout_s: float, statuses: Sequence[str] = records.ENDED, *,
             watch: bool = True) -> records.Job:
    """The job once its status is one of ``statuses``, or as it is when ``timeout_s``
    passes (JobNotFound at once for an id nothing announced). Pushed, not polled, for
    the statuses that end a job; ``watch``: mark the job as waited for (a job enqueued
    ``waited`` need not be)."""
    wait = _Wait(client, job_id, watch, statuses)
    wait_until(client.runtime.waiter, time.monotonic() + timeout_s, wait.check, job_id, wait.poll)
    return wait.last()


def wait(client: Client, job_id: str, timeout_s: float = 10.0, statuses: Sequence[str] = records.ENDED, *,
         watch: bool = True) -> records.Job:
    """The job once it reaches one of ``statuses`` (by default any end: done, dead or
    cancelled), or as it is when ``timeout_s`` passes. The one wait: ``result``,
    ``call``, ``wait_group`` and HTTP's ``?wait=`` wait through it (or ``await_job``).

    Pushed, not polled: the wait registers with the process's one subscriber (see
    store/waiter.py) and reads the job after subscribing and after each notice. With
    ``watch`` the job is marked as waited for first (one round trip), so its end is
    published even when it was enqueued without ``waited``."""
    return wait_for(client, job_id, timeout_s, statuses, watch=watch)


async def await_job(client: Client, job_id: str, timeout_s: float = 10.0, *, watch: bool = True) -> records.Job:
    """``wait`` for asyncio code, until the job ends (``await`` is Python's keyword, so
    not ``await``): the wait is a future of the event loop, woken by the process's one
    subscriber; only the reads run on threads."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout_s
    event = asyncio.Event()
    wait = _Wait(client, job_id, watch, records.ENDED)

    def poke() -> None:
        loop.call_soon_threadsafe(event.set)

    waiter = client.runtime.waiter
    waiter.add(job_id, poke)
    try:
        waiter.start()  # not waited for: the subscription, once confirmed, pokes the wait
        reached = await _checked(wait, deadline)  # an outage or no such job: raised at once
        failures = 0
        while not reached:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            soon = waiter.pull_after(retry_after(wait.poll(), failures), job_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left if soon is None else min(left, soon))
            event.clear()
            # Redis away: read again soon, and once the subscription coming back pokes.
            try:
                reached, failures = await _checked(wait, deadline), 0
            except RedisUnavailable:
                failures += 1
                if time.monotonic() >= deadline:
                    raise  # (the last read: how the job is now is not known)
        return wait.last()
    finally:
        waiter.discard(job_id, poke)


# When a read of any wait of this process last answered (or failed): reads queued behind
# others on the event loop's threads are not given up while the queue moves.
_answered = [0.0]


async def _checked(wait: _Wait, deadline: float) -> bool:
    """``wait.check()`` on a thread. Past READ_GRACE_S after the deadline it is given up
    (RedisUnavailable; the read goes on on its thread, its answer unused) once it has run
    READ_GRACE_S itself, or, still queued for a thread, once no read of this process has
    answered for READ_GRACE_S: many waits that share a deadline queue their last reads
    behind each other, and a queue that moves is not a Redis that stopped answering."""
    started: list[float] = []

    def read() -> bool:
        started.append(time.monotonic())
        try:
            return wait.check()
        finally:
            _answered[0] = time.monotonic()

    task = asyncio.ensure_future(asyncio.to_thread(read))
    give_up_at = deadline + READ_GRACE_S
    while True:
        left = give_up_at - time.monotonic()
        done, _ = await asyncio.wait({task}, timeout=max(left, 0.0))
        if done:
            return task.result()
        now = time.monotonic()
        since = now - started[0] if started else now - _answered[0]
        if since >= READ_GRACE_S:
            task.add_done_callback(_unused)
            waited = now - deadline + READ_GRACE_S if now > deadline else READ_GRACE_S
            said = TimeoutError(f"no answer to a read of job {wait.job_id} within {min(since, waited):.1f} s "
                                "(stopped or hung)")
            raise unreachable(said, "; how the job is now is not known") from None
        give_up_at = now + (READ_GRACE_S - since)


def _unused(task: asyncio.Future[bool]) -> None:
    """A read given up: its answer or error, once it comes, is dropped (not logged as never
    retrieved)."""
    if not task.cancelled():
        task.exception()


def result(client: Client, job_id: str, timeout: float = 30.0) -> Any:
    """The job's result once it is done; raises JobFailed when it ends dead and
    StillRunning when ``timeout`` seconds pass first."""
    return _ended(wait(client, job_id, timeout))


async def aresult(client: Client, job_id: str, timeout: float = 30.0) -> Any:
    return _ended(await await_job(client, job_id, timeout))


def call(client: Client, type: str, payload: Any, *, timeout: float = 30.0, version: int | None = None,
         idempotency_key: str | None = None) -> Any:
    """Enqueue and wait for the result (a serverless invoke): as ``result``."""
    job = client.enqueue(type, payload, version=version, idempotency_key=idempotency_key, waited=True)
    # A duplicate is another request's job: it may not carry the waited mark.
    return _ended(wait(client, job.id, timeout, watch=job.duplicate))


async def acall(client: Client, type: str, payload: Any, *, timeout: float = 30.0, version: int | None = None,
                idempotency_key: str | None = None) -> Any:
    job = await client.aenqueue(type, payload, version=version, idempotency_key=idempotency_key, waited=True)
    return _ended(await await_job(client, job.id, timeout, watch=job.duplicate))


def wait_group(client: Client, group_id: str, timeout_s: float) -> dict[str, Any]:
    """A group's progress (as ``get_group``) once its then-job ended, or as it is when
    ``timeout_s`` passes; GroupNotFound at once for no such group."""
    wait(client, then_of(client, group_id), timeout_s)
    return get_group(client, group_id)


def _ended(job: records.Job) -> Any:
    """A waited job's result, or its end raised (JobFailed, StillRunning)."""
    view = job.as_dict()
    if job.status == "done":
        return view.get("result")
    if job.status in ("dead", "cancelled"):
        raise JobFailed(job.id, view.get("last_error"), view.get("reason"))
    raise StillRunning(job.id, job.status)


def _read_waited(client: Client, job_id: str, named: set[str] | None = None,
                 ) -> tuple[records.Job, QueueKeys | None]:
    """The job and the keys of the partition that holds it, or for an id announced but
    not written yet (a group's then-job before its last member ended, a follow-up before
    its parent's ack) a job "pending" in the queue it will be written to (and no keys);
    JobNotFound for an id nothing announced. An id in ``named`` was named by its ended
    parent (it is on its way): the parent is not read again (a fan-out's parent is read
    once per wait, not once per poll)."""
    try:
        k, fields = find(client, job_id)
        return records.Job(job_id, k.queue, fields), k
    except JobNotFound:
        if named is not None and job_id in named:
            return records.Job(job_id, "", {"status": PENDING}), None
        queue = _announced(client, job_id, named)
        if queue is None:
            raise
        return records.Job(job_id, queue, {"status": PENDING}), None


def _announced(client: Client, job_id: str, named: set[str] | None = None) -> str | None:
    """The queue an announced id will be written to, None when nothing announced it:
    "<group>.then" of a group that exists; "<parent>.<n|s|f>" of a parent that has not
    ended, or that ended naming it among its children (a follow-up on its way through
    the outbox)."""
    if job_id.endswith(".then"):
        try:
            return group_state(client, job_id[:-len(".then")]).then[0]
        except GroupNotFound:
            return None
    parent, dot, tag = job_id.rpartition(".")
    if not dot or not (tag.isdigit() or tag in ("s", "f")):
        return None
    try:
        job = get(client, parent)
    except JobNotFound:
        return None
    if job.status not in records.ENDED:
        return ""  # its queue is known once it is written
    if records.names_child(job.as_dict(), job_id):
        if named is not None:
            named.add(job_id)
        return ""
    return None


def _watch(client: Client, job_id: str, queue: str, where: QueueKeys | None = None) -> bool:
    """Mark the job as waited for: False when Redis refused the write while answering
    (a read-only replica, maxmemory): the wait then polls, as reads still answer."""
    rt = client.runtime
    # A partitioned queue: the mark goes beside the job, in the partition that holds it
    # (``where``, as the read that found it said).
    k = rt.keys[queue] if len(rt.parts[queue]) == 1 else where if where is not None else find(client, job_id)[0]
    try:
        rt.scripts.watch(k, job_id)
    except UNAVAILABLE as exc:
        if refusal(exc) in ("READONLY", "OOM", "MISCONF"):
            return False
        raise unreachable(exc) from exc
    except RedisUnavailable as exc:  # from a link: its cause carries Redis's answer
        if refusal(exc) in ("READONLY", "OOM", "MISCONF"):
            return False
        raise
    return True
