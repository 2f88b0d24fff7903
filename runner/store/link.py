"""One plain connection to one Redis server, for the commands that make a round trip or
two and exit (`runner job`, `runner stats`, `runner check`): a socket, with commands packed and replies
parsed by hiredis (in C, as redis-py itself uses it), and nothing more. Importing redis-py
costs such a command more than all the rest of its work (its package imports its client,
cluster, sentinel, asyncio and command modules whatever a caller uses); this costs a
module.

It takes redis://, rediss:// (TLS: ``ssl`` is imported only then) and unix:// URLs, with
a user and password, a db (the path, or ``?db=``) and ``?socket_timeout=`` and
``?socket_connect_timeout=``. Anything else (Cluster, Sentinel, any other option in the
query) is redis-py's: ``from_config`` answers None and the caller uses connection.py.

What a user sees is what the redis-py client of connection.py shows: replies decoded the
same way (UTF-8, ``surrogateescape``), the same steps on connect (AUTH, CLIENT SETNAME,
SELECT, here in one write), the same timeouts, and the same words for every failure; an
outage (refused, unresolvable, timed out, closed, a wrong password, LOADING) raises
RedisUnavailable, any other error reply ReplyError, as redis-py's ResponseError would.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlparse

import hiredis

from runner.config import RedisConfig
from runner.errors import RedisUnavailable

if TYPE_CHECKING:
    import ssl

__all__ = ["CLIENT_NAME", "CONNECT_TIMEOUT_S", "TIMEOUT_S", "Link", "Pipeline", "ReplyError", "from_config",
           "is_outage"]

# The client's settings, shared with connection.py's redis-py clients.
CONNECT_TIMEOUT_S = 5.0
TIMEOUT_S = 15.0
CLIENT_NAME = "runner"
# The URL options a Link honours; a URL with any other goes to redis-py.
OPTIONS = frozenset({"db", "username", "password", "socket_timeout", "socket_connect_timeout"})
# Error codes redis-py strips from a reply's message (its parser's table, and MISCONF and
# BUSY, which connection.py's parser adds).
_CODES = frozenset({"ERR", "OOM", "WRONGPASS", "EXECABORT", "LOADING", "NOSCRIPT", "READONLY", "NOAUTH", "NOPERM",
                    "ASK", "TRYAGAIN", "MOVED", "CLUSTERDOWN", "CROSSSLOT", "MASTERDOWN", "MISCONF", "BUSY"})
# Replies redis-py raises as connection errors, at once, even inside a pipeline.
_LOST = frozenset({"WRONGPASS", "NOAUTH", "LOADING"})
_LOST_ERR = frozenset({
    "max number of clients reached", "invalid password", "Client sent AUTH, but no password is set",
    "AUTH <password> called without any password configured for the default user. Are you sure your "
    "configuration is correct?",
})
# Error replies that connection.UNAVAILABLE counts as an outage.
_OUTAGE = frozenset({"READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "OOM", "MISCONF", "BUSY"})
OLD_AUTH = ("wrong number of arguments for 'auth' command", "wrong number of arguments for 'AUTH' command")
_MORE = object()  # hiredis: no whole reply read yet


class ReplyError(Exception):
    """An error reply that is no outage (WRONGTYPE, NOPERM, an out-of-range db...): what
    redis-py raises as a ResponseError, with the same message."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def reply_error(text: str) -> ReplyError:
    code = text.split(" ", 1)[0]
    return ReplyError(text[len(code) + 1:] if code in _CODES else text, code)


def lost(e: ReplyError) -> bool:
    return e.code in _LOST or (e.code == "ERR" and str(e) in _LOST_ERR)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says Redis is away, from a Link or from redis-py (connection.py's
    UNAVAILABLE), without importing redis-py: a process that never loaded it cannot have
    met one of its errors."""
    if isinstance(exc, RedisUnavailable):
        return True
    conn = sys.modules.get("runner.store.connection")
    return conn is not None and isinstance(exc, conn.UNAVAILABLE)


def raised(e: ReplyError) -> Exception:
    """The error a caller sees for an error reply: an outage, or the reply itself."""
    if e.code in _OUTAGE or lost(e):
        out = RedisUnavailable(str(e))
        out.__cause__ = e  # its code: a refusal (OOM, READONLY...) is told apart from a loss
        return out
    return e


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect, read off a URL as redis-py reads it."""

    host: str
    port: int
    path: str | None  # a unix socket's; then host and port are unused
    tls: bool
    username: str | None
    password: str | None
    db: int
    connect_timeout_s: float
    timeout_s: float

    @property
    def where(self) -> str:
        """The server as redis-py names it in its messages."""
        return self.path if self.path is not None else f"{self.host}:{self.port}"


