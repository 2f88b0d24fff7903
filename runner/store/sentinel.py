"""Sentinel's failover, followed as it happens: every connection to a master that Sentinel
is replacing is cut at once, none is made to it again, and no reply read from it counts.

Why: a connection made before a failover stays on the old master until that master
errs. A master that stalls (a SIGSTOP, a long fork, a frozen VM) and resumes after
Sentinel promoted a replica still believes it is the master: it runs the commands that
waited in its sockets and takes new ones, and another replica still attached to it
answers WAIT, until Sentinel demotes it (Sentinel looks at a returning master every 10
s) and its resync from the new master wipes what it took. Measured before this module:
jobs answered OK with ``wait_replicas = 1`` and two replicas were lost, and a worker's
acks went to the stale master for about 10 s and were wiped (the jobs ran again).

How: one thread per sentinel subscribes to its failover events (one set of threads per
process for each set of sentinels and master, shared by its clients, PINGing every
HEALTH_S to notice a connection that died silently). The leader sentinel
says ``+failover-state-send-slaveof-noone`` just before it promotes a replica (then
``+failover-state-wait-promotion`` and ``+promoted-slave``); every sentinel says
``+switch-master`` once it knows the new master. The first of them for our master marks
the old address demoted: the sockets of every connection to it are shut down (a call
waiting on it fails at once, as an outage: the loops back off and reconnect, a producer
gets RedisUnavailable), a connection is refused to it (``_Watched``), and a reply read
from it raises ConnectionError (scripts.py): its WAIT counts for nothing. New connections
ask Sentinel for the master, which names none while the old one is down and the new one
once promoted. A failover Sentinel aborts (``-failover-abort-*``) gives the address back,
as do ``+switch-master`` naming it the master again and, at the latest, DEMOTED_S.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

import redis
from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

log = logging.getLogger("runner.store")

EVENTS = ("+failover-state-send-slaveof-noone", "+failover-state-wait-promotion", "+promoted-slave",
          "+switch-master")
ABORTS = "-failover-abort-*"
DEMOTED_S = 60.0  # a mark outlives any failover; an old master is no master in Sentinel's answers anyway
POLL_S = 1.0
HEALTH_S = 5.0  # a subscription PINGs this often, and is renewed after 3 of them unanswered


class _Feed:
    """The failover events of one master (``service``) from one set of sentinels: one
    thread and one subscribed connection per sentinel, shared by every client of the
    process that names the same set (see Watch), and stopped once none is left."""

    def __init__(self, key: tuple[Any, ...], sentinels: list[tuple[str, int]], service: str,
                 sentinel_kwargs: dict[str, Any]) -> None:
        self.key = key
        self.service = service
        # A subscription waits for events, so reads have no timeout; it is kept honest by a
        # PING every HEALTH_S instead (_follow).
        self._kwargs = {**sentinel_kwargs, "socket_timeout": None, "decode_responses": True}
        self._demoted: dict[tuple[str, int], float] = {}  # address -> when marked (monotonic)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sentinels = sentinels
        self._pid = 0
        self.users = 0  # the Watches started on it (_FEEDS' count)
        self.watches: weakref.WeakSet[Watch] = weakref.WeakSet()
        self.ready = threading.Event()  # set once one subscription is in place

    def start(self) -> None:
        """Follow the sentinels from this process (again in a forked child that uses the
        client: threads do not survive a fork; see demoted)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        for addr in self._sentinels:
            threading.Thread(target=self._follow, args=(addr,), daemon=True, name=f"sentinel-{addr[1]}").start()

    def stop(self) -> None:
        self._stop.set()

    def demoted(self, host: Any, port: Any) -> bool:
        if self._pid and self._pid != os.getpid() and not self._stop.is_set():
            self.start()
        if not self._demoted:
            return False
        try:
            key = (str(host), int(port))
        except (TypeError, ValueError):
            return False
        at = self._demoted.get(key)
        if at is None:
            return False
        if time.monotonic() - at > DEMOTED_S:
            with self._lock:
                self._demoted.pop(key, None)
            return False
        return True

    def _follow(self, addr: tuple[str, int]) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            client = None
            try:
                client = redis.Redis(host=addr[0], port=addr[1], **self._kwargs)
                sub = client.pubsub()  # type: ignore[no-untyped-call]
                sub.subscribe(*EVENTS)
                sub.psubscribe(ABORTS)
                heard = pinged = time.monotonic()
                while not self._stop.is_set():
                    msg = sub.get_message(timeout=POLL_S)
                    now = time.monotonic()
                    if msg is not None:
                        heard = now
                        kind = msg.get("type")
                        if kind in ("message", "pmessage"):
                            self.event(str(msg["channel"]), str(msg["data"]))
                        elif kind == "psubscribe":
                            self.ready.set()
                            backoff = 0.1
                    if now - heard > 3 * HEALTH_S:
                        # A connection that died silently (a host gone, a partition) answers
                        # nothing, not even an error: subscribe again on a new one.
                        raise redis.ConnectionError(f"sentinel {addr[0]}:{addr[1]} silent for {now - heard:.0f} s")
                    if now - pinged >= HEALTH_S:
                        sub.ping()
                        pinged = now
            except (redis.RedisError, OSError, ValueError):
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
            finally:
                if client is not None:
                    client.close()

    def event(self, channel: str, data: str) -> None:
        """One Sentinel event (the channel and its message)."""
        parts = data.split()
        if channel.startswith("-failover-abort"):  # master <name> <ip> <port>
            if len(parts) >= 4 and parts[1] == self.service:
                self._restore((parts[2], int(parts[3])))
            return
        if channel == "+switch-master":  # <name> <old ip> <old port> <new ip> <new port>
            if len(parts) < 5 or parts[0] != self.service:
                return
            old, new = (parts[1], int(parts[2])), (parts[3], int(parts[4]))
        else:  # slave <ip>:<port> <ip> <port> @ <name> <master ip> <master port>
            if len(parts) < 8 or parts[5] != self.service:
                return
            old, new = (parts[6], int(parts[7])), (parts[2], int(parts[3]))
        if old != new:
            self._demote(old, new)

    def _restore(self, addr: tuple[str, int]) -> None:
        with self._lock:
            if self._demoted.pop(addr, None) is not None:
                log.warning("Sentinel aborted the failover of %s:%d; it stays the master", *addr)

    def _demote(self, old: tuple[str, int], new: tuple[str, int]) -> None:
        with self._lock:
            self._demoted.pop(new, None)
            fresh = old not in self._demoted
            self._demoted[old] = time.monotonic() if fresh else self._demoted[old]
        cut = sum(cut_connections(w.pool, old) for w in list(self.watches))
        if fresh:
            log.warning("Sentinel is replacing the master %s:%d with %s:%d: %d connection(s) to it cut; "
                        "no more writes go there", *old, *new, cut)


