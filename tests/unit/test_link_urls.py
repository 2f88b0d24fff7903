"""The URLs the store's own connection (store/link.py) takes, read as redis-py reads them,
and the ones it leaves to redis-py."""

from __future__ import annotations

import pytest
from redis.connection import parse_url

from runner.store import link

TAKEN = [
    "redis://127.0.0.1:6379/0",
    "redis://localhost",
    "redis://cache.internal:1234/5",
    "redis://user:p%40ss@h:1/2",
    "redis://:secret@h/3",
    "redis://h/not-a-number",
    "redis://h:1/0?db=4",
    "redis://h:1/0?password=pw",
    "redis://h?socket_timeout=0.5&socket_connect_timeout=2",
    "rediss://u:p@h:6380/0",
    "rediss://:p@h",
    "unix:///tmp/r.sock",
    "unix:///tmp/r.sock?db=2&password=pw",
    "unix://u:p@/tmp/r.sock?db=1",
    "unix:///tmp/r.sock?username=u&password=p",
]

LEFT = [
    "redis+cluster://h1:1,h2:2",
    "rediss+cluster://h1:1",
    "redis+sentinel://s1:1,s2:2/mymaster?db=0",
    "redis://h?health_check_interval=3",
    "rediss://h?ssl_cert_reqs=none",
    "redis://h:1/0?db=abc",
    "redis://h:99999/0",
    "redis://h:port/0",
    "redis://u@h/0",
    "http://h:1/0",
]


@pytest.mark.parametrize("url", TAKEN)
def test_a_url_it_takes_is_read_as_redis_py_reads_it(url: str) -> None:
    """Host, port, socket path, user, password, db and timeouts are redis-py's reading of
    the URL (its defaults where the URL says nothing)."""
    a = link.address(url)
    assert a is not None
    want = parse_url(url)
    assert (a.path if a.path is not None else (a.host, a.port)) == (
        want["path"] if "path" in want else (want.get("host", "localhost"), want.get("port", 6379)))
    assert (a.username, a.password, a.db) == (want.get("username"), want.get("password"), want.get("db", 0))
    assert (a.timeout_s, a.connect_timeout_s) == (want.get("socket_timeout", link.TIMEOUT_S),
                                                  want.get("socket_connect_timeout", link.CONNECT_TIMEOUT_S))
    assert a.tls == url.startswith("rediss://")


@pytest.mark.parametrize("url", LEFT)
def test_cluster_sentinel_other_options_and_broken_urls_are_left_to_redis_py(url: str) -> None:
    """Cluster and Sentinel, an option of redis-py's it does not honour, and a URL redis-py
    would refuse with its own message: no Link (the caller connects through redis-py)."""
    assert link.address(url) is None
