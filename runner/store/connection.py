"""Redis clients from a RedisConfig: a single server, Redis Cluster or Sentinel, each
plain or over TLS, with an ACL user and password when the URL carries them.

    redis://[user:pass@]host:port/db               one server
    rediss://[user:pass@]host:port/db              one server over TLS (PaaS add-ons)
    unix:///path/to/redis.sock?db=0                one server on a unix socket
    redis+cluster://[user:pass@]h1:p1,h2:p2        Redis Cluster (any reachable nodes)
    rediss+cluster://...                           the same over TLS
    redis+sentinel://[user:pass@]s1:p1,s2:p2/<master>?db=0   a master found by Sentinel
    rediss+sentinel://...                          the same over TLS (to master and sentinels)

TLS: ``tls_verify = false`` (or RUNNER_REDIS_TLS_VERIFY=false) accepts a self-signed
certificate, ``ca_cert`` names the CA to verify against.

Client-side retries are off on purpose: a script call that failed on the wire may or may
not have run, and blindly sending it again could apply it twice. Every loop that talks
to Redis handles ConnectionError itself, with backoff and jitter. (Cluster redirects,
MOVED and ASK, are still followed: the node refused the command, nothing ran.)

Replies are decoded as UTF-8 with ``surrogateescape``: bytes that are not UTF-8 (a
corrupt record, a hostile producer) decode to lone surrogates instead of raising in the
middle of a claim, and encode back to the very same bytes, so such a job can still be
settled under its own id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import DefaultParser, HiredisRespSerializer
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    OutOfMemoryError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from runner.config import RedisConfig
from runner.errors import ConfigError
from runner.store import link, urls
from runner.store.refusals import refusal as refusal
from runner.store.refusals import unreachable as unreachable
from runner.store.urls import redact

__all__ = ["UNAVAILABLE", "ClusterUnreachable", "connect", "ping", "reachable", "redact", "refusal", "unreachable"]


class PersistenceFailed(ResponseError):
    """MISCONF: Redis refuses every write because it cannot persist (a full disk, a
    failing RDB or AOF write). The command did not run; like an outage, it is waited out,
    and it clears by itself once Redis can write again."""


class RedisBusy(ResponseError):
    """BUSY: Redis is running a script past its busy threshold and answers nothing else
    until it ends. The command did not run; an outage like any other, waited out."""


class Unconfirmed(redis.ConnectionError):
    """A worker's claim or settlement ran, but its WAIT ([redis] wait_replicas) did not
    confirm it: a master Redis Cluster or Sentinel has replaced answers what it had in its
    socket before it hears of its demotion, and its resync then wipes what the call wrote.
    Its answer is not acted on: a claim's jobs are handed back (their release is fenced by
    the claim's token), a settlement is sent again (fenced likewise: refused where it
    landed, taken where it was wiped). An outage of the call's partition, waited out.
    ``reply``: the script's own reply; ``acked``: the replicas WAIT counted."""

    def __init__(self, message: str, reply: Any = None, acked: int = 0) -> None:
        super().__init__(message)
        self.reply = reply
        self.acked = acked


class NodeStalled(redis.TimeoutError):
    """A Redis Cluster node that has not answered a call within its node wait
    (transport.NodeLanes.bounded): stopped, or hung, with its sockets still open, so the
    call would wait out the whole socket timeout. An outage of that node's partitions.
    ``sent``: the call went out and was given up (it may still run there later); False:
    it was not sent, the node being known stalled already."""

    def __init__(self, *args: object, sent: bool = True) -> None:
        super().__init__(*args)
        self.sent = sent


class ClusterUnreachable(redis.ConnectionError):
    """redis-py's cluster client could not read the cluster's layout: no node it asked
    answered ("Redis Cluster cannot be connected"), or those that did left slots uncovered.
    redis-py raises a bare RedisClusterException for it, which is also its error for a
    misused command; this one is an outage (UNAVAILABLE), and said as one."""


