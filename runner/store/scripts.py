"""One typed method per atomic transition, sent through the script transport (transport.py).

Each script is sent by SHA as sources.py assembles it, with the files of ``lua/includes/``
it declares prepended. Batch methods take sequences so one round trip settles many jobs;
a ``pipe`` argument queues a call on a Batch instead of sending it. How a call reaches
Redis (kept connections, NOSCRIPT reloads, Redis Cluster's nodes, WAIT for replicas behind
a durable call) is transport.py's.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

from runner.store import records, routing, scriptkeys
from runner.store.keys import EventKeys, QueueKeys

# Batch and Stream are re-exported: callers build their calls from here.
from runner.store.transport import Batch as Batch
from runner.store.transport import ScriptCall, Transport
from runner.store.transport import Stream as Stream

# How long a limit key stays marked in the partition its job went to (enqueue.lua) when no
# retention is given: a day's done retention and an hour (runtime.py passes its own).
MARK_MS = 25 * 3_600_000


class Suspension(NamedTuple):
    """A durable function's run ending at a sleep, as suspend.lua takes it."""

    id: str
    token: str
    position: int  # of the sleep's entry in the step log
    entry: str  # its JSON ('' when the log holds it already)
    delay_ms: int | None  # from the server's now, or None for due_ms
    due_ms: int  # absolute epoch ms (0 with a delay)
    max_steps: int
    max_bytes: int
    stats: str  # stats fields
    kind: str = "sleep"  # or "signal" (a wait), "invoke" (a child call)
    signal: str = ""  # the signal waited for
    ends_ms: int | None = None  # ms from now to the wait's end, when it differs from the due time
    child: Followup | None = None  # ctx.invoke's child job, written with the suspension
    hold: bool = False  # HOLD_LOCKS_WHILE_SUSPENDED: its limit slots stay reserved for it
    log_keep_ms: int = 0  # its log's retention: the log and stream are kept until it wakes plus this
    started_ms: int = 0  # its handler's start when its start mark was not sent (0: the claim's), as Ack's


class NewJob(NamedTuple):
    """One job as the enqueue script takes it (already validated and encoded).

    A NamedTuple, not a frozen dataclass as values are elsewhere: one is built per job on
    the enqueue path, where a frozen dataclass's __init__ (an object.__setattr__ per
    field) cost about a fifth of a batch's client time per job."""

    id: str
    type: str
    version: int
    payload: str
    max_attempts: int
    run_at_ms: int  # absolute, the caller's clock (0: none)
    delay_ms: int  # relative to the server's clock (0: none)
    idem_key: str
    payload_hash: str
    resource_key: str
    limits: str  # "<n> <key>" lines (see lua/includes/limits.lua), '' none
    meta: str = ""  # a small JSON object of annotations, '' none
    priority: int = 0  # 1-9: the queue's priority set, served first (enqueue.lua); 0 plain ready


def _job_fields(j: NewJob) -> list[Any]:
    """The 12 fields of one job as enqueue.lua (and ack's follow-ups, relay.lua) take them."""
    return [j.id, j.type, j.version, j.payload, j.max_attempts, j.run_at_ms, j.delay_ms,
            j.idem_key, j.payload_hash, j.resource_key, j.limits, j.meta]


def job_entry(queue: str, j: NewJob) -> list[str]:
    """A job as a list of its queue ('' the script's own), its 12 fields and its priority,
    all strings: the shape of an outbox entry (relay.py) and of a group's then-job
    (group.lua)."""
    return [queue, *(str(v) for v in _job_fields(j)), str(j.priority)]


def followup_id(parent_id: str, index: int | str) -> str:
    """A follow-up's id: its parent's and its place among the parent's follow-ups ("s"
    and "f" for the ON_SUCCESS and ON_FAILURE jobs), the same on every attempt, so the
    ack (or a relay) writes it at most once."""
    return f"{parent_id}.{index}"


# A run's follow-ups past STAGE_OVER, or past records.SCRIPT_BYTES of payloads with those
# of the acks before it in the call, are not sent with its ack: they are staged first, in
# writes of STAGE_CHUNK entries (and SCRIPT_BYTES) at most, in a list of their own that
# nothing reads until the ack commits it (ack.lua); the relay then places them a batch at
# a time (worker/relay.py). One script writing 400,000 at once had blocked Redis for 7 s,
# and an ack writing 60 of 1 MiB for up to 4 s.
STAGE_OVER = 500
STAGE_CHUNK = 1000
STAGE_TTL_MS = 7 * 86_400_000  # a stage whose ack never came (a lost lease) goes by itself
STAGED = "@staged"  # an outbox entry naming a committed stage: [STAGED, "<id>:fu:<token>"]


def stage_suffix(job_id: str, token: str) -> str:
    """A run's stage of follow-ups, after the job prefix: one per claim token, so a run
    that lost its lease never commits another's."""
    return f"{job_id}:fu:{token}"


class Followup(NamedTuple):
    """A job a handler enqueued (``ctx.enqueue``), written with its parent's ack."""

    queue: str  # its function's queue; another than the parent's goes through the outbox
    job: NewJob


class Member(NamedTuple):
    """A settled job's place in its group (its record's meta): counted down with the settle."""

    group: str
    number: int  # 1-based, the member's place in the group
    status: str  # done, dead or cancelled
    outcome: str  # JSON: {"id", "status", "result"} or {"id", "status", "reason", "error"}
    link: str = ""  # the W3C traceparent of the run that settled it: the then-job's run links to it


# The settlements below are NamedTuples too: one per job on the worker's path (see NewJob).
class Ack(NamedTuple):
    id: str
    token: str
    result: str
    census: str  # "<type>|<version>": the job leaves the deploy gate's count
    stats: str
    keep_ms: int = 0  # KEEP_RESULT: the outcome also kept on its own this long
    followups: tuple[Followup, ...] = ()
    member: Member | None = None  # a group's member: counted down in the ack's step
    created_ms: int = 0  # the record's (the server's clock at its enqueue): the done outcome keeps it
    # The handler's start (the server's clock, as its worker reckons it) when the run's start
    # mark was not sent, since it ends in the same settle: its outcome's start (0: the claim's)
    started_ms: int = 0


