"""One typed method per atomic transition, sent through redis-py.

Each script is sent by SHA (EVALSHA, loaded again on NOSCRIPT) as sources.py assembles it,
with the shared helpers of ``lua/_lib.lua`` that it uses prepended. Batch methods take sequences so one round trip
settles many jobs; a ``pipe`` argument queues a call on a Batch instead of sending it.

A single call goes out on a connection of the Scripts' own (see ``_Lanes``): redis-py's
pool checks every connection it hands out with a poll() and wraps each command in retry
and event layers, which together cost about a third of an enqueue round trip.

Durable calls (the enqueue and a schedule's tick) are followed by ``WAIT replicas
timeout`` on the same connection, sent with the script in one write, when the Scripts
were built with ``replicas`` > 0: WAIT counts the replicas that hold every write of its
own connection, so it must follow the script there, and pipelined it costs no round trip
of its own. Fewer replicas than asked raise NotReplicated, with the scripts' replies (the
script did run). With ``replicas`` = 0 no WAIT is ever sent. Every other transition (ack,
retry, claim...) stays asynchronous: one lost in a failover re-runs a job at most, which
at-least-once allows.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runner.errors import NotReplicated
from runner.store import records, routing
from runner.store.keys import QueueKeys
from runner.store.sources import NAMES, SHAS, SOURCES


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
    limits: str  # "<n> <key>" lines (see _lib.lua), '' none
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


class Hand(NamedTuple):
    """A release: ``now`` back to ready, or ``later`` once the lease lapses (the handler
    may still be running); see release.lua."""

    id: str
    token: str
    mode: str = "now"
    history: str = ""


def _followup_args(k: QueueKeys, items: Sequence[Ack | Burial]) -> list[Any]:
    """The follow-ups of a batch as ack.lua and bury.lua take them: m, then per follow-up
    its parent's index in the batch (1-based), its queue ('' this one), its 12 fields, its
    priority. A
    follow-up of this queue that routes to another of its partitions goes the way of
    another queue's (the outbox, then the relay), so its keys are met where they live."""
    follow: list[Any] = []
    m = 0
    for i, item in enumerate(items, 1):
        for f in item.followups:
            here = f.queue == k.queue and not k.draining and (
                k.partitions == 1 or routing.stays(f.job, k.partition, k.partitions))
            follow += [i, "" if here else f.queue, *_job_fields(f.job), f.job.priority]
            m += 1
    return [m, *follow]