class _Parser(DefaultParser):  # type: ignore[misc, valid-type]
    """redis-py's reply parser, with MISCONF raised as PersistenceFailed and BUSY as
    RedisBusy instead of a bare ResponseError (which the loops would take for a bug and
    log with tracebacks)."""

    EXCEPTION_CLASSES: ClassVar[dict[str, Any]] = {**DefaultParser.EXCEPTION_CLASSES,
                                                    "MISCONF": PersistenceFailed, "BUSY": RedisBusy}


# Exceptions that mean "Redis is not reachable right now".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError,  # includes Sentinel's MasterNotFoundError
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,  # a replica promoted away under us during failover
    ClusterDownError,  # a cluster mid-failover (includes MasterDownError)
    SlotNotCoveredError,
    TryAgainError,  # a slot being migrated
    # A slot being migrated, once redis-py's cluster client (sync or asyncio) gives up on
    # TRYAGAIN, MOVED or ASK after RedisClusterRequestTTL tries: "TTL exhausted". Every try
    # was refused, so the command never ran. (ClusterDownError is a ClusterError too.)
    ClusterError,
    OutOfMemoryError,  # maxmemory reached under noeviction: refused before it ran, wait it out
    PersistenceFailed,  # MISCONF: writes refused until Redis can persist again
    RedisBusy,  # BUSY: a script runs past the busy threshold; nothing else runs meanwhile
    ConnectionError,
    OSError,
)


# The one wording of an outage per kind (refusals.py, which a command on the raw link
# reads without redis-py), and the refused error classes it reads off redis-py's errors.
_REFUSED_CLASSES: tuple[tuple[type[BaseException], str], ...] = (
    (OutOfMemoryError, "OOM"), (PersistenceFailed, "MISCONF"), (redis.exceptions.ReadOnlyError, "READONLY"),
    (RedisBusy, "BUSY"), (redis.exceptions.BusyLoadingError, "LOADING"), (ClusterDownError, "CLUSTER"),
    (SlotNotCoveredError, "CLUSTER"), (TryAgainError, "CLUSTER"), (ClusterError, "CLUSTER"),
)