# An ack's fields as ack.lua takes them first: id, token, result, census, stats, keep_ms,
# created_ms (one C call where a slice and an attribute each were two steps a job).
_ACK_HEAD = operator.itemgetter(0, 1, 2, 3, 4, 5, 8)
_ACK_FOLLOWUPS = operator.itemgetter(6)
_ACK_MEMBER = operator.itemgetter(7)


class RetryAt(NamedTuple):
    id: str
    token: str
    delay_ms: int
    error: str
    history: str
    stats: str
    refund: bool = False  # handed back without spending an attempt
    rate_limited: bool = False  # a handler's RateLimited: a refund up to its bound (retry.lua)
    last: bool = False  # rate_limited on the job's last attempt: past the bound it is not retried
    started_ms: int = 0  # its handler's start when its start mark was not sent (0: the claim's), as Ack's


class Burial(NamedTuple):
    id: str
    token: str
    reason: str
    error: str
    history: str
    refund: bool
    stats: str
    followups: tuple[Followup, ...] = ()  # ON_FAILURE: the destination's job
    member: Member | None = None
    started_ms: int = 0  # its handler's start when its start mark was not sent (0: the claim's), as Ack's


class Hand(NamedTuple):
    """A release: ``now`` back to ready, or ``later`` once the lease lapses (the handler
    may still be running); see release.lua."""

    id: str
    token: str
    mode: str = "now"
    history: str = ""


def _followup_args(k: QueueKeys, items: Sequence[Ack | Burial], staged: Collection[int] = ()) -> list[Any]:
    """The follow-ups of a batch as ack.lua and bury.lua take them: m, then per follow-up
    its parent's index in the batch (1-based), its queue ('' this one), its 12 fields, its
    priority. A
    follow-up of this queue that routes to another of its partitions goes the way of
    another queue's (the outbox, then the relay), so its keys are met where they live."""
    follow: list[Any] = []
    m = 0
    for i, item in enumerate(items, 1):
        if i in staged:  # sent ahead (see STAGE_OVER)
            continue
        for f in item.followups:
            here = f.queue == k.queue and not k.draining and (
                k.partitions == 1 or routing.stays(f.job, k.partition, k.partitions))
            follow += [i, "" if here else f.queue, *_job_fields(f.job), f.job.priority]
            m += 1
    return [m, *follow]


