"""One connection to one Redis server on an event loop, for the web process's enqueues.

The web process answers on an event loop, and its enqueues used to cross to a thread
of their own for each round trip (combiner.AsyncCombiner): the hand-off, the thread's
wake-up and the answers' way back cost more CPU than the round trip itself. Here the
loop writes the commands and reads the replies on its own transport, as it reads the
HTTP requests, and a request waits for its reply without any other thread.

It connects as link.Link does (the same URLs: redis://, rediss://, unix://; the same
AUTH, CLIENT SETNAME and SELECT, the same timeouts) and fails in the same words: an
outage (refused, timed out, closed, a wrong password, LOADING, READONLY...) raises
RedisUnavailable, any other error reply comes back as a link.ReplyError. Calls are
pipelined: each writes at once, replies come back in order. A call whose reply is late
past the read timeout fails, and with it every call behind it on the connection, which
is closed (its replies can no longer be matched); the next call connects afresh.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import hiredis

from runner.errors import RedisUnavailable
from runner.store import link
from runner.store.link import Address

__all__ = ["AsyncLink"]

_MORE = object()  # hiredis: no whole reply read yet


class _Call:
    __slots__ = ("deadline", "future", "left", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], count: int, deadline: float) -> None:
        self.future = future
        self.left = count
        self.replies: list[Any] = []
        self.deadline = deadline


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: AsyncLink) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(encoding="utf-8", errors="surrogateescape", replyError=link.reply_error,
                                     notEnoughData=_MORE)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not _MORE:
                self.owner._reply(self, reply)
        except hiredis.ProtocolError as exc:  # not a Redis at the other end
            self.owner._fail(self, RedisUnavailable(str(exc)))

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._fail(self, RedisUnavailable("Connection closed by server."))


class AsyncLink:
    """Bound to the event loop of its first call; not for threads or other loops (see
    ``usable``)."""

    def __init__(self, where: Address, tls_verify: bool = True, ca_cert: str | None = None) -> None:
        self.address = where
        self.tls_verify = tls_verify
        self.ca_cert = ca_cert
        self.loop: asyncio.AbstractEventLoop | None = None
        self._proto: _Protocol | None = None  # connected and greeted
        self._live: _Protocol | None = None  # the connection the calls in _calls wait on
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._calls: collections.deque[_Call] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._pid = os.getpid()
        self._binding = threading.Lock()

    def usable(self) -> bool:
        """Whether the running loop may use this link: the first loop that asks takes it
        for the link's life (a web process's one loop). Any other loop, even once the
        first has closed, is refused (its calls take the caller's other path): a link
        handed from loop to loop would race between their threads, and would open and
        drop a connection per loop for code that runs ``asyncio.run`` per call. A forked
        child starts afresh."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self.loop is running:
            return True
        with self._binding:
            if self._pid != os.getpid():  # the parent's connection is not this process's
                self.loop, self._proto, self._live, self._connecting, self._timer = None, None, None, None, None
                self._calls = collections.deque()
                self._pid = os.getpid()
            if self.loop is None:
                self.loop = running
            return self.loop is running

    # -- connecting ---------------------------------------------------------------------

    async def _connected(self) -> _Protocol:
        """The greeted connection; one attempt at a time, shared by every caller that
        waits for it, and not cancelled when one of them goes away."""
        if self._proto is not None:
            return self._proto
        if self._connecting is None:
            assert self.loop is not None
            self._connecting = self.loop.create_task(self._open())
            self._connecting.add_done_callback(self._opened)
        return await asyncio.shield(self._connecting)

    def _opened(self, task: asyncio.Task[_Protocol]) -> None:
        self._connecting = None
        # An exception is each waiter's to raise; a connection lost since is no use.
        if not task.cancelled() and task.exception() is None and task.result() is self._live:
            self._proto = task.result()

    async def _open(self) -> _Protocol:
        a = self.address
        loop = self.loop
        assert loop is not None
        try:
            if a.path is not None:
                make = loop.create_unix_connection(lambda: _Protocol(self), a.path)
            else:
                make = loop.create_connection(lambda: _Protocol(self), a.host, a.port, ssl=self._tls(),
                                              server_hostname=a.host if a.tls else None)
            _, proto = await asyncio.wait_for(make, a.connect_timeout_s)
            self._live = proto
        except TimeoutError:
            raise RedisUnavailable("Timeout connecting to server") from None
        except OSError as exc:
            if exc.errno and str(exc.strerror).startswith("Connect call failed"):  # asyncio's own words
                exc = OSError(exc.errno, os.strerror(exc.errno))
            raise RedisUnavailable(link.connect_error(a.where, exc)) from None
        try:
            await self._hello(proto, a.username)
        except BaseException:
            if proto.transport is not None:
                proto.transport.abort()
            raise
        return proto

    def _tls(self) -> Any:
        return link.tls_context(self.tls_verify, self.ca_cert) if self.address.tls else None

    async def _hello(self, proto: _Protocol, username: str | None) -> None:
        """AUTH, CLIENT SETNAME and SELECT in one write, each reply checked in turn (as
        link.Link._hello)."""
        steps = link.hello_steps(self.address, username)
        replies = await self._write(proto, steps)
        for step, reply in zip(steps, replies, strict=True):
            if not isinstance(reply, link.ReplyError):
                continue
            if step[0] == "AUTH" and username and str(reply) in link.OLD_AUTH:
                return await self._hello(proto, None)  # a server before Redis 6 takes the password alone
            raise link.raised(reply)
        return None

    # -- the wire -----------------------------------------------------------------------

    async def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Every command in one write, then every reply, in order; an error reply is
        returned as a ReplyError, except those that mean a lost connection (a wrong
        password, LOADING), raised as RedisUnavailable (as link.Link.send)."""
        if self.loop is None and not self.usable():
            raise RuntimeError("this link belongs to another event loop")
        proto = self._proto or await self._connected()
        replies = await self._write(proto, commands)
        for reply in replies:
            if isinstance(reply, link.ReplyError) and link.lost(reply):
                self._fail(proto, RedisUnavailable(str(reply)))  # the replies behind it are not in step
                raise RedisUnavailable(str(reply))
        return replies

    def _write(self, proto: _Protocol, commands: Sequence[Sequence[Any]]) -> asyncio.Future[list[Any]]:
        loop = self.loop
        assert loop is not None and proto.transport is not None
        future: asyncio.Future[list[Any]] = loop.create_future()
        if proto.transport.is_closing():
            self._fail(proto, RedisUnavailable("Connection closed by server."))
            future.set_exception(RedisUnavailable("Connection closed by server."))
            return future
        call = _Call(future, len(commands), loop.time() + self.address.timeout_s)
        self._calls.append(call)
        proto.transport.write(b"".join(link.pack(c) for c in commands))
        if self._timer is None:
            self._timer = loop.call_at(call.deadline, self._late, proto)
        return future

    def _reply(self, proto: _Protocol, reply: Any) -> None:
        if proto is not self._live:
            return  # a closed connection's late bytes
        if not self._calls:  # nothing was asked: the stream is out of step, start afresh
            self._fail(proto, RedisUnavailable(f"an unexpected reply from {self.address.where}"))
            return
        call = self._calls[0]
        call.replies.append(reply)
        call.left -= 1
        if call.left:
            return
        self._calls.popleft()
        if not call.future.done():  # a caller cancelled (its request went away): the reply is dropped
            call.future.set_result(call.replies)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._calls:
            assert self.loop is not None
            self._timer = self.loop.call_at(self._calls[0].deadline, self._late, proto)

    def _late(self, proto: _Protocol) -> None:
        self._timer = None
        self._fail(proto, RedisUnavailable(f"Timeout reading from {self.address.where}"))

    def _fail(self, proto: _Protocol, exc: RedisUnavailable) -> None:
        """The connection is done for: every call on it fails with ``exc``; the next
        call connects afresh."""
        if proto is not self._live:
            return  # an old connection, already failed
        self._proto = self._live = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        calls, self._calls = self._calls, collections.deque()
        for call in calls:
            if not call.future.done():
                call.future.set_exception(exc)
        if proto.transport is not None and not proto.transport.is_closing():
            proto.transport.abort()

    def close(self) -> None:
        """Let go of the connection, whatever became of the loop it was made on."""
        loop = self.loop
        if loop is not None and loop.is_closed():
            self._drop()
        elif self._proto is not None:
            self._fail(self._proto, RedisUnavailable("Connection closed by the client."))

    def _drop(self) -> None:
        """The loop has ended (a client used under ``asyncio.run``, closed after it): it can
        run no callback, so the transport cannot be closed through it (asyncio raises
        "Event loop is closed"). The socket is shut down at once, so the server lets go
        of the connection, and the link forgets it; the loop's objects go with it."""
        proto = self._live or self._proto
        self._proto = self._live = self._connecting = self._timer = None
        self._calls = collections.deque()
        sock = None if proto is None or proto.transport is None else proto.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # (the server closed it already)
                sock.shutdown(socket.SHUT_RDWR)
