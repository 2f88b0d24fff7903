"""The only place a Redis key string is built.

Every key of one queue carries the queue's hash tag, so each Lua script touches one
slot and the layout runs unchanged on Redis Cluster::

    <prefix>:{<queue>}:ready          LIST    job ids ready to run (LPUSH in, RPOP out)
    <prefix>:{<queue>}:ready:tails    STRING  how many ids were put at ready's consumer end
                                              from outside a claim (resumed, handed back,
                                              woken): how far a list cursor's place moved
    <prefix>:{<queue>}:leases         ZSET    claimed job ids -> lease deadline (ms)
    <prefix>:{<queue>}:leases:since   ZSET    the same ids -> when claimed (ms): the processing
                                              list's order, which a renewal does not move
    <prefix>:{<queue>}:claims         HASH    claimed job id -> "<token> <attempt> <started_ms> <flags>"
    <prefix>:{<queue>}:donegen        HASH    the current done generation: gen, since, n (how many it
                                              holds, written at a quarter of the count bound)
    <prefix>:{<queue>}:done:<gen>     HASH    done job id -> its outcome: type, version, attempt, start,
                                              run time, history, result (see includes/records.lua)
    <prefix>:{<queue>}:done:<gen>:log LIST    the generation's done ids, newest first
    <prefix>:{<queue>}:res:<id>       STRING  an outcome kept on its own (KEEP_RESULT), expires
    <prefix>:{<queue>}:census         HASH    "<type>|<version>" -> jobs not done (deploy gate);
                                              "?|<version>" for a name no function can have
    <prefix>:{<queue>}:scheduled      ZSET    delayed, retrying, rate-limited and handed-back ids,
                                              and waiting durable functions -> due (ms)
    <prefix>:{<queue>}:sleeping       ZSET    sleeping durable functions -> wake time (ms): their
                                              only place (promote reads it after scheduled) and
                                              the sleeping list's index
    <prefix>:{<queue>}:waiting        ZSET    the ids of scheduled that are waiting durable functions
                                              (a signal, an event, a child) -> due (ms): the waiting
                                              list's own index
    <prefix>:{<queue>}:delayed        ZSET    the same for the scheduled and retrying ones (delayed,
                                              retrying, rate-limited, handed back) -> due (ms): the
                                              scheduled list's own index
    <prefix>:{<queue>}:dead           ZSET    dead-letter ids -> time of death (ms)
    <prefix>:{<queue>}:cancelled      ZSET    cancelled ids -> time of the cancel (ms), trimmed
                                              at the done retention (the job list's index)
    <prefix>:{<queue>}:notify         LIST    wake-up tokens for idle workers (bounded)
    <prefix>:{<queue>}:ended          channel ids of waited-for jobs that ended (space-joined)
    <prefix>:{<queue>}:cancels        channel "<id> <token>" of prefetched claims a cancel took
                                              (their worker drops them; see lua/cancel.lua), and
                                              "pause <queue> <function or *>" (Client.pause)
    <prefix>:{<queue>}:stats          HASH    cluster-wide counters and histogram buckets
                                              (own|<type>: a type counted under its own name)
    <prefix>:{<queue>}:tput:<minute>  HASH    per-minute throughput, expires after 6 h
    <prefix>:{<queue>}:job:<id>       STRING  the job record: its fields, then the payload
    <prefix>:{<queue>}:job:<id>:s     HASH    its state once it has one (status, attempt, history,
                                              error, priority...); a sleeping job's: status, its
                                              step log and 'sleep' (lua/includes/asleep.lua)
    <prefix>:{<queue>}:log:<id>       LIST    the job's log lines (JSON, each numbered "n"), oldest
                                              first, bounded, under one line that counts those
                                              lost; it expires with the job's retention
                                              (lua/joblog.lua, store/joblogs.py)
    <prefix>:{<queue>}:stream:<id>    LIST    the job's streamed output (ctx.stream), bounded; it
                                              expires with the job's retention
    <prefix>:{<queue>}:log:<id>:size  STRING  "<lines> <bytes> <sha1 of the newest>": what the log
                                              holds, so a write trims it without reading it; the
                                              stream's is stream:<id>:size; each expires with its
                                              list (lua/joblog.lua)
    <prefix>:{<queue>}:idem:<type>:<key>  STRING  "<job id> <payload hash> [done]"; no expiry
                                              until its job completes (then the retention)
    <prefix>:{<queue>}:lim:<key>      ZSET    a limit's holders: claim token -> lease deadline
                                              ms, "=<id>" -> end of a slot reserved for a woken job
    <prefix>:{<queue>}:lim:<key>:w    LIST    ids parked on that limit, oldest first
    <prefix>:{<queue>}:lim:<key>:w:heads STRING how many woken ids went back to its head
                                              (expires a day after the last)
    <prefix>:{<queue>}:lim:q:<type>   STRING  a function's RATE_LIMIT bucket: GCRA arrival time (ms),
                                              expires when full
    <prefix>:{<queue>}:lim:qk:<key>   STRING  a keyed RATE_LIMIT bucket, one per rendered key for
                                              every function that renders it
    <prefix>:{<queue>}:limwait        ZSET    limit keys with parked ids -> next sweep ms
    <prefix>:{<queue>}:outbox         LIST    follow-ups and then-jobs for other queues (JSON),
                                              written by an ack, moved by the relay (worker/relay.py)
    <prefix>:{<queue>}:lost           LIST    ids the reclaim buried as "worker lost": their
                                              ON_FAILURE jobs, which the scheduler writes
    <prefix>:{<queue>}:group:<id>     HASH    a group (fan-in): total, left, done, dead, cancelled,
                                              sealed, then (its then-job), ... (see includes/groups.lua)
    <prefix>:{<queue>}:group:<id>:o   HASH    member index -> its outcome (JSON)
    <prefix>:{<queue>}:group:<id>:m   LIST    the member ids in member order (a page of them)
    <prefix>:{<queue>}:group:<id>:f   STRING  a byte per member: the outcome the group counted
    <prefix>:{<queue>}:prio           ZSET    ready ids of priority 1-9 -> -priority * 1e13 + enqueue ms
    <prefix>:{<queue>}:paused         HASH    "queue" | "fn:<type>" -> paused since ms
    <prefix>:{<queue>}:held:<type>    LIST    ids of a paused function's jobs, oldest first (at the head)
    <prefix>:{<queue>}:schedules      HASH    schedule id -> digest of its winning definition
    <prefix>:{<queue>}:schedules:seen HASH    schedule id -> when a worker holding its winning
                                              definition last said it lives (server ms)
    <prefix>:{<queue>}:schedule:<id>  HASH    one schedule's state: def, def_at, line_at, tick, fired, job, counts,
                                              the outbox entries of its last jobs sent away
    <prefix>:{<queue>}:test:clock_offset_ms  STRING  tests only: ms added to the server clock of the
                                              queue's schedules (every queue's set alike)
    <prefix>:{<queue>}:partitions     SET     the hash tags any process routes the queue's jobs to
                                              (tagset.py); kept under the queue's own tag
    <prefix>:{<queue>}:partition_counts ZSET  each count of partitions a process routed by ->
                                              when it last said so (ms; tagset.py)
    <prefix>:{<queue>}:lim:<key>:at   STRING  "1": a job under limit <key> was enqueued in this
                                              partition within a retention (routing.py looks)
    <prefix>:{<queue>}:events         LIST    recent events whose home is this partition, newest
                                              first, capped (JSON records: id, name, at_ms, data,
                                              jobs; see lua/emit.lua)
    <prefix>:{<queue>}:emit:<name>:<key> HASH an emit's Idempotency-Key: hash (of its data),
                                              record; expires (see client/emitting.py)
    <prefix>:{<queue>}:idem:~ended:<type>:<key>  STRING  the id of the latest job of that key that
                                              died or was cancelled (its key freed), for the search by
                                              key; expires with its record (includes/idem.lua)
    <prefix>:{<queue>}:wakes          LIST    events whose waiters (ctx.wait_for_event) are still
                                              to be told, oldest first (JSON: id, name, ts, data;
                                              written by lua/emit.lua, taken off once every
                                              waiter was told: client/waking.py)
    <prefix>:{<queue>}:idem:~debounce:<type>:<key>  HASH  a DEBOUNCE burst per version: id:<v> (its
                                              one job), first:<v> (ms of its first enqueue); no TTL: the
                                              fields go when the job is claimed or ends, its state's
                                              'debounce' field naming the marker until then (includes/jobs.lua)
    <prefix>:{<queue>}:idem:~absorbed:<id>  STRING  the burst's job that a DEBOUNCE job placed from an
                                              outbox joined: its id stays known, so a second placement
                                              merges nothing (lua/relay.lua); PX the done retention + 1 h

A queue with ``partitions = N`` (see docs/partitions.md) has this whole set once per
partition, each under the partition's own tag (``partition_tags``): ``{<queue>}`` for the
partition whose share of the slots holds that tag's slot (the home partition; with N = 1
the only one, so the layout is unchanged), ``{<queue>:<s>}`` for the others. A job lives
in one partition for its whole life; every script touches one partition's keys. A
partition that the current count no longer has (``partitions`` changed) keeps its tag and
is served until it drains: its keys come after the current ones, ``draining``.

These keys are global, outside every queue's tag (each in its own slot on Redis Cluster)::

    <prefix>:audit                    LIST    who did what (requeue, delete, purge, cancel, trigger,
                                              bulk...), newest first, capped, a caller's repeats
                                              folded (see audit.py); each entry's place
                                              number `n` is a reader's cursor (seek_trail.lua)
    <prefix>:audit:flow               LIST    the pauses and resumes, apart (capped alike): cheap
                                              to repeat, they never push the others out
    <prefix>:workers                  HASH    live workers: what they serve, run and know; each entry
                                              carries its time to live (roster.py)
    <prefix>:workers:pruner           STRING  the worker that prunes the roster's dead entries this
                                              heartbeat (SET NX, expires with it; roster.py)
    <prefix>:place:<queue>:{<digest>} STRING  the partition a route key was placed in while two
                                              counts of partitions are live (routing.py)
    <prefix>:{ev:<name>}:shapes       HASH    a match's field names (JSON list) -> waiters with it
    <prefix>:{ev:<name>}:w:<digest>   ZSET    the waiters of one match (the digest of its fields
                                              and values) -> when each began to wait (server ms);
                                              a member is JSON [queue, tag, job id, position]
    <prefix>:{ev:<name>}:woke:<event> STRING  how many waiters that event resumed; expires

An event name's waiters (ctx.wait_for_event, see store/listeners.py) live under a tag of
the name's own (``{ev:<name>}``), so one name's registry is one slot, apart from every queue.

A claim lives in the queue's ``claims`` hash, not in the record: a claim costs a read of
the record and no write to it. A success deletes the record and its state, and keeps
a short outcome in the current done generation (a quarter of the retention, or of the
count bound; four are kept, the oldest dropped whole). records.py lays record, state,
claim and outcome into one view. ``leases``, ``leases:since`` and ``claims`` always hold the same ids (a
claim writes them together and ``unclaim`` in includes/claims.lua drops them together).

A schedule's keys live under its function's queue tag (the home partition's), so a tick's
check and its job's enqueue are one script in one slot (see lua/tick.lua); a tick's job
whose keys route it to another partition goes to that slot's outbox in the same script,
and is placed from there. A removed schedule's state stays a week as a tombstone, so a
worker with an older definition cannot bring it back.

A job id never moves between queues, so a job's record lives under its queue's tag.
Scripts whose ids are only known inside Redis (claim, reclaim, promote) get the
``job:``/``idem:``/``lim:``/``tput:`` prefixes as KEYS and append the id, key or
minute: the prefix carries the tag, so the resulting key is in the same slot. A limit
key is "r:<resource>" for a RESOURCE_KEY (limit 1), "c:<type>" or "ck:<key>" for CONCURRENCY
and "q:<type>" or "qk:<key>" for a RATE_LIMIT bucket (a rendered key is shared by every
function); see catalog/limits.py and includes/limits.lua.
"""

