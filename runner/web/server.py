"""Serving the ASGI app: gunicorn with uvicorn workers for `runner web`, uvicorn on a
thread for `runner dev`.

`runner web` runs gunicorn programmatically: the config is loaded once in the master (so a
broken runner.toml fails before any fork), and each worker process builds its own Runtime
(Redis connections must not cross a fork) and serves ``create_app(runtime)`` on an event
loop (uvloop, and httptools for HTTP/1.1 parsing, when installed). Settings fit a PaaS:
bind 0.0.0.0:$PORT, $WEB_CONCURRENCY worker processes, and a graceful timeout well under
the usual 30 s between SIGTERM and SIGKILL. GUNICORN_CMD_ARGS still overrides any of them.

`runner dev` serves the same app from a thread of its own process, so the app and the
workers share one Runtime and a reload is seen by both at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import uvicorn
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.glogging import Logger
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker

from runner.config import ApiConfig, Config
from runner.errors import ConfigError
from runner.store import codec
from runner.web.problems import MEDIA_TYPE, TYPE_PREFIX

log = logging.getLogger("runner.web")

# SIGTERM -> SIGKILL is 30 s on the common platforms; leave room for the interpreter to exit.
GRACEFUL_TIMEOUT_S = 20


# The request line and headers of one request. gunicorn capped them (a 4 KiB line, 100
# fields of 8 KiB); uvicorn's httptools protocol has no cap of its own and held a 100 MB
# header in memory. Proxies in front are stricter still (commonly 8 to 32 KiB).
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
_HEAD_TOO_LARGE = codec.dumpb({
    "type": TYPE_PREFIX + "headers-too-large", "title": "Request Header Fields Too Large", "status": 431,
    "detail": f"the request line and headers (and a chunked body's trailer fields) must be under "
              f"{MAX_HEAD_BYTES} bytes, in at most "
              f"{MAX_HEADERS} fields",
})


class _HeadTooLarge(Exception):
    pass


class _BadRequest(Exception):
    """A request to answer with the 400: one without an HTTP version, or one that began
    where the framing said none could (see HttpProtocol.data_received)."""


def _blank_end(tail: bytes, data: bytes, pos: int) -> int:
    """Where the first blank line (CRLF CRLF: the parser takes no bare LF) of data[pos:]
    ends, ``tail`` being the (up to 3) bytes read just before pos; -1 if there is none."""
    if tail:
        i = (tail + data[pos:pos + 3]).find(b"\r\n\r\n")
        if i >= 0:
            return pos + i + 4 - len(tail)
    i = data.find(b"\r\n\r\n", pos)
    return i + 4 if i >= 0 else -1


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


def _problem(status: int, reason: bytes, kind: str, title: str, detail: str) -> bytes:
    """A whole response, problem+json, that closes the connection: for what the HTTP layer
    answers itself, before any app sees a request."""
    body = codec.dumpb({"type": TYPE_PREFIX + kind, "title": title, "status": status, "detail": detail})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason, MEDIA_TYPE.encode(), len(body), body))


_BAD_REQUEST = _problem(400, b"Bad Request", "bad-request", "Bad Request",
                        "the request is not valid HTTP/1.1 (its request line, a header, or its framing); "
                        "check the client")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may hold of a process (runner.toml's [api]; docs/security.md)."""

    header_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_connections: int = 1000
    body_timeout_s: float = 60.0

    @classmethod
    def of(cls, api: ApiConfig) -> Limits:
        return cls(api.header_timeout_s, api.idle_timeout_s, api.max_connections, api.body_timeout_s)


# Where a connection is: waiting for a request's head (a new connection too), for its
# body, on the app, or idle between requests (uvicorn's keep-alive timer closes it).
_HEAD, _BODY, _APP, _IDLE = range(4)