def _member_args(items: Sequence[Ack | Burial]) -> list[Any]:
    """The group members of a batch as ack.lua and bury.lua take them: g, then per member
    its index in the batch (1-based), group id, index in the group, status, outcome, the
    run's traceparent ('' untraced)."""
    out: list[Any] = []
    for i, item in enumerate(items, 1):
        if item.member is not None:
            out += [i, *item.member]
    return [len(out) // 6, *out]




def _clock(now_ms: int | None) -> int | str:
    """The scripts' clock argument: '' (the server's TIME) unless a test passes its own."""
    return "" if now_ms is None else now_ms


# How many of the ids a page of a ready list showed last its cursor keeps (seek_list.lua
# starts the next page after the nearest one still queued).
SEEK_ANCHORS = 8


# A lookup's bytes of state values past its cut read whole to cut them, when not given.
_LOOKUP_READ = 16 * 1024

class Scripts(Transport):
    """The scripts of one Redis client: one typed method per transition, sent through the
    transport (transport.py).

    ``replicas`` > 0: durable calls return only once that many replicas confirmed them
    within ``replica_timeout_s`` (see transport.py)."""

    def __init__(self, client: Any, replicas: int = 0, replica_timeout_s: float = 1.0,
                 mark_ms: int = MARK_MS) -> None:
        super().__init__(client, replicas, replica_timeout_s)
        self.mark_ms = mark_ms  # how long a limit key stays marked where its job went
        # The queues another count of partitions was recorded for lately (the runtime keeps
        # it current): a queue of one partition marks nothing unless it is one of them.
        self.changing: frozenset[str] = frozenset()

    def enqueue(
        self, k: QueueKeys, jobs: Sequence[NewJob], pipe: Batch | None = None, spin: bool = False,
        now_ms: int | None = None,
    ) -> Any:
        """Durable: with replicas set, returns once they hold the jobs (else NotReplicated)."""
        return self._run(*self.enqueue_call(k, jobs, now_ms, self.mark_for(k)), pipe, spin, durable=True)

    def mark_for(self, k: QueueKeys) -> int:
        """How long a limit key stays marked where its job goes (routing.Placement), 0 for
        none: a queue of one partition with no other count recorded has no other placement
        to look a key up from (a marker per rendered key for a day cost gigabytes with
        unique keys); once another count is recorded, its producers mark too."""
        if k.partitions == 1 and not k.draining and k.queue not in self.changing:
            return 0
        return self.mark_ms

    @staticmethod
    def enqueue_call(
        k: QueueKeys, jobs: Sequence[NewJob], now_ms: int | None = None, mark_ms: int = MARK_MS,
    ) -> tuple[str, tuple[str, ...], list[Any]]:
        """The enqueue script's name, keys and arguments (for a Stream); ``mark_ms``: how
        long a limit key stays marked where its job went (routing.Placement)."""
        args: list[Any] = [_clock(now_ms), len(jobs)]
        for j in jobs:
            # The 12 job fields, then the priority: NewJob's own order (see
            # test_a_new_job_is_its_enqueue_fields_in_order), so the tuple goes as it is.
            args += j
        args.append(mark_ms)
        return "enqueue", scriptkeys.keys("enqueue", k), args

    def claim(
        self, k: QueueKeys, *, n: int, start: int, lease_ms: int, token_base: str, dead_ttl_ms: int,
        done_ttl_ms: int, done_max: int = 1_000_000, pipe: Batch | None = None, now_ms: int | None = None,
        max_ages: str = "", floor: int = 0, later: str = "", gathered: str = "",
        late: Callable[[Any], object] | None = None,
    ) -> Any:
        """Returns [server time ms, why it stopped short (0 | 1 held | 2 bounded), then
        CLAIM_FIELDS values per claimed job]
        (see claim.lua). ``max_ages``: "<type>=<ms> ..." of the functions with a MAX_AGE;
        ``floor``: claim only jobs of this priority or more (0: any); ``later``: "<type>
        ..." of the functions whose jobs, started at once, spend their attempt only at
        their start mark (start.lua); ``gathered``: "<type> ..." of those whose jobs are
        held from their claim until their start mark (BATCH functions), "<type>=<size>"
        for one without a key, whose jobs under limits a free executor takes up to size
        of (one call holds them); a call sends at
        most records.SCRIPT_BYTES of records (the first job whatever its size) and says
        so (2, bounded) when it left jobs behind for that; ``late``: the
        reply of a claim given up on a stalled master (transport.NodeLanes.bounded), whose
        jobs must be handed back."""
        return self._run(*self.claim_call(k, n=n, start=start, lease_ms=lease_ms, token_base=token_base,
                                          dead_ttl_ms=dead_ttl_ms, done_ttl_ms=done_ttl_ms, done_max=done_max,
                                          now_ms=now_ms, max_ages=max_ages, floor=floor, later=later,
                                          gathered=gathered), pipe, late=late)

    @staticmethod
    def claim_call(
        k: QueueKeys, *, n: int, start: int, lease_ms: int, token_base: str, dead_ttl_ms: int, done_ttl_ms: int,
        done_max: int = 1_000_000, now_ms: int | None = None, max_ages: str = "", floor: int = 0, later: str = "",
        gathered: str = "",
    ) -> tuple[str, tuple[str, ...], tuple[Any, ...]]:
        """The claim script's name, keys and arguments (for Transport.launch)."""
        args = (_clock(now_ms), n, start, lease_ms, token_base, dead_ttl_ms, done_ttl_ms, done_max, max_ages, floor,
                later, gathered, records.SCRIPT_BYTES)
        return "claim", scriptkeys.keys("claim", k), args

    def claim_woken(
        self, k: QueueKeys, wait_s: float, *, n: int, start: int, lease_ms: int, token_base: str, dead_ttl_ms: int,
        done_ttl_ms: int, done_max: int = 1_000_000, max_ages: str = "", floor: int = 0, later: str = "",
        gathered: str = "",
    ) -> tuple[Any, Any]:
        """claim, sent behind a BLPOP of the queue's notify list (see behind): it runs when a
        wake-up comes or ``wait_s`` passes, so an idle worker's wake-up and its claim are one
        round trip. Returns (the BLPOP's reply, or its error; the claim's reply)."""
        args = ("", n, start, lease_ms, token_base, dead_ttl_ms, done_ttl_ms, done_max, max_ages, floor, later,
                gathered, records.SCRIPT_BYTES)
        return self.behind(("BLPOP", k.notify, f"{wait_s:g}"), "claim", scriptkeys.keys("claim", k), args)

    def hold(self, k: QueueKeys, owned: Sequence[tuple[str, str]], off: bool = False,
             pipe: Batch | None = None) -> Any:
        """Mark claims (id, token) as waiting for their executor, or (``off``) end that wait,
        all in one call (see hold.lua): per job 1 held (or ended), 2 ended but cancelled,
        -1 refused (None: queued on ``pipe``)."""
        args: list[Any] = ["off" if off else "", len(owned)]
        for job_id, token in owned:
            args += [job_id, token]
        reply = self._run("hold", scriptkeys.keys("hold", k), args, pipe)
        return None if pipe is not None else [int(c) for c in reply]

    def start(
        self, k: QueueKeys, owned: Sequence[tuple[str, str]], pipe: Batch | None = None,
        now_ms: int | None = None,
    ) -> Any:
        args: list[Any] = [_clock(now_ms), len(owned)]
        for job_id, token in owned:
            args += [job_id, token]
        return self._run("start", scriptkeys.keys("start", k), args, pipe)

    def renew(
        self, k: QueueKeys, owned: Sequence[tuple[str, str] | tuple[str, str, str]], lease_ms: int,
        pipe: Batch | None = None, now_ms: int | None = None,
    ) -> Any:
        """``owned``: (id, token) or (id, token, progress JSON) per job (see renew.lua)."""
        args: list[Any] = [_clock(now_ms), lease_ms, len(owned)]
        for item in owned:
            args += [item[0], item[1], item[2] if len(item) > 2 else ""]
        return self._run("renew", scriptkeys.keys("renew", k), args, pipe)

    def ack(
        self, k: QueueKeys, acks: Sequence[Ack], idem_ttl_ms: int, done_ttl_ms: int = 86_400_000,
        done_max: int = 1_000_000, pipe: Batch | None = None, now_ms: int | None = None, totals: str = "",
    ) -> Any:
        """``totals``: every ack's stats fields summed ("field=N ..."), counted at once when
        the whole batch lands (see ack.lua); '' counts each ack's own."""
        args: list[Any] = [_clock(now_ms), idem_ttl_ms, done_ttl_ms, done_max, len(acks), totals]
        # Most batches carry no follow-up and no group member: their checks are C loops, and
        # the follow-ups' and members' Python loops run only for a batch with some.
        if any(map(_ACK_FOLLOWUPS, acks)):
            staged = self._stage(k, acks)
            for i, a in enumerate(acks, 1):
                args += _ACK_HEAD(a)
                args += (len(a.followups) if i in staged else 0, a.started_ms or "")
            args += _followup_args(k, acks, staged)
        else:
            for a in acks:
                args += _ACK_HEAD(a)
                args += (0, a[9] or "")  # (no follow-up staged; started_ms)
            args.append(0)  # m: no follow-ups
        args += _member_args(acks) if any(map(_ACK_MEMBER, acks)) else (0,)
        return self._run("ack", scriptkeys.keys("ack", k), args, pipe)

    def _stage(self, k: QueueKeys, acks: Sequence[Ack]) -> set[int]:
        """Write the follow-ups of each ack past STAGE_OVER to its stage, now (one round
        trip, STAGE_CHUNK entries a command), for the ack to commit; the 1-based places of
        those acks. Written again whole if the same ack is sent again."""
        big: list[tuple[int, Ack]] = []
        inline = 0  # bytes of the payloads the ack call itself writes
        for i, a in enumerate(acks, 1):
            if not a.followups:
                continue
            size = sum(records.text_bytes(f.job.payload) for f in a.followups)
            # Past SCRIPT_BYTES of them the ack call would hold Redis as long as a bulk
            # read past its bound: the rest are staged (one follow-up alone is written inline).
            if len(a.followups) > STAGE_OVER or (inline + size > records.SCRIPT_BYTES
                                                 and (inline or len(a.followups) > 1)):
                big.append((i, a))
            else:
                inline += size
        if not big:
            return set()
        batch = self.batch()  # (Redis Cluster: each call on its own, in order, to the stage's master)
        for _, a in big:
            key = k.job_prefix + stage_suffix(a.id, a.token)
            keys = scriptkeys.keys("stage", stage=key)
            entries = [json.dumps(job_entry(f.queue, f.job), separators=(",", ":")) for f in a.followups]
            first = True
            for s in range(0, len(entries), STAGE_CHUNK):
                for run in records.by_bytes(entries[s:s + STAGE_CHUNK], records.text_bytes):
                    batch.add("stage", keys, [STAGE_TTL_MS, "1" if first else "0", *run])
                    first = False
        batch.execute()
        return {i for i, _ in big}

    def unstage(self, k: QueueKeys, stage: str, head: str, placed: int, waiting: Sequence[str]) -> bool:
        """Drop the first ``placed`` entries of a committed ``stage`` and move ``waiting``
        (entries for a queue this process does not know) to ``k``'s outbox, in one step,
        when the stage still starts with ``head`` (the first entry read; see
        unstage.lua): nothing is lost or placed twice whichever of the two a crash would
        have split, nor when another relay took the same head. False: another relay
        advanced it first (what this one placed was placed once, by id)."""
        keys = scriptkeys.keys("unstage", k, stage=stage)
        return bool(self._run("unstage", keys, [head, placed, *waiting]))

    def emit(
        self, k: QueueKeys, jobs: Sequence[NewJob], *, event_id: str, name: str, data: str, idem_key: str,
        data_hash: str, idem_ms: int, keep: int, away: str, entries: Sequence[str], whole: str,
        now_ms: int | None = None,
    ) -> Any:
        """One event on its home partition ``k`` (see lua/emit.lua): ``jobs`` written here,
        ``entries`` (outbox entries) for the others, whose {id, type, queue} are ``away``
        (JSON); ``data`` as the record shows it, ``whole`` the data itself (JSON), which the
        name's waiters get. Returns [code, record, then code, id, status per job written
        here, then the entry pending for the name's waiters ('' when it has none)].
        Durable, as an enqueue is."""
        _, _, args = self.enqueue_call(k, jobs, now_ms, self.mark_for(k))
        args += [event_id, name, data, idem_key, data_hash, idem_ms, keep, away, k.queue, len(entries), *entries]
        # On one server the script reads the name's waiters itself (none: no pending entry,
        # and nothing for the emitter to tell); on Redis Cluster they live in another slot,
        # so a key of this one stands in and the entry is always written.
        registry = EventKeys(k.prefix, name).shapes if self.one_server else k.wakes
        args += [1 if self.one_server else 0, whole]
        return self._run("emit", scriptkeys.keys("emit", k, shapes=registry), args, durable=True)

    def emit_named(self, k: QueueKeys, event_id: str, name: str, idem_key: str, keep: int,
                   renamed: Sequence[tuple[str, str]]) -> int:
        """Rewrite the entries ``renamed`` (each as the record holds it, and its
        replacement) in the record of event ``event_id`` on its home ``k``, and under its
        idempotency key (see lua/emit_named.lua); 1 when the record was found."""
        args = [event_id, name, idem_key, keep, len(renamed), *(t for pair in renamed for t in pair)]
        return int(self._run("emit_named", scriptkeys.keys("emit_named", k), args))

    def relay(self, k: QueueKeys, entries: Sequence[Sequence[Any]], now_ms: int | None = None) -> Any:
        """Place follow-ups from another queue's outbox into queue ``k``, each once by id:
        ``entries`` hold the 12 enqueue fields and the priority each (see relay.lua)."""
        args: list[Any] = [_clock(now_ms), len(entries)]
        for e in entries:
            args += list(e)
        # (mark_ms: a done job's retention and a margin, as long as a placed id stays known)
        args += [self.mark_for(k), self.mark_ms]
        return self._run("relay", scriptkeys.keys("relay", k), args)

    def retry(self, k: QueueKeys, items: Sequence[RetryAt], pipe: Batch | None = None,
              now_ms: int | None = None, log_keep_ms: int = 0) -> Any:
        """Claims back to scheduled for later (retry.lua); ``log_keep_ms``: the retention
        of a job's log and stream, kept at least until it is due plus that."""
        args: list[Any] = [_clock(now_ms), len(items)]
        for r in items:
            mode = (3 if r.last else 2) if r.rate_limited else 1 if r.refund else 0
            args += [r.id, r.token, r.delay_ms, r.error, r.history, mode, r.stats, r.started_ms or ""]
        args.append(log_keep_ms)
        return self._run("retry", scriptkeys.keys("retry", k), args, pipe)

    def bury(
        self, k: QueueKeys, items: Sequence[Burial], dead_ttl_ms: int, pipe: Batch | None = None,
        now_ms: int | None = None,
    ) -> Any:
        args: list[Any] = [_clock(now_ms), dead_ttl_ms, len(items)]
        for b in items:
            args += [b.id, b.token, b.reason, b.error, b.history, 1 if b.refund else 0, b.stats, b.started_ms or ""]
        args += _followup_args(k, items)
        args += _member_args(items)
        return self._run("bury", scriptkeys.keys("bury", k), args, pipe)

    def release(
        self, k: QueueKeys, items: Sequence[Hand | tuple[str, str]], pipe: Batch | None = None,
        now_ms: int | None = None, done_ttl_ms: int = 86_400_000,
    ) -> Any:
        """Hand claims back (see release.lua); ``done_ttl_ms`` keeps a job that a cancel
        took while it waited to start, which ends cancelled instead."""
        args: list[Any] = [_clock(now_ms), len(items)]
        for item in items:
            h = item if isinstance(item, Hand) else Hand(*item)
            args += [h.id, h.token, h.mode, h.history]
        args.append(done_ttl_ms)
        return self._run("release", scriptkeys.keys("release", k), args, pipe)

    def reclaim(self, k: QueueKeys, limit: int, dead_ttl_ms: int, now_ms: int | None = None,
                check: bool = True) -> Any:
        """Returns [requeued, buried], and a third element (1) when records.SCRIPT_BYTES of
        records were read before ``limit`` jobs: more lapsed leases are left for another
        call. ``check``: look for queue keys damaged to another type first (a TYPE each;
        see reclaim.lua), which a caller passing every half second does only now and
        then, and after an error reply."""
        return self._run(*self.reclaim_call(k, limit, dead_ttl_ms, now_ms, check))

    @staticmethod
    def reclaim_call(k: QueueKeys, limit: int, dead_ttl_ms: int, now_ms: int | None = None,
                     check: bool = True) -> ScriptCall:
        args = (_clock(now_ms), limit, dead_ttl_ms, 1 if check else 0, records.SCRIPT_BYTES)
        return ScriptCall("reclaim", scriptkeys.keys("reclaim", k), args)

    def promote(self, k: QueueKeys, limit: int, now_ms: int | None = None, dead_ttl_ms: int = 0) -> Any:
        """Returns [jobs moved, ms until the next due job or sweep (-1: none)]. ``dead_ttl_ms``:
        the dead retention, for a sleeper it buries (0: its keys get no expiry)."""
        return self._run(*self.promote_call(k, limit, now_ms, dead_ttl_ms))

    @staticmethod
    def promote_call(k: QueueKeys, limit: int, now_ms: int | None = None, dead_ttl_ms: int = 0) -> ScriptCall:
        return ScriptCall("promote", scriptkeys.keys("promote", k), (_clock(now_ms), limit, dead_ttl_ms))

    @classmethod
    def look_calls(cls, k: QueueKeys, limit: int, dead_ttl_ms: int, check: bool) -> list[ScriptCall | tuple[str, str]]:
        """A partition's look for the scheduler, for one round trip (Transport.gather,
        gather_on_node): its first promote and reclaim, then its outbox's and its wakes'
        lengths."""
        return [cls.promote_call(k, limit, dead_ttl_ms=dead_ttl_ms),
                cls.reclaim_call(k, limit, dead_ttl_ms, check=check), ("LLEN", k.outbox), ("LLEN", k.wakes)]

    def resume(self, k: QueueKeys, function: str | None, first: bool, limit: int = 10_000) -> Any:
        """Lift a pause (a queue's, or one function's: None is the queue) and put back up to
        ``limit`` held jobs; returns [moved, still held, 1 if it lifted a pause] (see resume.lua)."""
        field = "queue" if function is None else f"fn:{function}"
        # A queue's resume holds no list: the bare held: prefix names none (held lists are
        # held:<type>), so the script finds it empty, and unlike '' it is in the queue's
        # slot, which Redis Cluster requires of every key.
        keys = scriptkeys.keys("resume", k, held=k.held(function) if function is not None else k.held_prefix)
        return self._run("resume", keys, (field, 1 if first else 0, limit))

    def requeue(
        self, k: QueueKeys, job_id: str, payload: str = "", version: str = "", payload_hash: str = "",
        history: str = "", now_ms: int | None = None,
    ) -> Any:
        return int(self.requeue_many(k, [(job_id, payload, version, payload_hash, history)], now_ms=now_ms)[0])

    def requeue_many(
        self, k: QueueKeys, jobs: Sequence[tuple[str, str, str, str, str]], now_ms: int | None = None,
    ) -> list[int]:
        """Requeue dead jobs, each (id, payload, version, payload hash, history entry),
        '' keeping what is stored; one code per job (see requeue.lua)."""
        args: list[Any] = [_clock(now_ms), len(jobs)]
        for job in jobs:
            args += job
        return [int(c) for c in self._run("requeue", scriptkeys.keys("requeue", k), args)]

    def remove(self, k: QueueKeys, job_id: str, pipe: Batch | None = None) -> Any:
        return self._run("remove", scriptkeys.keys("remove", k, job=k.job(job_id)), (job_id,), pipe)

    def checkpoint(self, k: QueueKeys, job_id: str, token: str, data: str) -> Any:
        return self._run("checkpoint", scriptkeys.keys("checkpoint", k, job=k.job(job_id)), (token, data, job_id))

    def append_log(self, k: QueueKeys, job_id: str, lines: Sequence[str], max_lines: int, max_bytes: int,
                   keep_ms: int, pipe: Batch | None = None, key: str = "", marker: str = "",
                   dropped: int = 0, token: str | None = None, progress: str = "") -> Any:
        """Append a job's log lines and bound its log (joblog.lua); no lines: only the
        expiry is set. ``key``: another list of the job's kept the same way (its stream).
        ``marker``: a log's line that counts what it lost (its count as LOST in
        worker/joblog.py), the lines numbered; ``dropped``: lines lost before they were
        sent, ahead of these. ``token``: the run's claim, which must still hold the job
        (None: unfenced, a tool's write). ``progress``: the run's latest ctx.progress (JSON),
        written ahead of the lines, fenced (a run's only). Returns the lines kept, or -1:
        refused, the run's lease was lost (nothing written)."""
        fenced = ("", "") if token is None else (job_id, token)
        return self._run("joblog", scriptkeys.keys("joblog", k, log=key or k.log(job_id), job=k.job(job_id)),
                         (max_lines, max_bytes, keep_ms, dropped if marker else "", marker, *fenced,
                          progress if token is not None else "", *lines), pipe)

    def step(self, k: QueueKeys, job_id: str, token: str, position: int, entry: str, max_steps: int,
             max_bytes: int, now_ms: int | None = None, stats: str = "", progress: str = "") -> Any:
        """Record a durable function's step (step.lua): {code, n}; ``stats``, the field
        that counts it; ``progress``, the run's latest report not written yet (JSON),
        written with it under the same fence. Durable: with replicas set, returns once they
        hold the record (else NotReplicated), so no step's value reaches a handler before a
        failover keeps it."""
        return self._run("step", scriptkeys.keys("step", k, job=k.job(job_id)),
                         (_clock(now_ms), token, job_id, position, entry, max_steps, max_bytes, stats,
                          records.step_head(entry), progress),
                         durable=True)

    def steps(self, k: QueueKeys, job_id: str, stats: str = "", durable: bool = False) -> Any:
        """A job's step log entries (steps.lua), counting ``stats`` when there is one.
        ``durable`` (a run's replay): returned once the replicas hold every write before it
        on this connection, the log's entries among them (else NotReplicated)."""
        return self._run("steps", scriptkeys.keys("steps", k, job=k.job(job_id)), (stats, records.MAX_STEPS),
                         durable=durable)

    def suspend(self, k: QueueKeys, s: Suspension, pipe: Batch | None = None, now_ms: int | None = None) -> Any:
        """End a durable function's run at a sleep (suspend.lua): {code, due ms}."""
        keys = scriptkeys.keys("suspend", k)
        args: list[Any] = [_clock(now_ms), s.id, s.token, s.position, s.entry,
                           "" if s.delay_ms is None else s.delay_ms, s.due_ms, s.max_steps, s.max_bytes, s.stats,
                           s.kind, s.signal, "" if s.ends_ms is None else s.ends_ms]
        if s.child is None:
            args += [0, *[""] * 15]
        else:
            f = s.child
            here = f.queue == k.queue and not k.draining and (
                k.partitions == 1 or routing.stays(f.job, k.partition, k.partitions))
            args += [1, 1, "" if here else f.queue, *_job_fields(f.job), f.job.priority]
        args += [1 if s.hold else 0, s.log_keep_ms or "", s.started_ms or ""]
        return self._run("suspend", keys, args, pipe)

    def signal(self, k: QueueKeys, job_id: str, name: str, body: str, now_ms: int | None = None, *,
               most: int = 0, most_bytes: int = 0, position: int | None = None, durable: bool = False,
               key: str = "") -> Any:
        """Deliver a signal (signal.lua): {code, status}; ``most``/``most_bytes`` bound what
        one job keeps unread (0: unbounded); with ``position``, refused (-6) once the wait
        there is over (an event's delivery). ``durable``: confirmed by the replicas, as an
        enqueue is (NotReplicated). ``key``: the delivery's, a duplicate of the last one of
        that name answered 3 and not delivered."""
        return self._run("signal", scriptkeys.keys("signal", k, job=k.job(job_id)),
                         (_clock(now_ms), job_id, name, body, most, most_bytes,
                          "" if position is None else position, key), durable=durable)

    def listen(self, ek: EventKeys, shape: str, digest: str, member: str, most_shapes: int,
               now_ms: int | None = None) -> Any:
        """Put a waiter on an event name's registry (listen.lua): {code, since ms}."""
        return self._run("listen", scriptkeys.keys("listen", shapes=ek.shapes, bucket=ek.bucket(digest)),
                         (_clock(now_ms), shape, member, most_shapes))

    def unlisten(self, ek: EventKeys, items: Sequence[tuple[str, str, str]], event_id: str = "",
                 resumed: int = 0, keep_ms: int = 0) -> int:
        """Take waiters (digest, field names, member) off an event name's registry, counting
        ``resumed`` for ``event_id`` (unlisten.lua); returns how many were there."""
        args: list[Any] = [event_id, keep_ms, resumed, len(items)]
        for item in items:
            args += list(item)
        return int(self._run("unlisten", scriptkeys.keys("unlisten", shapes=ek.shapes,
                                                         bucket_prefix=ek.bucket_prefix,
                                                         woke_prefix=ek.woke_prefix), args))

    def take_signal(self, k: QueueKeys, job_id: str, token: str, position: int, name: str, head: str,
                    until_ms: int | None, max_steps: int, max_bytes: int, now_ms: int | None = None) -> Any:
        """A wait reads its signal (wait.lua): {code, body}."""
        return self._run("wait", scriptkeys.keys("wait", k, job=k.job(job_id)),
                         (_clock(now_ms), job_id, token, position, name, head, "" if until_ms is None else until_ms,
                          max_steps, max_bytes, records.STEP_INLINE, records.wait_head(head)))

    def trim(self, k: QueueKeys, dead_ttl_ms: int, done_ttl_ms: int, limit: int, done_max: int = 1_000_000,
             now_ms: int | None = None) -> Any:
        """Returns [dead entries removed (at most ``limit``, <= 4000), the done generation]."""
        args = (_clock(now_ms), dead_ttl_ms, done_ttl_ms, min(limit, 4000), done_max)
        return self._run("trim", scriptkeys.keys("trim", k), args)

    def aside(self, key: str, wanted: str) -> int:
        """Rename ``key`` to ``<key>:corrupt`` when it holds another Redis type than
        ``wanted`` (aside.lua, after its writer was answered WRONGTYPE): 1 renamed, 0 left."""
        return int(self.call("aside", scriptkeys.keys("aside", damaged=key), (wanted,)))

    def audit(self, key: str, entry: str, most: int, max_age_ms: int, now_ms: int | None = None,
              bulk: str = "", fold_ms: int = 0, max_ids: int = 100) -> int:
        """Put ``entry`` (a JSON object, stamped here) on the audit trail ``key``, or with
        ``bulk`` replace that bulk action's entry; with ``fold_ms``, a repeat of an entry
        written less than that ago is folded into it. Returns the entries the trail holds
        (see audit.lua)."""
        args = (_clock(now_ms), entry, most, max_age_ms, bulk, fold_ms, max_ids)
        return int(self.call("audit", scriptkeys.keys("audit", audit=key), args))

    def seek_trail(self, key: str, place: tuple[int, int] | None,
                   n: int) -> tuple[int, int, tuple[int, int], list[str]]:
        """Up to ``n`` entries of audit trail ``key`` after ``place`` (an anchor's place
        number and the entries after it already shown; with no anchor, number 0, the count
        of entries left past the last one shown), or from its head; found and read in one
        call. Returns (the trail's length, the index of the first entry read, (number,
        index) of the newest numbered entry, (0, -1) if none, the entries)."""
        args: list[Any] = ["", 0, n] if place is None else [place[0], place[1], n]
        reply = self.call("seek_trail", scriptkeys.keys("seek_trail", audit=key), args)
        return int(reply[0]), int(reply[1]), (int(reply[2]), int(reply[3])), [str(e) for e in reply[4:]]

    def seek(self, key: str, pos: int, n: int, anchor: tuple[float, str] | None,
             newest_first: bool) -> tuple[int, list[tuple[str, float]]]:
        """Up to ``n`` (member, score) of sorted set ``key`` in the order read, from rank
        ``pos`` or, given ``anchor`` (score, member), from the first member after that
        position, found and read in one call; and the rank of the first one (see seek.lua)."""
        args: list[Any] = ["1" if newest_first else "0", pos, n]
        if anchor is not None:
            score = anchor[0]
            # (a whole number of ms as digits; any other score as Redis reads a float back)
            mark = str(int(score)) if math.isfinite(score) and abs(score) < 2**53 and score == int(score) else (
                ("+inf" if score > 0 else "-inf") if math.isinf(score) else repr(score))
            args += [mark, anchor[1]]
        reply = self.call("seek", scriptkeys.keys("seek", index=key), args)
        return int(reply[0]), [(reply[i], float(reply[i + 1])) for i in range(1, len(reply) - 1, 2)]

    def prune(self, key: str, k: QueueKeys, ids: Sequence[str], listed: Sequence[str]) -> int:
        """Take off list index ``key`` (delayed, sleeping or waiting) those of ``ids``
        whose job's status is none of ``listed``, in one step; how many (see prune.lua)."""
        if not ids:
            return 0
        return int(self.call("prune", scriptkeys.keys("prune", k, index=key), [len(listed), *listed, *ids]))

    def index_delayed(self, k: QueueKeys, start: int, n: int) -> tuple[int, int]:
        """Index the scheduled and retrying jobs among ``n`` ids of the scheduled set from
        rank ``start``: (the rank to go on from, -1 once walked; how many were added)
        (see index_delayed.lua)."""
        reply = self.call("index_delayed", scriptkeys.keys("index_delayed", k), [start, n])
        return int(reply[0]), int(reply[1])

    def seek_list(self, k: QueueKeys, key: str, n: int, place: tuple[Any, ...] | None, ready: bool = False,
                  pushed: int | None = None) -> tuple[tuple[Any, ...] | None, list[str], int]:
        """Up to ``n`` ids of deferred list ``key`` (of ``k``'s queue), newest first, from
        the tail or, given ``place`` (where the first id not yet shown was, that id, the
        last id shown, and for a ready list the ids shown before it, back from the one
        just before it), from just before the last id shown, found and read in one call;
        the place of the next page, None when the list is read; and the count of ids
        pushed at the end the place counts from as it stood for that place (see
        seek_list.lua), which the next call gives back as ``pushed`` (None: unknown).
        ``ready``: a ready list, newest at the head, read from the head (the place counts
        from the tail). No ids and a place: the call followed a long chain of cancelled
        ids without reaching the list, and the next call goes on from where it stopped."""
        head = list(place[:3]) if place is not None else ["", "", ""]
        args: list[Any] = [n, *head, "1" if ready else "", "" if pushed is None or place is None else pushed,
                           *((place or ())[3:] if ready else ())]
        reply = self.call("seek_list", scriptkeys.keys("seek_list", k, list=key), args)
        ids = [str(i) for i in reply[3:]]
        at, count = int(reply[0]), int(reply[2])
        if at >= 0 and not ids and place is not None:
            return (at, str(reply[1]), *place[2:]), ids, count
        if at < 0 or not ids:
            return None, ids, count
        earlier = ids[-2:-SEEK_ANCHORS - 1:-1] if ready else []
        return (at, str(reply[1]), ids[-1], *earlier), ids, count

    def seek_done(self, k: QueueKeys, key: str, n: int, left: int | None, skip: int = 0) -> tuple[int, list[str]]:
        """Up to ``n`` ids of done log ``key``, newest first, from the one ``left`` places
        from the tail (None: ``skip`` from the head, the log's first page), read in one
        call; and how many are left past them (0: the log is read; see seek_list.lua)."""
        args: list[Any] = [n, "" if left is None else left, skip, "", "2", ""]
        reply = self.call("seek_list", scriptkeys.keys("seek_list", k, list=key), args)
        return max(int(reply[0]), 0), [str(i) for i in reply[3:]]

    def lookup(self, k: QueueKeys, job_id: str, pipe: Batch | None = None, cut: int | None = None,
               read: int | None = None) -> Any:
        """[record or None, state (flat), claim or None, outcome or None] (see lookup.lua);
        given ``cut`` (bytes, a list's), the big values cut to it and a fifth element
        naming them: state values past it read whole within ``read`` bytes in all (else
        their size alone), step log entries as their summaries."""
        args = (job_id,) if cut is None else (job_id, cut, _LOOKUP_READ if read is None else read, records.STEP_INLINE,
                                                   records.LIST_STEPS)
        return self._run("lookup", records.lookup_keys(k, job_id), args, pipe)

    def statuses(self, k: QueueKeys, job_ids: Sequence[str], pipe: Batch | None = None) -> Any:
        """Each job's status alone, in order (see statuses.lua): its state's status, '' for
        a record whose state says none, '-' for neither record nor state."""
        return self._run("statuses", scriptkeys.keys("statuses", k), tuple(job_ids), pipe)

    def cancel(self, k: QueueKeys, job_id: str, retention_ms: int, now_ms: int | None = None,
               entry: str = "") -> Any:
        """[code, status] (see cancel.lua): 1 cancelled, 2 stop requested (running), 3
        claimed ahead (its worker drops it), -1 no such job, -2 ended already. ``entry``
        (JSON) goes in the job's history when the cancel takes."""
        args = (_clock(now_ms), job_id, retention_ms, entry)
        return self._run("cancel", scriptkeys.keys("cancel", k, job=k.job(job_id)), args)

    def run_now(self, k: QueueKeys, job_id: str, entry: str = "", now_ms: int | None = None) -> Any:
        """[code, status] (see run_now.lua): 1 moved to ready (the status it had), -1 no
        record (gone or done), -2 refused with the job's status. ``entry`` (JSON) goes in
        the job's history when it moves."""
        return self._run("run_now", scriptkeys.keys("run_now", k, job=k.job(job_id)), (_clock(now_ms), job_id, entry))

    def cancel_deferred(self, k: QueueKeys, list_key: str, limit: str, n: int, type_: str, after: str,
                        retention_ms: int, entry: str = "", most_bytes: int | None = None,
                        ) -> tuple[bool, str, list[str]]:
        """Cancel up to ``n`` deferred jobs (of ``type_``, '' any) of one deferred list (a
        held list, or the waiters of limit ``limit``) in one step, from just after the id
        ``after``, reading at most ``most_bytes`` of their records (at least one job; see
        cancel.lua's batch): (more to read, the next ``after``, ids cancelled)."""
        # A batch's KEYS[1] (K.job) is the list of ids, not one job's record (cancel.lua).
        args = (_clock(None), "", retention_ms, entry, n, type_, after, limit,
                "" if most_bytes is None else most_bytes)
        reply = self._run("cancel", scriptkeys.keys("cancel", k, job=list_key), args)
        return int(reply[0]) == 1, str(reply[1]), [str(i) for i in reply[2:]]

    def group(
        self, k: QueueKeys, group_id: str, members: Sequence[NewJob], *, first: bool, seal: bool, then: str,
        inline_bytes: int, keep_ms: int, pipe: Batch | None = None, now_ms: int | None = None, also: int = 0,
        listed: Sequence[str] = (),
    ) -> Any:
        """Write one chunk of a group's members (see group.lua): [code, status per member];
        ``then`` is the then-job as a JSON list (queue, 12 fields, priority), read on the first
        chunk; ``also``: members counted in but written in other partitions; ``listed``:
        member ids to append to the group's member list, in member order."""
        args: list[Any] = [_clock(now_ms), group_id, 1 if first else 0, 1 if seal else 0, then, inline_bytes,
                           keep_ms, len(members)]
        for j in members:
            args += [*_job_fields(j), j.priority]
        args.append(also)
        args += listed
        return self._run("group", scriptkeys.keys("group", k), args, pipe)

    def member_page(self, k: QueueKeys, group_id: str, start: int, limit: int, marks: str) -> Any:
        """One page of a group's members from member ``start`` (see member_page.lua):
        [next, listed, member, id, mark, ...]; ``marks``: the outcomes listed ('' all)."""
        return self._run("member_page", scriptkeys.keys("member_page", k), (group_id, start, limit, marks))

    def group_count(self, k: QueueKeys, counts: Sequence[Sequence[str]], now_ms: int | None = None) -> Any:
        """Count down members that finished in another partition (see group_count.lua):
        ``counts`` hold (group id, member index, status, outcome JSON, traceparent) each."""
        args: list[Any] = [_clock(now_ms), len(counts)]
        for c in counts:
            args += c
        return self._run("group_count", scriptkeys.keys("group_count", k), args)

    def watch(self, k: QueueKeys, job_id: str) -> Any:
        """Mark a job as waited for, so its end is published (see watch.lua): 1, or 0
        when it has no record (ended, or no such job)."""
        return self._run("watch", scriptkeys.keys("watch", k, job=k.job(job_id)), (job_id,))

    def tick(
        self, k: QueueKeys, schedule_id: str, job: NewJob, *, mode: str, tick_ms: int, digest: str,
        born_ms: int, overlap: str, missed: int, late_ms: int, now_ms: int, pipe: Batch | None = None,
        away: str = "", seen: str = "",
    ) -> Any:
        """One tick of one schedule (see lua/tick.lua): returns [code, id, status]. Durable,
        as an enqueue is. ``away``: the job's outbox entry when its keys route it to another
        partition than ``k`` (the schedule's); ``seen``: what the caller read of the last
        jobs in the queue's other partitions (schedules.last_jobs), '' on one partition."""
        _, _, args = self.enqueue_call(k, [job], now_ms, self.mark_for(k))
        keys = scriptkeys.keys("tick", k, schedule=k.schedule(schedule_id))
        args += [mode, tick_ms, digest, born_ms, overlap, missed, late_ms, job.id, away, seen]
        return self._run("tick", keys, args, pipe, durable=True)

    def adopt(
        self, k: QueueKeys, born_ms: int, tombstone_ms: int, defined: Sequence[tuple[str, str]],
        retire: Sequence[str], stale_before_ms: int = 0, now_ms: int | None = None,
        forced: int = 0,
    ) -> Any:
        """Take over or retire schedule definitions of one queue (see lua/adopt.lua); with
        ``stale_before_ms``, take back (or retire) only those whose holders went quiet before
        it. Of ``retire``, only the first ``forced`` ids (a reload's own removals) and those
        no living worker holds are retired."""
        args: list[Any] = [born_ms, tombstone_ms, len(defined)]
        for schedule_id, digest in defined:
            args += [schedule_id, digest]
        args += [len(retire), *retire, stale_before_ms, born_ms if now_ms is None else now_ms, forced]
        return self._run("adopt", scriptkeys.keys("adopt", k), args)

    def alive(self, k: QueueKeys, now_ms: int, held: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Say this worker lives for the schedules it holds (id, digest); returns those it
        no longer holds, each with the winning digest ('' removed) (see lua/alive.lua)."""
        args: list[Any] = [now_ms, len(held)]
        for schedule_id, digest in held:
            args += [schedule_id, digest]
        reply = self._run("alive", scriptkeys.keys("alive", k), args)
        return [(str(reply[i]), str(reply[i + 1])) for i in range(0, len(reply), 2)]
