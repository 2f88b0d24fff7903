"""Inspecting: jobs by id or key, job lists, queue figures, pauses and flow, dead
letters, groups, the audit trail and the schedules. Reads only; every Redis command is a
store function's (store/admin.py and its neighbours), and Redis going away is one error
(connection.reachable)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from runner.errors import GroupNotFound, JobNotFound, RunnerError, UnknownQueue
from runner.observe import figures
from runner.store import admin, connection, damage, keys, listing, records, refusals, roster, routing
from runner.store import audit as audit_log
from runner.store import groups as group_store
from runner.store.connection import UNAVAILABLE, reachable
from runner.store.keys import QueueKeys
from runner.store.schedules import ServerClock, State, read_states

if TYPE_CHECKING:
    from runner.catalog.schedules import Schedule
    from runner.client import Client

T = TypeVar("T")


def queue_keys(client: Client, queue: str) -> QueueKeys:
    """The keys of a configured queue's home partition (UnknownQueue names the others)."""
    if queue not in client.runtime.keys:
        raise UnknownQueue(queue, list(client.runtime.keys))
    return client.runtime.keys[queue]


def every(client: Client) -> list[QueueKeys]:
    """The keys of every queue's every partition (draining ones included: the tags
    recorded are read again every tagset.RECORD_EVERY_S)."""
    client.runtime.discover_for_reading()
    return [k for parts in client.runtime.parts.values() for k in parts]


def ping(client: Client) -> bool:
    try:
        return connection.ping(client.runtime.redis)
    except UNAVAILABLE:
        return False


def get(client: Client, job_id: str) -> records.Job:
    """The job record, from whichever queue holds it."""
    k, fields = find(client, job_id)
    return records.Job(job_id, k.queue, fields)


def reading(client: Client, fn: Callable[[], T]) -> T:
    """``fn()``, a read of jobs or a page, within a bound: on Redis Cluster each master is
    waited for at most READ_WAIT_S (longer for one whose recent round trips are slow),
    then given up as a worker gives up a call (marked stalled until it answers again: the
    next reads skip it at once), so the masters that answer are read within that bound
    (docs/partitions.md, "A shard down"). On one server, on the caller's thread, bounded
    by the socket timeout: a bound of its own refused healthy but slow reads (a page of 16
    partitions at a 140 ms round trip) and cost each read a pool thread's hand-off."""
    from runner.store.transport import READ_WAIT_S

    scripts = client.runtime.scripts
    if scripts.one_server:
        return fn()
    with scripts.waiting(READ_WAIT_S):
        return fn()

def find(client: Client, job_id: str) -> tuple[QueueKeys, dict[str, str]]:
    """The keys of the queue (partition) that holds a job, and the job as readers see it.
    On Redis Cluster, a job found on a master that answers is returned while another
    master is away; one found on none is RedisUnavailable naming the partitions away."""
    if not job_id or len(job_id) > 200:
        raise JobNotFound(job_id)
    away: list[tuple[QueueKeys, BaseException]] = []

    def read() -> tuple[QueueKeys, dict[str, str]] | None:
        searched = every(client)
        found = records.lookup_many(client.runtime.scripts, searched, [job_id], away).get(job_id)
        if found is None and (new := client.runtime.discover_missed(searched)):
            found = records.lookup_many(client.runtime.scripts, new, [job_id], away).get(job_id)
        return found

    with reachable():
        found = reading(client, read)
    if found is None:
        if away:
            raise refusals.left_out([job_id], away, client.runtime.redis)
        raise JobNotFound(job_id)
    return found


def get_many(client: Client, job_ids: Sequence[str]) -> dict[str, records.Job]:
    """The jobs of these ids that exist, by id, in one round trip (on Redis Cluster, with
    a master away: RedisUnavailable when one of them is found on none that answered)."""
    wanted = [i for i in job_ids if i and len(i) <= 200]
    away: list[tuple[QueueKeys, BaseException]] = []

    def read() -> dict[str, tuple[QueueKeys, dict[str, str]]]:
        searched = every(client)
        found = records.lookup_many(client.runtime.scripts, searched, wanted, away)
        missed = [i for i in wanted if i not in found]
        if missed and (new := client.runtime.discover_missed(searched)):
            found.update(records.lookup_many(client.runtime.scripts, new, missed, away))
        return found

    with reachable():
        found = reading(client, read)
    missed = [i for i in wanted if i not in found]
    if missed and away:
        raise refusals.left_out(missed, away, client.runtime.redis)
    return {i: records.Job(i, k.queue, fields) for i, (k, fields) in found.items()}


