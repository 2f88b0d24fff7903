"""Redis URLs as text, for people: the password hidden. Apart from connection.py so that
saying which server a command talks to (every `--help`) does not import redis-py."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def same_server(a: str, b: str) -> bool:
    """Whether two single-server URLs name the same server and database (the default
    port and database filled in; ``localhost`` is 127.0.0.1)."""
    def norm(url: str) -> tuple[str, str, int, str] | None:
        try:
            p = urlsplit(url)
            port = p.port or 6379
        except ValueError:
            return None
        host = (p.hostname or "").lower()
        host = "127.0.0.1" if host == "localhost" else host
        return p.scheme, host, port, p.path.strip("/") or "0"

    na, nb = norm(a), norm(b)
    return na is not None and na == nb


def redact(url: str) -> str:
    """A Redis URL fit for logs: the password replaced by ***. Works on the multi-host
    netlocs of cluster and sentinel URLs too (``user:pw@h1:p1,h2:p2``), which the
    standard library cannot parse into a port."""
    parts = urlsplit(url)
    auth, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in auth:
        return url
    user = auth.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))
