"""The socket between a worker and one of its child processes (isolation.py, child.py):
length-framed JSON messages, a 4-byte big-endian length and then the body.

Both ends are runner, so the body is orjson's, read back by orjson alone (no depth or
long-integer passes: a handler's values cross it as the strings they were encoded to,
and what the child cannot encode never reaches it). A message goes out in one system
call; messages come in through one buffer, so a burst of them (a child's outcomes, ended
one after another while the worker was busy) costs one read, not two per message as
multiprocessing's Connection did.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from contextlib import AbstractContextManager
from typing import Any

import orjson

_HEADER = struct.Struct("!I")
READ_BYTES = 65536  # one read's worth: a whole batch of outcomes


class Channel:
    """One end of the socket. ``send`` may be called from several threads if the caller
    serialises them; ``recv`` and ``fill`` from one thread only.

    ``own_work`` is entered around what this end allocates for a message (encoding and
    sending one, taking in what was read, decoding one), never around the wait for the
    other end: a child lifts its handler's MEMORY_MB there (child.MemoryCap). The wait
    reads into a buffer allocated once, so it allocates nothing under that cap."""

    def __init__(self, sock: socket.socket, own_work: AbstractContextManager[Any] | None = None) -> None:
        self.sock = sock
        self.own_work: AbstractContextManager[Any] = own_work or contextlib.nullcontext()
        self._buf = bytearray()
        self._at = 0  # where the next message starts in _buf
        self._read = bytearray(READ_BYTES)  # what one read brings, before it joins _buf

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, Any]) -> None:
        # The sending goes past own_work: a blocking call lets the process's other threads
        # run, and a child's handler threads would allocate past its MEMORY_MB meanwhile.
        with self.own_work:
            body = orjson.dumps(msg)
            framed = _HEADER.pack(len(body)) + body if len(body) < READ_BYTES else None
        self._send(body, framed)

    def send_encoded(self, body: bytes) -> None:
        """A message the caller encoded (JSON), sent with nothing allocated in own_work:
        framing it may raise MemoryError, and then nothing was sent."""
        self._send(body, _HEADER.pack(len(body)) + body if len(body) < READ_BYTES else None)

    def _send(self, body: bytes, framed: bytes | None) -> None:
        if framed is not None:
            self.sock.sendall(framed)
        else:  # (a large result or payload: not copied again to join its header)
            self.sock.sendall(_HEADER.pack(len(body)))
            self.sock.sendall(body)

    def next(self) -> dict[str, Any] | None:
        """The next whole message already received, or None (reads nothing)."""
        buf, at = self._buf, self._at
        if len(buf) - at < 4:
            return None
        (size,) = _HEADER.unpack_from(buf, at)
        end = at + 4 + size
        if len(buf) < end:
            return None
        with self.own_work:
            msg = orjson.loads(buf[at + 4:end])  # (a copy: a view would pin the buffer's size)
        if end == len(buf):
            buf.clear()
            self._at = 0
        else:
            self._at = end
            if end > READ_BYTES:  # what was read is mostly parsed: drop it
                del buf[:end]
                self._at = 0
        if not isinstance(msg, dict):
            raise ValueError(f"a message that is not an object: {type(msg).__name__}")
        return msg

    def fill(self) -> None:
        """Read what the socket holds (blocking until something comes); EOFError once the
        other end is gone."""
        n = self.sock.recv_into(self._read)
        if not n:
            raise EOFError
        with self.own_work:
            self._buf += memoryview(self._read)[:n]

    def recv(self) -> dict[str, Any]:
        """The next message, waiting for it; EOFError once the other end is gone."""
        while True:
            msg = self.next()
            if msg is not None:
                return msg
            self.fill()

    def close(self) -> None:
        self.sock.close()