def _member_args(items: Sequence[Ack | Burial]) -> list[Any]:
    """The group members of a batch as ack.lua and bury.lua take them: g, then per member
    its index in the batch (1-based), group id, index in the group, status, outcome."""
    out: list[Any] = []
    for i, item in enumerate(items, 1):
        if item.member is not None:
            out += [i, *item.member]
    return [len(out) // 5, *out]


def _clock(now_ms: int | None) -> int | str:
    """The scripts' clock argument: '' (the server's TIME) unless a test passes its own."""
    return "" if now_ms is None else now_ms


class Batch:
    """Script calls queued on one pipeline: one round trip, no SCRIPT EXISTS check.

    A call answered NOSCRIPT (Redis restarted or flushed its script cache) is loaded and
    sent again on its own; a call that ran is never sent twice.

    A durable call makes the batch end with one WAIT (see the module's docstring); when
    it falls short, execute raises NotReplicated carrying every reply.
    """

    def __init__(self, scripts: Scripts) -> None:
        self.scripts = scripts
        self.calls: list[tuple[str, Sequence[str], Sequence[Any], bool]] = []

    def add(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool = False) -> None:
        self.calls.append((name, keys, args, durable))

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Every call's reply, in order. With ``raise_on_error`` false, a call that failed
        after the round trip went out (an error reply, its reload cut off) has its
        exception in its place, so the calls that ran keep their answers; a failure before
        any reply was read is raised all the same."""
        if not self.calls:
            return []
        sc = self.scripts
        acked: list[int] = []
        if isinstance(sc.client, RedisCluster):
            # A cluster pipeline refuses EVALSHA; a batch holds a few script calls (one per
            # transition), each already covering many jobs, so one by one costs little.
            # Each durable call waits on its own node: WAIT counts that node's replicas.
            replies: list[Any] = []
            for i, (name, keys, args, durable) in enumerate(self.calls):
                try:
                    reply, n = sc.counted(name, keys, args, durable=durable)
                except Exception as exc:
                    if raise_on_error or i == 0:
                        raise
                    replies.append(exc)
                    continue
                replies.append(reply)
                acked += [] if n is None else [n]
            sc.confirm(acked, replies)
            return replies
        wait = sc.wait if any(c[3] for c in self.calls) else None
        cmds: list[tuple[Any, ...]] = [("EVALSHA", sc.shas[name], len(keys), *keys, *args)
                                       for name, keys, args, _ in self.calls]
        if wait is not None:
            cmds.append(wait)
        replies = sc.pipelined(cmds)
        last = replies.pop() if wait is not None else None
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                name, keys, args, durable = self.calls[i]
                try:
                    replies[i], n = sc.counted(name, keys, args, durable=durable)
                except Exception as exc:
                    if raise_on_error:
                        raise
                    replies[i] = exc
                    continue
                acked += [] if n is None else [n]
            elif isinstance(reply, Exception) and raise_on_error:
                raise reply
        if isinstance(last, Exception):  # after the scripts' own errors, which say more
            raise last
        if last is not None:
            acked.append(int(last))
        sc.confirm(acked, replies)
        return replies


class _Lanes:
    """Connections taken from the client's pool once and then kept for script calls.

    A call pops an idle one (a list op, atomic under the GIL, so threads never share a
    connection), sends, reads, and pushes it back. The pool still owns them, so closing
    the client closes them too; a connection that failed mid-call is disconnected (it may
    hold half a reply) and reconnects on its next use through its own ``connect()`` (a
    Sentinel-managed one asks Sentinel for the master there); a forked child starts
    afresh.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.idle: list[Any] = []
        self.pid = os.getpid()

    def take(self) -> Any:
        if self.pid != os.getpid():  # a fork: the parent's sockets are not ours
            self.idle, self.pid = [], os.getpid()
        try:
            conn = self.idle.pop()
        except IndexError:
            return self.pool.get_connection()
        conn.connect()  # a no-op when connected
        return conn

    def give(self, conn: Any) -> None:
        self.idle.append(conn)


class _Spin:
    """Polls a connection for its reply for up to BUDGET_S before the read that sleeps.

    A blocking read puts the thread to sleep and the reply has to wake it: on the 2-core
    VMs measured, that wake-up was most of a loopback round trip (a PING took 82-95 us
    with a blocking read, 28 us polling). A caller making one call at a time (a producer
    enqueueing job by job) waits on every round trip, so it polls for a moment first;
    the CPU spent is at most the wait it saves. When replies keep taking longer than the
    budget (a distant Redis), polling stops for the next SKIP calls and is then tried
    again. Polling only watches the socket: the read itself, and every error, are the
    connection's own, as without it."""

    BUDGET_S = 100e-6
    MISSES = 16  # in a row, before a pause
    SKIP = 500

    def __init__(self) -> None:
        self.misses = 0
        self.skip = 0

    def wait(self, conn: Any) -> None:
        # Counters shared by threads without a lock: a lost update only shifts a pause.
        if self.skip:
            self.skip -= 1
            return
        sock = getattr(conn, "_sock", None)
        if sock is None:
            return
        poller = getattr(conn, "_runner_poll", None)
        if poller is None or poller[0] is not sock:
            poller = (sock, select.poll())
            poller[1].register(sock, select.POLLIN)
            conn._runner_poll = poller
        poll = poller[1].poll
        deadline = time.perf_counter() + self.BUDGET_S
        while not poll(0):
            if time.perf_counter() > deadline:
                self.misses += 1
                if self.misses >= self.MISSES:
                    self.misses, self.skip = 0, self.SKIP
                return
        self.misses = 0


class Stream:
    """Script calls sent one after another on one connection without waiting for each
    reply, so the caller can prepare the next call while Redis runs the last; replies
    are read back in the order sent. ``read`` returns the oldest call's tag and reply.

    A call answered NOSCRIPT did not run: it is loaded and sent again on its own when its
    reply is read (after a SCRIPT FLUSH mid-stream a later call may then run first). Any
    other failure drops the connection, with the replies still owed on it, and raises;
    what those calls did is unknown, as for a single call whose reply was lost. Without
    kept connections (Redis Cluster) each call is sent and read at once.

    A durable call is followed by its own WAIT, so each reply read is confirmed by itself
    (a WAIT blocks its connection, so calls sent behind it run once it is answered); one
    that falls short raises NotReplicated from ``read``, with that call's reply.
    """

    def __init__(self, scripts: Scripts) -> None:
        self.scripts = scripts
        self.pending: deque[tuple[str, Sequence[str], Sequence[Any], Any, bool]] = deque()
        self.ready: deque[tuple[Any, Any, int | None]] = deque()
        self.conn: Any = None

    def send(self, name: str, keys: Sequence[str], args: Sequence[Any], tag: Any, durable: bool = False) -> None:
        sc = self.scripts
        if sc._lanes is None:
            self.ready.append((tag, *sc.counted(name, keys, args, durable=durable)))
            return
        if self.conn is None:
            self.conn = sc._lanes.take()
        try:
            sc._send(self.conn, name, keys, args, durable)
        except BaseException:
            self._drop()
            raise
        self.pending.append((name, keys, args, tag, durable))

    def __len__(self) -> int:
        return len(self.pending) + len(self.ready)

    def read(self) -> tuple[Any, Any]:
        if self.ready:
            tag, reply, acked = self.ready.popleft()
        else:
            tag, reply, acked = self._read_next()
        self.scripts.confirm([] if acked is None else [acked], [reply])
        return tag, reply

    def _read_next(self) -> tuple[Any, Any, int | None]:
        name, keys, args, tag, durable = self.pending.popleft()
        try:
            try:
                reply, acked = self.scripts._read(self.conn, durable)
            except NoScriptError:  # it did not run: load, run alone
                reply, acked = self.scripts.counted(name, keys, args, durable=durable)
        except ResponseError:
            self._drop()  # read whole, but the calls behind it are not the caller's to keep
            raise
        except BaseException:
            self._drop()
            raise
        if not self.pending:
            self.close()
        return tag, reply, acked

    def close(self) -> None:
        """Give the connection back; replies still owed make it unusable, so drop it."""
        if self.conn is None:
            return
        if self.pending:
            self._drop()
            return
        self.scripts._lanes.give(self.conn)  # type: ignore[union-attr]
        self.conn = None

    def _drop(self) -> None:
        self.pending.clear()
        if self.conn is not None:
            self.conn.disconnect()
            self.scripts._lanes.give(self.conn)  # type: ignore[union-attr]
            self.conn = None


class Scripts:
    """The scripts of one Redis client, sent by SHA and loaded again on NOSCRIPT.

    ``replicas`` > 0: durable calls return only once that many replicas confirmed them
    within ``replica_timeout_s`` (see the module's docstring)."""

    def __init__(self, client: Any, replicas: int = 0, replica_timeout_s: float = 1.0) -> None:
        self.client = client
        self.sources = SOURCES
        self.shas = SHAS
        pool = None if isinstance(client, RedisCluster) else getattr(client, "connection_pool", None)
        self._lanes = _Lanes(pool) if pool is not None else None
        self._spin = _Spin()
        self.replicas = replicas
        self.replica_timeout_s = replica_timeout_s
        # The command itself; None: no WAIT is sent.
        self.wait: tuple[str, int, int] | None = (
            ("WAIT", replicas, max(1, round(replica_timeout_s * 1000))) if replicas > 0 else None
        )

    def confirm(self, acked: Sequence[int], replies: Sequence[Any]) -> None:
        """Raise NotReplicated when any WAIT answered fewer replicas than asked."""
        if acked and min(acked) < self.replicas:
            raise NotReplicated(min(acked), self.replicas, self.replica_timeout_s, replies=replies)

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any], *, spin: bool = False,
             durable: bool = False) -> Any:
        """One script call. With ``spin``, wait for the reply by polling for a moment
        before sleeping on it (see _Spin): for a caller that makes one call at a time.
        With ``durable``, confirmed by the replicas (NotReplicated when it is not)."""
        reply, acked = self.counted(name, keys, args, spin=spin, durable=durable)
        self.confirm([] if acked is None else [acked], [reply])
        return reply

    def counted(self, name: str, keys: Sequence[str], args: Sequence[Any], *, spin: bool = False,
                durable: bool = False) -> tuple[Any, int | None]:
        """One script call and, when durable and WAIT is on, the replicas that confirmed it
        (None: no WAIT was sent)."""
        if self._lanes is None:
            if durable and self.wait is not None:
                return self._call_on_node(name, keys, args)
            try:
                return self.client.evalsha(self.shas[name], len(keys), *keys, *args), None
            except NoScriptError:
                self.client.script_load(self.sources[name])
                return self.client.evalsha(self.shas[name], len(keys), *keys, *args), None
        lanes = self._lanes
        conn = lanes.take()
        try:
            try:
                self._send(conn, name, keys, args, durable)
                if spin:
                    self._spin.wait(conn)
                out = self._read(conn, durable)
            except NoScriptError:  # Redis restarted or flushed its scripts: nothing ran
                conn.send_command("SCRIPT", "LOAD", self.sources[name])
                conn.read_response()
                self._send(conn, name, keys, args, durable)
                out = self._read(conn, durable)
        except ResponseError:
            lanes.give(conn)  # an error reply was read whole: the connection is in step
            raise
        except BaseException:
            conn.disconnect()
            lanes.give(conn)
            raise
        lanes.give(conn)
        return out

    def pipelined(self, cmds: Sequence[Sequence[Any]]) -> list[Any]:
        """Send commands in one write on a kept connection and read every reply; an error
        reply takes its place in the list instead of being raised (a settle batch is one
        or two script calls: redis-py's pipeline object cost more than the calls' own
        packing). Without kept connections, redis-py's pipeline."""
        if self._lanes is None:
            pipe = self.client.pipeline(transaction=False)
            for cmd in cmds:
                pipe.execute_command(*cmd)
            return list(pipe.execute(raise_on_error=False))
        lanes = self._lanes
        conn = lanes.take()
        replies: list[Any] = []
        try:
            conn.send_packed_command(conn.pack_commands(cmds))
            for _ in cmds:
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # read whole: the connection stays in step
                    replies.append(exc)
        except BaseException:
            conn.disconnect()  # it may owe replies
            lanes.give(conn)
            raise
        lanes.give(conn)
        return replies

    def _send(self, conn: Any, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool) -> None:
        """The EVALSHA, and the WAIT behind it when durable, in one write."""
        cmd = ("EVALSHA", self.shas[name], len(keys), *keys, *args)
        if durable and self.wait is not None:
            conn.send_packed_command(conn.pack_commands([cmd, self.wait]))
        else:
            conn.send_command(*cmd)

    def _read(self, conn: Any, durable: bool) -> tuple[Any, int | None]:
        """The script's reply and, when a WAIT followed it, WAIT's count. An error reply is
        raised only once both are read, so the connection stays in step."""
        if not (durable and self.wait is not None):
            return conn.read_response(), None
        try:
            reply = conn.read_response()
        except ResponseError:
            # The script's error says more (READONLY on a replica, where WAIT errs too).
            with contextlib.suppress(ResponseError):
                conn.read_response()
            raise
        return reply, int(conn.read_response())

    def _call_on_node(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, int]:
        """A durable call on Redis Cluster: the script and its WAIT pipelined on one
        connection of the master that holds the slot (RedisCluster would send each on a
        connection of its choosing, and a WAIT elsewhere confirms nothing)."""
        cmd = ("EVALSHA", self.shas[name], len(keys), *keys, *args)
        assert self.wait is not None
        for attempt in range(3):
            node = self.client.get_node_from_key(keys[0])
            pipe = node.redis_connection.pipeline(transaction=False)
            pipe.execute_command(*cmd)
            pipe.execute_command(*self.wait)
            try:
                reply, acked = pipe.execute(raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError):
                # The master is gone (killed, or failing over). RedisCluster learns a new
                # layout after its own commands fail; this call bypasses it, so it asks
                # itself, or it would keep sending to the dead master after the promotion.
                with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                    self.client.nodes_manager.initialize()
                if attempt < 2 and self.client.get_node_from_key(keys[0]) is not node:
                    continue  # a new master holds the slot: send it there
                raise
            if isinstance(reply, NoScriptError):
                node.redis_connection.script_load(self.sources[name])
                continue
            if isinstance(reply, (MovedError, AskError)) and attempt < 2:
                # The slot moved (a failover, a resharding): nothing ran; learn the layout again.
                self.client.nodes_manager.initialize()
                continue
            if isinstance(reply, (MovedError, AskError)):
                raise TryAgainError(str(reply))  # type: ignore[no-untyped-call]
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
            return reply, int(acked)
        raise TryAgainError(f"{name}: the slot of {keys[0]!r} kept moving")  # type: ignore[no-untyped-call]

    def prepare(self) -> None:
        """Assemble every script now (a process that runs them all, before its first job)."""
        for name in NAMES:
            self.shas[name]

    def batch(self) -> Batch:
        return Batch(self)

    def stream(self) -> Stream:
        return Stream(self)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any], pipe: Batch | None = None,
             spin: bool = False, durable: bool = False) -> Any:
        if pipe is not None:
            pipe.add(name, keys, args, durable)
            return None
        return self.call(name, keys, args, spin=spin, durable=durable)

    def enqueue(
        self, k: QueueKeys, jobs: Sequence[NewJob], pipe: Batch | None = None, spin: bool = False,
        now_ms: int | None = None,
    ) -> Any:
        """Durable: with replicas set, returns once they hold the jobs (else NotReplicated)."""
        return self._run(*self.enqueue_call(k, jobs, now_ms), pipe, spin, durable=True)

    @staticmethod
    def enqueue_call(
        k: QueueKeys, jobs: Sequence[NewJob], now_ms: int | None = None
    ) -> tuple[str, tuple[str, ...], list[Any]]:
        """The enqueue script's name, keys and arguments (for a Stream)."""
        args: list[Any] = [_clock(now_ms), len(jobs)]
        for j in jobs:
            # The 12 job fields, then the priority: NewJob's own order (see
            # test_a_new_job_is_its_enqueue_fields_in_order), so the tuple goes as it is.
            args += j
        keys = (k.ready, k.scheduled, k.notify, k.stats, k.job_prefix, k.idem_prefix, k.claims, k.census,
                k.prio)
        return "enqueue", keys, args

    def claim(
        self, k: QueueKeys, *, n: int, start: int, lease_ms: int, token_base: str, dead_ttl_ms: int,
        done_ttl_ms: int, done_max: int = 1_000_000, pipe: Batch | None = None, now_ms: int | None = None,
        max_ages: str = "",
    ) -> Any:
        """Returns [server time ms, held back (0|1), then CLAIM_FIELDS values per claimed job]
        (see claim.lua). ``max_ages``: "<type>=<ms> ..." of the functions with a MAX_AGE."""
        keys = (k.ready, k.leases, k.scheduled, k.dead, k.stats, k.job_prefix, k.lim_prefix,
                k.idem_prefix, k.claims, k.done_meta, k.limwait, k.notify, k.done_prefix, k.census,
                k.paused, k.held_prefix, k.prio, k.ended, k.cancelled, k.group_prefix, k.outbox)
        args = (_clock(now_ms), n, start, lease_ms, token_base, dead_ttl_ms, done_ttl_ms, done_max, max_ages)
        return self._run("claim", keys, args, pipe)

    def start(
        self, k: QueueKeys, owned: Sequence[tuple[str, str]], pipe: Batch | None = None,
        now_ms: int | None = None,
    ) -> Any:
        args: list[Any] = [_clock(now_ms), len(owned)]
        for job_id, token in owned:
            args += [job_id, token]
        return self._run("start", (k.claims,), args, pipe)

    def renew(
        self, k: QueueKeys, owned: Sequence[tuple[str, str] | tuple[str, str, str]], lease_ms: int,
        pipe: Batch | None = None, now_ms: int | None = None,
    ) -> Any:
        """``owned``: (id, token) or (id, token, progress JSON) per job (see renew.lua)."""
        args: list[Any] = [_clock(now_ms), lease_ms, len(owned)]
        for item in owned:
            args += [item[0], item[1], item[2] if len(item) > 2 else ""]
        return self._run("renew", (k.leases, k.job_prefix, k.lim_prefix, k.claims), args, pipe)

    def ack(
        self, k: QueueKeys, acks: Sequence[Ack], idem_ttl_ms: int, done_ttl_ms: int = 86_400_000,
        done_max: int = 1_000_000, pipe: Batch | None = None, now_ms: int | None = None, totals: str = "",
    ) -> Any:
        """``totals``: every ack's stats fields summed ("field=N ..."), counted at once when
        the whole batch lands (see ack.lua); '' counts each ack's own."""
        args: list[Any] = [_clock(now_ms), idem_ttl_ms, done_ttl_ms, done_max, len(acks), totals]
        for a in acks:
            args += a[:6]  # id, token, result, census, stats, keep_ms: Ack's first six fields
        args += _followup_args(k, acks)
        args += _member_args(acks)
        keys = (k.leases, k.stats, k.job_prefix, k.lim_prefix, k.idem_prefix, k.tput_prefix, k.dead,
                k.ready, k.notify, k.claims, k.done_meta, k.done_prefix, k.limwait, k.census, k.res_prefix,
                k.scheduled, k.outbox, k.ended, k.group_prefix, k.prio)
        return self._run("ack", keys, args, pipe)

    def relay(self, k: QueueKeys, entries: Sequence[Sequence[Any]], now_ms: int | None = None) -> Any:
        """Place follow-ups from another queue's outbox into queue ``k``, each once by id:
        ``entries`` hold the 12 enqueue fields and the priority each (see relay.lua)."""
        args: list[Any] = [_clock(now_ms), len(entries)]
        for e in entries:
            args += list(e)
        keys = (k.ready, k.scheduled, k.notify, k.stats, k.job_prefix, k.idem_prefix, k.claims, k.census,
                k.done_meta, k.done_prefix, k.prio)
        return self._run("relay", keys, args)

    def retry(self, k: QueueKeys, items: Sequence[RetryAt], pipe: Batch | None = None,
              now_ms: int | None = None) -> Any:
        args: list[Any] = [_clock(now_ms), len(items)]
        for r in items:
            mode = (3 if r.last else 2) if r.rate_limited else 1 if r.refund else 0
            args += [r.id, r.token, r.delay_ms, r.error, r.history, mode, r.stats]
        keys = (k.leases, k.scheduled, k.stats, k.job_prefix, k.lim_prefix, k.ready, k.notify,
                k.claims, k.limwait, k.prio)
        return self._run("retry", keys, args, pipe)

    def bury(
        self, k: QueueKeys, items: Sequence[Burial], dead_ttl_ms: int, pipe: Batch | None = None,
        now_ms: int | None = None,
    ) -> Any:
        args: list[Any] = [_clock(now_ms), dead_ttl_ms, len(items)]
        for b in items:
            args += [b.id, b.token, b.reason, b.error, b.history, 1 if b.refund else 0, b.stats]
        args += _followup_args(k, items)
        args += _member_args(items)
        keys = (k.leases, k.dead, k.stats, k.job_prefix, k.lim_prefix, k.idem_prefix, k.ready, k.notify,
                k.claims, k.limwait, k.scheduled, k.census, k.done_meta, k.done_prefix, k.outbox, k.ended,
                k.cancelled, k.group_prefix, k.prio)
        return self._run("bury", keys, args, pipe)

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
        keys = (k.leases, k.ready, k.notify, k.job_prefix, k.lim_prefix, k.claims, k.limwait,
                k.idem_prefix, k.census, k.cancelled, k.ended, k.group_prefix, k.scheduled, k.stats, k.done_meta,
                k.done_prefix, k.outbox, k.prio)
        return self._run("release", keys, args, pipe)

    def reclaim(self, k: QueueKeys, limit: int, dead_ttl_ms: int, now_ms: int | None = None) -> Any:
        keys = (k.leases, k.ready, k.dead, k.notify, k.stats, k.job_prefix, k.lim_prefix, k.scheduled,
                k.claims, k.done_meta, k.limwait, k.idem_prefix, k.ended, k.group_prefix, k.done_prefix, k.census,
                k.outbox, k.lost, k.prio)
        return self._run("reclaim", keys, (_clock(now_ms), limit, dead_ttl_ms))

    def promote(self, k: QueueKeys, limit: int, now_ms: int | None = None) -> Any:
        """Returns [jobs moved, ms until the next due job or sweep (-1: none)]."""
        keys = (k.scheduled, k.ready, k.notify, k.job_prefix, k.lim_prefix, k.limwait, k.prio)
        return self._run("promote", keys, (_clock(now_ms), limit))

    def resume(self, k: QueueKeys, function: str | None, first: bool, limit: int = 10_000) -> Any:
        """Lift a pause (a queue's, or one function's: None is the queue) and put back up to
        ``limit`` held jobs; returns [moved, still held] (see resume.lua)."""
        field = "queue" if function is None else f"fn:{function}"
        # A queue's resume holds no list: the bare held: prefix names none (held lists are
        # held:<type>), so the script finds it empty, and unlike '' it is in the queue's
        # slot, which Redis Cluster requires of every key.
        keys = (k.paused, k.ready, k.notify, k.job_prefix, k.held(function) if function is not None else k.held_prefix,
                k.prio)
        return self._run("resume", keys, (field, 1 if first else 0, limit))

    def requeue(
        self, k: QueueKeys, job_id: str, payload: str = "", version: str = "", payload_hash: str = "",
        history: str = "", now_ms: int | None = None,
    ) -> Any:
        keys = (k.dead, k.ready, k.notify, k.job(job_id), k.idem_prefix, k.census, k.prio)
        return self._run("requeue", keys, (_clock(now_ms), job_id, payload, version, payload_hash, history))

    def remove(self, k: QueueKeys, job_id: str) -> Any:
        return self._run("remove", (k.dead, k.job(job_id), k.idem_prefix, k.census), (job_id,))

    def checkpoint(self, k: QueueKeys, job_id: str, token: str, data: str) -> Any:
        return self._run("checkpoint", (k.job(job_id), k.claims), (token, data, job_id))

    def trim(self, k: QueueKeys, dead_ttl_ms: int, done_ttl_ms: int, limit: int, done_max: int = 1_000_000,
             now_ms: int | None = None) -> Any:
        """Returns [dead entries removed (at most ``limit``, <= 4000), the done generation]."""
        keys = (k.dead, k.done_meta, k.done_prefix, k.job_prefix, k.census, k.cancelled)
        return self._run("trim", keys, (_clock(now_ms), dead_ttl_ms, done_ttl_ms, min(limit, 4000), done_max))

    def lookup(self, k: QueueKeys, job_id: str, pipe: Batch | None = None) -> Any:
        """[record or None, state (flat), claim or None, outcome or None] (see lookup.lua)."""
        return self._run("lookup", records.lookup_keys(k, job_id), (job_id,), pipe)

    def cancel(self, k: QueueKeys, job_id: str, retention_ms: int, now_ms: int | None = None,
               entry: str = "") -> Any:
        """[code, status] (see cancel.lua): 1 cancelled, 2 stop requested (running), 3
        claimed ahead (its worker drops it), -1 no such job, -2 ended already. ``entry``
        (JSON) goes in the job's history when the cancel takes."""
        keys = (k.job(job_id), k.claims, k.leases, k.scheduled, k.done_meta, k.done_prefix, k.idem_prefix,
                k.census, k.ended, k.cancelled, k.cancels, k.group_prefix, k.job_prefix,
                k.ready, k.notify, k.stats, k.outbox, k.prio, k.lim_prefix, k.limwait)
        return self._run("cancel", keys, (_clock(now_ms), job_id, retention_ms, entry))

    def group(
        self, k: QueueKeys, group_id: str, members: Sequence[NewJob], *, first: bool, seal: bool, then: str,
        inline_bytes: int, keep_ms: int, pipe: Batch | None = None, now_ms: int | None = None,
    ) -> Any:
        """Write one chunk of a group's members (see group.lua): [code, status per member];
        ``then`` is the then-job as a JSON list (queue, 12 fields, priority), read on the first
        chunk."""
        args: list[Any] = [_clock(now_ms), group_id, 1 if first else 0, 1 if seal else 0, then, inline_bytes,
                           keep_ms, len(members)]
        for j in members:
            args += [*_job_fields(j), j.priority]
        keys = (k.ready, k.scheduled, k.notify, k.stats, k.job_prefix, k.idem_prefix, k.claims, k.census, k.prio,
                k.group_prefix, k.done_meta, k.done_prefix, k.outbox)
        return self._run("group", keys, args, pipe)

    def watch(self, k: QueueKeys, job_id: str) -> Any:
        """Mark a job as waited for, so its end is published (see watch.lua): 1, or 0
        when it has no record (ended, or no such job)."""
        return self._run("watch", (k.job(job_id), k.claims), (job_id,))

    def tick(
        self, k: QueueKeys, schedule_id: str, job: NewJob, *, mode: str, tick_ms: int, digest: str,
        born_ms: int, overlap: str, missed: int, late_ms: int, now_ms: int, pipe: Batch | None = None,
    ) -> Any:
        """One tick of one schedule (see lua/tick.lua): returns [code, id, status]. Durable,
        as an enqueue is."""
        _, keys, args = self.enqueue_call(k, [job], now_ms)
        keys = (*keys, k.schedule(schedule_id), k.job_prefix, k.claims, k.done_meta)
        args += [mode, tick_ms, digest, born_ms, overlap, missed, late_ms, job.id]
        return self._run("tick", keys, args, pipe, durable=True)

    def adopt(
        self, k: QueueKeys, born_ms: int, tombstone_ms: int, defined: Sequence[tuple[str, str]],
        retire: Sequence[str], stale_before_ms: int = 0, now_ms: int | None = None,
    ) -> Any:
        """Take over or retire schedule definitions of one queue (see lua/adopt.lua); with
        ``stale_before_ms``, take back only those whose holders went quiet before it."""
        args: list[Any] = [born_ms, tombstone_ms, len(defined)]
        for schedule_id, digest in defined:
            args += [schedule_id, digest]
        args += [len(retire), *retire, stale_before_ms, born_ms if now_ms is None else now_ms]
        return self._run("adopt", (k.schedules, k.schedule_prefix, k.schedules_seen), args)

    def alive(self, k: QueueKeys, now_ms: int, held: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Say this worker lives for the schedules it holds (id, digest); returns those it
        no longer holds, each with the winning digest ('' removed) (see lua/alive.lua)."""
        args: list[Any] = [now_ms, len(held)]
        for schedule_id, digest in held:
            args += [schedule_id, digest]
        reply = self._run("alive", (k.schedule_prefix, k.schedules_seen), args)
        return [(str(reply[i]), str(reply[i + 1])) for i in range(0, len(reply), 2)]
