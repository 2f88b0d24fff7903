"""The public Python client: enqueue (one or many), look up jobs, queue figures, the
dead-letter operations, and waiting for a job's end. The HTTP API and the CLI are thin
shells over it; a Django or Flask app uses it directly::

    from runner import Client
    client = Client.from_config()                # ./runner.toml + environment
    job = client.enqueue("send_email", {"user_id": 7, "to": "a@b.c", "template": "welcome"})
    client.get(job.id).as_dict()["status"]

``Client`` is a facade: each method is a function of the module that owns its job,

    emitting.py        an event's jobs for every subscriber, in one atomic step
    enqueuing.py       prepare, then ONE send path (Sender) for one, many, asyncio, groups
    inspecting.py      jobs, lists, stats, pauses and flow, dead letters, audit, schedules
    administering.py   pause/resume, requeue/delete/purge, cancel, signal, trigger, the audit trail
    waiting.py         ONE pushed wait: wait/await_job, result, call, wait_group
    watching.py        a run's log, read or followed, and its stream

and none of them issues a Redis command: the store does (store/admin.py and the
scripts), and Redis going away is one error with one message (store/connection.py reachable).

May import: runner.config, runner.errors, runner.runtime, runner.groups, runner.outbox,
runner.catalog, runner.observe and the store. Knows no worker, web, CLI or dev.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from runner import config as config_mod
from runner.client import administering, emitting, enqueuing, inspecting, waiting, watching
from runner.client.administering import BULK_BATCH, CANCEL_AHEAD_S
from runner.client.enqueuing import MAX_BATCH, STREAM_CHUNK, STREAM_WINDOW, Enqueued, Prepared, Request, Sender
from runner.client.inspecting import pause_view
from runner.client.waiting import PENDING, PENDING_POLL_S
from runner.runtime import Runtime
from runner.store import session


class Client:
    """A producer's, reader's and operator's view of the queues, over one Runtime (one
    Redis client, its scripts, the loaded functions). Safe to share between threads."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.sender = Sender(runtime)  # the enqueue writes: combiners, the event loop's link

    @classmethod
    def from_config(cls, path: str | Path | None = None) -> Client:
        """A client for ./runner.toml (or ``path``, or $RUNNER_CONFIG) and the environment.
        The Redis is the CLI's: REDIS_URL, else the ``[redis] url`` of a file named; else,
        while `runner dev` runs its embedded server for the project, that one (where dev's
        worker runs the jobs); else the file's ``[redis] url`` or the default.

        In a handler (a worker's thread or child process), no path, or the worker's own
        file, is the worker's app: its server and prefix, as the worker runs on them
        (session.hosted); any other file is another app's, read as above."""
        worker = session.hosted(path)
        if worker is not None:
            own = Path(worker.source)
            cfg = config_mod.load(own if path is not None or own.exists() else None)
            return cls(Runtime.create(replace(cfg, redis=worker.redis)))
        named = path is not None or bool(os.environ.get("RUNNER_CONFIG"))
        return cls(Runtime.create(session.follow_dev(config_mod.load(path), named)))

    def close(self) -> None:
        """Let go of Redis: the connections and, behind Sentinel, this client's share of
        the process's failover watch. A client dropped without it is closed when collected.
        Safe after the event loop of an ``aenqueue`` has ended (``asyncio.run``)."""
        try:
            self.sender.close()
        finally:
            self.runtime.close()  # (redis-py's connections, whatever became of the loop's)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Enqueueing (enqueuing.py): checks first, then the one send path.
    prepare = enqueuing.prepare
    prepare_type = enqueuing.prepare_type
    enqueue = enqueuing.enqueue
    aenqueue = enqueuing.aenqueue
    asend = enqueuing.asend
    enqueue_many = enqueuing.enqueue_many
    enqueue_all = enqueuing.enqueue_all
    group = enqueuing.group

    # Events (emitting.py): one emit, a job per subscribed function.
    emit = emitting.emit
    events = emitting.events

    # Inspecting (inspecting.py): reads only.
    ping = inspecting.ping
    get = inspecting.get
    get_many = inspecting.get_many
    _find = inspecting.find
    jobs = inspecting.jobs
    by_idempotency_key = inspecting.by_idempotency_key
    stats = inspecting.stats
    paused = inspecting.paused
    flow = inspecting.flow
    dead = inspecting.dead
    dead_page = inspecting.dead_page
    dead_ids = inspecting.dead_ids
    get_group = inspecting.get_group
    group_members = inspecting.group_members
    group_outcomes = inspecting.group_outcomes
    iter_group_outcomes = inspecting.iter_group_outcomes
    then_of = inspecting.then_of
    audit = inspecting.audit
    audit_page = inspecting.audit_page
    schedules = inspecting.schedules
    workers = inspecting.workers

    # Watching (watching.py): a run's log and its stream.
    logs = watching.logs
    follow_logs = watching.follow_logs
    stream = watching.stream

    # Administering (administering.py): each action on the audit trail when done ``by``.
    pause = administering.pause
    resume = administering.resume
    requeue = administering.requeue
    requeue_many = administering.requeue_many
    delete_dead = administering.delete_dead
    delete_many = administering.delete_many
    purge_dead = administering.purge_dead
    record_bulk = administering.record_bulk
    bulk_entry = administering.bulk_entry
    trigger = administering.trigger
    trigger_schedule = administering.trigger
    run_now = administering.run_now
    cancel = administering.cancel
    cancel_many = administering.cancel_many
    signal = administering.signal
    deliver_signal = administering.deliver_signal
    cancel_deferred = administering.cancel_deferred

    # Waiting (waiting.py): one pushed wait behind every way to wait; "wait" its one verb.
    wait = waiting.wait
    await_job = waiting.await_job
    wait_group = waiting.wait_group
    result = waiting.result
    aresult = waiting.aresult
    call = waiting.call
    acall = waiting.acall
    # The names of earlier releases, kept: "settle" is the worker's write (docs/glossary.md).
    settle = waiting.wait
    asettle = waiting.await_job
    settle_group = waiting.wait_group

    def _send_prepared(self, preps: list[Prepared], spin: bool = False) -> list[object]:
        """The round trip that overlapping enqueues share (Sender.send), for tests."""
        return list(self.sender.send(preps, spin))


__all__ = [
    "BULK_BATCH",
    "CANCEL_AHEAD_S",
    "MAX_BATCH",
    "PENDING",
    "PENDING_POLL_S",
    "STREAM_CHUNK",
    "STREAM_WINDOW",
    "Client",
    "Enqueued",
    "Prepared",
    "Request",
    "pause_view",
]
