"""The script transport: the one place a script call meets a connection.

It runs a script by SHA on a connection, loads it again when Redis answers NOSCRIPT (a
restart or a SCRIPT FLUSH: the call ran nowhere, so it is sent again), routes a call to the
master of its partition's slot on Redis Cluster, and waits for replicas behind a durable
call. Every way runner sends a script goes through here: redis-py's client (with the
connections the Transport keeps and their spin read), the raw Link (link.py), and the
event-loop link (aiolink.py) that the client's async path and the web fast lane use.
scripts.py builds the calls, one typed method per transition, on top of it.

A single call goes out on a connection of the Transport's own (see ``_Lanes``): redis-py's
pool checks every connection it hands out with a poll() and wraps each command in retry
and event layers, which together cost about a third of an enqueue round trip.

Durable calls (the scripts in DURABLE: an enqueue, an event's jobs, a group's members, a
schedule's tick, an outbox's placement) are followed by ``WAIT replicas timeout`` on the same connection, sent
with the script in one write, when the Transport
was built with ``replicas`` > 0: WAIT counts the replicas that hold every write of its
own connection, so it must follow the script there, and pipelined it costs no round trip
of its own. Fewer replicas than asked raise NotReplicated, with the scripts' replies (the
script did run). With ``replicas`` = 0 no WAIT is ever sent. A worker's claims and
settlements (CHECKED) carry their WAIT too, so that an answer from a master being replaced
is not acted on (see CHECKED). Every other transition stays asynchronous.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from runner.errors import NotReplicated, RedisUnavailable
from runner.store import link as link_mod
from runner.store import records

if TYPE_CHECKING:  # (loaded on first use: only a cluster client's round trips need them)
    from concurrent.futures import Future, ThreadPoolExecutor

    from redis.cluster import RedisCluster
    from redis.exceptions import (
        AskError,
        MovedError,
        NoScriptError,
        RedisClusterException,
        ResponseError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from runner.store.aiolink import AsyncLink
    from runner.store.connection import NodeStalled, RedisBusy, Unconfirmed
    from runner.store.nodecalls import NodeCalls
    from runner.store.sources import NAMES, SHAS, SOURCES


def _import_redis() -> None:
    """redis-py and the assembled scripts, bound here when the first Transport is built: a
    Link's batches (LinkScripts, a ``reader`` runtime's reads) and a CLI command that runs
    no script import neither."""
    if "NoScriptError" in globals():
        return
    from redis.cluster import RedisCluster
    from redis.exceptions import (
        AskError,
        MovedError,
        NoScriptError,
        RedisClusterException,
        ResponseError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from runner.store.connection import NodeStalled, RedisBusy, Unconfirmed
    from runner.store.sources import NAMES, SHAS, SOURCES

    globals().update(Unconfirmed=Unconfirmed, RedisBusy=RedisBusy, RedisCluster=RedisCluster, AskError=AskError,
                     MovedError=MovedError,
                     ResponseError=ResponseError, RedisClusterException=RedisClusterException,
                     TryAgainError=TryAgainError,
                     RedisConnectionError=RedisConnectionError, RedisTimeoutError=RedisTimeoutError,
                     NAMES=NAMES, SHAS=SHAS, SOURCES=SOURCES, NoScriptError=NoScriptError,
                     NodeStalled=NodeStalled)


# The scripts that write jobs a producer is answered for (an enqueue, an event's jobs, a
# group's members, a schedule's tick): each call of one is durable, whoever sends it and
# however (a single call, a Batch, a Stream, a cluster node's lane), so no path that
# answers "accepted" skips the WAIT. The relay too: it places an outbox's jobs (an event's
# or a group's for another queue or master, a tick's routed away), and the entry leaves
# its replicated outbox only once the job it placed is confirmed. Every other call stays
# asynchronous.
DURABLE = frozenset({"enqueue", "emit", "group", "tick", "relay"})
# The durable calls a worker may give up on a stalled master (Transport.node_wait_s) all
# the same, as what they write is fenced: a placement by its job's id (relay.lua places
# each id once, and its entry stays in the outbox until a placement is confirmed), a
# tick by the schedule's state (tick.lua refuses a tick handled already). One given up
# that ran after all is found done by the next try, never written twice.
FENCED = frozenset({"relay", "tick"})
# A worker's claims and settlements, also followed by their WAIT when ``replicas`` > 0:
# a master Redis Cluster or Sentinel has replaced, stalled and then resumed, answers the
# calls it had in its socket before it hears of its demotion, and its resync wipes what
# they wrote. Believed, a claim ran its jobs while they stayed ready on the new master
# (claimed again: the same attempt twice at once), and an ack wiped let the lease lapse
# (the job ran again). Their WAIT answers UNBLOCKED there (or counts too few replicas):
# such a call raises Unconfirmed (or, in a Batch, is listed in ``short``) and its answer
# is not acted on. Each is fenced by its claim's token, so unlike DURABLE calls they may
# be given up on a stalled master (and one answered late is handed back or sent again).
# Sent with the script in one write: a round trip each still; none with ``replicas`` = 0.
CHECKED = frozenset({"claim", "start", "ack", "retry", "bury", "release", "suspend"})
# Calls a split round trip may send again after its connection was lost (Transport._split):
# each is fenced by its claim's token, so one whose write went out and whose reply was lost
# is refused if it had run. An enqueue is not (a job without an idempotency key would be
# written twice), nor a claim (a job leased to nobody who knows it). A run's log lines
# (joblog) go with its settlement, fenced alike: sent again before their run's end landed,
# they may show twice in its log, the only cost.
RESUMABLE = frozenset({"start", "ack", "retry", "bury", "release", "suspend", "joblog"})

# The most bytes of commands one write of ``pipelined`` carries (one command whatever its
# size): Redis goes on reading a client it holds back (CLIENT PAUSE WRITE, a failover's
# pause), and once it lets the client go it runs every command of its query buffer back
# to back, every other client waiting. 160 settlements of 1 MB parked through an outage
# and sent again in one write into a paused server held a PING 0.7 s (21 calls of 8 MiB);
# in writes of this bound, each sent once the last is answered, one call is waiting there.
WRITE_BYTES = records.SCRIPT_BYTES
# The most lost connections one split round trip (Transport._split) goes on after, each
# on a fresh connection that connects: a server that takes connections and drops them
# again costs a few connects, then the caller's own retry with its backoff.
RESUMES = 3
# A short wait (Transport.waiting) stretches to this many times a master's recent round
# trip: a master that answers in 0.4 s is slow, and waited for; one silent for that long
# past its usual answer is stalled.
SLOW_FACTOR = 4.0
# Redis Cluster: the longest an enqueue waits for its master (Transport.enqueue_wait_s),
# as a worker's calls wait (its node wait, at most 2 s), plus the WAIT's own timeout.
ENQUEUE_WAIT_S = 2.0
# Redis Cluster: the longest a read of a job or a page (client/inspecting.py) waits for a
# master (Transport.waiting: longer for one whose recent round trips are slow) before it
# answers from the others and says which partitions it left out.
READ_WAIT_S = 2.0
RTT_WEIGHT = 0.3  # of a call's time in its master's moving average of round trips
# Redis Cluster: while a master is marked stalled (NodeLanes), the layout is read again
# from a master that answers at most this often (NodeLanes.relearn), so a replica the
# cluster promoted in its place is learnt within about that long, and a plain stall costs
# one CLUSTER SLOTS this often per process.
RELEARN_S = 1.0
# How long a call that finds such a read due (or under way) waits for it before it routes
# by the layout it has (the read asks the masters that answer first: a round trip).
RELEARN_WAIT_S = 0.5
# How long a master marked stalled that answered its PING with BUSY (a long script) is
# left before it is asked again: it answers BUSY at once, and stays marked meanwhile.
BUSY_PROBE_S = 0.2


def _eval(source: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    """A call answered NOSCRIPT sent again with its source (EVAL), behind a SCRIPT LOAD in
    the same write. Sending it again is safe for every script, idempotent or not: Redis
    answers NOSCRIPT when it looks the SHA up, before it runs a line, so the call ran
    nowhere. EVAL cannot answer NOSCRIPT, so the call runs on this one re-send even while
    another client flushes the script cache over and over (a load and an EVALSHA after it
    could each time be parted by a flush: a SCRIPT FLUSH every 2 ms did so six times in a
    row): there is no second try to bound. Every path's re-send goes by source at once,
    never by SHA again. The load keeps the script for the calls after it (a script only
    EVAL loaded may be evicted by Redis 7.4 and later)."""
    return ("EVAL", source, len(keys), *keys, *args)


def demoted(reply: Any) -> bool:
    """Whether WAIT's answer says its master is a replica now: UNBLOCKED (demoted while
    WAIT blocked) or WAIT refused by a replica (demoted before it came)."""
    text = str(reply)
    return text.startswith("UNBLOCKED") or text.startswith("WAIT cannot be used with replica")


def _acked(reply: Any) -> int:
    """WAIT's count, or its error reply raised. UNBLOCKED means the master was turned into
    a replica while WAIT blocked (a failover, a CLUSTER FAILOVER TAKEOVER): the write it
    waited for may be wiped by the master's resync, so this is an outage whose outcome is
    unknown, as a connection lost mid-call (raised at once: the new master is not asked
    for a WAIT on a write it may never have seen). WAIT refused by a replica is the same
    outage: the master was demoted between the write and its WAIT."""
    if isinstance(reply, Exception):
        if demoted(reply):
            raise RedisConnectionError(
                f"the master was demoted to a replica while the write waited for its replicas "
                f"({reply}): the write may be lost with it") from reply
        raise reply
    return int(reply)


def _command_bytes(cmd: Sequence[Any]) -> int:
    """About the bytes a command takes on the wire: its words' lengths."""
    return sum(len(w) for w in cmd if isinstance(w, (str, bytes)))