class _Sweeper:
    """Once a second, closes the connections of one server past their header or idle
    timeout: one timer per process, not one per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        self.loop = loop
        self.connections = connections
        self.handle: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        if self.handle is None:
            self.handle = self.loop.call_later(1.0, self.sweep)

    def sweep(self) -> None:
        self.handle = None
        now = self.loop.time()
        for c in list(self.connections):
            if isinstance(c, HttpProtocol):
                c.expire(now)
        if self.connections:
            self.wake()


# A response sent before its request's body was read (a 413, a 401, a 404 before the body)
# on a connection that is to close: the rest of the body is read and dropped before the
# close, as nginx's lingering close does. Closing a socket with unread data sends a reset,
# and a client that sends its whole body before it reads (urllib, most SDKs) then loses
# the response it was sent. Bounded: at most this many bytes, this many seconds in all, and
# this long without a byte.
LINGER_BYTES = 64 * 1024 * 1024
LINGER_S = 10.0
LINGER_IDLE_S = 2.0


# Requests read ahead of their answers on one connection (pipelined): past this many queued,
# or while the answers already made wait for the client to read them (the transport's
# buffer over its high-water mark), what else was read is held unparsed and nothing more
# is read. uvicorn parsed a whole read at once: 300 requests in 12 KB queued 300 requests'
# state, and their answers, for a client that never read one.
MAX_AHEAD = 16


class _CycleTransport:
    """The transport as a request's cycle sees it: its writes go through the protocol
    (HttpProtocol.write_response, which sends a response's head together with its body), and
    ``close()`` waits for the request's body to be read first (HttpProtocol.linger).
    Everything else is the transport's own."""

    __slots__ = ("_cycle", "_head_seen", "_protocol", "_transport")

    def __init__(self, transport: asyncio.Transport, protocol: HttpProtocol, cycle: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._cycle = cycle
        self._head_seen = False

    def write(self, data: bytes) -> None:
        if not self._head_seen and self._cycle.response_started:
            # The cycle writes the head once, right after it marks the response started
            # (a 100 Continue, written before, is no head).
            self._head_seen = True
            self._protocol.hold(data)
        else:
            self._protocol.write_response(data)

    def close(self) -> None:
        self._protocol.linger()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), with a cap on the request head: past
    MAX_HEAD_BYTES or MAX_HEADERS the client gets a 431 problem and the connection is
    closed.

    And with what uvicorn lacks against idle connections (Limits): a request's head must
    be in within header_timeout_s of the connection's opening or of the request's first
    byte, else a 408 problem (a connection that sent nothing is just closed); a body that
    pauses for idle_timeout_s is dropped; past max_connections, a new connection closes
    the oldest one that holds no request (idle, or still sending a head), or is itself
    refused when every one is serving. uvicorn never timed out either, so a thousand
    silent connections took every file descriptor of a process.

    A request the parser refuses (no HTTP version, a control character in a header, a bad
    Content-Length, a folded header) gets a 400 problem, not plain text.

    The head is counted in bytes as they arrive, before the parser sees them: httptools
    gathers a header whole before it hands it over, skips the blanks before a value, and
    tells no offsets, so what it hands over undercounts (a 214 KB head behind a pipelined
    request was served). A read is fed to the parser in pieces cut where one message ends
    and the next begins: a head ends at its first blank line, a body after its
    Content-Length or its last chunk (data_received). So each head's bytes are counted
    exactly, from the end of the message before it, whoever sent what before it and
    however its bytes are split across reads, and a head is never refused below the cap.

    A refusal of a head (the 431, a 400, the 408) waits for the answers of the requests
    before it on the connection: they go out first, in order, then the refusal and the
    close. The header timeout of a head does not run while the requests before it are on
    the app (the client may not send more until they are answered), and the connection is
    not one "holding no request" for max_connections.

    A client that does not read its answers: at most MAX_AHEAD requests are parsed ahead of
    their answers, and none while the answers back up (the transport paused its writer);
    such a connection gives way to a new one past max_connections as an idle one does; and
    answers that wait idle_timeout_s without the client reading a byte cut the connection
    (an abort: a close waits for them to be read, and kept the socket for good)."""

    _held: bytes | None = None
    _in_head = False
    _head_bytes = 0  # of the coming head, from the end of the message before it
    _tail = b""  # the last bytes read of a head (or a chunked body's trailers): a blank line may span reads
    _between = True  # no byte of the next request read yet
    _may_begin = True  # the piece being fed may begin a request (see data_received)
    _in_body = False  # the parser is in a body: it ends after _body_left bytes, or chunked
    _body_left = 0
    _chunked = False
    _chunk_left = 0  # bytes of the current chunk's data and its CRLF still to come
    _chunk_line = b""  # the start of a chunk-size line split across reads
    _trailers = False  # past the last chunk: the message ends at the next blank line
    _no_more = False  # the parser reads no message after this one (Connection: close)
    _last_word: bytes | None = None  # a refusal waiting for the answers before it (see _refuse)
    _refused = False
    _body_read = False
    _eof = False  # the client half-closed with requests still to answer (see eof_received)
    _linger_left = 0
    _linger_until = 0.0
    _linger_timer: asyncio.TimerHandle | None = None
    _phase = _HEAD
    _since = 0.0
    _opened = 0.0
    _got_bytes = False
    _body_start = 0.0
    _body_bytes = 0
    _ahead = b""  # read, not yet parsed (from _ahead_pos): held while MAX_AHEAD requests wait, or the answers do
    _ahead_pos = 0
    _ahead_handle: asyncio.Handle | None = None
    _fin = False  # the client half-closed while bytes were held (see _parse_ahead)
    _paused_at = 0.0  # when the answers last backed up (the transport paused its writer)
    _stall_since = 0.0
    _stall_size = 0
    _told_gone = False

    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits: Limits = getattr(config, "runner_limits", None) or Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self._since = self.loop.time()
        state = self.server_state
        sweeper = getattr(state, "runner_sweeper", None)
        if sweeper is None:
            sweeper = _Sweeper(self.loop, self.connections)
            setattr(state, "runner_sweeper", sweeper)  # noqa: B010 (uvicorn's state has no slot for it)
        sweeper.wake()
        if len(self.connections) > self.limits.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        others = [c for c in self.connections
                  if c is not self and isinstance(c, HttpProtocol) and not c.transport.is_closing()]
        idle = [c for c in others if c._phase in (_HEAD, _IDLE) and not c._answering()]
        if idle:
            min(idle, key=lambda c: c._opened).drop()
            return
        # A client that does not read its answers holds its slot as an idle one would:
        # the one backed up the longest gives way. (A request on the app whose client reads
        # is never cut.)
        backed_up = [c for c in others if c.flow.write_paused]
        if backed_up:
            min(backed_up, key=lambda c: c._paused_at).drop()
            return
        # None idle: the slowest of the bodies still arriving gives way (a client that
        # trickles its body holds a slot as long as an idle one would). When every one is
        # on the app, this connection waits its turn.
        now = self.loop.time()
        reading = [c for c in others if c._phase == _BODY and not c.pipeline]  # (pipeline: waits its turn)
        if not reading:
            self.transport.close()
            return
        min(reading, key=lambda c: c._body_bytes / max(now - c._body_start, 1e-3)).drop()

    def drop(self) -> None:
        """Close at once: a close() waits for the answers written to be read, and a client
        that reads none held its socket (and their bytes) for good."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def _stalled(self, now: float) -> bool:
        """Whether the answers written have waited idle_timeout_s without the client
        reading a byte of them (their buffer never shrank)."""
        size = self.transport.get_write_buffer_size()
        if not size:
            self._stall_since = 0.0
        elif not self._stall_since or size < self._stall_size:
            self._stall_since = now
        self._stall_size = size
        return bool(size) and now - self._stall_since > self.limits.idle_timeout_s

    def expire(self, now: float) -> None:
        """Close this connection if it is past its header or idle timeout, or cut it if
        its answers have waited idle_timeout_s for the client to read them (closing too:
        a close waits for them)."""
        if self._stalled(now):
            self.transport.abort()
            return
        if self._linger_timer is not None:
            return  # closing (bounded by LINGER_S)
        phase = self._phase
        if phase == _HEAD and now - self._since > self.limits.header_timeout_s:
            if self.transport.is_closing() or self._answering():
                return  # its clock starts when the answers before it are out (on_response_complete)
            if self._got_bytes:
                self.transport.write(_problem(
                    408, b"Request Timeout", "request-timeout", "Request Timeout",
                    f"the request line and headers must arrive within {self.limits.header_timeout_s:g} s"))
            self.transport.close()
        elif phase == _BODY and (self.pipeline or self._last_word is not None or self._eof):
            # Queued behind a request on the app, not read meanwhile: its clocks start with
            # it. (Or dropped, refused or cut by a FIN: the answers before it go out first.)
            return
        elif phase == _BODY and now - self._since > self.limits.idle_timeout_s:
            self.transport.close()  # the app sees a disconnect
        elif phase == _BODY and now - self._body_start > self.limits.body_timeout_s:
            if self.transport.is_closing() or self._linger_timer is not None:
                return  # lingering after its answer: bounded by LINGER_S already
            self.flush()
            if not (self.cycle is not None and self.cycle.response_started):
                self.transport.write(_problem(
                        408, b"Request Timeout", "request-timeout", "Request Timeout",
                    f"the request body must arrive within {self.limits.body_timeout_s:g} s of its headers "
                    "([api] body_timeout)"))
            self.transport.close()  # the app sees a disconnect

    def _answering(self) -> bool:
        """Whether a request before the coming head (read whole) is still being answered."""
        return not self._in_body and self.cycle is not None and not self.cycle.response_complete

    def on_message_begin(self) -> None:
        if not self._may_begin:
            raise _BadRequest  # a request where a body or another head was to be: refused, never served
        self._may_begin = False
        super().on_message_begin()
        self._in_head, self._between, self._body_read = True, False, False
        self._body_left, self._chunked = 0, False
        if self._phase != _HEAD:
            self._phase, self._since = _HEAD, self.loop.time()

    def on_message_complete(self) -> None:
        self._body_read = True
        self._between = True
        self._in_body = False
        self._head_bytes, self._tail = 0, b""
        self._phase = _APP
        super().on_message_complete()

    def hold(self, head: bytes) -> None:
        """A response's head: sent with the first chunk of its body, in one write.
        uvicorn writes them apart, and each write is a send of its own: for a small
        answer (an enqueue's 202), a second packet and a second wake-up of the client,
        about a quarter of the CPU that the server and the client spend on the request.
        A head whose body does not follow at once (a stream, a HEAD) goes out at the end
        of the loop's turn, or before anything else is written or the response ends."""
        self.flush()
        self._held = head
        self.loop.call_soon(self.flush)

    def write_response(self, data: bytes) -> None:
        """A write of a request's cycle: after the head it holds, if any (see hold)."""
        if self._gone():
            return
        held = self._held
        if held is None:
            self.transport.write(data)
        else:
            self._held = None
            self.transport.writelines((held, data))

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._gone():
                self.transport.write(held)

    def _gone(self) -> bool:
        """Whether the connection is closed or closing (or lingering): an answer still
        being made for it is dropped. (Written, a closed transport raised, and each client that dropped its
        connection mid-answer left an ERROR traceback in the log.)"""
        if not self.transport.is_closing() and self._linger_timer is None:
            return False  # (lingering: its answer is out, the write side shut)
        if not self._told_gone:
            self._told_gone = True
            self.logger.debug("%s: the connection closed before its answer was written", self.client)
        return True

    def linger(self) -> None:
        """Close once the request's body is in (at once if it is): until then the
        response is followed by a FIN, and whatever else arrives is read and dropped."""
        self.flush()
        if self._body_read:
            self.transport.close()
        else:
            self._linger()

    def _linger(self) -> None:
        """Close, reading and dropping what else arrives first (bounded: LINGER_*)."""
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        if self._linger_timer is not None:
            return
        transport.write_eof()
        self._linger_left = LINGER_BYTES
        self._linger_until = self.loop.time() + LINGER_S
        self.flow.resume_reading()
        self._linger_rearm()

    def _linger_rearm(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self._linger_timer = self.loop.call_at(min(self._linger_until, self.loop.time() + LINGER_IDLE_S),
                                               self.transport.close)

    def on_headers_complete(self) -> None:
        if self.parser.get_http_version() not in ("1.1", "1.0"):
            # A request line without a version reads as HTTP/0.9, which ASGI apps refuse
            # (falcon raised: a 500 and a traceback). Raised, the parser stops: a 400.
            raise _BadRequest
        self._in_head, self._tail = False, b""
        self._phase, self._since = _BODY, self.loop.time()
        self._body_start, self._body_bytes = self._since, 0
        super().on_headers_complete()  # (a refusal raised in it waits for the answers before)
        self._in_body, self._no_more = True, not self.parser.should_keep_alive()
        self._chunk_left, self._chunk_line, self._trailers = 0, b"", False
        if self.cycle is not None and not isinstance(self.cycle.transport, _CycleTransport):
            self.cycle.transport = _CycleTransport(self.transport, self, self.cycle)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        self.flush()
        if self._phase == _APP:
            self._phase = _IDLE
        if self._linger_timer is not None:
            # Closing: no keep-alive timer, no pipelined request.
            self.server_state.total_requests += 1
            return
        last, queued = not self.pipeline, len(self.pipeline)
        held = bool(self._ahead)
        if held:
            # Reading stays paused: held bytes are parsed first (on the loop's next turn,
            # not inside the app's send), and reading resumes when they are. (uvicorn's own
            # resumes it here: two system calls an answer, to pause it again at once.)
            self.flow.read_paused = False
        super().on_response_complete()
        if held:
            self.flow.read_paused = True
        if held and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            if len(self.pipeline) <= MAX_AHEAD // 2:  # (in batches: not one parse per answer)
                self._parse_ahead_soon()
        if queued == 1 and self._phase == _BODY:
            # The request whose body is being read was queued (reading paused): it starts now.
            self._since = self._body_start = self.loop.time()
        if self._last_word is not None:
            if last and not self.transport.is_closing():
                self.transport.write(self._last_word)
                self._linger()
            else:
                self.flow.pause_reading()  # nothing more is read: the refusal ends the connection
            return
        if self._phase == _HEAD and last and not self.transport.is_closing():
            # A head begun while the answers before it were made: its timeout runs from now,
            # and it, not the keep-alive timer, closes the connection.
            self._since = self.loop.time()
            self._unset_keepalive_if_required()
        if self._eof and last and not self.transport.is_closing():
            # The client sends no more: the last answer is out, no keep-alive to wait for.
            self._unset_keepalive_if_required()
            self.transport.close()

    def _parse_ahead_soon(self) -> None:
        if self._ahead_handle is None:
            self._ahead_handle = self.loop.call_soon(self._parse_ahead)

    def _parse_ahead(self) -> None:
        """Parse what was held, now that an answer went out or the client read some."""
        self._ahead_handle = None
        if not self._ahead or self.transport.is_closing() or self._last_word is not None:
            return
        data, pos, self._ahead = self._ahead, self._ahead_pos, b""
        self._feed(data, pos)
        if self._ahead or self.transport.is_closing() or self._last_word is not None:
            return
        if self._fin:
            # The FIN came while bytes were held: taken now that they are parsed.
            self._fin = False
            if self.eof_received() is None:
                self.transport.close()
        elif not self.pipeline:
            self.flow.resume_reading()  # (with a request queued, its turn resumes it)

    def pause_writing(self) -> None:
        self._paused_at = self.loop.time()
        super().pause_writing()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._ahead:
            self._parse_ahead_soon()

    def timeout_keep_alive_handler(self) -> None:
        if not self._ahead:  # (bytes held to parse: not idle)
            super().timeout_keep_alive_handler()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol's own is bool | None
        """The client has sent all it will (a half-close: `nc -N`, shutdown(SHUT_WR)).
        Its requests read whole are answered, in order, and then the connection closes;
        one left half-sent is dropped. uvicorn's own returns None, and the transport then
        closed at once: not one of the requests before the FIN got its answer."""
        if self._ahead:
            self._fin = True  # taken when they are parsed (_parse_ahead)
            return True
        pending = (self.cycle is not None and not self.cycle.response_complete) or bool(self.pipeline)
        mid_body = not self._between and not self._in_head  # the app would wait for it forever
        if mid_body and self._drop_queued():
            mid_body = False  # cut in a queued request's body: the ones before it are answered
        # An answer already under way with nothing behind it (an event stream, a follow)
        # is a client gone, as before: a FIN cannot tell a half-close from a close, and a
        # stream kept for a closed client would hold its place (a token's share of them).
        streaming = self.cycle is not None and self.cycle.response_started and not self.pipeline
        if pending and not mid_body and not streaming and self._linger_timer is None \
                and not self.transport.is_closing():
            self._eof = True
            return True  # the write side stays open
        return None  # closed: nothing to answer (or lingering, and the rest of the body is in)

    def connection_lost(self, exc: Exception | None) -> None:
        self._held = None
        self._ahead = b""
        if self._ahead_handle is not None:
            self._ahead_handle.cancel()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            self._refused = True
            raise _HeadTooLarge  # httptools stops; the 431 goes out through send_400_response
        super().on_header(name, value)
        if not self._in_head or len(name) not in (14, 17):
            return  # a chunked body's trailer field, or not one of the two below
        # The body's framing, as the parser takes it (it refuses a Content-Length beside a
        # Transfer-Encoding, and a request's Transfer-Encoding whose last coding is not chunked).
        name, value = self.headers[-1]
        if name == b"content-length":
            self._body_left = int(value)
        elif name == b"transfer-encoding":
            self._chunked = value.rsplit(b",", 1)[-1].strip().lower() == b"chunked"

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            self._linger_left -= len(data)
            if self._linger_left <= 0:
                self.transport.close()
            else:
                self._linger_rearm()
            return
        if self._last_word is not None or (self._no_more and not self._in_body):
            return  # refused, or after a last request (Connection: close): nothing more is parsed
        self._unset_keepalive_if_required()
        if self._ahead:
            self._ahead, self._ahead_pos = self._ahead[self._ahead_pos:] + data, 0  # after what is held
            self.flow.pause_reading()
            return
        self._feed(data)

    def _feed(self, data: bytes, pos: int = 0) -> None:
        """Parse data[pos:] (pos: where the bytes held ahead start)."""
        size = len(data)
        if self._phase == _BODY:
            self._since = self.loop.time()
            self._body_bytes += size - pos
        else:
            self._got_bytes = True
        # Fed in pieces, each cut where a message ends: a piece that starts between two
        # messages is the only one that may begin a request (on_message_begin checks), so
        # a head's bytes are those of the pieces from its start to its blank line, counted
        # before the parser sees them. A read of one request is one piece.
        parser, pipeline = self.parser, self.pipeline
        while pos < size:
            may_begin = self._may_begin = self._between and not self._in_body
            if may_begin and (len(pipeline) >= MAX_AHEAD or self.flow.write_paused):
                # Enough read ahead of the answers: the rest waits (_parse_ahead).
                self._ahead, self._ahead_pos = data, pos
                self.flow.pause_reading()
                return
            if self._in_body:
                end = self._body_end(data, pos)
                if self._head_bytes > MAX_HEAD_BYTES:  # (its trailers)
                    self._refused = True
                    self.send_400_response("")
                    return
            else:
                tail = self._tail
                if tail:
                    end = _blank_end(tail, data, pos)
                else:
                    end = data.find(b"\r\n\r\n", pos)
                    if end >= 0:
                        end += 4
                if end < 0:  # the head goes on in a later read
                    end = size
                    self._tail = (tail + data[max(pos, size - 3):])[-3:]
                self._head_bytes += end - pos
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._refused = True  # (before the parser sees it: nothing of it is dispatched)
                    self.send_400_response("")
                    return
            try:
                parser.feed_data(data if pos == 0 and end == size else data[pos:end])
            except httptools.HttpParserUpgrade:
                if self._should_upgrade() or not self._between:
                    self._upgrade()
                    return
                # An upgrade not taken (h2c): answered as HTTP/1.1, and the requests sent
                # behind it in the same read are parsed too (they were dropped).
                self._unsupported_upgrade_warning()
            except httptools.HttpParserError:
                self.send_400_response("")
                return
            if self.transport.is_closing() or (self._no_more and not self._in_body):
                return
            pos = end

    def _body_end(self, data: bytes, pos: int) -> int:
        """Where in data the body the parser is in ends (len(data): not in it). Moves the
        count of the body's bytes still to come past what it returns."""
        size = len(data)
        if not self._chunked:
            end = min(size, pos + self._body_left)
            self._body_left -= end - pos
            return end
        while pos < size:
            if self._trailers:
                # Trailer fields count against the head's cap (the parser gathers a field
                # by copying: an endless one held the process).
                end = _blank_end(self._tail, data, pos)
                self._head_bytes += (end if end >= 0 else size) - pos
                if end >= 0:
                    return end
                self._tail = (self._tail + data[max(pos, size - 3):])[-3:]
                return size
            if self._chunk_left:
                step = min(self._chunk_left, size - pos)
                self._chunk_left -= step
                pos += step
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self._chunk_line = (self._chunk_line + data[pos:pos + 16])[:16]
                return size
            line, self._chunk_line = self._chunk_line + data[pos:min(eol, pos + 16)], b""
            pos = eol + 1
            digits = _CHUNK_SIZE.match(line)
            if digits is None:
                return size  # the parser refuses the line
            length = int(digits.group(), 16)
            if length:
                self._chunk_left = length + 2  # its data and the CRLF after it
            else:
                self._trailers, self._tail = True, b"\r\n"  # the last chunk: trailer fields, a blank line
        return size

    def _upgrade(self) -> None:
        if self._should_upgrade():
            self.handle_websocket_upgrade()
        else:
            self._unsupported_upgrade_warning()

    def send_400_response(self, msg: str) -> None:
        self.flush()
        if not self._refused:
            self._refuse(_BAD_REQUEST)
            return
        self._refuse(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: %s\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                     % (MEDIA_TYPE.encode(), len(_HEAD_TOO_LARGE), _HEAD_TOO_LARGE))

    def _drop_queued(self) -> bool:
        """Drop the request whose body is being read if it is queued behind others (True):
        it will not be served, and the answers before it go out first."""
        if self._in_body and self.pipeline and self.pipeline[0][0] is self.cycle:
            self.pipeline.popleft()
            return True
        return False

    def _refuse(self, answer: bytes) -> None:
        """Answer and close; after the answers of the requests before, when a head is
        refused behind them (pipelined), so each client request gets its own answer."""
        if not self.transport.is_closing() and (self._answering() or self._drop_queued()):
            self._last_word = answer
            self.flow.pause_reading()
            return
        self.transport.write(answer)
        # The rest of what the client sends is read and dropped first: a close with unread
        # bytes is a reset, and the client would lose the answer.
        self._linger()


class Server(uvicorn.Server):
    """uvicorn's server, which tells the app (its ``drain()``, when it has one) as soon as
    the graceful shutdown begins: uvicorn waits for open responses to finish, and an
    event stream never finishes by itself."""

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = getattr(self.app, "drain", None)
        if drain is not None:
            drain()
        await super().shutdown(sockets)


class Worker(UvicornWorker):  # type: ignore[misc]
    """gunicorn's uvicorn worker, with the capped request head (HttpProtocol), without
    the Server header (it names the software), and two fixes to process handling:

    - gunicorn's quick shutdown: on SIGINT or SIGQUIT to the master each worker gets a
      SIGQUIT, which the stock worker only notes, so it was killed after the whole
      graceful timeout. Here it closes at once. (SIGTERM stays graceful: uvicorn
      finishes the requests in flight.)
    - a worker whose master is gone shuts down instead of serving on."""

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {"loop": "auto", "http": HttpProtocol, "server_header": False}

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        self.config.runner_limits = _limits(self.wsgi)
        server = Server(self.config, self.wsgi)

        def quit_now() -> None:
            server.should_exit = server.force_exit = True

        async def watch_master() -> None:
            # The stock worker never looks: with its master killed (SIGKILL, the OOM
            # killer) it would serve on, orphaned, holding the port.
            while not server.should_exit:
                if os.getppid() != self.ppid:
                    self.log.warning("the master (pid %s) is gone: shutting down", self.ppid)
                    server.should_exit = True
                await asyncio.sleep(1)

        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, quit_now)
        watcher = asyncio.create_task(watch_master())
        # The plain sockets, not gunicorn's wrappers: uvloop closes a listening socket's fd
        # itself on shutdown and then detaches a plain socket, but calls a wrapper's close(),
        # which closed the fd a second time ("Error while closing socket [Errno 9]").
        await server.serve(sockets=[getattr(s, "sock", None) or s for s in self.sockets])
        watcher.cancel()
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)


