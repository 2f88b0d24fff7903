"""Redis Cluster: an enqueue sent straight to the master of its slot, on a connection kept
for it, its answer waited for at most a bound (Transport.enqueue_wait_s).

The bound is the socket's timeout for that call: the caller's thread sends and reads the
call itself, and a master that does not answer in time (stopped or hung, its sockets
open) ends the read, not a thread left waiting. Before, each enqueue went to a thread of
a pool that the caller waited on, which cost one-at-a-time enqueues about 30%.

A call not answered in time may have run: its connection is dropped (it may owe a
reply), the master is marked stalled (NodeLanes: calls to it fail at once, and keyless
jobs pass over its partitions) until a PING to it is answered, and the caller gets
NodeStalled saying the call went out. A connection to be made (the first, or one
dropped so) is made within the same bound, its handshake included: past it the master
is marked stalled as well, and NodeStalled says the call was not sent. A call whose
connection could not be made never reached Redis; one answered MOVED or ASK did not
run (the layout is learnt again, within the same bound, and it goes to the slot's new
master). An error reply is raised as it came (the transport sends a call that lacked its
script again by its source). Nothing that may have run is sent again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.cluster import ClusterNode
from redis.exceptions import AskError, MovedError, ReadOnlyError, RedisClusterException, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runner.store.transport import _acked, _eval, _Lanes, demoted

if TYPE_CHECKING:
    from runner.store.transport import Transport

# The name a read of the cluster's layout goes by among the nodes (NodeLanes.bounded).
LAYOUT = "the cluster's layout"
# The least a read of the layout is waited for, when the call's own bound has run out.
MIN_LAYOUT_S = 0.1


class NodeCalls:
    """Kept connections to each master of a Redis Cluster, for calls bounded by their
    socket's timeout. Shared by threads (a connection is popped whole, as _Lanes does)."""

    def __init__(self, scripts: Transport) -> None:
        self.scripts = scripts
        self._lanes: dict[str, _Lanes] = {}  # node name (host:port) -> its kept connections

    def _lanes_of(self, node: Any) -> _Lanes:
        pool = self.scripts.client.get_redis_connection(node).connection_pool
        lanes = self._lanes.get(node.name)
        if lanes is None or lanes.pool is not pool:  # (a node that left the layout and came back)
            lanes = self._lanes[node.name] = _Lanes(pool)
        return lanes

    def call(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool, wait_s: float,
             spin: bool = False, by_source: bool = False) -> tuple[Any, int | None]:
        """One script call (and its WAIT when ``durable`` and the Transport waits for
        replicas) on the slot's master, answered within ``wait_s`` or NodeStalled (see the
        module's docstring). Returns (the reply, WAIT's count or None)."""
        sc = self.scripts
        client = sc.client
        waits = durable and sc.wait is not None
        cmd: tuple[Any, ...] = _eval(sc.sources[name], keys, args) if by_source else (
            "EVALSHA", sc.shas[name], len(keys), *keys, *args)
        load: tuple[Any, ...] | None = ("SCRIPT", "LOAD", sc.sources[name]) if by_source else None
        for attempt in range(3):
            sc.nodes.relearn()  # (a master marked stalled: its replica may hold its slots now)
            node = client.get_node_from_key(keys[0])
            stalled = sc.nodes.stalled_error(node.name)
            if stalled is not None:
                raise stalled
            lanes = self._lanes_of(node)
            deadline = time.monotonic() + wait_s  # (a connect to be made counts in it)
            try:
                conn = lanes.take(deadline)  # (connects: a failure here sent nothing)
            except RedisTimeoutError:  # accepted, no handshake answered: stalled, not gone
                raise sc.nodes.stalled_now(node.name, wait_s, sent=False) from None
            except RedisConnectionError:
                if attempt < 2 and self._moved(keys[0], node, deadline):
                    continue
                raise
            wire = [c for c in (load, cmd, sc.wait if waits else None) if c is not None]
            try:
                replies = self._round_trip(conn, wire, deadline, spin)
            except RedisTimeoutError:
                conn.disconnect()  # (it may owe replies)
                lanes.give(conn)
                raise sc.nodes.stalled_now(node.name, wait_s) from None
            except RedisConnectionError:
                conn.disconnect()
                lanes.give(conn)
                self._moved(keys[0], node, deadline)  # (a master gone: the next call goes to its successor)
                raise
            except BaseException:
                conn.disconnect()
                lanes.give(conn)
                raise
            lanes.give(conn)
            reply = replies[1 if load is not None else 0]
            # The script's answer first: MOVED or READONLY from a node demoted in a failover
            # says nothing ran, whatever its WAIT answered ("WAIT cannot be used with
            # replica instances"); the layout is learnt again, from that node first (it
            # just answered), and the call goes to the slot's new master.
            if isinstance(reply, (MovedError, AskError)):
                self._moved(keys[0], node, deadline, answered=True)
                continue
            if isinstance(reply, ReadOnlyError):
                if attempt < 2 and self._moved(keys[0], node, deadline, answered=True):
                    continue
                raise reply
            if waits and demoted(replies[-1]):  # the script ran, then its master was demoted
                self._moved(keys[0], node, deadline, answered=True)
            acked = _acked(replies[-1]) if waits else None
            if isinstance(reply, ResponseError):
                raise reply
            return reply, acked
        raise TryAgainError(f"{name}: the slot of {keys[0]!r} kept moving")  # type: ignore[no-untyped-call]

    def _round_trip(self, conn: Any, wire: list[tuple[Any, ...]], deadline: float, spin: bool) -> list[Any]:
        """Send ``wire`` in one write and read each reply (an error reply in its place),
        every read within ``deadline`` (the socket's timeout, restored after)."""
        sock = conn._sock
        conn.send_packed_command(conn.pack_commands(wire) if len(wire) > 1 else conn.pack_command(*wire[0]))
        if spin:
            self.scripts._spin.wait(conn)
        out: list[Any] = []
        try:
            for _ in wire:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:  # read whole: the connection stays in step
                    out.append(exc)
        finally:
            if conn._sock is sock:  # (a timeout drops the socket)
                sock.settimeout(conn.socket_timeout)
        return out

    def _moved(self, key: str, node: Any, deadline: float, answered: bool = False) -> bool:
        """Learn the layout again (a call failed on ``node``), waiting no later than the
        call's ``deadline``; whether ``key``'s slot now has another master.

        redis-py asks the configured masters for the layout one after another, each
        within the 15 s socket timeout: a stalled one among them held the call that long.
        So the read goes on a thread of the pool, waited for until ``deadline`` (LAYOUT
        stands for it among the nodes: while one given up still runs, the next fails at
        once rather than start another), and a layout not learnt in time is learnt later,
        by that read or the next call's.

        redis-py stops at the first master whose layout covers every slot, so the masters
        are asked in an order that puts the ones likely to answer first: ``node`` when it
        ``answered`` (MOVED: it is up, and knows who took its slots), then the masters not
        known stalled, then the stalled ones and ``node`` when it did not answer. Asked in
        the configured order (the URL's masters), a stalled first seed held every read of the layout until it
        answered again (and each call meanwhile was refused "kept moving")."""
        client = self.scripts.client
        manager = client.nodes_manager
        nodes = self.scripts.nodes
        seeds = manager.startup_nodes
        if answered and node.name not in seeds:  # (a node of its own: a read closes the connections it used)
            seeds = {node.name: ClusterNode(node.host, node.port), **seeds}  # type: ignore[no-untyped-call]
        order = sorted(seeds.items(), key=lambda kv: (
            0 if kv[0] == node.name and answered else
            2 if kv[0] == node.name or nodes.stalled(kv[0]) else 1))
        manager.startup_nodes = dict(order)  # (one assignment: a read under way keeps its own)
        try:
            nodes.bounded(LAYOUT, manager.initialize, max(MIN_LAYOUT_S, deadline - time.monotonic()),
                          what="a read of the layout")
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException):
            return False
        return client.get_node_from_key(key) is not node
