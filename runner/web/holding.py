"""The requests that hold their connection in a ``?wait=`` (call and wait): how many one
token, and the whole process, may hold at once.

A wait holds a connection for up to ``[api] max_wait``, and the server never cuts a
connection whose request is on the app to make room for a new one (server.py). Unbounded,
one producer's call-and-wait requests for delayed jobs (which never end within the wait)
took every one of ``[api] max_connections``, and every other client's connection was
reset for the wait's length. So one token holds at most TOKEN_PART of the connections in
waits, and all tokens together at most PROCESS_PART: the rest always serve everything
else. Past a bound, the route answers at once as without the wait (jobs.py, groups.py).
The open API (no token) counts as one token, as for the event streams (hub.py).

The shares are of the connections the process really takes: ``max_connections``, or
fewer under a low open-file limit (open_file_room; server.py caps the server alike). And
the process's share bounds every request that holds its connection, waits, event streams
(hub.py) and follows (watching.py) together: each kind's per-token cap alone let a few
tokens fill the process.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterator

import falcon.asgi

from runner.web.events import _owner
from runner.web.problems import Problem

# Shares of [api] max_connections: a token's waits, and every token's together.
TOKEN_PART = 8
PROCESS_PART = 2
# A refused GET ?wait= comes back after this: a held wait frees its place within max_wait.
RETRY_AFTER_S = 5


# What the process keeps of its open files for Redis connections, the log and threads.
SPARE_FILES = 64


def open_file_room(max_connections: int) -> int:
    """The connections this process can take: ``max_connections``, or its open-file limit
    less SPARE_FILES when that is lower (past it, accept() fails for every client)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - SPARE_FILES))


class Waits:
    """The waits held on this process, per token (one per app: its event loop's), and the
    process's bound on every request holding its connection (``others``: how many event
    streams and follows are open; ``full``)."""

    def __init__(self, max_connections: int) -> None:
        room = open_file_room(max_connections)
        self.per_token = max(1, room // TOKEN_PART)
        self.most = max(1, room // PROCESS_PART)
        self.held: dict[str, int] = {}
        self.others: list[Callable[[], int]] = []

    def total(self) -> int:
        """Requests holding their connection now: waits, event streams and follows."""
        return sum(self.held.values()) + sum(count() for count in self.others)

    def full(self) -> str | None:
        """Why one more held request (of any kind) is refused, or None."""
        if self.total() >= self.most:
            return (f"this web process already holds {self.most} requests open (waits, event streams and "
                    "follows of every token together), the most it holds so that other requests are served; "
                    "retry shortly")
        return None

    def refusal(self, owner: str) -> str | None:
        """Why one more wait of this token is refused, or None."""
        if self.held.get(owner, 0) >= self.per_token:
            return (f"this token already holds {self.per_token} requests waiting (?wait=) on this web process, "
                    "the most one token may; ask again without ?wait=, or once one of them answered")
        if self.total() >= self.most:
            return (f"this web process already holds {self.most} requests waiting (?wait=) or streaming, the "
                    "most it holds for every token together; ask again without ?wait=, or shortly")
        return None

    @contextlib.contextmanager
    def holding(self, req: falcon.asgi.Request) -> Iterator[bool]:
        """Counts this request's wait while the block runs; yields False (nothing counted)
        when it is past a bound: the caller answers at once instead."""
        owner = _owner(req)
        if self.refusal(owner) is not None:
            yield False
            return
        self.held[owner] = self.held.get(owner, 0) + 1
        try:
            yield True
        finally:
            self.held[owner] -= 1
            if not self.held[owner]:
                del self.held[owner]

    def admit(self, req: falcon.asgi.Request) -> contextlib.AbstractContextManager[bool]:
        """``holding``, for a read that has no answer without its wait: past a bound, a 429
        with Retry-After."""
        refused = self.refusal(_owner(req))
        if refused is not None:
            raise Problem(429, "too-many-waits", refused, title="Too many waiting requests",
                          headers={"Retry-After": str(RETRY_AFTER_S)})
        return self.holding(req)
