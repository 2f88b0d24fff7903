"""Waiting for jobs to end, pushed: one pub/sub connection per process for every wait.

The scripts that end a waited-for job (ack, bury, reclaim) publish its id on its queue's
``ended`` channel (see ``waited`` in lua/includes/ended.lua). One thread here subscribes to the
channels of every queue and pokes the waits registered for each id it hears of; a wait
then reads the job to see how it ended. Every (re)subscription pokes every wait too:
an end published while the connection was down (a Redis restart) is never heard, so each
wait reads its job again once the subscription is back.

A worker process uses the same subscriber with ``on_message`` for the queues' cancels
channels (a cancel of a job it claimed ahead).

A Redis user that may not subscribe (an ACL user without channels) hears of no end: the
process is "deaf". Its waits then hear from this thread's timer instead: each wait tells
where its job lives (``place``), and every DEAF_POLL_S the thread reads the status alone
(statuses.lua: two commands a job) of every wait that is due, in one round trip for all
of them (a script call per partition), and pokes the waits whose job ended; only those
read their job whole. A job whose status did not change is read ever less often, its
pause doubled from DEAF_POLL_S up to DEAF_POLL_MAX_S, and every DEAF_POLL_S again once it
changed. So an end is answered at most about DEAF_POLL_MAX_S after it (and the round
trips of the two reads), and a held wait costs about two commands a second. On Redis
Cluster each master's calls are waited for at most READ_WAIT_S (as a reader's are): a
partition whose master is down or stalled stays due, and the others are read and poked.

An end published to nobody (the scripts publish under pcall: a worker's Redis user
without channels is refused in silence) is not heard either: while subscribed, the same
timer reads every PUSHED_POLL_S the status of each wait held longer than that, so no wait
misses an end by more than about PUSHED_POLL_S, whatever its publisher may do.

A poke that fails (the event loop of an abandoned ``await_job`` closed) drops that wait
alone, with one warning: the other waits are poked all the same, and this thread goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError
from redis.exceptions import TimeoutError as RedisTimeout

from runner.errors import RedisUnavailable
from runner.store import scriptkeys
from runner.store.connection import UNAVAILABLE

if TYPE_CHECKING:
    from runner.store.keys import QueueKeys
    from runner.store.records import ScriptRunner

log = logging.getLogger("runner.waiter")

Poke = Callable[[], None]
RETRY_S = 0.2  # between reconnection attempts while Redis is away
RETRY_MAX_S = 2.0  # the longest a wait goes without reading while Redis is away
READ_S = 1.0  # a read's timeout, so a stop is seen
# Redis Cluster: a subscription not confirmed this long moves to another master (the one
# it is on stopped answering with its sockets open: stalled).
CONFIRM_S = 2.0
# A Redis user that may not subscribe (an ACL user with no channels: Redis 7's default for
# a new user) hears of no end: the waits' jobs' statuses are read on a timer instead, each
# first DEAF_POLL_S after its wait began, then ever less often while it does not change
# (the pause doubled up to DEAF_POLL_MAX_S: the longest an end goes unseen), again every
# DEAF_POLL_S once it changed; the subscription is tried again every DEAF_RETRY_S (the user
# may be granted them meanwhile). One statuses.lua call reads at most PROBE_IDS jobs.
DEAF_POLL_S = 0.25
DEAF_POLL_MAX_S = 1.0
DEAF_RETRY_S = 30.0
PROBE_IDS = 1000
# While subscribed: a wait held longer than this has its job's status read this often all
# the same (an end its publisher could not publish is seen this late at most).
PUSHED_POLL_S = 3.0
# What statuses.lua says of a job that ended (or is gone: done, or removed): its wait
# reads it whole. Any other status is one the wait goes on waiting through.
ENDS = frozenset({"done", "dead", "cancelled", "-"})


@dataclass(eq=False, slots=True)
class _Probe:
    """Where a deaf wait's job lives, and when its status is read next."""

    keys: QueueKeys
    due: float  # time.monotonic()
    pause: float = DEAF_POLL_S
    last: str | None = None  # the status read last (None: not read yet)
    placed: float = 0.0  # time.monotonic() when it was placed