def stats(client: Client) -> dict[str, dict[str, Any]]:
    """Per queue: ready (plain and priority jobs due now), processing, scheduled, dead,
    and the cluster-wide counters; summed over a partitioned queue's partitions, which
    "partitions" lists one by one. A stats hash too wide to read whole is read by the
    names of the functions loaded, and "stats_fields_left_out" counts the rest."""
    rt = client.runtime
    parts = every(client)
    with reachable():
        counted = admin.counts(rt.redis, parts, lambda: figures.stats_names(list(rt.registry.functions)))
    out: dict[str, dict[str, Any]] = {}
    for k, one in zip(parts, counted, strict=True):
        q = out.get(k.queue)
        if q is None:
            out[k.queue] = q = {**one, "counters": dict(one["counters"])}
        else:
            for f in ("ready", "processing", "scheduled", "dead", "stats_fields_left_out"):
                q[f] += one[f]
            for name, v in one["counters"].items():
                q["counters"][name] = q["counters"].get(name, 0) + v
        if len(rt.parts[k.queue]) > 1:
            q.setdefault("partitions", []).append({"partition": k.partition, "tag": k.tag, **one})
    return out


def jobs(client: Client, status: str, *, queue: str | None = None, type: str | None = None, limit: int = 50,
         cursor: str | None = None) -> listing.Page:
    """One page of jobs in ``status`` (see store/listing.py), newest first; pass the
    page's cursor for the next. Raises ValueError for an unknown status or cursor,
    UnknownQueue and UnknownFunction for a queue or type that is not there."""
    if status not in listing.LISTED:
        raise ValueError(f"status must be one of {', '.join(listing.LISTED)}")
    rt = client.runtime
    names = [queue] if queue else list(rt.keys)
    for q in names:
        queue_keys(client, q)  # an unknown queue is refused, naming the configured ones
    if type is not None:
        rt.registry.get(type)  # a type not loaded (a typo) is refused, naming the loaded ones
    types_of: dict[str, list[str]] = {}  # each queue's function types (a paused one's jobs are held)
    for fn in sorted(rt.registry.functions.values(), key=lambda f: f.name):
        types_of.setdefault(fn.queue, []).append(fn.name)

    def read() -> listing.Page:
        # A long-lived reader (a web process that never enqueues) learns of the partitions
        # another count recorded since, as its figures do: else it never lists their jobs.
        rt.discover_for_reading()
        # A partitioned queue's partitions are listed one after another, as queues are.
        queues = [(q, k) for q in names for k in rt.parts[q]]
        return listing.page(rt.redis, rt.scripts, queues, status, type, max(1, limit), cursor, types_of)

    with reachable():
        return reading(client, read)


def by_idempotency_key(client: Client, key: str, *, type: str | None = None) -> list[records.Job]:
    """The jobs holding idempotency key ``key``: of function ``type``, or of any
    loaded function (a key is per type, so several may hold the same one). One round
    trip for the keys, one lookup per job found; a key whose job is gone finds none.
    Raises UnknownFunction for a type not loaded."""
    rt = client.runtime
    fns = [rt.registry.get(type)] if type is not None else list(rt.registry.functions.values())
    # A key's job lives where its route sent it: on a partitioned queue, any partition.
    candidates = [(fn.name, k) for fn in fns if fn.queue in rt.parts for k in rt.parts[fn.queue]]
    with reachable():
        found = listing.holders(rt.redis, candidates, key) if candidates else []
    out = []
    for _, job_id in found:
        with contextlib.suppress(JobNotFound):
            out.append(get(client, job_id))
    return out


def workers(client: Client, damaged: list[damage.Damaged] | None = None) -> list[dict[str, Any]]:
    """The worker processes alive now, oldest first, each with what it serves and the
    jobs its handlers run (as of its last heartbeat, store/roster.py). A roster of
    another Redis type lists none, named in ``damaged`` (store/damage.py)."""
    rt = client.runtime
    with reachable():
        return [m.view() for m in roster.read(rt.redis, rt.config.redis.prefix, damaged=damaged)]