def address(url: str) -> Address | None:
    """The Address of a URL, or None for one a Link does not take (redis-py's then)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    try:
        parts = urlparse(url)
        query = {k: unquote(v[0]) for k, v in parse_qs(parts.query).items()}
        if not query.keys() <= OPTIONS:
            return None
        username = unquote(parts.username) if parts.username else query.get("username")
        password = unquote(parts.password) if parts.password else query.get("password")
        db = int(query["db"]) if "db" in query else 0
        if parts.scheme != "unix" and "db" not in query and parts.path:
            try:  # as redis-py: a path that is no number is no db
                db = int(unquote(parts.path).replace("/", ""))
            except ValueError:
                db = 0
        connect_s = float(query.get("socket_connect_timeout", CONNECT_TIMEOUT_S))
        timeout_s = float(query.get("socket_timeout", TIMEOUT_S))
        port = parts.port or 6379
    except ValueError:  # a bad port or option: redis-py says which
        return None
    if username and not password:  # AUTH with a user and no password: redis-py's to refuse
        return None
    return Address(host=unquote(parts.hostname) if parts.hostname else "localhost", port=port,
                   path=unquote(parts.path) if parts.scheme == "unix" else None, tls=parts.scheme == "rediss",
                   username=username, password=password, db=db, connect_timeout_s=connect_s, timeout_s=timeout_s)


def from_config(cfg: RedisConfig) -> Link | None:
    """A Link for the config's URL, not connected yet; None when the URL is redis-py's."""
    where = address(cfg.url)
    return None if where is None else Link(where, tls_verify=cfg.tls_verify, ca_cert=cfg.ca_cert)


def hello_steps(a: Address, username: str | None) -> list[tuple[Any, ...]]:
    """The commands that open a connection: AUTH, CLIENT SETNAME, SELECT."""
    steps: list[tuple[Any, ...]] = []
    if a.password:
        steps.append(("AUTH", username, a.password) if username else ("AUTH", a.password))
    steps.append(("CLIENT", "SETNAME", CLIENT_NAME))
    if a.db:
        steps.append(("SELECT", a.db))
    return steps


def tls_context(verify: bool, ca_cert: str | None) -> ssl.SSLContext:
    """The TLS settings of a rediss:// URL as redis-py applies them (``ssl`` is imported
    only here: a plain URL never loads it)."""
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = verify
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    if ca_cert:
        context.load_verify_locations(cafile=ca_cert)
    return context


def connect_error(where: str, exc: OSError) -> str:
    """redis-py's words for a failed connect."""
    if not exc.args:
        return f"Error connecting to {where}."
    if len(exc.args) == 1:
        return f"Error {exc.args[0]} connecting to {where}."
    return f"Error {exc.args[0]} connecting to {where}. {exc.args[1]}."


def pack(args: Sequence[Any]) -> bytes:
    try:
        return hiredis.pack_command(tuple(args))  # type: ignore[no-any-return]
    except UnicodeEncodeError:
        # An id or field that came back from Redis surrogate-escaped goes back as its bytes.
        raw = tuple(a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a for a in args)
        return hiredis.pack_command(raw)  # type: ignore[arg-type, no-any-return]


