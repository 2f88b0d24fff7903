"""Sentinel's failover events as the store follows them (store/sentinel.py), on a real
server's connections: the event that names our master as the one being replaced cuts
every connection to it at once and marks it demoted; an abort, or a later switch back
to it, gives it back; events of another master change nothing. (The failover itself,
with real sentinels, is tests/crash/test_failover.py.)"""

from __future__ import annotations

import socket
import threading

import pytest
import redis

from runner.store import sentinel
from runner.store.embedded import Server
from runner.store.sentinel import Watch

from conftest import wait_for


def _watch(server: Server) -> tuple[Watch, redis.Redis, redis.Connection]:
    client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    conn = client.connection_pool.get_connection()
    conn.send_command("PING")
    assert conn.read_response() == "PONG"
    return Watch([], "jobs", client.connection_pool, {}), client, conn


@pytest.mark.parametrize("channel,data", [
    ("+failover-state-send-slaveof-noone", "slave 127.0.0.1:9 127.0.0.1 9 @ jobs 127.0.0.1 {port}"),
    ("+promoted-slave", "slave 127.0.0.1:9 127.0.0.1 9 @ jobs 127.0.0.1 {port}"),
    ("+switch-master", "jobs 127.0.0.1 {port} 127.0.0.1 9"),
])
def test_a_master_being_replaced_is_cut_at_once(server: Server, channel: str, data: str) -> None:
    watch, client, conn = _watch(server)
    try:
        assert not watch.demoted("127.0.0.1", server.port)
        watch.event(channel, data.format(port=server.port))
        assert watch.demoted("127.0.0.1", server.port) and not watch.demoted("127.0.0.1", 9)
        with pytest.raises(redis.ConnectionError):  # its socket was shut down under it
            conn.send_command("PING")
            conn.read_response()
        watch.event("-failover-abort-not-elected", f"master jobs 127.0.0.1 {server.port}")
        assert not watch.demoted("127.0.0.1", server.port)
        watch.event(channel, data.format(port=server.port))
        watch.event("+switch-master", f"jobs 127.0.0.1 9 127.0.0.1 {server.port}")  # its turn again
        assert not watch.demoted("127.0.0.1", server.port)
    finally:
        client.connection_pool.release(conn)
        client.close()


def test_another_masters_failover_changes_nothing(server: Server) -> None:
    watch, client, conn = _watch(server)
    try:
        watch.event("+switch-master", f"other 127.0.0.1 {server.port} 127.0.0.1 9")
        watch.event("+promoted-slave", f"slave 127.0.0.1:9 127.0.0.1 9 @ other 127.0.0.1 {server.port}")
        watch.event("+promoted-slave", "garbled")
        assert not watch.demoted("127.0.0.1", server.port)
        conn.send_command("PING")
        assert conn.read_response() == "PONG"
    finally:
        client.connection_pool.release(conn)
        client.close()


class _Blackhole:
    """A TCP proxy to a server whose connections open so far can be made to go silent both
    ways, their sockets left open: a sentinel's host gone, or a partition that drops them."""

    def __init__(self, port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream = port
        self.silenced: set[socket.socket] = set()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if a not in self.silenced:
                    b.sendall(data)
        except OSError:
            pass

    def silence(self) -> None:
        self.silenced.update(self.conns)

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


def test_a_subscription_that_died_silently_is_renewed(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch PINGs its subscriptions: one whose connection went silent (no error, no
    close) is noticed and made again, so the next failover event still reaches it."""
    monkeypatch.setattr(sentinel, "HEALTH_S", 0.2)
    proxy = _Blackhole(server.port)
    client = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    watch = Watch([("127.0.0.1", proxy.port)], "jobs", client.connection_pool, {}).start()
    try:
        wait_for(lambda: watch.ready.is_set(), timeout=10, what="the subscription")
        proxy.silence()
        event = f"jobs 127.0.0.1 {server.port} 127.0.0.1 9"
        wait_for(lambda: client.publish("+switch-master", event) and watch.demoted("127.0.0.1", server.port),
                 timeout=10, interval=0.2, what="a new subscription to hear the failover")
    finally:
        watch.close()
        proxy.close()
        client.close()