def paused(client: Client) -> dict[str, dict[str, Any]]:
    """Per queue: whether it is paused and which of its functions are (a pause is
    written to every partition of a queue; its home partition's is read)."""
    rt = client.runtime
    with reachable():
        raw = admin.pauses(rt.redis, rt.keys.values())
    return {q: pause_view(h) for q, h in zip(rt.keys, raw, strict=True)}


def pause_view(raw: dict[str, str]) -> dict[str, Any]:
    """A queue's pause hash as shown: {"paused": bool, "paused_functions": [type, ...]}."""
    return {"paused": "queue" in raw, "paused_functions": sorted(f[3:] for f in raw if f.startswith("fn:"))}


def flow(client: Client, type_: str) -> dict[str, Any]:
    """A function's flow control now: paused or not, jobs held by its pause, and its
    concurrency limit with the slots in use and jobs parked on it (counted for a
    function-wide limit; a per-key limit has a key of its own per tenant)."""
    fn = client.runtime.registry.get(type_)
    home = queue_keys(client, fn.queue)
    parts = client.runtime.parts[fn.queue]
    conc = fn.concurrency
    # A function-wide limit lives in the partition its key routes every job of it to.
    limit_keys = parts[routing.partition_of(f"c:{fn.name}", parts[0].partitions)]
    with reachable():
        now = admin.flow(client.runtime.redis, home, parts, limit_keys, fn.name)
    out: dict[str, Any] = {"paused": now["paused"], "held_by_pause": now["held"], "concurrency": None}
    if conc is not None:
        keyed = conc.key is not None
        # Holders past their lease are dead workers' slots, freed at the next claim.
        out["concurrency"] = {**conc.describe(),
                              "running": None if keyed else sum(1 for _, end in now["holders"] if end > now["now_ms"]),
                              "waiting": None if keyed else now["waiting"]}
    return out


def dead(client: Client, queue: str, offset: int = 0, limit: int = 50) -> tuple[int, list[records.Job]]:
    """The dead-letter list of a queue, newest first (over all its partitions): (total,
    page); each job's big values come as previews (see store/listing.py). An offset is
    not stable while jobs die or leave: dead_page's cursor is."""
    page = dead_page(client, queue, limit, offset=offset)
    return page.total, page.jobs


def dead_page(client: Client, queue: str, limit: int = 50, cursor: str | None = None,
              offset: int | None = None) -> listing.DeadPage:
    """One page of a queue's dead letters, newest first (over all its partitions), and
    the cursor of the next (None: the last page): pass it back for the page after the
    last job shown, however many jobs died, left or came back meanwhile
    (store/listing.py dead_after). ValueError for a cursor it did not make for
    ``queue``. ``offset`` instead of a cursor: from that place in the list as it is now."""
    queue_keys(client, queue)
    rt = client.runtime
    rt.discover_for_reading()  # (as jobs does)
    with reachable():
        if offset:
            return listing.dead_page(rt.redis, rt.scripts, queue, rt.parts[queue], offset, limit)
        return listing.dead_after(rt.redis, rt.scripts, queue, rt.parts[queue], limit, cursor)


def dead_ids(client: Client, queue: str) -> list[str]:
    queue_keys(client, queue)
    client.runtime.discover_for_reading()  # (as jobs does)
    with reachable():
        return admin.dead_ids(client.runtime.redis, client.runtime.parts[queue])


def group_state(client: Client, group_id: str) -> group_store.GroupState:
    if not group_id or len(group_id) > 200:
        raise GroupNotFound(group_id)
    with reachable():
        state = group_store.read(client.runtime.redis, client.runtime.keys, group_id)
    if state is None:
        raise GroupNotFound(group_id)
    return state