_FEEDS: dict[tuple[Any, ...], _Feed] = {}  # one per set of sentinels and master, per process
_FEEDS_LOCK = threading.Lock()


def _release(feed: _Feed) -> None:
    """One Watch of ``feed`` closed (or collected): the last one stops its threads."""
    with _FEEDS_LOCK:
        feed.users -= 1
        if feed.users <= 0:
            feed.stop()
            if _FEEDS.get(feed.key) is feed:
                del _FEEDS[feed.key]


def feeds() -> int:
    """How many feeds this process runs (each a thread per sentinel)."""
    return len(_FEEDS)


class Watch:
    """The failover events of one master (``service``), for the connections of ``pool``.
    Every Watch of a process that names the same sentinels, master and settings shares one
    feed (a thread and a subscribed connection per sentinel); ``close`` (or the Watch
    being collected with its client) lets go of it, and the last one stops it."""

    def __init__(self, sentinels: list[tuple[str, int]], service: str, pool: Any,
                 sentinel_kwargs: dict[str, Any]) -> None:
        self.service = service
        self.pool = pool
        self._args = (sentinels, service, sentinel_kwargs)
        self._feed = _Feed((), sentinels, service, sentinel_kwargs)  # its own until started
        self._feed.watches.add(self)
        self._done: weakref.finalize[Any, Any] | None = None

    @property
    def ready(self) -> threading.Event:
        return self._feed.ready

    def start(self) -> Watch:
        sentinels, service, kwargs = self._args
        key = (tuple(sentinels), service, repr(sorted(kwargs.items())))
        with _FEEDS_LOCK:
            feed = _FEEDS.get(key)
            if feed is None:
                feed = _FEEDS[key] = _Feed(key, sentinels, service, kwargs)
                feed.start()
            feed.users += 1
        feed.watches.add(self)
        self._feed = feed
        # Not a method of self: the finalizer must not keep the Watch (and its pool) alive.
        self._done = weakref.finalize(self, _release, feed)
        return self

    def close(self) -> None:
        if self._done is not None:
            self._done()

    def demoted(self, host: Any, port: Any) -> bool:
        """Whether the master at this address is being (or was) replaced."""
        return self._feed.demoted(host, port)

    def event(self, channel: str, data: str) -> None:
        """One Sentinel event (the channel and its message)."""
        self._feed.event(channel, data)


def cut_connections(pool: Any, addr: tuple[str, int]) -> int:
    """Shut down the socket of every connection of ``pool`` to ``addr``: the thread using
    one gets an error at once (its own code disconnects it), an idle one reconnects on its
    next use. Shutting down, not closing, so no thread meets a socket gone from under it."""
    conns = [*list(getattr(pool, "_available_connections", ())), *list(getattr(pool, "_in_use_connections", ()))]
    n = 0
    for conn in conns:
        sock = getattr(conn, "_sock", None)
        if sock is None or (str(conn.host), _port(conn.port)) != addr:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:
            pass
    return n


def _port(port: Any) -> int:
    try:
        return int(port)
    except (TypeError, ValueError):
        return -1


def watch_of(pool: Any) -> Watch | None:
    return getattr(pool, "runner_watch", None)


class _Refusing:
    """Refuses to connect to a master Sentinel is replacing (see the module docstring)."""

    connection_pool: Any

    def connect_to(self, address: tuple[str, int]) -> None:
        pool = self.connection_pool.connection_pool_ref() if hasattr(self.connection_pool, "connection_pool_ref") \
            else self.connection_pool
        watch = watch_of(pool)
        if watch is not None and watch.demoted(*address):
            raise redis.ConnectionError(f"Sentinel is replacing the master at {address[0]}:{address[1]}; "
                                        "waiting for the new one")
        super().connect_to(address)  # type: ignore[misc]


class WatchedConnection(_Refusing, SentinelManagedConnection):
    pass


class WatchedSSLConnection(_Refusing, SentinelManagedSSLConnection):
    pass