def _limits(app: Any) -> Limits:
    """The app's connection limits, within the process's open-file limit (raised to its
    hard limit first): past it, accept() fails and no client gets in at all."""
    from runner.web.asgi import LazyApp

    built = app.build() if isinstance(app, LazyApp) else app
    runtime = getattr(built, "runtime", None)
    limits = Limits.of(runtime.config.api) if runtime is not None else Limits()
    import resource

    from runner.web.holding import open_file_room

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    # Room for Redis connections, the log, the offload threads' sockets (the app's bounds
    # on held requests are shares of the same room: holding.py).
    room = open_file_room(limits.max_connections)
    if limits.max_connections > room:
        log.warning("api.max_connections (%d) is over this process's open-file limit (%d): capped at %d",
                    limits.max_connections, soft, max(room, 1))
        limits = Limits(limits.header_timeout_s, limits.idle_timeout_s, max(room, 1), limits.body_timeout_s)
    return limits


def gunicorn_options(host: str, port: int, workers: int, threads: int) -> dict[str, Any]:
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "runner.web.server.Worker",
        # Not gunicorn's threads (an event loop serves the requests): the size of each
        # process's pool for blocking work, passed to create_app.
        "threads": threads,
        # Each worker process listens on a socket of its own and the kernel spreads new
        # connections over them. With one shared socket, whichever process is idle takes
        # every connection that arrives at once, and long-lived keep-alive clients then
        # load one process while the other idles: seen here as 32 connections on one
        # process and half the throughput. Unix-socket binds turn it off (load_config).
        "reuse_port": True,
        "graceful_timeout": GRACEFUL_TIMEOUT_S,
        # A request that takes this long is stuck: enqueueing is a few Redis round trips.
        "timeout": 30,
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "logger_class": "runner.web.server.GunicornLog",
        "proc_name": "runner-web",
    }