def get_group(client: Client, group_id: str) -> dict[str, Any]:
    """A group's progress (GET /groups/{id}): total, done, dead, cancelled, pending, and
    the then-job with its status ("waiting" until the last member finished)."""
    state = group_state(client, group_id)
    view = state.view()
    queue, then_id, then_type = state.then
    status: str | None = "waiting"
    if not then_id:
        status = None  # an unreadable then-job (another writer's record): none to wait for
    elif state.complete:
        try:
            status = get(client, then_id).status
        except JobNotFound:
            status = "pending"  # on its way through the outbox to its queue
    view["then"] = {"id": then_id, "type": then_type, "queue": queue, "status": status}
    return view


def group_members(client: Client, group_id: str, cursor: str | None = None, limit: int = 100,
                  outcomes: Sequence[str] = ()) -> dict[str, Any]:
    """One page of a group's members (GET /groups/{id}/members): {"id", "total", "members":
    [{"member", "id", "status"}], "cursor", "listed"}, in member order from ``cursor`` (the
    last page's; None: the first), at most ``limit`` (500) a page. A member's status is the
    outcome the group counted for it (done, dead, cancelled), pending until then;
    ``outcomes``: those of these only (dead, to find the members that failed). "listed" is
    false for a group written before members were listed (none then). ValueError for a
    cursor or an outcome it does not know."""
    start = 1
    if cursor is not None:
        if not (cursor.isascii() and cursor.isdigit() and 1 <= int(cursor) <= group_store.MAX_MEMBERS):
            raise ValueError(f"cursor {cursor!r:.40} is not one this list gave")
        start = int(cursor)
    unknown = set(outcomes) - set(group_store.OUTCOMES)
    if unknown:
        raise ValueError(f"no outcome {sorted(unknown)[0]!r:.40}: one of {', '.join(group_store.OUTCOMES)}")
    state = group_state(client, group_id)
    with reachable():
        page = group_store.member_page(client.runtime.scripts, client.runtime.keys[state.queue], group_id, start,
                                       limit, frozenset(outcomes))
    return {"id": group_id, "total": state.total, "members": page.members,
            "cursor": str(page.next) if page.next else None, "listed": page.listed > 0 or not state.total}


# The most bytes of outcomes group_outcomes gathers in one list (iter_group_outcomes holds
# one page at a time, store/groups.py PAGE_BYTES).
MAX_OUTCOME_BYTES = 64 * 1024 * 1024


def group_outcomes(client: Client, group_id: str, max_bytes: int | None = MAX_OUTCOME_BYTES) -> list[Any]:
    """Every member's outcome in member order (None for one not finished yet): what the
    then-job's payload carries, read from Redis for a group too big to carry them. A group
    whose outcomes pass ``max_bytes`` together (its hash counts them) is refused, naming
    iter_group_outcomes, which reads them a page at a time: 1,000 outcomes of 1 MiB were
    1 GB held at once in a web process. ``max_bytes=None`` reads any size (a then-handler's
    ctx.group_outcomes: its memory is its own choice)."""
    state = _readable_group(client, group_id)
    held = records.count_of(state.fields.get("bytes") or 0, 2**62) or 0
    if max_bytes is not None and held > max_bytes:
        raise RunnerError(f"group {group_id!r}'s outcomes take {held:,} bytes, past the {max_bytes:,} read into one "
                          "list: read them a page at a time with Client.iter_group_outcomes (or pass max_bytes)")
    return list(iter_group_outcomes(client, group_id))


def iter_group_outcomes(client: Client, group_id: str, page_bytes: int = group_store.PAGE_BYTES) -> Iterator[Any]:
    """Every member's outcome in member order (None for one not finished yet), read a
    page at a time (at most 1,000 members and ``page_bytes`` of outcomes a round trip):
    only that page is held, whatever the group's size."""
    state = _readable_group(client, group_id)
    k = client.runtime.keys[state.queue]
    start = 1
    while start <= state.total:
        with reachable():
            got, start = group_store.outcome_page(client.runtime.redis, k, group_id, state.total, start, page_bytes)
        yield from got


def outcome_page(client: Client, group_id: str, start: int) -> tuple[list[Any], int]:
    """The outcomes of members ``start``.. (1-based) in one bounded round trip (as
    iter_group_outcomes pages): (them, the next member to read, 0 when none is left). An
    isolated then-handler's ctx.iter_group_outcomes asks its worker for one page at a time,
    so no message between them carries more than a page."""
    state = _readable_group(client, group_id)
    if not 1 <= start <= state.total:
        return [], 0
    k = client.runtime.keys[state.queue]
    with reachable():
        got, after = group_store.outcome_page(client.runtime.redis, k, group_id, state.total, start,
                                              group_store.PAGE_BYTES)
    return got, after if after <= state.total else 0