class Waiter:
    """The waits of one process: job id -> the pokes of its waits."""

    def __init__(self, redis: Any, channels: Sequence[str],
                 on_message: Callable[[list[str]], None] | None = None,
                 scripts: Callable[[], ScriptRunner] | None = None) -> None:
        self.redis = redis
        self.channels = tuple(channels)
        self.on_message = on_message  # every message's words, instead of poking waits
        self.scripts = scripts  # what reads the placed waits' statuses while deaf
        self._probes: dict[str, _Probe] = {}  # job id -> where it lives (placed waits)
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._waits: dict[str, set[Poke]] = {}
        self._subscribed = threading.Event()
        self._more: list[str] = []  # channels to add, subscribed by the listening thread
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pubsub: Any = None  # the listening thread's, for stop to wake its read
        # Set while the server refuses this user the channels: the waits read on a timer.
        self.deaf = False

    def pull_after(self, soon: float | None, job_id: str | None = None) -> float | None:
        """How soon a wait reads again: ``soon``; while nothing can be heard, at most
        DEAF_POLL_S, unless its job is placed: then this thread reads its status and pokes
        it once it ended."""
        if not self.deaf or (job_id is not None and self.scripts is not None and job_id in self._probes):
            return soon
        return DEAF_POLL_S if soon is None else min(soon, DEAF_POLL_S)

    def add(self, job_id: str, poke: Poke) -> None:
        with self._lock:
            self._waits.setdefault(job_id, set()).add(poke)

    def place(self, job_id: str, keys: QueueKeys) -> None:
        """Where a waited job lives (its queue's partition), for reading its status while
        deaf. Placed again in the same partition, nothing changes; elsewhere (it moved),
        it is read there from the start."""
        with self._lock:
            if job_id not in self._waits:
                return  # (its waits are over)
            p = self._probes.get(job_id)
            if p is None or p.keys.job_prefix != keys.job_prefix:
                now = time.monotonic()
                self._probes[job_id] = _Probe(keys, now + DEAF_POLL_S, placed=now)

    def extend(self, channels: Sequence[str]) -> None:
        """Listen to these channels too (a draining partition found after the start)."""
        with self._lock:
            new = [c for c in channels if c not in self.channels]
            self.channels += tuple(new)
            self._more += new

    def discard(self, job_id: str, poke: Poke) -> None:
        with self._lock:
            pokes = self._waits.get(job_id)
            if pokes is not None:
                pokes.discard(poke)
                if not pokes:
                    del self._waits[job_id]
                    self._probes.pop(job_id, None)

    def start(self) -> None:
        """Start the subscriber if needed, without waiting for it: a wait registered
        before the subscription is confirmed is poked once it is (see _listen)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="runner-waiter", daemon=True)
                self._thread.start()

    def ready(self, timeout_s: float) -> bool:
        """Start the subscriber if needed; True once it listens (a wait registered before
        this returns hears of every end published after it)."""
        self.start()
        return self._subscribed.wait(timeout_s)

    def stop(self, wait: bool = True) -> None:
        """Stop listening; ``wait`` for the thread (up to a read's timeout), or leave it
        to end on its own (a daemon thread, gone with the process)."""
        self._stopped.set()
        self._wake()
        if wait and self._thread is not None:
            self._thread.join(timeout=READ_S + 1)

    def _wake(self) -> None:
        """End the listening thread's blocked read now rather than at its timeout (a
        `runner call` would exit a second late): shutting the socket down, unlike closing
        it, is safe while another thread reads it. The read then fails as a lost
        connection, and the thread, seeing the stop, ends."""
        with self._lock:
            pubsub = self._pubsub
        sock = getattr(getattr(pubsub, "connection", None), "_sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _poke(self, job_ids: Sequence[str] | None) -> None:
        """Poke the waits of these ids (None: of every id). A poke that raises (the event
        loop of an ``await_job`` left pending was closed) drops its wait, with a warning;
        the other waits are poked all the same."""
        with self._lock:
            if job_ids is None:
                pokes = [(i, p) for i, ps in self._waits.items() for p in ps]
            else:
                pokes = [(i, p) for i in job_ids for p in self._waits.get(i, ())]
        for i, p in pokes:
            try:
                p()
            except Exception as exc:
                self.discard(i, p)
                log.warning("waiter: a wait for job %s could not be told of its job (%r): that wait is "
                            "dropped (an await_job left pending on an event loop that was closed?)", i, exc)

    def _subscriber(self, attempt: int) -> Any:
        """A pub/sub connection: on Redis Cluster, on a master that answered (a PUBLISH
        reaches every master), the client's default one first, the next at each attempt;
        those the client's probe found stalled last. Else the client's own."""
        primaries = getattr(self.redis, "get_primaries", None)
        if primaries is None:
            return self.redis.pubsub()
        stalled: set[str] = getattr(self.redis, "runner_stalled", set())
        first = self.redis.get_default_node()
        nodes = sorted(primaries(), key=lambda n: (n.name in stalled, n is not first, n.name))
        return self.redis.pubsub(node=nodes[attempt % len(nodes)]) if nodes else self.redis.pubsub()

    def _run(self) -> None:
        attempt = 0
        while not self._stopped.is_set():
            pubsub = None
            refused = False
            try:
                pubsub = self._subscriber(attempt)
                with self._lock:
                    channels, self._more = self.channels, []
                pubsub.subscribe(*channels)
                with self._lock:
                    self._pubsub = pubsub
                if self._stopped.is_set():  # stopped before the read could be woken
                    break
                self._listen(pubsub)
            except UNAVAILABLE as exc:
                attempt += 1  # (on Redis Cluster, on the next master)
                log.debug("waiter: Redis unreachable, subscribing again: %s", exc)
            except NoPermissionError as exc:
                refused = True
                if not self.deaf:
                    self.deaf = True
                    user = getattr(getattr(self.redis, "connection_pool", None), "connection_kwargs", {}).get(
                        "username") or "<user>"
                    log.warning("the Redis user may not subscribe to runner's channels (%s): waits read "
                                "their jobs' statuses every %g to %g s instead, and a worker hears no cancel "
                                "of a job it claimed ahead until it starts it; grant them: ACL SETUSER %s "
                                "resetchannels '&<prefix>:*' (or allchannels)", exc, DEAF_POLL_S,
                                DEAF_POLL_MAX_S, user)
                    # The waits read once more, and place their jobs for the timer. (Not at
                    # each attempt after: each wait's whole read every DEAF_RETRY_S would
                    # cost more than all its status reads; a placed job's status is read
                    # again once this thread is back, due at once after an outage.)
                    self._poke(None)
                    with self._lock:  # (read at the next tick, whatever the pushed timer said)
                        for p in self._probes.values():
                            p.due = min(p.due, time.monotonic())
            except Exception:  # a stray error must not leave every wait to its timeout
                log.exception("waiter: subscription failed, subscribing again")
            finally:
                self._subscribed.clear()
                with self._lock:
                    self._pubsub = None
                if pubsub is not None:
                    with contextlib.suppress(*UNAVAILABLE):
                        pubsub.close()
            if refused:  # (its connection closed: the statuses go on the client's own)
                self._read_deaf(DEAF_RETRY_S)
                continue
            # What ends while we are away is published to nobody: the waits read their jobs
            # again once the subscription is back (see _listen), not before.
            self._stopped.wait(RETRY_S)

    def _listen(self, pubsub: Any) -> None:
        confirmed = 0
        since = time.monotonic()
        cluster = hasattr(self.redis, "get_primaries")
        checked = time.monotonic()
        while not self._stopped.is_set():
            if self._subscribed.is_set() and time.monotonic() - checked >= DEAF_POLL_S:
                checked = time.monotonic()
                self._read_pushed()  # (those due only: most ticks read nothing)
            if cluster and not self._subscribed.is_set() and time.monotonic() - since > CONFIRM_S:
                raise RedisTimeout(f"Redis node {getattr(pubsub.node, 'name', '?')} did not confirm the "
                                   f"subscription within {CONFIRM_S:g} s (stopped or hung)")
            if self._more:  # a pubsub connection is this thread's alone: it subscribes
                with self._lock:
                    more, self._more = self._more, []
                pubsub.subscribe(*more)
            # (while waits are held, back at least every DEAF_POLL_S for the pushed timer)
            msg = pubsub.get_message(timeout=DEAF_POLL_S if self._probes else READ_S)
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "subscribe":
                confirmed += 1
                self.deaf = False
                # ">=": the connection may subscribe again by itself after a reconnection
                # (a Redis restart), confirming every channel once more.
                if confirmed >= len(self.channels):
                    self._subscribed.set()
                    # An end published before this subscription was heard by nobody.
                    self._poke(None)
            elif kind == "message":
                data = msg.get("data")
                if isinstance(data, bytes):
                    data = data.decode()
                if isinstance(data, str):
                    if self.on_message is not None:
                        self.on_message(data.split())
                    else:
                        self._poke(data.split())

    def _read_pushed(self) -> None:
        """While subscribed, the statuses of the waits held longer than PUSHED_POLL_S, and
        a poke for those whose job ended unheard (its publisher refused the channels)."""
        if self.scripts is None:
            return
        try:
            self._tick(self.scripts(), pushed=True)
        except Exception as exc:
            if isinstance(exc, (*UNAVAILABLE, RedisUnavailable)):
                log.debug("waiter: reading the held jobs' statuses failed: %s", exc)
            else:
                log.exception("waiter: reading the held jobs' statuses failed")

    def _read_deaf(self, for_s: float) -> None:
        """For ``for_s`` (or until stopped): every DEAF_POLL_S, the statuses of the placed
        waits that are due, and a poke for those whose job ended. After a tick that met an
        outage, the next waits longer (RETRY_S doubling up to RETRY_MAX_S)."""
        if self.scripts is None:  # (a worker's subscriber to the cancels: no waits)
            self._stopped.wait(for_s)
            return
        until = time.monotonic() + for_s
        failures = 0
        while not self._stopped.is_set():
            began = time.monotonic()
            left = until - began
            if left <= 0:
                return
            try:
                self._tick(self.scripts())
                failures = 0
            except Exception as exc:  # a stray error must not stop the waits' reads either
                failures += 1
                if self._stopped.is_set():
                    return  # (the runtime is closing: its connections with it)
                if isinstance(exc, (*UNAVAILABLE, RedisUnavailable)):
                    log.debug("waiter: reading the waited jobs' statuses failed: %s", exc)
                else:
                    log.exception("waiter: reading the waited jobs' statuses failed")
            # (a tick every DEAF_POLL_S from the last one's start: a pause is not stretched
            # by the reads' round trips)
            pause = max(began + DEAF_POLL_S - time.monotonic(), DEAF_POLL_S / 5) if not failures else \
                min(RETRY_S * 2.0 ** failures, RETRY_MAX_S)
            self._stopped.wait(min(left, pause))

    def _tick(self, scripts: ScriptRunner, pushed: bool = False) -> None:
        """One read of the statuses of every placed wait due now (or within half a tick:
        their reads share the round trip), one statuses.lua call per partition (and per
        PROBE_IDS jobs); then each one's next read, and a poke for each one that ended.
        ``pushed``: while subscribed, those held PUSHED_POLL_S or longer, read again
        PUSHED_POLL_S later. On Redis Cluster each master is waited for at most
        READ_WAIT_S: a partition whose call failed is read again at its next tick (within
        DEAF_POLL_MAX_S), the others are answered and poked."""
        from runner.store.transport import READ_WAIT_S

        now = time.monotonic()
        with self._lock:
            if pushed:
                due = [(i, p) for i, p in self._probes.items()
                       if p.due <= now and now - p.placed >= PUSHED_POLL_S]
            else:
                due = [(i, p) for i, p in self._probes.items() if p.due <= now + DEAF_POLL_S / 2]
        if not due:
            return
        by_tag: dict[str, list[tuple[str, _Probe]]] = {}
        for i, p in due:
            by_tag.setdefault(p.keys.job_prefix, []).append((i, p))
        batch = scripts.batch()
        calls: list[list[tuple[str, _Probe]]] = []
        for some in by_tag.values():
            for at in range(0, len(some), PROBE_IDS):
                chunk = some[at:at + PROBE_IDS]
                batch.add("statuses", scriptkeys.keys("statuses", chunk[0][1].keys), [i for i, _ in chunk])
                calls.append(chunk)
        if getattr(scripts, "one_server", True):  # (one server, or a Link's: one round trip, or an outage)
            replies = batch.execute()
        else:  # Redis Cluster: each master's answer on its own, one that does not answer given up
            with scripts.waiting(READ_WAIT_S):  # type: ignore[attr-defined]
                replies = batch.execute(raise_on_error=False)  # type: ignore[call-arg]
        now = time.monotonic()
        ended: dict[str, tuple[_Probe, str]] = {}
        failed: list[BaseException] = []
        with self._lock:
            for chunk, reply in zip(calls, replies, strict=True):
                if isinstance(reply, BaseException):
                    failed.append(reply)
                    for _, p in chunk:  # read again at its next tick
                        p.due = now + (PUSHED_POLL_S if pushed else DEAF_POLL_MAX_S)
                    continue
                for (i, p), raw in zip(chunk, reply, strict=True):
                    status = raw.decode() if isinstance(raw, bytes) else str(raw)
                    if self._probes.get(i) is not p:
                        continue  # its waits are over, or it moved meanwhile
                    if pushed:
                        p.due = now + PUSHED_POLL_S
                        if status in ENDS:
                            ended[i] = (p, status)
                        continue
                    # Something changed: it may change again soon. Else read it less often.
                    p.pause = DEAF_POLL_S if p.last is not None and status != p.last else \
                        min(p.pause * 2, DEAF_POLL_MAX_S)
                    if status in ENDS and status != p.last:
                        ended[i] = (p, status)
                    else:
                        p.last = status
                    p.due = now + p.pause
        if ended:
            self._poke(list(ended))
            with self._lock:  # (recorded once its waits were poked: else poked at the next tick)
                for p, status in ended.values():
                    p.last = status
        if failed and len(failed) == len(calls):
            raise failed[0]  # (every partition away: the timer backs off)
        for exc in failed:
            log.debug("waiter: a partition's statuses were not read: %s", exc)


def retry_after(soon: float | None, failures: int) -> float | None:
    """How soon a wait reads again: ``soon`` (None: on a poke only), and after reads that
    met an outage RETRY_S, doubling per failure up to RETRY_MAX_S (a thousand waits of
    a web process do not hammer a Redis that is down; its return pokes them anyway)."""
    if not failures:
        return soon
    backoff: float = min(RETRY_S * 2.0 ** (failures - 1), RETRY_MAX_S)
    return backoff if soon is None else min(soon, backoff)


def wait_until(waiter: Waiter, deadline: float, check: Callable[[], bool], job_id: str,
               poll: Callable[[], float | None] | None = None) -> None:
    """Block until ``check()`` is true or the deadline (time.monotonic) passes. ``check``
    runs at once (its errors raised: Redis away, no such job), after each poke, after
    the subscription is confirmed (closing the race with an end before it), and once at
    the deadline. The wait registers before the first check and does not wait for the
    subscriber: it is poked once the subscription is confirmed. Redis going away after
    the first check does not end the wait: the subscription coming back pokes it.
    ``poll()`` says how soon to check again without a poke (None: only on one), for a job
    whose change nothing publishes (an announced id not written yet, a status that is
    not an end). A check that met an outage is tried again (see retry_after): the poke
    of the subscription coming back may reach a read on a connection the restart cut."""
    event = threading.Event()
    waiter.add(job_id, event.set)
    try:
        waiter.start()
        ended, failures = check(), 0
        while not ended:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            soon = waiter.pull_after(retry_after(poll() if poll is not None else None, failures), job_id)
            event.wait(left if soon is None else min(left, soon))
            event.clear()
            try:
                ended, failures = check(), 0
            except RedisUnavailable:
                failures += 1
    finally:
        waiter.discard(job_id, event.set)