class GunicornLog(Logger):  # type: ignore[misc]
    """gunicorn's logger, with an address in its "Listening at" line: with reuse_port the
    master holds no socket (each worker binds its own), and gunicorn's line named none."""

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if msg.startswith("Listening at:") and args and not args[0]:
            where = ", ".join(f"http://{b}" if _is_tcp(b) else b for b in self.cfg.bind)
            args = (f"{where}, a socket per worker process", *args[1:])
        super().info(msg, *args, **kwargs)


class GunicornApp(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: Config, options: dict[str, Any]) -> None:
        self.config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:
            # Newer gunicorns open a control socket under $HOME by default: read-only on
            # some platforms, and shared by every instance on a machine.
            self.cfg.set("control_socket_disable", True)
        # The operator's overrides, as with the gunicorn command.
        parser = self.cfg.parser()
        env_args = parser.parse_args(self.cfg.get_cmd_args_from_env())
        for key, value in vars(env_args).items():
            if value is not None and key != "args":
                self.cfg.set(key.lower(), value)
        if any(not _is_tcp(addr) for addr in self.cfg.bind):
            # Every worker would bind (and first unlink) the same socket file.
            self.cfg.set("reuse_port", False)

    def load(self) -> Any:
        # Runs in each worker after the fork.
        from runner.web import app_for

        return app_for(self.config, threads=self.cfg.threads)


