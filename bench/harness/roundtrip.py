"""Microseconds per round trip of redis-py, in whatever environment runs this file:

    python roundtrip.py REDIS_URL  ->  {"redis_py": ..., "ping_us": ..., ...} as JSON

PING, SET and a small EVALSHA one at a time, a 100-command pipeline per command, and,
where the version has them, the pure-Python parser and RESP3. Bounded: a fixed count each.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import redis

N = 5000


def per_call_us(fn: Any, n: int = N) -> float:
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def measure(client: redis.Redis) -> dict[str, float]:
    sha = client.script_load("return redis.call('GET', KEYS[1])")
    client.set("rt:k", "v")

    def pipe100() -> None:
        p = client.pipeline(transaction=False)
        for _ in range(100):
            p.get("rt:k")
        p.execute()

    return {
        "ping_us": per_call_us(client.ping),
        "set_us": per_call_us(lambda: client.set("rt:k", "v")),
        "evalsha_us": per_call_us(lambda: client.evalsha(sha, 1, "rt:k")),
        "pipelined_get_us": per_call_us(pipe100, N // 50) / 100,
    }


def main() -> None:
    url = sys.argv[1]
    out: dict[str, Any] = {"redis_py": redis.__version__}
    try:
        import hiredis

        out["hiredis"] = hiredis.__version__
    except ImportError:
        out["hiredis"] = None
    out["default"] = measure(redis.Redis.from_url(url, decode_responses=True))
    try:
        from redis._parsers import _RESP2Parser

        out["python_parser"] = measure(redis.Redis.from_url(url, decode_responses=True,
                                                            parser_class=_RESP2Parser))
    except Exception as exc:
        out["python_parser"] = {"error": str(exc)[:200]}
    try:
        out["resp3"] = measure(redis.Redis.from_url(url, decode_responses=True, protocol=3))
    except Exception as exc:
        out["resp3"] = {"error": str(exc)[:200]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