def _readable_group(client: Client, group_id: str) -> group_store.GroupState:
    state = group_state(client, group_id)
    if "total" in state.damaged:
        raise RunnerError(f"group {group_id!r}'s record is damaged (its total, {state.fields.get('total')!r:.40}, "
                          f"is not 0 to {group_store.MAX_MEMBERS:,}): its outcomes cannot be read; another "
                          "writer set it, so look for what writes this queue's group keys besides runner")
    return state


def then_of(client: Client, group_id: str) -> str:
    """The id of a group's then-job (GroupNotFound for no such group)."""
    return group_state(client, group_id).then[1]


def audit(client: Client, offset: int = 0, limit: int = 50, damaged: list[damage.Damaged] | None = None
          ) -> tuple[int, list[dict[str, Any]]]:
    """Who did what, newest first: (entries held, one page). The trail is capped
    (store/audit.py MAX_ENTRIES); the log keeps every entry. A trail of another Redis type
    reads as empty, named in ``damaged`` (store/damage.py)."""
    with reachable():
        return audit_log.read(client.runtime.redis, keys.audit(client.runtime.config.redis.prefix), offset, limit,
                              damaged)


def audit_page(client: Client, limit: int = 50, cursor: str | None = None) -> audit_log.Page:
    """Who did what, newest first: one page and the cursor of the next (None: the last
    page), which goes on after the last entry shown however many actions land meanwhile
    (store/audit.py read_after); a trail of another Redis type reads as empty, named in
    the page's ``damaged``. ValueError for a cursor it did not make."""
    with reachable():
        return audit_log.read_after(client.runtime.scripts, keys.audit(client.runtime.config.redis.prefix), limit,
                                    cursor)


def schedules(client: Client) -> list[dict[str, Any]]:
    """Every schedule of the loaded functions, by id: its definition, the next tick by
    the server's clock, the last tick that fired and the last job with its status,
    and its counts (see _schedule_view). A schedule whose state lives in a partition left
    out of the runtime's (its Redis Cluster master is down: cli's shards_down) is left out."""
    rt = client.runtime
    live = {(k.queue, k.tag) for parts in rt.parts.values() for k in parts}
    scheds = [s for s in rt.registry.schedules() if (s.queue, rt.keys[s.queue].tag) in live]
    wanted: dict[str, tuple[QueueKeys, list[str]]] = {}
    for s in scheds:
        wanted.setdefault(s.queue, (rt.keys[s.queue], []))[1].append(s.id)
    with reachable():
        now = ServerClock(rt.redis, rt.config.redis.prefix, [k.queue for k in rt.keys.values()
                                                              if k in rt.parts[k.queue]]).now_ms()
        states = read_states(rt.redis, wanted, rt.scripts, rt.parts) if scheds else {}
    return [_schedule_view(s, states.get(s.id), now) for s in scheds]


def _schedule_view(s: Schedule, st: State | None, now_ms: int) -> dict[str, Any]:
    """One schedule as `runner schedules --json`, GET /schedules and the dashboard show it.

    ``state`` says whether the workers fire this definition: "active" (Redis holds it),
    "pending" (no worker has registered it yet) or "superseded" (Redis holds another: a
    different release of the function file is running)."""
    from runner.catalog.schedules import iso  # loaded with the registry that holds ``s``

    st = st or State(digest=None, tick_ms=None, fired_ms=None, job_id=None, job_status=None, late_ms=None)
    state = "pending" if not st.digest else "active" if st.digest == s.digest else "superseded"
    return {
        **s.describe(),
        "next": iso(s.timeline.next_after(now_ms)),
        "last": iso(st.fired_ms),
        "last_job": {"id": st.job_id, "status": st.job_status} if st.job_id else None,
        "state": state,
        "late_s": st.late_ms / 1000 if st.late_ms is not None else None,
        "counts": {"fired": st.fired, "missed": st.missed, "overlap": st.overlapped, "manual": st.manual},
    }