from __future__ import annotations

from binascii import crc_hqx
from dataclasses import dataclass, field

# Redis Cluster's slots (its key space is split into this many).
HASH_SLOTS = 16384

# A partition's searched tag keeps this many slots away from either end of its share, so
# a split of the slots that rounds its boundaries otherwise still holds it.
SLOT_MARGIN = 2


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every key of one queue (of one of its partitions), built once (they are read on
    every script call). ``tag`` is the hash tag, the queue's name unless a partition's."""

    prefix: str
    queue: str
    tag: str = ""
    partition: int = 0
    partitions: int = 1  # of the queue
    base: str = field(init=False)
    ready: str = field(init=False)
    # The count of ids put at ready's consumer end (lua/includes/ready.lua builds it from
    # ready, as ready .. ':tails'; lua/seek_list.lua reads it so).
    ready_tails: str = field(init=False)
    leases: str = field(init=False)
    running: str = field(init=False)
    claims: str = field(init=False)
    done_meta: str = field(init=False)
    done_prefix: str = field(init=False)
    res_prefix: str = field(init=False)
    census: str = field(init=False)
    scheduled: str = field(init=False)
    sleeping: str = field(init=False)
    waiting: str = field(init=False)
    delayed: str = field(init=False)
    dead: str = field(init=False)
    cancelled: str = field(init=False)
    notify: str = field(init=False)
    ended: str = field(init=False)
    cancels: str = field(init=False)
    stats: str = field(init=False)
    job_prefix: str = field(init=False)
    idem_prefix: str = field(init=False)
    lim_prefix: str = field(init=False)
    limwait: str = field(init=False)
    paused: str = field(init=False)
    prio: str = field(init=False)
    held_prefix: str = field(init=False)
    tput_prefix: str = field(init=False)
    outbox: str = field(init=False)
    lost: str = field(init=False)
    group_prefix: str = field(init=False)
    schedules: str = field(init=False)
    schedules_seen: str = field(init=False)
    schedule_prefix: str = field(init=False)
    log_prefix: str = field(init=False)
    stream_prefix: str = field(init=False)
    emitted: str = field(init=False)
    emit_prefix: str = field(init=False)
    wakes: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.tag:
            object.__setattr__(self, "tag", self.queue)
        base = f"{self.prefix}:{{{self.tag}}}:"
        for name, suffix in (("base", ""), ("ready", "ready"), ("ready_tails", "ready:tails"), ("leases", "leases"),
                             ("running", "leases:since"),
                             ("claims", "claims"), ("done_meta", "donegen"), ("done_prefix", "done:"),
                             ("res_prefix", "res:"), ("census", "census"),
                             ("scheduled", "scheduled"), ("sleeping", "sleeping"), ("waiting", "waiting"),
                             ("delayed", "delayed"),
                             ("dead", "dead"), ("cancelled", "cancelled"),
                             ("notify", "notify"), ("ended", "ended"), ("cancels", "cancels"),
                             ("stats", "stats"), ("job_prefix", "job:"), ("idem_prefix", "idem:"),
                             ("lim_prefix", "lim:"), ("limwait", "limwait"), ("tput_prefix", "tput:"),
                             ("outbox", "outbox"), ("lost", "lost"), ("group_prefix", "group:"),
                             ("paused", "paused"), ("held_prefix", "held:"), ("prio", "prio"),
                             ("schedules", "schedules"), ("schedules_seen", "schedules:seen"),
                             ("schedule_prefix", "schedule:"), ("log_prefix", "log:"),
                             ("stream_prefix", "stream:"), ("emitted", "events"), ("emit_prefix", "emit:"),
                             ("wakes", "wakes")):
            object.__setattr__(self, name, base + suffix)

    @property
    def draining(self) -> bool:
        """A partition of another count than this process's (after a change of
        ``partitions``): served and read until it holds nothing, never routed to."""
        return self.partition >= self.partitions

    def throughput(self, minute: int) -> str:
        return f"{self.tput_prefix}{minute}"

    def held(self, type_: str) -> str:
        return self.held_prefix + type_

    def job(self, job_id: str) -> str:
        return self.job_prefix + job_id

    def log(self, job_id: str) -> str:
        return self.log_prefix + job_id

    def stream(self, job_id: str) -> str:
        return self.stream_prefix + job_id

    def state(self, job_id: str) -> str:
        return self.job_prefix + job_id + ":s"

    def done(self, gen: int) -> str:
        return f"{self.done_prefix}{gen}"

    def idem(self, type_: str, key: str) -> str:
        return f"{self.idem_prefix}{type_}:{key}"

    def idem_ended(self, type_: str, key: str) -> str:
        return f"{self.idem_prefix}~ended:{type_}:{key}"

    def debounce(self, type_: str, key: str) -> str:
        """The marker HASH of a DEBOUNCE burst of ``key`` (as includes/jobs.lua builds it)."""
        return f"{self.idem_prefix}~debounce:{type_}:{key}"

    def limit(self, key: str) -> str:
        return self.lim_prefix + key

    def waiters(self, key: str) -> str:
        """The LIST of jobs parked on limit ``key``, oldest first (see wake_parked in includes/parking.lua)."""
        return self.lim_prefix + key + ":w"

    def placed(self, key: str) -> str:
        """The marker of a job under limit ``key`` enqueued here lately (see routing.py)."""
        return self.lim_prefix + key + ":at"

    def group(self, group_id: str) -> str:
        return self.group_prefix + group_id

    def group_outcomes(self, group_id: str) -> str:
        return self.group_prefix + group_id + ":o"

    def schedule(self, schedule_id: str) -> str:
        return self.schedule_prefix + schedule_id

    def pattern(self) -> str:
        """A SCAN pattern for every key of this queue (tests and `runner check`)."""
        return self.base.replace("{", "\\{").replace("}", "\\}") + "*"


def audit(prefix: str) -> str:
    return f"{prefix}:audit"


def audit_flow(prefix: str) -> str:
    """The pauses and resumes, on a trail of their own (see audit.py)."""
    return f"{prefix}:audit:flow"


def key_slot(key: bytes) -> int:
    """The cluster slot of a key, as Redis computes it: the CRC16 (XMODEM, which
    ``crc_hqx`` is) of its hash tag, the part between the first ``{`` and the next ``}``
    when that is not empty, else of the whole key. Here rather than redis-py's (the same
    function): importing it would load all of redis-py for the commands that need none."""
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return crc_hqx(key, 0) % HASH_SLOTS


def for_queue(prefix: str, queue: str) -> QueueKeys:
    """The keys of a queue of one partition (or of a queue's home partition's tag)."""
    return QueueKeys(prefix=prefix, queue=queue)


def slot_range(i: int, n: int) -> tuple[int, int]:
    """The ``i``-th of ``n`` equal shares of the cluster's slots: [first, end)."""
    return i * HASH_SLOTS // n, (i + 1) * HASH_SLOTS // n