@contextlib.contextmanager
def reachable() -> Iterator[None]:
    """Raise an outage inside as ``unreachable`` says; every other error as it is."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise unreachable(exc) from exc


def ping(client: Any) -> bool:
    """One PING: True when the server answers it; its error (an outage, a refused
    password) otherwise."""
    return bool(client.ping())

SCHEMES = urls.SCHEMES


class _Packer(HiredisRespSerializer):
    """hiredis packs str arguments as strict UTF-8; an id or field that came back from
    Redis as surrogate-escaped bytes is packed again as those very bytes."""

    def pack(self, *args: Any) -> list[bytes]:
        try:
            return super().pack(*args)  # type: ignore[no-any-return]
        except UnicodeEncodeError:
            raw = tuple(a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a for a in args)
            return super().pack(*raw)  # type: ignore[arg-type, no-any-return]


def _packer() -> dict[str, Any]:
    try:
        import hiredis  # noqa: F401
    except ImportError:  # redis-py's own packer honours encoding_errors already
        return {}
    return {"command_packer": _Packer()}


def _base_kwargs() -> dict[str, Any]:
    return {
        **_packer(),
        "decode_responses": True,
        "encoding_errors": "surrogateescape",
        "socket_connect_timeout": link.CONNECT_TIMEOUT_S,
        "socket_timeout": link.TIMEOUT_S,
        "socket_keepalive": True,
        "health_check_interval": 15,
        "retry": Retry(NoBackoff(), 0),
        "client_name": link.CLIENT_NAME,
        # No CLIENT SETINFO at connect: redis-py sends each of its two apart, a round trip
        # each, and a new connection to a master answering in 0.4 s took 1.2 s to make
        # (the client's name says who it is).
        "lib_name": None,
        "lib_version": None,
        # Not taken by RedisCluster: its nodes' connections get it as they connect
        # (_cluster's Cluster.on_connect).
        "parser_class": _Parser,
    }


def _tls_kwargs(cfg: RedisConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"ssl": True}
    if not cfg.tls_verify:
        kwargs["ssl_cert_reqs"] = "none"
        kwargs["ssl_check_hostname"] = False
    if cfg.ca_cert:
        kwargs["ssl_ca_certs"] = cfg.ca_cert
    return kwargs


def _hosts(netloc: str, what: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """``user:pass@h1:p1,h2:p2`` -> ([(h1, p1), (h2, p2)], user, password)."""
    user = password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        user, _, password = auth.partition(":")
        user, password = unquote(user) or None, unquote(password) or None
    out: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"redis.url: {what} node {part!r} must be host:port")
        out.append((host.strip("[]"), int(port)))
    return out, user, password


def connect(cfg: RedisConfig, **overrides: Any) -> Any:
    """A client for ``cfg.url``: redis.Redis, or RedisCluster for a cluster URL."""
    url = cfg.url
    if not url.startswith(SCHEMES):
        raise ConfigError(f"redis.url: {urls.problem(url)}")
    if "+cluster://" in url:
        return _cluster(cfg, url, overrides)
    if "+sentinel://" in url:
        return _sentinel(cfg, url, overrides)
    kwargs = _base_kwargs()
    if url.startswith("rediss://"):
        kwargs.update(_tls_kwargs(cfg))
        kwargs.pop("ssl")  # implied by the scheme
    if url.startswith("unix://"):
        kwargs.pop("socket_keepalive")  # a TCP option: redis-py's unix connection refuses it
    kwargs.update(overrides)
    return redis.Redis.from_url(url, **kwargs)


def _cluster(cfg: RedisConfig, url: str, overrides: dict[str, Any]) -> Any:
    from redis.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    nodes, user, password = _hosts(parts.netloc, "cluster")
    kwargs = _base_kwargs()
    # The cluster client takes its retry policy itself: none, for the reason above.
    retry = kwargs.pop("retry")
    kwargs.pop("health_check_interval")
    # The cluster client builds its node clients itself and takes no command packer:
    # on a cluster, bytes that are not UTF-8 decode as surrogates but are packed strictly.
    kwargs.pop("command_packer", None)
    if url.startswith("rediss+"):
        kwargs.update(_tls_kwargs(cfg))
    kwargs.pop("parser_class")  # (its nodes' connections get it in Cluster.on_connect)
    if user:
        kwargs["username"] = user
    if password:
        kwargs["password"] = password
    kwargs.update(overrides)
    # Which masters answer now, each asked for at most PROBE_S: the client asks a master
    # that answers for the layout and the command table, rather than wait out a stalled
    # one's socket timeout (15 s per read) as it is built.
    answered, stalled, rtt = _probe(nodes, kwargs)
    nodes.sort(key=lambda hp: f"{hp[0]}:{hp[1]}" not in answered)

    class Cluster(RedisCluster):
        """The client sends COMMAND once, as it is built, to its first master: with that
        master down (one dead shard) or stalled, it asks the others (those that answered
        the probe first), so a process still starts and serves the live shards
        (docs/partitions.md, "A shard down")."""

        runner_stalled: set[str]  # the masters that did not answer the probe (set below)
        runner_rtt: dict[str, float]  # each master's PING round trip in the probe, in seconds

        def on_connect(self, connection: Any) -> None:
            """Each node's connection with this module's reply parser, set before its
            handshake (RedisCluster passes no ``parser_class`` on to its nodes): BUSY and
            MISCONF are RedisBusy and PersistenceFailed there too, outages of that
            master's partitions (a reader leaves them out, as a stalled master's), not
            bare ResponseErrors (an HTTP 500). A new connection to a busy master meets
            BUSY at its handshake first."""
            if not isinstance(getattr(connection, "_parser", None), _Parser):
                connection.set_parser(_Parser)
            super().on_connect(connection)  # type: ignore[no-untyped-call]

        def command(self, **kw: Any) -> Any:
            primaries = sorted(self.get_primaries(), key=lambda n: n.name not in answered)  # type: ignore[no-untyped-call]
            err: BaseException | None = None
            for node in primaries:
                try:
                    return self.execute_command("COMMAND", target_nodes=node, **kw)  # type: ignore[no-untyped-call]
                except UNAVAILABLE as exc:
                    err = exc
            if err is None:
                return super().command(**kw)  # type: ignore[no-untyped-call]
            raise err

    try:
        # Static startup nodes: the client learns the layout again after any failed call,
        # and closes every connection of the node it asked; with the layout's own nodes as
        # startup nodes (the default) that is every connection in use on a live master, so
        # one dead shard failed the calls of every thread on the others, again and again.
        client = Cluster(
            startup_nodes=[ClusterNode(h, p) for h, p in nodes], retry=retry,  # type: ignore[no-untyped-call]
            require_full_coverage=True, dynamic_startup_nodes=False, **kwargs,
        )
    except RedisClusterException as exc:
        # The client reads the cluster's layout at once: no node answering is an outage
        # like any other, not a bug, and said as one (RedisUnavailable, the CLI's exit 3).
        raise unreachable(redis.ConnectionError(str(exc))) from exc
    _one_read_at_a_time(client.nodes_manager)
    live = [n for n in client.get_primaries() if n.name in answered]  # type: ignore[no-untyped-call]
    if live and client.get_default_node().name not in answered:  # type: ignore[no-untyped-call]
        client.set_default_node(live[0])  # type: ignore[no-untyped-call]  # (TIME, INFO: commands of no key go to one that answers)
    # The masters that did not answer the probe in time though their port took the
    # connection (stopped, hung): what the process starts with (Runtime.create) does not
    # wait for them.
    client.runner_stalled = stalled
    # A worker's first call to a master waits for it as long as its round trip asks
    # (Transport.node_wait): a slow master is not taken for a stalled one at its first call.
    client.runner_rtt = rtt
    return client


def _one_read_at_a_time(manager: Any) -> None:
    """Reads of the layout (redis-py's NodesManager.initialize, after any failed call) one
    at a time: each closes the connections of the startup node it asked once it has its
    answer, and two at once closed each other's (a call in another thread's read failed
    "Bad file descriptor" or "Connection closed by server" on a live node, until none was
    left to ask: "Redis Cluster cannot be connected", an HTTP 500 during a master's stall).
    A thread that waited while another read it takes that layout, as fresh as its own. A
    read that finds no layout raises ClusterUnreachable, an outage like any other. The
    startup nodes known stalled (``runner_stalled``: the Transport's NodeLanes.stalled) are
    asked last: redis-py asks them one after another, a stalled one for its 15 s socket
    timeout, and every thread's read would wait behind that one. The order is kept from
    read to read, so a master whose mark was cleared as its replica was promoted
    (NodeLanes.relearn), and which may still be stopped, stays behind the others. Each
    node is asked within LAYOUT_NODE_S (``_bounded_source``), so one newly stalled, not
    yet known, holds a read that long, not its socket timeout; it is asked last by the
    next reads."""
    import threading

    read = manager.initialize
    seeds = [(n.host, n.port) for n in manager.startup_nodes.values()]
    lock = threading.Lock()
    reads = [0]  # layouts read so far
    slow: set[str] = set()  # the startup nodes that did not answer their last CLUSTER SLOTS in time

    def initialize() -> None:
        seen = reads[0]
        with lock:
            if reads[0] != seen:
                return
            _refill(manager, seeds)
            for node in list(manager.startup_nodes.values()):
                _bounded_source(manager, node, slow)
            stalled = getattr(manager, "runner_stalled", None)
            # (One assignment: sorted is stable, the order otherwise kept.)
            manager.startup_nodes = dict(sorted(manager.startup_nodes.items(), key=lambda kv: (
                stalled is not None and stalled(kv[0]), kv[0] in slow)))
            before = manager.default_node
            try:
                read()
            except RedisClusterException as exc:
                raise ClusterUnreachable(str(exc)) from exc
            reads[0] += 1
            _keep_default(manager, before, stalled)

    manager.initialize = initialize


# The longest a read of the layout waits for one startup node's CLUSTER SLOTS (its
# connection and handshake included) before it asks the next: redis-py asks them one after
# another, and a master newly stopped or hung (not yet known stalled) held the read, and
# every read behind it, for its 15 s socket timeout (a second stalled master while the
# first was marked: the first's promoted replica was learnt about 14 s late).
LAYOUT_NODE_S = 1.0


def _bounded_source(manager: Any, node: Any, slow: set[str]) -> None:
    """``node``'s (a startup node's) own client for reads of the layout, its timeouts at
    most LAYOUT_NODE_S: a node that does not answer in time is put in ``slow`` (asked
    after the others by the next reads) and the read asks the next; one that answers
    leaves it."""
    if getattr(node.redis_connection, "runner_layout", False):
        return
    kwargs = dict(manager.connection_kwargs)
    for name in ("socket_timeout", "socket_connect_timeout"):
        kwargs[name] = min(kwargs.get(name) or LAYOUT_NODE_S, LAYOUT_NODE_S)
    r = manager.create_redis_node(node.host, node.port, **kwargs)
    ask = r.execute_command

    def execute_command(*args: Any, **options: Any) -> Any:
        try:
            got = ask(*args, **options)
        except redis.TimeoutError:
            slow.add(node.name)
            raise
        slow.discard(node.name)
        return got

    r.execute_command = execute_command
    r.runner_layout = True
    node.redis_connection = r


def _keep_default(manager: Any, before: Any, stalled: Callable[[str], bool] | None) -> None:
    """After a read of the layout, the default node (redis-py makes it the first master of
    the layout on each read: the master of slot 0) is the one before if it is still a
    master, else a master not known stalled. A pipeline asks the default node for the keys
    of some commands (COMMAND GETKEYS): with a stalled master as default node every read
    of a live master waited on it, was given up, and marked the live master too."""
    masters = [n for n in list(manager.nodes_cache.values()) if n.server_type == "primary"]
    names = {n.name: n for n in masters}
    if before is not None and before.name in names and not (stalled is not None and stalled(before.name)):
        manager.default_node = names[before.name]
        return
    live = [n for n in masters if stalled is None or not stalled(n.name)]
    if live:
        manager.default_node = live[0]


def _refill(manager: Any, seeds: list[tuple[str, int]]) -> None:
    """The startup nodes a read of the layout asks, refilled: redis-py drops the node of
    every call that failed on a lost connection or a timeout from them, and with static
    startup nodes none is ever added back, so after outages of a few masters no node was
    left to ask and a failover was never learnt ("Redis Cluster cannot be connected")
    until the process restarted. The seeds of the URL and the masters of the last layout
    read are added back, each a node of its own (its connections closed after each read,
    never those of the node the calls use)."""
    from redis.cluster import ClusterNode

    nodes = manager.startup_nodes
    known = [(n.host, n.port) for n in list(manager.nodes_cache.values()) if n.server_type == "primary"]
    for host, port in [*seeds, *known]:
        name = f"{host}:{port}"
        if name not in nodes:
            nodes[name] = ClusterNode(host, port)  # type: ignore[no-untyped-call]


PROBE_S = 2.0  # how long a cluster client being built waits for each master's PING
# A probe that found a master stalled is taken as it is by a client built this soon after
# in the same process or a child forked from it (`runner web`'s workers, forked once its
# own client checked the settings): a start waits for one probe, not one per process.
PROBE_KEEP_S = 10.0
_probed: dict[tuple[Any, ...], tuple[float, set[str], set[str], dict[str, float]]] = {}


def _probe(seeds: list[tuple[str, int]], kwargs: dict[str, Any]
           ) -> tuple[set[str], set[str], dict[str, float]]:
    """Which masters answer a PING within PROBE_S (host:port), which took the connection
    and said nothing (stalled), and the round trip of each PING answered (its connection
    made first, so the handshake is not in it): the seeds first, then the masters of the
    layout a seed that answered gives (CLUSTER SLOTS). All at once, each on a connection
    of its own with PROBE_S as its timeouts; a refused connection is neither (a master
    down, which the client's own errors report)."""
    import threading

    keep = {k: v for k, v in kwargs.items() if k in ("username", "password", "decode_responses")
            or k.startswith("ssl")}
    import time

    memo = (tuple(seeds), tuple(sorted((k, repr(v)) for k, v in keep.items())))
    kept = _probed.get(memo)
    if kept is not None and time.monotonic() - kept[0] < PROBE_KEEP_S:
        return set(kept[1]), set(kept[2]), dict(kept[3])
    answered: set[str] = set()
    stalled: set[str] = set()
    rtt: dict[str, float] = {}
    layout: list[Any] = []

    def ask(host: str, port: int, slots: bool) -> None:
        r = redis.Redis(host=host, port=port, socket_timeout=PROBE_S, socket_connect_timeout=PROBE_S,
                        retry=Retry(NoBackoff(), 0), **keep)
        try:
            conn = r.connection_pool.get_connection()  # (connected: its handshake is behind it)
            try:
                t = time.monotonic()
                conn.send_command("PING")  # type: ignore[no-untyped-call]
                conn.read_response()  # type: ignore[no-untyped-call]
                rtt[f"{host}:{port}"] = time.monotonic() - t
            finally:
                r.connection_pool.release(conn)
            answered.add(f"{host}:{port}")
            if slots and not layout:
                layout.append(r.execute_command("CLUSTER SLOTS"))  # type: ignore[no-untyped-call]
        except redis.TimeoutError:
            stalled.add(f"{host}:{port}")
        except Exception:  # refused, an error reply: the client's own call says why
            pass
        finally:
            r.close()

    def run(targets: list[tuple[str, int]], slots: bool) -> None:
        threads = [threading.Thread(target=ask, args=(h, p, slots), daemon=True) for h, p in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join(PROBE_S * 2 + 1)

    run(seeds, True)
    if layout:
        masters = {(str(m[2][0]) or seeds[0][0], int(m[2][1])) for m in layout[0]}
        run([hp for hp in masters if f"{hp[0]}:{hp[1]}" not in answered | stalled], False)
    stalled -= answered
    if stalled:
        _probed[memo] = (time.monotonic(), set(answered), set(stalled), dict(rtt))
    return answered, stalled, rtt


def _sentinel(cfg: RedisConfig, url: str, overrides: dict[str, Any]) -> Any:
    from redis.sentinel import Sentinel

    parts = urlsplit(url)
    sentinels, user, password = _hosts(parts.netloc, "sentinel")
    service = unquote(parts.path.strip("/")) or "mymaster"
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    kwargs = _base_kwargs()
    if url.startswith("rediss+"):
        kwargs.update(_tls_kwargs(cfg))
    try:
        kwargs["db"] = int(query.get("db", "0"))
    except ValueError:
        raise ConfigError(f"redis.url: db must be an integer, got {query['db']!r}") from None
    if user:
        kwargs["username"] = user
    if password:
        kwargs["password"] = password
    kwargs.update(overrides)
    # Sentinels are asked with the same timeouts and TLS settings, and their own password
    # when the URL names one (?sentinel_password=...).
    sentinel_kwargs = {k: v for k, v in kwargs.items()
                       if k.startswith(("socket_", "ssl")) or k == "decode_responses"}
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    if "sentinel_username" in query:
        sentinel_kwargs["username"] = query["sentinel_username"]
    from runner.store.sentinel import Watch, WatchedConnection, WatchedSSLConnection

    # Every connection follows Sentinel's failover events (sentinel.py): cut at once from a
    # master being replaced, and never made to it again.
    kwargs["connection_class"] = WatchedSSLConnection if kwargs.get("ssl") else WatchedConnection
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(service, **kwargs)  # type: ignore[no-untyped-call]
    pool = client.connection_pool
    pool.runner_watch = Watch(sentinels, service, pool, sentinel_kwargs).start()
    return client