def _is_tcp(addr: str) -> bool:
    return not addr.startswith(("unix:", "fd://"))


def _bind_overridden() -> bool:
    args = shlex.split(os.environ.get("GUNICORN_CMD_ARGS", ""))
    return any(a == "-b" or a.startswith(("--bind", "-b")) for a in args)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port that something already listens on. The workers bind with
    SO_REUSEPORT, so a second server on the same port would otherwise start without error
    and silently take a share of the first one's connections; a plain bind fails. (A bind
    given in GUNICORN_CMD_ARGS is gunicorn's to check.)"""
    if _bind_overridden():
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As gunicorn binds: a port left in TIME_WAIT by a server just stopped is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(config: Config, host: str, port: int, workers: int, threads: int) -> None:
    """Run gunicorn in this process until SIGTERM (graceful) or SIGINT/SIGQUIT (fast)."""
    check_port_free(host, port)
    GunicornApp(config, gunicorn_options(host, port, workers, threads)).run()


# --- dev ---------------------------------------------------------------------------------


class _QuietReads(logging.Filter):
    """Access log lines of reads (the dashboard polls) only at DEBUG; the rest at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and args[1] in ("GET", "HEAD"):
            return log.isEnabledFor(logging.DEBUG)
        return True


class DevServer:
    """uvicorn on its own thread and event loop, with start()/stop(). The socket is bound
    here, so a taken port fails at once and port 0 gets a real port."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        # Listening now, not when the server thread gets to it: a client that connects
        # right after `runner dev` says it serves waits in the backlog, never refused.
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        server_log = logging.getLogger("uvicorn.error")
        if server_log.level == logging.NOTSET:  # its start-up lines repeat what runner dev says
            server_log.setLevel(logging.WARNING)
        access = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, _QuietReads) for f in access.filters):
            access.addFilter(_QuietReads())
        config = uvicorn.Config(app, http=HttpProtocol, lifespan="off", log_config=None, server_header=False,
                                timeout_graceful_shutdown=2, timeout_keep_alive=5)
        config.runner_limits = _limits(app)  # type: ignore[attr-defined]
        self.server = Server(config, app)
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=5)
        self.sock.close()