def partition_tags(queue: str, n: int) -> tuple[str, ...]:
    """The hash tags of a queue's ``n`` partitions, partition ``i``'s slot in the ``i``-th
    share of the slots: the queue's own name for the share that holds its slot, else
    ``<queue>:<s>`` with the smallest ``s`` whose slot lies inside the share (SLOT_MARGIN
    from its ends). A pure function of (queue, n): every process computes the same."""
    home = home_partition(queue, n)
    out: list[str] = []
    for i in range(n):
        if i == home:
            out.append(queue)
            continue
        lo, hi = slot_range(i, n)
        s = 1
        while not lo + SLOT_MARGIN <= key_slot(f"{queue}:{s}".encode()) < hi - SLOT_MARGIN:
            s += 1
        out.append(f"{queue}:{s}")
    return tuple(out)


def home_partition(queue: str, n: int) -> int:
    """The partition that keeps the queue's own tag (and its keys of before partitions)."""
    return key_slot(queue.encode()) * n // HASH_SLOTS


def for_partitions(prefix: str, queue: str, n: int) -> tuple[QueueKeys, ...]:
    """The keys of each of a queue's ``n`` partitions, by partition index."""
    return tuple(QueueKeys(prefix=prefix, queue=queue, tag=t, partition=i, partitions=n)
                 for i, t in enumerate(partition_tags(queue, n)))