def _noscript(reply: Any) -> bool:
    """A reply of the raw links (link.py, aiolink.py) saying Redis lacks the script."""
    return isinstance(reply, link_mod.ReplyError) and reply.code == "NOSCRIPT"


class ScriptCall(NamedTuple):
    """One script call, to send with others in one round trip (Transport.gather)."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]

_MISSING = object()  # a reply not read (see Transport.behind)
T = TypeVar("T")
R = TypeVar("R")


class Batch:
    """Script calls queued on one pipeline: one round trip, no SCRIPT EXISTS check.

    A call answered NOSCRIPT (Redis restarted or flushed its script cache) is loaded and
    sent again on its own; a call that ran is never sent twice.

    A durable call makes the batch end with one WAIT (see the module's docstring); when
    it falls short, execute raises NotReplicated carrying every reply.
    """

    def __init__(self, scripts: Transport) -> None:
        self.scripts = scripts
        self.calls: list[tuple[str, Sequence[str], Sequence[Any], bool]] = []
        # After execute: the indexes of the durable calls whose WAIT fell short (on Redis
        # Cluster each call's own; on one server the one WAIT speaks for them all).
        self.short: list[int] = []

    def add(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool = False) -> None:
        self.calls.append((name, keys, args, durable or name in DURABLE or name in CHECKED))

    def launch(self) -> tuple[str, Future[list[Any]]] | None:
        """Redis Cluster with a node wait: the calls, all to one master and none durable,
        sent in order on a thread of the pool and not waited for (NodeLanes.launch): their
        master (host:port) and the future of their replies, an error in place of a call
        that failed. The caller waits as long as it likes, and past its node wait says so
        (NodeLanes.give_up). NodeStalled at once while that master is stalled. None where
        calls are not bounded (one server, no node wait) or one is durable: execute. CHECKED
        calls go so (fenced), with their WAIT: ``short`` lists, once the future is done,
        those it did not confirm."""
        sc = self.scripts
        if sc.one_server or sc.node_wait_s is None or not self.calls or any(
                c[3] and c[0] not in CHECKED for c in self.calls):
            return None
        nodes = {sc.nodes.node(keys) for _, keys, _, _ in self.calls}
        if len(nodes) != 1:
            return None
        node = nodes.pop()
        calls = list(self.calls)

        def run() -> list[Any]:
            out: list[tuple[Any, int | None] | BaseException] = [None] * len(calls)  # type: ignore[list-item]
            sc.nodes._run(calls, list(range(len(calls))), out)  # (each call as execute sends it)
            self.short = [i for i, got in enumerate(out) if not isinstance(got, BaseException)
                          and got[1] is not None and got[1] < sc.replicas]
            return [got if isinstance(got, BaseException) else got[0] for got in out]

        return node, sc.nodes.launch(node, run)

    def execute(self, raise_on_error: bool = True, confirm: bool = True) -> list[Any]:
        """Every call's reply, in order. With ``raise_on_error`` false, a call that failed
        after the round trip went out (an error reply, its reload cut off) has its
        exception in its place, so the calls that ran keep their answers; a failure before
        any reply was read is raised all the same. With ``confirm`` false, a WAIT short of
        its replicas raises nothing: ``short`` lists the calls it did not confirm."""
        if not self.calls:
            return []
        sc = self.scripts
        acked: list[int] = []
        if isinstance(sc.client, RedisCluster):
            # A cluster pipeline refuses EVALSHA: each call goes on its own, the calls to
            # different masters at once (NodeLanes), so a master slow to answer (a WAIT
            # short of replicas) delays its own calls only. Each durable call waits on its
            # own node: WAIT counts that node's replicas.
            if len(self.calls) == 1:
                name, keys, args, durable = self.calls[0]
                reply, n = sc.counted(name, keys, args, durable=durable)
                self.short = [0] if n is not None and n < sc.replicas else []
                if confirm:
                    sc.confirm([] if n is None else [n], [reply])
                return [reply]
            self.short = []
            replies: list[Any] = []
            first: BaseException | None = None
            for got in sc.nodes.send(self.calls):
                if isinstance(got, BaseException):
                    # Each call went on its own: one that failed (even the first) tells
                    # nothing of the others, which keep their answers.
                    if raise_on_error and first is None:
                        first = got
                    replies.append(got)
                    continue
                reply, n = got
                replies.append(reply)
                acked += [] if n is None else [n]
                if n is not None and n < sc.replicas:
                    self.short.append(len(replies) - 1)
            if first is not None:  # (raised once every call is answered: none is left in flight)
                raise first
            if confirm:
                sc.confirm(acked, replies)
            return replies
        wait = sc.wait if any(c[3] for c in self.calls) else None
        # The calls run in order, and a later one may count on an earlier one having run
        # (a settlement's log lines before its end). A call answered NOSCRIPT is sent
        # again after the others ran, so a script not known loaded on the server is loaded
        # ahead of the calls, in the same write.
        fresh = sorted({name for name, *_ in self.calls} - sc.loaded)
        cmds: list[tuple[Any, ...]] = [("SCRIPT", "LOAD", sc.sources[name]) for name in fresh]
        cmds += [("EVALSHA", sc.shas[name], len(keys), *keys, *args) for name, keys, args, _ in self.calls]
        if wait is not None:
            cmds.append(wait)
        try:
            replies = sc.pipelined(cmds, resumable=all(name in RESUMABLE for name, *_ in self.calls))
        except BaseException:
            sc.loaded.clear()  # a restart or a failover may come with it: nothing is known loaded
            raise
        loads, replies = replies[:len(fresh)], replies[len(fresh):]
        if not any(isinstance(r, Exception) for r in loads):
            sc.loaded.update(fresh)
        last = replies.pop() if wait is not None else None
        failed: Exception | None = None
        resent: list[int] = []  # (calls sent again by source whose own WAIT fell short)
        if any(isinstance(r, NoScriptError) for r in replies):
            sc.loaded.clear()  # flushed since they were loaded: load each again before its next batch
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError):
                # Sent again alone once loaded; every such call is sent, even past one that
                # fails, as the pipelined calls all ran: the error is raised at the end.
                name, keys, args, durable = self.calls[i]
                try:
                    replies[i], n = sc.counted(name, keys, args, durable=durable, by_source=True)
                except Exception as exc:
                    if raise_on_error and not isinstance(exc, ResponseError):
                        raise  # an outage: the calls after it would meet it too
                    replies[i] = exc
                    failed = failed or exc
                    continue
                acked += [] if n is None else [n]
                if n is not None and n < sc.replicas:
                    resent.append(i)
            elif isinstance(reply, Exception):
                failed = failed or reply
        if failed is not None and raise_on_error:
            raise failed
        self.short = resent
        if last is not None:  # (its error raised after the scripts' own, which say more)
            acked.append(_acked(last))
            if acked[-1] < sc.replicas:
                self.short = [i for i, c in enumerate(self.calls) if c[3]]
        if confirm:
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

    def take(self, deadline: float | None = None) -> Any:
        """An idle connection, connected. ``deadline`` (time.monotonic()): a connection
        to be made is made by then, its handshake's replies included, or TimeoutError
        (nothing sent; the connection is kept for the next call); without it the
        connection's own timeouts apply."""
        if self.pid != os.getpid():  # a fork: the parent's sockets are not ours
            self.idle, self.pid = [], os.getpid()
        try:
            conn = self.idle.pop()
        except IndexError:
            if deadline is None:
                return self.pool.get_connection()
            conn = self._made()
        if _closed(conn):
            # Closed while it idled (a Redis restart, a failover, an idle timeout): opened
            # again here, before anything is sent, so no call fails on it (the pool's own
            # check on handing out a connection, which these kept ones skip) and none is
            # sent twice.
            conn.disconnect()
        if deadline is None:
            conn.connect()  # a no-op when connected
            return conn
        try:
            _connect_by(conn, deadline)
        except BaseException:
            conn.disconnect()
            self.idle.append(conn)
            raise
        return conn

    def _made(self) -> Any:
        """A connection of the pool's, not yet connected (the first half of the pool's
        get_connection, whose connect would wait out the connection's own timeouts)."""
        pool = self.pool
        with pool._lock:
            try:
                conn = pool._available_connections.pop()
            except IndexError:
                conn = pool.make_connection()
            pool._in_use_connections.add(conn)  # (the pool's still: closing it closes this)
        return conn

    def give(self, conn: Any) -> None:
        self.idle.append(conn)


def _connect_by(conn: Any, deadline: float) -> None:
    """``conn.connect()`` (a no-op when connected) within ``deadline``: the TCP connect
    and each reply of the handshake (CLIENT SETNAME, AUTH, its health check's PING) read
    within what is left, and no retry. A master stopped with its sockets open accepts the
    connect and answers nothing, so the handshake would wait out the socket timeout, and
    redis-py's retry would wait it out again."""
    if conn._sock is not None:
        return
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    read = conn.read_response

    def read_by(*args: Any, **kwargs: Any) -> Any:
        if conn._sock is not None:
            conn._sock.settimeout(max(0.001, deadline - time.monotonic()))
        return read(*args, **kwargs)

    kept = conn.socket_connect_timeout, conn.retry
    conn.socket_connect_timeout = max(0.001, deadline - time.monotonic())
    conn.retry = Retry(NoBackoff(), 0)
    conn.read_response = read_by  # (the handshake reads through the instance)
    try:
        conn.connect()
    finally:
        del conn.read_response
        conn.socket_connect_timeout, conn.retry = kept
        if conn._sock is not None:
            conn._sock.settimeout(conn.socket_timeout)


def _known_id(conn: Any) -> int | None:
    """The server's id of a kept connection, as read on its current socket (None: not
    read yet there; a reconnect makes a new one; 0: the server would not say)."""
    known = getattr(conn, "_runner_id", None)
    return known[1] if known is not None and known[0] is getattr(conn, "_sock", None) else None


def _read_id(conn: Any) -> int:
    """Read the reply of the CLIENT ID sent first on ``conn``, and keep it for its socket."""
    try:
        cid = int(conn.read_response())
    except ResponseError:  # read whole; an ACL may refuse it: the waits then end at their timeout
        cid = 0
    conn._runner_id = (getattr(conn, "_sock", None), cid)
    return cid


def _closed(conn: Any) -> bool:
    """Whether an idle kept connection was closed by the other end: it owes no reply, so
    anything to read on it is the end of the stream (or an error). One poll, no wait."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return False
    poller = getattr(conn, "_runner_poll", None)
    if poller is None or poller[0] is not sock:
        poller = (sock, select.poll())
        poller[1].register(sock, select.POLLIN)
        conn._runner_poll = poller
    return bool(poller[1].poll(0))


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
    other error reply (OOM at maxmemory, READONLY, MISCONF: refused before it wrote) is
    raised once the calls behind it are read too, the connection being still in step: the
    exception carries ``behind``, each of those calls' (tag, reply or error), so the
    caller knows which of them ran. A lost connection raises with ``unknown``, the tags
    of the calls whose replies were owed: what they did is unknown, as for a single call
    whose reply was lost. Without kept connections (Redis Cluster) each call is sent on a
    thread of a pool (NodeLanes), after the stream's call before it to the same master, so
    calls to different masters overlap; they are read in order, with the same ``behind``
    and ``unknown`` on a failure.

    A durable call is followed by its own WAIT, so each reply read is confirmed by itself
    (a WAIT blocks its connection, so calls sent behind it run once it is answered); one
    that falls short raises NotReplicated from ``read``, with that call's reply.
    """

    def __init__(self, scripts: Transport) -> None:
        self.scripts = scripts
        self.pending: deque[tuple[str, Sequence[str], Sequence[Any], Any, bool]] = deque()
        # Redis Cluster: calls sent on threads of the pool (NodeLanes), read in order.
        self.ready: deque[tuple[Any, Future[tuple[Any, int | None]]]] = deque()
        self.after: dict[str, Future[tuple[Any, int | None]]] = {}  # the last call sent to each master
        self.conn: Any = None
        self._sizes: deque[int] = deque()  # each call's ``size``, as sent (see held)

    def send(self, name: str, keys: Sequence[str], args: Sequence[Any], tag: Any, durable: bool = False,
             size: int = 0) -> None:
        """``size``: the bytes the caller counts the call at, for ``held``."""
        sc = self.scripts
        durable = durable or name in DURABLE
        if sc._lanes is None:
            self.ready.append((tag, sc.nodes.submit(name, keys, args, durable, self.after)))
            self._sizes.append(size)
            return
        if self.conn is None:
            self.conn = sc._lanes.take()
        try:
            sc._send(self.conn, name, keys, args, durable)
        except BaseException as exc:
            exc.unknown = [tag, *(p[3] for p in self.pending)]  # type: ignore[attr-defined]
            self._drop()
            raise
        self.pending.append((name, keys, args, tag, durable))
        self._sizes.append(size)

    def __len__(self) -> int:
        return len(self.pending) + len(self.ready)

    @property
    def held(self) -> int:
        """The bytes of the calls sent and not read yet, by their ``size``. A caller that
        keeps it within WRITE_BYTES (reading before it sends more) has at most that
        waiting in Redis for it, whatever Redis does meanwhile (see WRITE_BYTES)."""
        sizes = self._sizes
        while len(sizes) > len(self):  # (the oldest were read, or dropped with the connection)
            sizes.popleft()
        return sum(sizes)

    def read(self) -> tuple[Any, Any]:
        if self.ready:
            tag, sent = self.ready.popleft()
            try:
                reply, acked = sent.result()
            except BaseException as exc:
                # As on one connection: a refused call (an error reply) did not run; any
                # other failure leaves it undetermined. The calls sent behind it (on their
                # masters' own threads) are waited for and told on the exception.
                behind, unknown = self.answered()
                exc.behind = behind  # type: ignore[attr-defined]
                exc.unknown = ([] if isinstance(exc, ResponseError) else [tag]) + unknown  # type: ignore[attr-defined]
                raise
        else:
            tag, reply, acked = self._read_next()
        self.scripts.confirm([] if acked is None else [acked], [reply])
        return tag, reply

    def answered(self) -> tuple[list[tuple[Any, Any]], list[Any]]:
        """Redis Cluster: wait for every call sent and not read yet and take them off:
        (tag, reply or error reply) of those answered, and the tags of those whose outcome
        is unknown (their connection failed)."""
        behind: list[tuple[Any, Any]] = []
        unknown: list[Any] = []
        while self.ready:
            tag, sent = self.ready.popleft()
            try:
                behind.append((tag, sent.result()[0]))
            except ResponseError as err:
                behind.append((tag, err))
            except BaseException:
                unknown.append(tag)
        return behind, unknown

    def _read_next(self) -> tuple[Any, Any, int | None]:
        name, keys, args, tag, durable = self.pending.popleft()
        try:
            try:
                reply, acked = self.scripts._read(self.conn, durable)
            except NoScriptError:  # it did not run: load, run alone by its source
                reply, acked = self.scripts.counted(name, keys, args, durable=durable, by_source=True)
        except ResponseError as exc:
            self._read_behind(exc)  # read whole: the calls behind it say what they did
            raise
        except BaseException as exc:
            exc.unknown = [tag, *(p[3] for p in self.pending)]  # type: ignore[attr-defined]
            self._drop()
            raise
        if not self.pending:
            self.close()
        return tag, reply, acked

    def _read_behind(self, exc: BaseException) -> None:
        """After an error reply, read the replies owed behind it onto ``exc.behind`` (a
        lost connection leaves the rest on ``exc.unknown``), then drop the connection."""
        behind: list[tuple[Any, Any]] = []
        while self.pending:
            tag, durable = self.pending[0][3], self.pending[0][4]
            try:
                reply: Any = self.scripts._read(self.conn, durable)[0]
            except ResponseError as err:
                reply = err
            except BaseException:
                break
            self.pending.popleft()
            behind.append((tag, reply))
        exc.behind = behind  # type: ignore[attr-defined]
        exc.unknown = [p[3] for p in self.pending]  # type: ignore[attr-defined]
        self._drop()

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


class _Mark(NamedTuple):
    """A node marked stalled (NodeLanes._stalled)."""

    since: float  # monotonic time of its first call given up
    out: int  # its calls given up and not ended
    about: tuple[str, ...]  # the masters of the layout it stands for (several for a read of several)


class NodeLanes:
    """Redis Cluster: a round trip's script calls to different masters go at once, each
    master's in the order given, sent for the caller that makes the round trip (a cluster
    pipeline refuses EVALSHA). The caller sends one master's calls itself and hands the
    others to threads of a pool shared by the process, one task per master and round trip:
    two callers' calls to one slow master wait each for its own, never behind the other's
    (a lane per master shared by every caller queued them: six threads' batches took six
    times as long). Made anew in a forked child."""

    # Threads are started only when no idle one is left; the bound only keeps a runaway
    # number of callers from starting threads without end.
    MAX_THREADS = 256

    def __init__(self, scripts: Transport) -> None:
        self.scripts = scripts
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        # Nodes with bounded calls still out past their wait (see bounded) -> (since when,
        # how many are out, the masters the mark stands for): the node is stalled until the
        # last of them ends, or until a read of the layout finds one of those masters holds
        # no slot any more (relearn: its replica promoted in its place).
        self._stalled: dict[str, _Mark] = {}
        # The last read of the layout while a master was marked (relearn): (its future, when
        # it was started).
        self._relearning: tuple[Future[None], float] | None = None
        # Each master's recent round trip (a moving average of its bounded calls' times,
        # those given up included once they end): a short wait (Transport.waiting) is
        # stretched to SLOW_FACTOR times it, so a master that answers slowly is waited
        # for (up to the node wait) while one that stops answering is given up at once.
        # Seeded with the PINGs of the client's probe (connection.py: Transport), so a
        # master's first call is waited for as its round trip asks.
        self._rtt: dict[str, float] = {}

    def stalled(self, node: str) -> bool:
        """Whether a call to ``node`` was given up and neither it nor a probe since has
        been answered (calls to it fail at once meanwhile)."""
        return node in self._stalled

    def rtt(self, node: str) -> float:
        """``node``'s recent round trip in seconds (0: none timed yet)."""
        return self._rtt.get(node, 0.0)

    def seed(self, rtt: dict[str, float]) -> None:
        """Round trips timed before any call (the client's probe), for masters none timed."""
        for node, took in rtt.items():
            self._rtt.setdefault(node, took)

    def _timed(self, node: str, f: Future[Any], wait_s: float) -> None:
        """Time a bounded call to ``node`` from now until it ends, into its round trip: at
        most the node wait (or, without one, the call's own wait, ``wait_s``), so a call
        given up that ends at the socket timeout does not stretch the next calls' waits."""
        started = time.monotonic()
        cap = self.scripts.node_wait_s or wait_s

        def ended(_: Future[Any]) -> None:
            took = min(time.monotonic() - started, cap)
            before = self._rtt.get(node)
            self._rtt[node] = took if before is None else before + RTT_WEIGHT * (took - before)

        f.add_done_callback(ended)

    def node(self, keys: Sequence[str]) -> str:
        self.relearn()
        try:
            return str(self.scripts.client.get_node_from_key(keys[0]).name) if keys else ""
        except Exception:  # no layout now: the call itself says why
            return ""

    def send(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any], bool]]
             ) -> list[tuple[Any, int | None] | BaseException]:
        """Every call's (reply, WAIT's count) or the exception it raised, in order."""
        by_node: dict[str, list[int]] = {}
        for i, (_, keys, _, _) in enumerate(calls):
            by_node.setdefault(self.node(keys), []).append(i)
        out: list[tuple[Any, int | None] | BaseException] = [None] * len(calls)  # type: ignore[list-item]
        wait_s = self.scripts.node_wait(*by_node)
        enqueues = self.scripts.enqueue_wait_s is not None and all(c[0] == "enqueue" for c in calls)
        if enqueues:
            wait_s = None  # (each call bounded by its socket's timeout: nodecalls.py)
        elif not all(c[0] in FENCED or c[0] in CHECKED or not (c[3] or c[0] in DURABLE) for c in calls):
            wait_s = None
        if wait_s is not None:
            return self._send_bounded(calls, by_node, out, wait_s + self.scripts.wait_s(calls))
        groups = list(by_node.values())
        futures = [self.pool().submit(self._run, calls, g, out) for g in groups[1:]]
        self._run(calls, groups[0], out)
        for f in futures:
            f.result()
        return out

    def _send_bounded(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any], bool]],
                      by_node: dict[str, list[int]], out: list[tuple[Any, int | None] | BaseException],
                      wait_s: float) -> list[tuple[Any, int | None] | BaseException]:
        """``send`` with each master waited for at most ``wait_s`` (see bounded): a stalled
        master's calls get NodeStalled in their places, the others keep their answers."""
        from runner.store.runclock import RunClock

        mine: dict[int, tuple[Any, int | None] | BaseException] = {}
        sent: dict[str, Future[None]] = {}
        for node, group in by_node.items():
            stalled = self._stalled_error(node)
            if stalled is not None:
                mine.update((i, stalled) for i in group)
            else:
                sent[node] = self.pool().submit(self._run_raising, calls, group, out)
                self._timed(node, sent[node], wait_s)
        RunClock().wait(sent.values(), wait_s)  # (the time this process ran: runclock.py)
        for node, f in sent.items():
            if not f.done():
                mine.update((i, self._given_up(node, f, wait_s)) for i in by_node[node])
        # A call given up keeps running on its thread and may still write its slot in
        # ``out``: the caller reads a list of its own.
        return [mine[i] if i in mine else out[i] for i in range(len(calls))]

    def bounded(self, node: str, fn: Callable[[], T], wait_s: float,
                late: Callable[[T], object] | None = None, *, what: str = "",
                among: Sequence[str] = ()) -> T:
        """``fn()`` (a call to ``node``) on a thread of the pool, waited for at most
        ``wait_s``. A master stopped or hung with its sockets open answers nothing until
        the socket timeout (15 s), longer than a worker's leases: past ``wait_s`` this
        raises NodeStalled (an outage of that node's partitions, which the caller's loop
        backs off from while it goes on with the others), and every bounded call to the
        node fails so at once until the call given up ends, so no thread piles up behind
        it. ``late`` gets the result of a call given up, if it comes (a claim's jobs, to
        hand back). ``what`` names the call in the error. ``among``: the masters a read
        of several goes to (``node`` is then the read's own name, marked in their
        stead: which of them held it up is not known); it fails at once while one of
        them is stalled, and its error names the stalled ones among them."""
        for n in (node, *among):
            stalled = self._stalled_error(n, what, among)
            if stalled is not None:
                raise stalled
        from runner.store.runclock import RunClock

        f = self.pool().submit(fn)
        if not among:
            self._timed(node, f, wait_s)
        if RunClock().wait([f], wait_s):  # (the time this process ran: runclock.py)
            return f.result()
        err = self._given_up(node, f, wait_s, what, among)
        if late is not None:
            f.add_done_callback(lambda done: None if done.exception() is not None else late(done.result()))
        raise err

    def launch(self, node: str, fn: Callable[[], T], wait_s: float | None = None) -> Future[T]:
        """``fn()`` (a call to ``node``) on a thread of the pool, not waited for: the caller
        waits as long as it likes, and past its node wait (``wait_s``, when the caller's is
        not the process's) says so (``give_up``). Raises NodeStalled at once while ``node``
        is stalled, as ``bounded`` does."""
        stalled = self._stalled_error(node)
        if stalled is not None:
            raise stalled
        f = self.pool().submit(fn)
        self._timed(node, f, wait_s if wait_s is not None else self.scripts.node_wait_s or 0.0)
        return f

    def stalled_error(self, node: str) -> BaseException | None:
        """NodeStalled (not sent) while ``node`` is stalled; None otherwise."""
        return self._stalled_error(node) if self._stalled else None

    def stalled_now(self, node: str, wait_s: float, sent: bool = True) -> BaseException:
        """A call to ``node`` bounded by its socket's timeout was not answered within
        ``wait_s`` (nodecalls.py): ``node`` is stalled until a PING to it is answered;
        returns the error that says so (``sent``: the call went out; False: its
        connection's handshake was not answered, so nothing was sent)."""
        return self._given_up(node, self.pool().submit(self._probe, node), wait_s, sent=sent)

    def give_up(self, node: str, f: Future[Any], wait_s: float, what: str = "") -> BaseException:
        """A launched call not answered within ``wait_s``: ``node`` is stalled until it
        ends (as for ``bounded``); returns the error that says so."""
        return self._given_up(node, f, wait_s, what)

    def _who(self, node: str, among: Sequence[str]) -> str:
        """The node an error names: ``node``, or for a read of several masters those of
        ``among`` stalled now (every one of them when none is known to be)."""
        if not among:
            return node
        stalled = [n for n in among if n in self._stalled]
        return " or ".join(stalled or among)

    def _stalled_error(self, node: str, what: str = "", among: Sequence[str] = ()) -> BaseException | None:
        out = self._stalled.get(node)
        if out is None:
            return None
        who = node if node in among or not among else self._who(node, among)
        call = f"; {what} not sent" if what else ""
        return NodeStalled(f"Redis node {who} has not answered for {time.monotonic() - out.since:.1f} s "
                           f"(stopped or hung{call}); its partitions wait", sent=False)

    def _given_up(self, node: str, f: Future[Any], wait_s: float, what: str = "",
                  among: Sequence[str] = (), sent: bool = True) -> BaseException:
        """Mark ``node`` stalled until ``f`` ends; the error for the call given up."""
        about = self._masters(among or (node,))
        with self._lock:
            mark = self._stalled.get(node) or _Mark(time.monotonic(), 0, about)
            self._stalled[node] = mark = mark._replace(out=mark.out + 1)
        since = mark.since  # (the mark this call counts in: one cleared since is not another's)
        self._off_default(node)

        def ended(done: Future[Any], probe: bool = False) -> None:
            exc = done.exception()
            # The call given up: no answer within the socket timeout, or its connection
            # lost, or no layout read meanwhile (redis-py reads it again after such a call);
            # a PING since: no answer within the socket timeout.
            # On Redis Cluster BUSY (a long script) is no answer either: the master serves
            # nothing, and the cluster may promote its replica meanwhile, which only a read of
            # the layout learns (relearn, while the mark holds): its new connections'
            # handshakes get BUSY, never MOVED. (One server: its calls say BUSY at once.)
            busy = () if self.scripts.one_server else (RedisBusy,)
            lost = ((RedisTimeoutError, *busy) if probe else
                    (RedisTimeoutError, RedisConnectionError, RedisClusterException, *busy))
            if not among and isinstance(exc, lost) and not isinstance(exc, NodeStalled):
                # Still stalled, perhaps: a PING keeps it marked until the node answers (or
                # leaves the layout, or refuses the connection: down, and said so at once).
                pause = BUSY_PROBE_S if isinstance(exc, RedisBusy) else 0.0
                with contextlib.suppress(RuntimeError):  # (the process is ending)
                    self.pool().submit(self._probe, node, pause).add_done_callback(lambda d: ended(d, True))
                    return
            with self._lock:
                now = self._stalled.get(node)
                if now is None or now.since != since:  # (cleared by relearn: its slots moved)
                    return
                if now.out > 1:
                    self._stalled[node] = now._replace(out=now.out - 1)
                else:
                    del self._stalled[node]

        f.add_done_callback(ended)
        call = f" {what}" if what else ""
        if not sent:
            return NodeStalled(f"Redis node {self._who(node, among)} did not answer a new connection within "
                               f"{wait_s:g} s (stopped or hung; the call was not sent); its partitions wait",
                               sent=False)
        return NodeStalled(f"Redis node {self._who(node, among)} did not answer{call} within {wait_s:g} s "
                           "(stopped or hung); its partitions wait")

    def _masters(self, names: Sequence[str]) -> tuple[str, ...]:
        """Those of ``names`` that are masters of the layout now (a mark's name may be a
        read's own: ``bounded``'s ``among``, or a read of the layout)."""
        if self.scripts.one_server:
            return ()
        client = self.scripts.client
        with contextlib.suppress(Exception):  # (no layout now)
            return tuple(n for n in names if getattr(client.get_node(node_name=n), "server_type", "") == "primary")
        return ()

    def relearn(self) -> None:
        """Redis Cluster, while a master is marked stalled: the layout read again, from a
        master that answers, at most every RELEARN_S, each read waited for at most
        RELEARN_WAIT_S (by the calls that find it due or under way; the others route by the
        layout they have). A stalled master's mark holds until it answers a PING, and its
        calls fail at once meanwhile; but the cluster may promote its replica, and nothing
        sent to the stalled master fails to tell redis-py so (the calls given up end at the
        socket timeout, 15 s on), so its partitions were left out for that long after the
        promotion, and a producer that only enqueues never learnt it. A mark whose master
        holds no slot in the layout read is cleared: its calls go to the new master."""
        if not self._stalled or self.scripts.one_server:
            return
        now = time.monotonic()
        last = self._relearning
        if last is None or (last[0].done() and now - last[1] >= RELEARN_S):
            pool = self.pool()
            with self._lock:
                last = self._relearning
                if last is None or (last[0].done() and now - last[1] >= RELEARN_S):
                    try:
                        last = self._relearning = (pool.submit(self._relearn), now)
                    except RuntimeError:  # (the process is ending)
                        return
        f, started = last
        if not f.done():
            from concurrent.futures import CancelledError
            from concurrent.futures import TimeoutError as WaitedOut

            with contextlib.suppress(WaitedOut, CancelledError):
                f.exception(timeout=max(0.0, started + RELEARN_WAIT_S - time.monotonic()))

    def _relearn(self) -> None:
        """One read of the layout (connection.py: the masters known stalled asked last), then
        the marks of masters that hold no slot in it cleared."""
        client = self.scripts.client
        try:
            client.nodes_manager.initialize()
            masters = {n.name for n in client.get_primaries()}
        except Exception:  # (no master answered: the next read, RELEARN_S on)
            return
        with self._lock:
            for node, mark in list(self._stalled.items()):
                if any(n not in masters for n in mark.about):
                    del self._stalled[node]

    def _off_default(self, node: str) -> None:
        """The client's default node moved off ``node``, marked stalled, to a master not
        marked: a pipeline asks the default node for the keys of some commands (COMMAND
        GETKEYS), so a read of a live master would wait on the stalled one and be given
        up, marking the live master too."""
        if self.scripts.one_server:
            return
        client = self.scripts.client
        with contextlib.suppress(Exception):  # (no layout now: the next read of it chooses)
            if client.get_default_node().name != node:
                return
            live = [n for n in client.get_primaries() if n.name not in self._stalled]
            if live:
                client.set_default_node(live[0])

    def _probe(self, node: str, pause: float = 0.0) -> None:
        """One PING to ``node`` (host:port), if it is still in the layout (on one server:
        to the server), ``pause`` seconds on."""
        if pause:
            time.sleep(pause)
        client = self.scripts.client
        if self.scripts.one_server:
            client.ping()
            return
        found = client.get_node(node_name=node)
        if found is not None:
            client.get_redis_connection(found).ping()

    def submit(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool,
               after: dict[str, Future[tuple[Any, int | None]]]) -> Future[tuple[Any, int | None]]:
        """One call of a Stream on a thread of the pool, sent once the same stream's call
        before it to the same master is answered (``after``: the stream's last call per
        master), so one caller's calls to a master keep their order."""
        node = self.node(keys)
        before = after.get(node)
        counted = self.scripts.counted

        def call() -> tuple[Any, int | None]:
            if before is not None:
                with contextlib.suppress(BaseException):
                    before.result()
            return counted(name, keys, args, durable=durable)

        sent = after[node] = self.pool().submit(call)
        return sent

    def _run_raising(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any], bool]], group: list[int],
                   out: list[tuple[Any, int | None] | BaseException]) -> None:
        """``_run``, raising the first call's lost or unanswered connection once every call
        ended: a round trip given up on a stalled master (``_send_bounded``) keeps its mark
        while PINGs to it go unanswered (``_given_up``), not only until its calls end (each
        at its socket timeout; before, the next read then waited 2 s for the master again)."""
        self._run(calls, group, out)
        lost = next((r for i in group if isinstance(r := out[i], (RedisTimeoutError, RedisConnectionError))
                     and not isinstance(r, NodeStalled)), None)
        if lost is not None:
            raise lost

    def _run(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any], bool]], group: list[int],
             out: list[tuple[Any, int | None] | BaseException]) -> None:
        counted = self.scripts._counted  # (on its own thread already: never bounded again)
        bounded = self.scripts.enqueue_wait_s
        for i in group:
            name, keys, args, durable = calls[i]
            try:
                if name == "enqueue" and bounded is not None:
                    out[i] = self.scripts.timed_call(name, keys, args, durable=True)
                else:
                    out[i] = counted(name, keys, args, False, durable or name in DURABLE or name in CHECKED)
            except Exception as exc:
                out[i] = exc

    def pool(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._pid != os.getpid():
                self._pool, self._pid = None, os.getpid()
                self._relearning = None  # (the parent's read: no thread here ends it)
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(self.MAX_THREADS, thread_name_prefix="redis-send")
            return self._pool


class Transport:
    """Script calls on one Redis client, sent by SHA and loaded again on NOSCRIPT.

    ``replicas`` > 0: durable calls return only once that many replicas confirmed them
    within ``replica_timeout_s`` (see the module's docstring)."""

    def __init__(self, client: Any, replicas: int = 0, replica_timeout_s: float = 1.0) -> None:
        self.client = client
        _import_redis()
        self.nodes = NodeLanes(self)  # Redis Cluster: calls to the masters at once
        self.nodes.seed(getattr(client, "runner_rtt", None) or {})  # (its probe's PINGs: connection.py)
        # Redis Cluster: the longest a call that is not durable waits for its master before
        # NodeStalled (NodeLanes.bounded); None waits out the socket timeout. A worker sets
        # it below its leases, so one stalled master cannot stall its other partitions.
        self.node_wait_s: float | None = None
        self._local = threading.local()  # a thread's shorter node wait (``waiting``)
        self.sources = SOURCES
        self.shas = SHAS
        # The scripts a batch of this Transport loaded (and none answered NOSCRIPT since):
        # a batch loads the others ahead of its calls (Batch.execute).
        self.loaded: set[str] = set()
        # One server holds every key (not Redis Cluster): a script may then read a key of
        # another slot that it is given (lua/emit.lua reads an event name's waiters so).
        self.one_server = not isinstance(client, RedisCluster)
        # Redis Cluster: the longest an enqueue waits for its master before NodeStalled
        # (its job may then be written or not: the caller is told so). A producer's jobs
        # without a key go on to another partition meanwhile (a master known stalled is
        # passed over until it answers again: NodeLanes.stalled).
        self.enqueue_wait_s: float | None = None if self.one_server else ENQUEUE_WAIT_S
        if not self.one_server:  # (its reads of the layout ask the masters known stalled last: connection.py)
            client.nodes_manager.runner_stalled = self.nodes.stalled
        self._node_calls: NodeCalls | None = None  # (made at the first call bounded so)
        pool = None if isinstance(client, RedisCluster) else getattr(client, "connection_pool", None)
        self._lanes = _Lanes(pool) if pool is not None else None
        self._watch: Any = getattr(pool, "runner_watch", None)  # Sentinel's events (sentinel.py)
        self._spin = _Spin()
        # The server's ids of the kept connections now blocked in ``behind``, by the key
        # they block on, for ``unblock`` to wake them.
        self._blocked: dict[str, set[int]] = {}
        self._blocked_lock = threading.Lock()
        self.replicas = replicas
        self.replica_timeout_s = replica_timeout_s
        # Error replies seen by this process's calls (a key damaged to another type makes
        # some): the scheduler's reclaim checks the queues' key types after one (reclaim).
        self.error_replies = 0
        # The command itself; None: no WAIT is sent.
        self.wait: tuple[str, int, int] | None = (
            ("WAIT", replicas, max(1, round(replica_timeout_s * 1000))) if replicas > 0 else None
        )

    def node_wait(self, *nodes: str) -> float | None:
        """The calling thread's node wait for a call to ``nodes`` (host:port): ``node_wait_s``,
        or less within ``waiting``: its short wait, stretched to SLOW_FACTOR times the
        slowest of those masters' recent round trips."""
        wait = self.node_wait_s
        short: float | None = getattr(self._local, "wait_s", None)
        if short is None:
            return wait
        slowest = max((self.nodes.rtt(n) for n in nodes), default=0.0)
        stretched = max(short, SLOW_FACTOR * slowest)
        # Without a node wait (a process that does not work jobs: `runner web`), a reader's
        # short wait is the bound, stretched so for a master that answers slowly.
        return stretched if wait is None else min(wait, stretched)

    @contextlib.contextmanager
    def waiting(self, wait_s: float) -> Iterator[None]:
        """The calls this thread makes within give up on a stalled master past ``wait_s``
        (at most ``node_wait_s``, when there is one), or past SLOW_FACTOR times the
        master's recent round trip when that is longer (a master that answers slowly is
        not stalled): for a loop whose every call is safe to give up and make again, and
        whose other masters' work must not wait (the scheduler's), and for the reads of
        a job or a page (client/inspecting.py), which answer from the masters that do."""
        before = getattr(self._local, "wait_s", None)
        self._local.wait_s = wait_s
        try:
            yield
        finally:
            self._local.wait_s = before

    def confirm(self, acked: Sequence[int], replies: Sequence[Any]) -> None:
        """Raise NotReplicated when any WAIT answered fewer replicas than asked."""
        if acked and min(acked) < self.replicas:
            raise NotReplicated(min(acked), self.replicas, self.replica_timeout_s, replies=replies)

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any], *, spin: bool = False,
             durable: bool = False, late: Callable[[Any], object] | None = None, by_source: bool = False) -> Any:
        """One script call. With ``spin``, wait for the reply by polling for a moment
        before sleeping on it (see _Spin): for a caller that makes one call at a time.
        With ``durable``, confirmed by the replicas (NotReplicated when it is not).
        ``late``: the reply of a call given up on a stalled master (``node_wait_s``).
        ``by_source``: the call was answered NOSCRIPT already: it goes by its source at
        once (``_eval``), not by SHA a second time."""
        reply, acked = self.counted(name, keys, args, spin=spin, durable=durable, by_source=by_source,
                                    late=None if late is None else lambda got: late(got[0]))
        if name in CHECKED:
            self.checked(name, reply, acked)
        else:
            self.confirm([] if acked is None else [acked], [reply])
        return reply

    def checked(self, name: str, reply: Any, acked: int | None) -> None:
        """Raise Unconfirmed for a CHECKED call whose WAIT counted too few replicas."""
        if acked is not None and acked < self.replicas:
            raise Unconfirmed(f"{name}: {acked} of {self.replicas} replica(s) confirmed it within "
                              f"{self.replica_timeout_s:g} s (a master being replaced, or short of replicas); "
                              "its answer is not acted on", reply, acked)

    def counted(self, name: str, keys: Sequence[str], args: Sequence[Any], *, spin: bool = False,
                durable: bool = False, late: Callable[[tuple[Any, int | None]], object] | None = None,
                by_source: bool = False) -> tuple[Any, int | None]:
        """One script call and, when durable and WAIT is on, the replicas that confirmed it
        (None: no WAIT was sent). ``by_source``: as for ``call``."""
        durable = durable or name in DURABLE or name in CHECKED
        if name == "enqueue" and self.enqueue_wait_s is not None:
            return self.timed_call(name, keys, args, durable=durable, spin=spin, by_source=by_source)
        node = self.nodes.node(keys) if not self.one_server else ""
        wait = self.node_wait(node)
        if wait is not None and (not durable or name in FENCED or name in CHECKED) and not self.one_server:
            return self.nodes.bounded(node,
                                      lambda: self._counted(name, keys, args, spin, durable, by_source),
                                      wait + self.wait_s([(name, keys, args, durable)]), late)
        return self._counted(name, keys, args, spin, durable, by_source)

    def launch(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[str, Future[Any]] | None:
        """A script call that is not durable, sent on a thread of the pool and not waited
        for (NodeLanes.launch): its master (host:port) and the future of its reply (a
        CHECKED call's WAIT short: Unconfirmed). None where calls are not bounded (one
        server, or no node wait): the caller calls."""
        if self.one_server or self.node_wait_s is None:
            return None
        node = self.nodes.node(keys)
        counted, checked = self._counted, name in CHECKED

        def run() -> Any:
            reply, acked = counted(name, keys, args, False, checked)
            if checked:
                self.checked(name, reply, acked)
            return reply

        return node, self.nodes.launch(node, run)

    def timed_call(self, name: str, keys: Sequence[str], args: Sequence[Any], *, durable: bool, spin: bool = False,
                by_source: bool = False) -> tuple[Any, int | None]:
        """Redis Cluster: one call (an enqueue) on the caller's thread, straight to its
        slot's master, answered within ``enqueue_wait_s`` and the WAIT's own timeout or
        NodeStalled (nodecalls.py)."""
        assert self.enqueue_wait_s is not None
        calls = self._node_calls
        if calls is None:
            from runner.store.nodecalls import NodeCalls

            calls = self._node_calls = NodeCalls(self)
        wait_s = self.enqueue_wait_s + self.wait_s([(name, keys, args, durable)])
        try:
            return calls.call(name, keys, args, durable, wait_s, spin=spin, by_source=by_source)
        except NoScriptError:  # nothing ran: by its source, which cannot answer NOSCRIPT
            return calls.call(name, keys, args, durable, wait_s, by_source=True)
        except ResponseError:
            self.error_replies += 1
            raise

    def wait_s(self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any], bool]]) -> float:
        """How much longer than ``node_wait_s`` a bounded round trip of ``calls`` may take:
        the WAIT's own timeout when one of them is durable (a master short of replicas is
        slow to answer, not stalled)."""
        return self.replica_timeout_s if self.wait is not None and any(c[3] for c in calls) else 0.0

    def on_node(self, key: str, fn: Callable[[], T], what: str = "") -> T:
        """``fn()``, a command (or a pipeline) of its own to the master of ``key``'s slot,
        given up past ``node_wait_s`` as a script call to that master is (NodeLanes.bounded;
        ``what`` names it in the error): a worker's periodic reads and writes outside
        scripts (an outbox's head, the roster's heartbeat) wait for a stalled master no
        longer than its claims do. At once on one server, or without a node wait."""
        if self.one_server:
            return fn()
        node = self.nodes.node([key])
        wait = self.node_wait(node)
        if wait is None:
            return fn()
        return self.nodes.bounded(node, fn, wait, what=what)

    def keyless(self, *command: Any) -> Any:
        """A command of no key (TIME), answered by a master that answers: on Redis Cluster
        with a node wait, the client's default node first, then the other masters, each
        waited for at most ``node_wait_s`` (one that answers becomes the default); the last
        error when none does."""
        wait = self.node_wait()
        if wait is None or self.one_server:
            return self.client.execute_command(*command)
        from runner.store.connection import UNAVAILABLE

        client = self.client
        first = client.get_default_node()
        err: BaseException | None = None
        for node in [first, *(n for n in client.get_primaries() if n is not first)]:
            def ask(n: Any = node) -> Any:
                return client.execute_command(*command, target_nodes=n)

            try:
                reply = self.nodes.bounded(node.name, ask, wait, what=str(command[0]))
            except UNAVAILABLE as exc:
                err = exc
                continue
            if node is not first:
                client.set_default_node(node)
            return reply
        assert err is not None
        raise err

    def server_ms(self) -> int:
        """Epoch milliseconds by the server's clock (TIME), from a master that answers
        (``keyless``)."""
        sec, usec = self.keyless("TIME")
        return int(sec) * 1000 + int(usec) // 1000

    def bounded(self, what: str, fn: Callable[[], T], keys: Sequence[str]) -> T:
        """``fn()``, a read (or a pipeline) of its own on Redis Cluster over ``keys``, given
        up past ``node_wait_s`` as a script call is (NodeLanes.bounded); its error names the
        master (host:port) and ``what``. On one master, it is that master's call (it fails
        at once while the master is stalled, and a give-up marks it so); over several, it
        fails at once while one of them is stalled, and names the stalled ones. At once on
        one server, or without a node wait."""
        if self.one_server or self.node_wait_s is None:
            return fn()
        nodes = sorted({self.nodes.node([k]) for k in keys})
        wait = self.node_wait(*nodes)
        assert wait is not None
        if len(nodes) == 1:
            return self.nodes.bounded(nodes[0], fn, wait, what=what)
        return self.nodes.bounded(what, fn, wait, what=what, among=nodes)

    def each_master(self, keys: Sequence[str], read: Callable[[list[int]], Sequence[R]], what: str
                    ) -> tuple[list[R | None], dict[int, BaseException]]:
        """A read of items, ``keys[i]`` the key of item ``i``: on Redis Cluster ``read`` once
        per master, given the indexes of the items whose slots it holds (in order) and
        answering one result for each, every master's read on a thread of the pool at once
        and each waited for at most the calling thread's node wait (``waiting``: a reader's
        2 s, longer for a master whose recent round trips are slow), then given up as a call
        to that master is (NodeLanes: marked stalled until it answers a PING, so the reads
        after it skip its items at once). Returns each item's result (None for one left
        out) and, by index, the outage that left each out (its master stalled, down or
        refusing; ``what`` names the read in a stall's error); any other error is raised.
        Without a node wait each master's read runs on the caller's thread, one after
        another, its outage leaving its items out all the same. On one server, ``read`` of
        every item on the caller's thread, as the caller would make it, its errors raised."""
        if self.one_server:
            return list(read(list(range(len(keys))))), {}
        from runner.store.connection import UNAVAILABLE, ClusterUnreachable
        from runner.store.outage import OUTAGE
        from runner.store.runclock import RunClock

        def outage(exc: BaseException) -> BaseException:
            # (redis-py's bare RedisClusterException for a master gone with no layout read
            # since: an outage, raised as one by a caller that leaves every item out)
            return exc if isinstance(exc, UNAVAILABLE) else ClusterUnreachable(str(exc))

        by_node: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            by_node.setdefault(self.nodes.node([key]), []).append(i)
        out: list[R | None] = [None] * len(keys)
        away: dict[int, BaseException] = {}
        sent: list[tuple[str, list[int], Future[Sequence[R]], float]] = []
        clock = RunClock()  # (each master's wait in the time this process ran: runclock.py)
        for node, idx in by_node.items():
            wait = self.node_wait(node)
            try:
                if wait is not None:  # (NodeStalled at once while the master is known stalled)
                    f = self.nodes.launch(node, partial(read, idx), wait)
                    sent.append((node, idx, f, wait))
                    continue
                got = read(idx)
            except OUTAGE as exc:
                away.update(dict.fromkeys(idx, outage(exc)))
                continue
            for i, one in zip(idx, got, strict=True):
                out[i] = one
        for node, idx, f, wait in sent:
            if not clock.wait([f], wait):
                away.update(dict.fromkeys(idx, self.nodes.give_up(node, f, wait, what)))
                continue
            try:
                got = f.result()
            except OUTAGE as exc:
                away.update(dict.fromkeys(idx, outage(exc)))
                continue
            for i, one in zip(idx, got, strict=True):
                out[i] = one
        return out, away

    def _counted(self, name: str, keys: Sequence[str], args: Sequence[Any], spin: bool,
                 durable: bool, by_source: bool = False) -> tuple[Any, int | None]:
        if self._lanes is None:
            if durable and self.wait is not None:
                return self._call_on_node(name, keys, args, by_source)
            try:
                if not by_source:
                    with contextlib.suppress(NoScriptError):  # nothing ran: by its source below
                        return self.client.evalsha(self.shas[name], len(keys), *keys, *args), None
                return self._by_source(name, keys, args), None
            except ResponseError:
                self.error_replies += 1
                raise
        lanes = self._lanes
        conn = lanes.take()
        try:
            if by_source:
                out = self._reload(conn, name, keys, args, durable)
            else:
                try:
                    self._send(conn, name, keys, args, durable)
                    if spin:
                        self._spin.wait(conn)
                    out = self._read(conn, durable)
                except NoScriptError:  # Redis restarted or flushed its scripts: nothing ran
                    out = self._reload(conn, name, keys, args, durable)
        except ResponseError:
            self.error_replies += 1
            lanes.give(conn)  # an error reply was read whole: the connection is in step
            raise
        except BaseException:
            conn.disconnect()
            lanes.give(conn)
            raise
        lanes.give(conn)
        return out

    def pipelined(self, cmds: Sequence[Sequence[Any]], resumable: bool = False) -> list[Any]:
        """Send commands in one write on a kept connection and read every reply; an error
        reply takes its place in the list instead of being raised (a settle batch is one
        or two script calls: redis-py's pipeline object cost more than the calls' own
        packing). Past WRITE_BYTES, in several writes on the same connection (so a WAIT
        at the end counts them all), each once the last is answered (``_split``: with
        ``resumable`` calls, a connection lost after some were answered keeps their
        replies); a failure raises, as in one. Without kept connections, redis-py's
        pipeline."""
        if self._lanes is None:
            pipe = self.client.pipeline(transaction=False)
            for cmd in cmds:
                pipe.execute_command(*cmd)
            return list(pipe.execute(raise_on_error=False))
        lanes = self._lanes
        held = [lanes.take()]  # (_split may swap a lost connection for a fresh one)
        replies: list[Any] = []
        try:
            packed = held[0].pack_commands(cmds)
            if len(cmds) > 1 and sum(map(len, packed)) > WRITE_BYTES:  # (rare: big records)
                self._split(lanes, held, cmds, replies, resumable)
            else:
                self._exchange(held[0], packed, len(cmds), replies)
            if self._watch is not None:
                self._trusted(held[0])
        except BaseException:
            held[0].disconnect()  # it may owe replies
            lanes.give(held[0])
            raise
        lanes.give(held[0])
        return replies

    def _split(self, lanes: _Lanes, held: list[Any], cmds: Sequence[Sequence[Any]], replies: list[Any],
               resumable: bool) -> None:
        """``cmds`` in writes of WRITE_BYTES on ``held[0]``, their replies read onto
        ``replies``. A connection lost once some of its writes were answered: those replies
        are kept and the calls after them go on a fresh connection (``held[0]`` then) to
        the same server. (Sent again whole, the calls that had run were refused by their
        fences: false "lease lost" warnings, successes never counted.) A call whose write
        went out but whose reply was lost is sent again: unknown, as in one write, its
        fence decides. A loss with nothing answered yet, the RESUMES+1-th loss, a fresh
        connection that does not connect, or one to another server (a failover: what the
        lost one answered may be wiped) raises, and the caller sends the batch again; so
        does any loss unless every call is ``resumable`` (RESUMABLE: fenced)."""
        start = losses = 0  # (start: the replies kept when the last connection was lost)
        while True:
            conn = held[0]
            try:
                for group in records.by_bytes(cmds[len(replies):], _command_bytes, WRITE_BYTES):
                    self._exchange(conn, conn.pack_commands(group), len(group), replies)
                break
            except RedisConnectionError:
                losses += 1
                if not resumable or not replies or losses > RESUMES or (
                        self._watch is not None and self._watch.demoted(conn.host, conn.port)):
                    raise
                start, where = len(replies), (conn.host, conn.port)
                held[0] = lanes.take()  # (taken first: a failure here gives back this one only)
                conn.disconnect()
                lanes.give(conn)
                held[0].connect()
                if (held[0].host, held[0].port) != where:
                    raise
        if start and cmds[-1][0] == "WAIT":
            # WAIT counts the replicas of its own connection's writes: those of the lost
            # one are not vouched for (Batch lists the durable calls as short).
            replies[-1] = 0

    def _exchange(self, conn: Any, packed: Any, n: int, replies: list[Any]) -> None:
        """One write of ``n`` packed commands, and their replies read onto ``replies``."""
        conn.send_packed_command(packed)
        for _ in range(n):
            try:
                replies.append(conn.read_response())
            except ResponseError as exc:  # read whole: the connection stays in step
                replies.append(exc)
                if not isinstance(exc, NoScriptError):
                    self.error_replies += 1

    def behind(self, block: Sequence[Any], name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, Any]:
        """A blocking command (a BLPOP) and a script call behind it, in one write on a kept
        connection: Redis runs the script the moment the command returns, whether it
        unblocked or timed out, so a caller that waits for news and then acts on it pays
        one round trip and one wake-up for both. Returns (the command's reply, or its error
        reply: the script ran all the same, and its reply must not be lost; the script's
        reply). Without kept connections (Redis Cluster), the two go one after the other."""
        if self._lanes is None:
            try:
                first = self.client.execute_command(*block)
            except ResponseError as exc:
                first = exc
                self.error_replies += 1
            return first, self.call(name, keys, args)
        lanes = self._lanes
        conn = lanes.take()
        reply: Any = _MISSING
        # A CHECKED call's WAIT goes behind it in the same write (its answer read here).
        checked = name in CHECKED and self.wait is not None
        acked: int | None = None
        try:
            try:
                first = self._blocking(conn, block, [str(block[1])],
                                       [("EVALSHA", self.shas[name], len(keys), *keys, *args),
                                        *([self.wait] if checked and self.wait is not None else [])])
            except ResponseError as exc:  # read whole: the connection stays in step
                first = exc
                self.error_replies += 1
            failed: ResponseError | None = None
            try:
                reply = conn.read_response()
            except NoScriptError:  # nothing ran: loaded and sent alone below
                pass
            except ResponseError as exc:
                failed = exc
            if checked:
                try:
                    waited: Any = conn.read_response()
                except ResponseError as exc:  # read whole; UNBLOCKED closes the connection after it
                    waited = exc
                if failed is None and reply is not _MISSING:
                    acked = _acked(waited)
            if failed is not None:
                raise failed
            if self._watch is not None:
                self._trusted(conn)
        except ResponseError:
            lanes.give(conn)  # an error reply was read whole
            raise
        except BaseException:
            conn.disconnect()  # it may owe replies
            lanes.give(conn)
            raise
        lanes.give(conn)
        if reply is _MISSING:  # answered NOSCRIPT
            reply = self.call(name, keys, args, by_source=True)
        elif checked:
            self.checked(name, reply, acked)
        return first, reply

    def _blocking(self, conn: Any, block: Sequence[Any], on: Sequence[str], behind: Sequence[Any] = ()) -> Any:
        """Send ``block`` (blocking on the keys ``on``) and the commands ``behind`` it in one
        write on ``conn``, and read the blocking command's reply, its wait registered
        meanwhile for ``unblock``. A connection's first wait asks its id in the same write."""
        cid = _known_id(conn)
        cmds = [block, *behind]
        conn.send_packed_command(conn.pack_commands(cmds if cid is not None else [("CLIENT", "ID"), *cmds]))
        if cid is None:
            cid = _read_id(conn)
        if not cid:
            return conn.read_response()
        with self._blocked_lock:
            for key in on:
                self._blocked.setdefault(key, set()).add(cid)
        try:
            return conn.read_response()
        finally:
            with self._blocked_lock:
                for key in on:
                    self._blocked.get(key, set()).discard(cid)

    def blocking(self, block: Sequence[Any], on: Sequence[str]) -> Any:
        """A blocking command (a BLPOP over ``on``) alone on a kept connection, so that
        ``unblock`` of any of those keys ends it at once. Without kept connections (Redis
        Cluster), sent through the client, ending at its own timeout."""
        if self._lanes is None:
            return self.client.execute_command(*block)
        lanes = self._lanes
        conn = lanes.take()
        try:
            reply = self._blocking(conn, block, on)
        except ResponseError:
            lanes.give(conn)  # an error reply was read whole
            raise
        except BaseException:
            conn.disconnect()  # it may owe a reply
            lanes.give(conn)
            raise
        lanes.give(conn)
        return reply

    def unblock(self, *keys: str) -> None:
        """End now the waits of ``behind`` and ``blocking`` on any of ``keys`` in this
        process, as if their timeout had passed: the script behind each runs and its reply
        is read, so nothing it did is lost (a stopping fetcher hands its claim back at once
        instead of after its wait's second). CLIENT UNBLOCK goes on another connection;
        refused (an ACL without it) or unreachable, the waits end at their timeout as before."""
        with self._blocked_lock:
            ids = sorted({cid for key in keys for cid in self._blocked.get(key, ())})
        for cid in ids:
            with contextlib.suppress(ResponseError, RedisConnectionError, RedisTimeoutError):
                self.client.execute_command("CLIENT", "UNBLOCK", cid)

    def gather(self, calls: Sequence[ScriptCall | tuple[Any, ...]]) -> list[Any] | None:
        """Script calls and plain commands (tuples of words) in one round trip on a kept
        connection, for a caller that looks at many keys at once (the scheduler's pass over
        every partition): each reply, or its error reply, in its place; a script answered
        NOSCRIPT is loaded and sent again alone. None without kept connections (Redis
        Cluster, where the keys live on several masters): the caller sends each on its own."""
        if self._lanes is None:
            return None
        cmds = [("EVALSHA", self.shas[c.name], len(c.keys), *c.keys, *c.args) if isinstance(c, ScriptCall) else c
                for c in calls]
        replies = self.pipelined(cmds)
        for i, (c, reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(c, ScriptCall) and isinstance(reply, NoScriptError):
                try:
                    replies[i] = self.call(c.name, c.keys, c.args, by_source=True)
                except ResponseError as exc:
                    replies[i] = exc
        return replies

    def gather_on_node(self, key: str, calls: Sequence[ScriptCall | tuple[Any, ...]],
                       what: str = "") -> list[Any] | None:
        """Redis Cluster: script calls and plain commands on the keys of one slot (``key``'s)
        in one round trip to its master, given up past the node wait as any call to it is
        (on_node; ``what`` names it): each reply in its place. A script answered NOSCRIPT
        (not loaded there: a process's first call to that master, or after a flush) ran
        nowhere: it goes again by its source behind a load (``_eval``), in one more round
        trip within the same wait, after the calls that ran (for calls whose order among
        themselves does not matter, as the scheduler's look). None when a reply says a
        call must go another way (MOVED or ASK: the slot moves; any other error reply):
        nothing of it is answered, and the caller sends each call on its own, which
        follows and raises as a single call does (a script that ran then runs again: for
        calls that re-check what they move, as the scheduler's are). On one server:
        ``gather``."""
        if self._lanes is not None:
            return self.gather(calls)
        cmds = [("EVALSHA", self.shas[c.name], len(c.keys), *c.keys, *c.args) if isinstance(c, ScriptCall) else c
                for c in calls]

        def send() -> list[Any]:
            client = self.client
            conn = client.get_redis_connection(client.get_node_from_key(key))
            pipe = conn.pipeline(transaction=False)
            for cmd in cmds:
                pipe.execute_command(*cmd)
            replies = list(pipe.execute(raise_on_error=False))
            lost = [(i, c) for i, (c, r) in enumerate(zip(calls, replies, strict=True))
                    if isinstance(c, ScriptCall) and isinstance(r, NoScriptError)]
            if lost:
                pipe = conn.pipeline(transaction=False)
                for _, c in lost:
                    pipe.execute_command("SCRIPT", "LOAD", self.sources[c.name])
                    pipe.execute_command(*_eval(self.sources[c.name], c.keys, c.args))
                again = pipe.execute(raise_on_error=False)
                for n, (i, _) in enumerate(lost):
                    replies[i] = again[2 * n + 1]
            return replies

        replies = self.on_node(key, send, what)
        return None if any(isinstance(r, Exception) for r in replies) else replies

    def _reload(self, conn: Any, name: str, keys: Sequence[str], args: Sequence[Any],
                durable: bool) -> tuple[Any, int | None]:
        """A call answered NOSCRIPT (it ran nowhere) sent again on ``conn``: SCRIPT LOAD and
        the call by its source (``_eval``), and its WAIT when durable, in one write."""
        load = ("SCRIPT", "LOAD", self.sources[name])
        cmd = _eval(self.sources[name], keys, args)
        conn.send_packed_command(conn.pack_commands(
            [load, cmd, self.wait] if durable and self.wait is not None else [load, cmd]))
        conn.read_response()
        return self._read(conn, durable)

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
            reply = conn.read_response()
            if self._watch is not None:
                self._trusted(conn)
            return reply, None
        try:
            reply = conn.read_response()
        except ResponseError:
            # The script's error says more (READONLY on a replica, where WAIT errs too).
            with contextlib.suppress(ResponseError):
                conn.read_response()
            raise
        try:
            waited: Any = conn.read_response()
        except ResponseError as exc:  # read whole; UNBLOCKED closes the connection after it
            waited = exc
        acked = _acked(waited)
        if self._watch is not None:
            self._trusted(conn)
        return reply, acked

    def _trusted(self, conn: Any) -> None:
        """Raise ConnectionError for a reply read from a master Sentinel is replacing: what
        it wrote (and the replicas' WAIT for it) may be wiped by its resync (sentinel.py)."""
        if self._watch.demoted(conn.host, conn.port):
            raise RedisConnectionError(f"the reply came from {conn.host}:{conn.port}, a master Sentinel is "
                                       "replacing: it does not count")

    def _by_source(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A call by its source (``_eval``) behind the load of its script, in one write to
        the master of its keys' slot: a load and then the call were two round trips, and a
        worker's first calls to a master answering in 0.4 s each took one more. A slot that
        moved meanwhile (nothing ran there) is followed by the cluster client's own call."""
        source = self.sources[name]
        if not isinstance(self.client, RedisCluster) or not keys:
            self._load(name, keys)
            return self.client.execute_command(*_eval(source, keys, args))
        node = self.client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
        pipe = node.redis_connection.pipeline(transaction=False)
        pipe.execute_command("SCRIPT", "LOAD", source)
        pipe.execute_command(*_eval(source, keys, args))
        reply = pipe.execute(raise_on_error=False)[-1]
        if isinstance(reply, (MovedError, AskError)):
            return self.client.execute_command(*_eval(source, keys, args))  # type: ignore[no-untyped-call]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _load(self, name: str, keys: Sequence[str]) -> None:
        """Load a script where its call goes: on Redis Cluster the master of its keys' slot
        only (SCRIPT LOAD to every master fails while one shard is down, and with it every
        call to the live ones)."""
        if isinstance(self.client, RedisCluster) and keys:
            node = self.client.get_node_from_key(keys[0])  # type: ignore[no-untyped-call]
            node.redis_connection.script_load(self.sources[name])
        else:
            self.client.script_load(self.sources[name])

    def _call_on_node(self, name: str, keys: Sequence[str], args: Sequence[Any],
                      by_source: bool = False) -> tuple[Any, int]:
        """A durable call on Redis Cluster: the script and its WAIT pipelined on one
        connection of the master that holds the slot (RedisCluster would send each on a
        connection of its choosing, and a WAIT elsewhere confirms nothing)."""
        cmd: tuple[Any, ...] = ("EVALSHA", self.shas[name], len(keys), *keys, *args)
        if by_source:  # answered NOSCRIPT already
            self._load(name, keys)
            cmd = _eval(self.sources[name], keys, args)
        assert self.wait is not None
        attempt = 0
        while attempt < 3:
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
                    attempt += 1
                    continue  # a new master holds the slot: send it there
                raise
            if str(acked).startswith("UNBLOCKED"):
                # The master was demoted (a failover): the layout is learnt again for the
                # next call, and this one is an outage (see _acked).
                with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                    self.client.nodes_manager.initialize()
                _acked(acked)
            if isinstance(reply, NoScriptError) and cmd[0] == "EVALSHA":  # nothing ran: by its source
                node.redis_connection.script_load(self.sources[name])
                cmd = _eval(self.sources[name], keys, args)
                continue
            if isinstance(reply, (MovedError, AskError)) and attempt < 2:
                # The slot moved (a failover, a resharding): nothing ran; learn the layout again.
                self.client.nodes_manager.initialize()
                attempt += 1
                continue
            if isinstance(reply, (MovedError, AskError)):
                raise TryAgainError(str(reply))  # type: ignore[no-untyped-call]
            if isinstance(reply, Exception):
                raise reply
            return reply, _acked(acked)
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
             spin: bool = False, durable: bool = False, late: Callable[[Any], object] | None = None) -> Any:
        if pipe is not None:
            pipe.add(name, keys, args, durable)
            return None
        return self.call(name, keys, args, spin=spin, durable=durable, late=late)



# The raw links ------------------------------------------------------------------------


class LinkScripts:
    """Script calls batched over a Link, as Batch sends them over redis-py: each by SHA in
    one write; one answered NOSCRIPT (a restarted or flushed Redis) is loaded and sent
    again, the load and the call in one more write. Read-only scripts only: no WAIT is ever
    sent (``durable`` is refused)."""

    def __init__(self, link: link_mod.Link) -> None:
        self.link = link

    def batch(self) -> LinkBatch:
        return LinkBatch(self.link)


class LinkBatch:
    def __init__(self, link: link_mod.Link) -> None:
        self.link = link
        self.calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []

    def add(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool = False) -> None:
        if durable:
            raise ValueError(f"{name}: a Link sends no durable (WAIT) calls")
        self.calls.append((name, keys, args))

    def execute(self) -> list[Any]:
        from runner.store.sources import SHAS, SOURCES  # here: `runner stats` runs no script

        calls, self.calls = self.calls, []
        replies = self.link.send([("EVALSHA", SHAS[n], len(k), *k, *a) for n, k, a in calls]) if calls else []
        for i, reply in enumerate(replies):
            if _noscript(reply):
                name, keys, args = calls[i]
                _, reply = self.link.send([("SCRIPT", "LOAD", SOURCES[name]), _eval(SOURCES[name], keys, args)])
                replies[i] = reply
            if isinstance(reply, link_mod.ReplyError):
                raise link_mod.raised(reply)
        return replies


async def send_on_loop(link: AsyncLink, scripts: Transport,
                       calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
    """Script calls pipelined in one write on the event loop's link (the client's async
    enqueue, the web fast lane); each reply (or error reply) in its place. A call answered
    NOSCRIPT ran nowhere: it is loaded and sent again, the load and the call in one more
    write. Raises RedisUnavailable when no reply was read (every call's outcome is
    unknown); a reload cut off by an outage puts that error in the place of its call and
    of every later one answered NOSCRIPT, so a call that ran keeps its answer."""
    wire = [("EVALSHA", scripts.shas[name], len(keys), *keys, *args) for name, keys, args in calls]
    replies: list[Any] = await link.send(wire)
    lost: RedisUnavailable | None = None
    for n, reply in enumerate(replies):
        if _noscript(reply):  # it ran nowhere
            if lost is None:
                name, keys, args = calls[n]
                try:
                    _, replies[n] = await link.send([("SCRIPT", "LOAD", scripts.sources[name]),
                                                     _eval(scripts.sources[name], keys, args)])
                except RedisUnavailable as exc:
                    lost = exc
            replies[n] = lost if lost is not None else replies[n]
    return replies
