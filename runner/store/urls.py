"""Redis URLs as text, for people: the password hidden. Apart from connection.py so that
saying which server a command talks to (every `--help`) does not import redis-py."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


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