def partition_set(prefix: str, queue: str) -> str:
    """The tags a queue's jobs are routed to by any process (tagset.py)."""
    return f"{prefix}:{{{queue}}}:partitions"


def partition_counts(prefix: str, queue: str) -> str:
    """The counts of partitions processes route a queue's jobs by (tagset.py)."""
    return f"{prefix}:{{{queue}}}:partition_counts"


def place_prefix(prefix: str, queue: str) -> str:
    """The start of a queue's place keys: where a route key's partition is claimed while
    two counts are live (routing.Placement; each key under a hash tag of its own)."""
    return f"{prefix}:place:{queue}"


@dataclass(frozen=True, slots=True)
class EventKeys:
    """The keys of one event name's waiters (ctx.wait_for_event), under the name's own tag."""

    prefix: str
    name: str
    shapes: str = field(init=False)
    bucket_prefix: str = field(init=False)
    woke_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        base = f"{self.prefix}:{{ev:{self.name}}}:"
        object.__setattr__(self, "shapes", base + "shapes")
        object.__setattr__(self, "bucket_prefix", base + "w:")
        object.__setattr__(self, "woke_prefix", base + "woke:")

    def bucket(self, digest: str) -> str:
        return self.bucket_prefix + digest

    def woke(self, event_id: str) -> str:
        return self.woke_prefix + event_id


def clock_offset(prefix: str, queue: str) -> str:
    """Tests only: milliseconds the schedules' clock runs ahead of the server's, one key per
    queue under the queue's own tag (on Redis Cluster, on the master of its schedules'
    states; a test sets every queue's alike)."""
    return f"{prefix}:{{{queue}}}:test:clock_offset_ms"
