"""Each Lua script's KEYS, named once.

A script's list is the order its KEYS go on the wire. The same list makes both sides:
sources.py prepends the Lua binding ``local K = {ready = KEYS[1], ...}`` to the script, so
a body reads ``K.ready`` and never a position, and ``keys()`` builds the tuple a call
sends. A name is the ``QueueKeys`` attribute the key comes from, unless the caller gives
it (``GIVEN``: a key made from an argument, such as one job's record). The header of
each script documents its keys in the same order, under the same names (a test checks).

Adding a key to a script: add its name here (where the script reads it), use ``K.<name>``
in the script and add its line to the header; no caller changes unless it is given.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.store.keys import QueueKeys

_ENQUEUE = ("ready", "scheduled", "notify", "stats", "job_prefix", "idem_prefix", "claims", "census", "prio",
            "lim_prefix", "delayed")
_CANCEL = ("job", "claims", "leases", "scheduled", "done_meta", "done_prefix", "idem_prefix", "census", "ended",
           "cancelled", "cancels", "group_prefix", "job_prefix", "ready", "notify", "stats", "outbox", "prio",
           "lim_prefix", "limwait", "sleeping", "waiting", "delayed", "dead")
_GROUP = ("ready", "scheduled", "notify", "stats", "job_prefix", "idem_prefix", "claims", "census", "prio",
          "group_prefix", "done_meta", "done_prefix", "outbox", "delayed")

KEYS: dict[str, tuple[str, ...]] = {
    "enqueue": _ENQUEUE,
    "claim": ("ready", "leases", "scheduled", "dead", "stats", "job_prefix", "lim_prefix", "idem_prefix", "claims",
              "done_meta", "limwait", "notify", "done_prefix", "census", "paused", "held_prefix", "prio", "ended",
              "cancelled", "group_prefix", "outbox", "delayed"),
    "hold": ("claims",),
    "start": ("claims",),
    "renew": ("leases", "job_prefix", "lim_prefix", "claims"),
    "ack": ("leases", "stats", "job_prefix", "lim_prefix", "idem_prefix", "tput_prefix", "dead", "ready", "notify",
            "claims", "done_meta", "done_prefix", "limwait", "census", "res_prefix", "scheduled", "outbox", "ended",
            "group_prefix", "prio", "delayed"),
    "retry": ("leases", "scheduled", "stats", "job_prefix", "lim_prefix", "ready", "notify", "claims", "limwait",
              "prio", "delayed", "log_prefix", "stream_prefix"),
    "bury": ("leases", "dead", "stats", "job_prefix", "lim_prefix", "idem_prefix", "ready", "notify", "claims",
             "limwait", "scheduled", "census", "done_meta", "done_prefix", "outbox", "ended", "cancelled",
             "group_prefix", "prio", "delayed"),
    "release": ("leases", "ready", "notify", "job_prefix", "lim_prefix", "claims", "limwait", "idem_prefix", "census",
                "cancelled", "ended", "group_prefix", "scheduled", "stats", "done_meta", "done_prefix", "outbox",
                "prio", "delayed"),
    "reclaim": ("leases", "ready", "dead", "notify", "stats", "job_prefix", "lim_prefix", "scheduled", "claims",
                "done_meta", "limwait", "idem_prefix", "ended", "group_prefix", "done_prefix", "census", "outbox",
                "lost", "prio", "delayed", "sleeping", "waiting"),
    "promote": ("scheduled", "ready", "notify", "job_prefix", "lim_prefix", "limwait", "prio", "sleeping", "waiting",
                "delayed", "dead", "stats"),
    "requeue": ("dead", "ready", "notify", "job_prefix", "idem_prefix", "census", "prio"),
    "remove": ("dead", "job", "idem_prefix", "census", "log_prefix", "stream_prefix"),
    "checkpoint": ("job", "claims"),
    "trim": ("dead", "done_meta", "done_prefix", "job_prefix", "census", "cancelled"),
    "lookup": ("job", "claims", "done_meta", "done_prefix", "res_prefix", "dead", "scheduled", "cancelled",
               "sleeping", "waiting"),
    # A schedule's tick runs the enqueue script after its own guard (sources.COMPOSED).
    "tick": (*_ENQUEUE, "outbox", "schedule"),
    # An event's jobs, record and key on its home partition (docs/events.md).
    "emit": (*_ENQUEUE, "outbox", "emitted", "emit_prefix", "wakes", "shapes"),
    "emit_named": ("emitted", "emit_prefix"),
    "adopt": ("schedules", "schedule_prefix", "schedules_seen"),
    "alive": ("schedule_prefix", "schedules_seen"),
    "relay": ("ready", "scheduled", "notify", "stats", "job_prefix", "idem_prefix", "claims", "census", "done_meta",
              "done_prefix", "prio", "lim_prefix", "delayed"),
    "resume": ("paused", "ready", "notify", "job_prefix", "held", "prio"),
    "watch": ("job", "claims"),
    "cancel": _CANCEL,
    "run_now": ("job", "claims", "scheduled", "ready", "notify", "prio", "sleeping", "delayed"),
    "group": _GROUP,
    "group_count": _GROUP,
    "seek": ("index",),
    "prune": ("index", "job_prefix"),
    "index_delayed": ("scheduled", "job_prefix", "delayed", "sleeping", "waiting"),
    "seek_list": ("list", "job_prefix"),
    "audit": ("audit",),
    "seek_trail": ("audit",),
    # Durable functions (docs/durable.md): the step log lives in the job's state hash.
    "step": ("job", "claims", "stats"),
    "steps": ("job", "stats"),
    "suspend": ("leases", "scheduled", "stats", "job_prefix", "lim_prefix", "ready", "notify", "claims", "limwait",
                "prio", "idem_prefix", "done_meta", "done_prefix", "census", "outbox", "sleeping", "waiting",
                "delayed", "log_prefix", "stream_prefix"),
    "signal": ("job", "claims", "scheduled", "ready", "notify", "prio", "done_meta", "done_prefix", "stats",
               "waiting"),
    "wait": ("job", "claims"),
    # Per-job logs (store/joblogs.py): one job's log list, given; the claims fence its writes,
    # and a run's progress goes to the job's state hash with its lines.
    "joblog": ("log", "claims", "job", "stats"),
    # An event name's waiters (store/listeners.py): the name's own slot, given.
    "listen": ("shapes", "bucket"),
    "unlisten": ("shapes", "bucket_prefix", "woke_prefix"),
    # A run's follow-ups past STAGE_OVER (scripts.py): its stage, given (the job's and
    # its claim token's), written before its ack and taken off by the relay.
    "stage": ("stage",),
    "unstage": ("stage", "outbox"),
    # The app's roster of workers (store/roster.py): a slot of its own, given.
    "unroster": ("roster",),
    # A key of another Redis type set aside by its writer (store/damage.py): given.
    "aside": ("damaged",),
    # A worker's summed figures (store/stats.py add_counts): the hash each row names, given.
    "count": ("figures",),
    # A stats hash's exact bytes for its reader (store/stats.py weigh).
    "weigh": ("stats",),
    # The statuses of the jobs a process's deaf waits wait for (store/waiter.py).
    "statuses": ("job_prefix",),
    # A page of a group's members (store/groups.py): the group's keys, under its prefix.
    "member_page": ("group_prefix",),
}

# Keys a caller passes itself (made from an argument, or not a queue's at all).
GIVEN = frozenset({"job", "held", "schedule", "index", "list", "audit", "log", "shapes", "bucket",
                   "bucket_prefix", "woke_prefix", "stage", "roster", "figures", "damaged"})

# The keys of a script that takes all of its keys from the queue, in one C call.
def _getter(names: tuple[str, ...]) -> Callable[[QueueKeys], Any]:
    if len(names) > 1:
        return attrgetter(*names)
    one = attrgetter(names[0])
    return lambda k: (one(k),)


_GETTERS: dict[str, Callable[[QueueKeys], Any]] = {
    name: _getter(names) for name, names in KEYS.items() if not GIVEN.intersection(names)
}


def keys(script: str, k: QueueKeys | None = None, **given: str) -> tuple[str, ...]:
    """The KEYS of one call of ``script``, in its order: each a ``k`` attribute, or given."""
    if not given and k is not None:
        getter = _GETTERS.get(script)
        if getter is not None:
            return getter(k)  # type: ignore[no-any-return]
    out = []
    for name in KEYS[script]:
        if name in GIVEN:
            if name not in given:
                raise TypeError(f"{script}: the key {name!r} must be given")
            out.append(given[name])
        else:
            out.append(getattr(k, name))
    return tuple(out)


def binding(script: str) -> str:
    """The Lua line that names a script's KEYS: ``local K = {ready = KEYS[1], ...}``."""
    fields = ", ".join(f"{name} = KEYS[{i}]" for i, name in enumerate(KEYS[script], 1))
    return f"local K = {{{fields}}}"