class Link:
    """One connection, made on first use (so that its failures arise where the caller
    handles Redis errors) and made again after a failure. Not for threads."""

    def __init__(self, where: Address, tls_verify: bool = True, ca_cert: str | None = None) -> None:
        self.address = where
        self.tls_verify = tls_verify
        self.ca_cert = ca_cert
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._buf = bytearray(65536)

    # -- connecting ---------------------------------------------------------------------

    def _tcp(self) -> socket.socket:
        a = self.address
        # An ASCII name goes to the resolver as bytes: a str would load the idna codec.
        host: str | bytes = a.host.encode() if a.host.isascii() else a.host
        err: OSError | None = None
        for family, kind, proto, _, addr in socket.getaddrinfo(host, a.port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.settimeout(a.connect_timeout_s)
                sock.connect(addr)
                # As redis-py: the TLS handshake runs under the read timeout.
                sock.settimeout(a.timeout_s)
                return sock
            except OSError as exc:
                err = exc
                sock.close()
        raise err if err is not None else OSError("socket.getaddrinfo returned an empty list")

    def _tls(self, sock: socket.socket) -> socket.socket:
        context = tls_context(self.tls_verify, self.ca_cert)
        try:
            return context.wrap_socket(sock, server_hostname=self.address.host)
        except BaseException:
            sock.close()
            raise

    def _open(self) -> None:
        a = self.address
        try:
            if a.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(a.connect_timeout_s)
                try:
                    sock.connect(a.path)
                except OSError:
                    sock.close()
                    raise
                sock.settimeout(a.timeout_s)
            else:
                sock = self._tcp()
                if a.tls:
                    sock = self._tls(sock)
        except TimeoutError:
            raise RedisUnavailable("Timeout connecting to server") from None
        except OSError as exc:
            raise RedisUnavailable(connect_error(a.where, exc)) from None
        self._sock = sock
        self._reader = hiredis.Reader(encoding="utf-8", errors="surrogateescape", replyError=reply_error,
                                      notEnoughData=_MORE)
        try:
            self._hello(a.username)
        except BaseException:
            self.close()
            raise

    def _hello(self, username: str | None) -> None:
        """AUTH, CLIENT SETNAME and SELECT in one write, each reply checked in turn."""
        steps = hello_steps(self.address, username)
        self._send(b"".join(pack(s) for s in steps))
        replies = [self._read() for _ in steps]
        for step, reply in zip(steps, replies, strict=True):
            if not isinstance(reply, ReplyError):
                continue
            if step[0] == "AUTH" and username and str(reply) in OLD_AUTH:
                return self._hello(None)  # a server before Redis 6 takes the password alone
            raise raised(reply)
        return None

    def close(self) -> None:
        sock, self._sock, self._reader = self._sock, None, None
        if sock is not None:
            sock.close()

    # -- the wire -----------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except TimeoutError:
            self.close()
            raise RedisUnavailable("Timeout writing to socket") from None
        except OSError as exc:
            self.close()
            errno, text = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
            raise RedisUnavailable(f"Error {errno} while writing to socket. {text}.") from None

    def _read(self) -> Any:
        """The next reply; an error reply comes back as a ReplyError, not raised."""
        reader, sock = self._reader, self._sock
        assert reader is not None and sock is not None
        try:
            reply = reader.gets()
            while reply is _MORE:
                n = sock.recv_into(self._buf)
                if n == 0:
                    raise RedisUnavailable("Connection closed by server.")
                reader.feed(self._buf, 0, n)
                reply = reader.gets()
        except TimeoutError:
            self.close()
            raise RedisUnavailable(f"Timeout reading from {self.address.where}") from None
        except hiredis.ProtocolError as exc:  # not a Redis at the other end
            self.close()
            raise RedisUnavailable(str(exc)) from None
        except OSError as exc:
            self.close()
            raise RedisUnavailable(f"Error while reading from {self.address.where} : {exc.args}") from None
        except BaseException:
            self.close()
            raise
        return reply

    def send(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Every command in one write, then every reply, in order; an error reply is
        returned as a ReplyError, except those redis-py raises at once as a lost
        connection (a wrong password, LOADING), raised as RedisUnavailable."""
        if self._sock is None:
            self._open()
        self._send(b"".join(pack(c) for c in commands))
        out: list[Any] = []
        for _ in commands:
            reply = self._read()
            if isinstance(reply, ReplyError) and lost(reply):
                self.close()  # the replies behind it are not read: start afresh
                raise RedisUnavailable(str(reply))
            out.append(reply)
        return out

    def execute_command(self, *args: Any) -> Any:
        """One command; an error reply raised."""
        (reply,) = self.send([args])
        if isinstance(reply, ReplyError):
            raise raised(reply)
        return reply

    def pipeline(self, transaction: bool = False) -> Pipeline:
        """Commands sent together, as redis-py's pipeline (never a MULTI here)."""
        if transaction:
            raise ValueError("a Link sends no transactions")
        return Pipeline(self)

    def ping(self) -> bool:
        return bool(self.execute_command("PING") == "PONG")

    # -- the reads of `runner check` (store/guard.py, roster.py), in redis-py's shapes -----

    def time(self) -> tuple[int, int]:
        sec, usec = self.execute_command("TIME")
        return int(sec), int(usec)

    def hvals(self, key: str) -> list[str]:
        return list(self.execute_command("HVALS", key))

    def config_get(self, pattern: str) -> dict[str, str]:
        return dict(_pairs(self.execute_command("CONFIG", "GET", pattern)))

    def info(self, section: str | None = None) -> dict[str, Any]:
        return parse_info(self.execute_command("INFO", *([section] if section else [])))


def parse_info(text: str) -> dict[str, Any]:
    """INFO's ``name:value`` lines as redis-py gives them for plain fields: numbers as int
    or float, anything else as text (its nested ``k=v,...`` fields stay text here: no
    caller reads one)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        name, value = line.split(":", 1)
        try:
            out[name] = int(value)
        except ValueError:
            try:
                out[name] = float(value)
            except ValueError:
                out[name] = value
    return out


def _pairs(reply: Any) -> Any:
    return dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else reply


class Pipeline:
    """The reads of redis-py's pipeline that the one-shot commands use, with its reply
    shapes (HGETALL as a dict) and its errors: ``execute`` raises the first error reply
    with redis-py's note of which command it answered, or with ``raise_on_error=False``
    returns error replies in their places."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.commands: list[tuple[tuple[Any, ...], Callable[[Any], Any] | None]] = []

    def _add(self, *args: Any, then: Callable[[Any], Any] | None = None) -> Pipeline:
        self.commands.append((args, then))
        return self

    def get(self, key: str) -> Pipeline:
        return self._add("GET", key)

    def hget(self, key: str, field: str) -> Pipeline:
        return self._add("HGET", key, field)

    def hgetall(self, key: str) -> Pipeline:
        return self._add("HGETALL", key, then=_pairs)

    def hlen(self, key: str) -> Pipeline:
        return self._add("HLEN", key)

    def hmget(self, key: str, fields: list[str]) -> Pipeline:
        return self._add("HMGET", key, *fields)

    def llen(self, key: str) -> Pipeline:
        return self._add("LLEN", key)

    def lindex(self, key: str, index: int) -> Pipeline:
        return self._add("LINDEX", key, index)

    def smembers(self, key: str) -> Pipeline:
        return self._add("SMEMBERS", key)

    def sadd(self, key: str, *members: str) -> Pipeline:
        return self._add("SADD", key, *members)

    def hvals(self, key: str) -> Pipeline:
        return self._add("HVALS", key)

    def zcard(self, key: str) -> Pipeline:
        return self._add("ZCARD", key)

    def zcount(self, key: str, low: Any, high: Any) -> Pipeline:
        return self._add("ZCOUNT", key, low, high)

    def zrange(self, key: str, start: int, end: int) -> Pipeline:
        return self._add("ZRANGE", key, start, end)

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Pipeline:
        return self._add("EVALSHA", sha, numkeys, *keys_and_args)

    def execute_command(self, *args: Any) -> Pipeline:
        return self._add(*args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.commands = self.commands, []
        if not commands:
            return []
        replies = self.link.send([args for args, _ in commands])
        out = [r if then is None or isinstance(r, ReplyError) else then(r)
               for r, (_, then) in zip(replies, commands, strict=True)]
        if raise_on_error:
            for i, r in enumerate(out):
                if isinstance(r, ReplyError):
                    raise raised(_noted(r, i + 1, commands[i][0]))
        return out


def _noted(e: ReplyError, number: int, args: tuple[Any, ...]) -> ReplyError:
    """The error as redis-py's pipeline raises it: which command of the pipeline it answered."""
    import textwrap

    cmd = textwrap.shorten(" ".join(map(str, args)), width=100, placeholder="...", break_long_words=True)
    return ReplyError(f"Command # {number} ({cmd}) of pipeline caused error: {e}", e.code)
