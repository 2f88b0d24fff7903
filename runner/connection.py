"""Redis clients from a RedisConfig: plain, TLS (rediss://), unix sockets.

Client-side retries are off on purpose: a script call that failed on the wire may or may
not have run, and blindly sending it again could apply it twice. Every loop that talks
to Redis handles ConnectionError itself, with backoff and jitter.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from runner.config import RedisConfig
from runner.errors import ConfigError

# Exceptions that mean "Redis is not reachable right now".
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,  # a replica promoted away under us during failover
    ConnectionError,
    OSError,
)


def connect(cfg: RedisConfig, **overrides: Any) -> redis.Redis:
    url = cfg.url
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"redis.url must start with redis://, rediss:// or unix://, got {url.split('://')[0]}://"
        )
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": 5,
        "socket_timeout": 15,
        "socket_keepalive": True,
        "health_check_interval": 15,
        "retry": Retry(NoBackoff(), 0),
        "client_name": "runner",
    }
    if url.startswith("rediss://"):
        if not cfg.tls_verify:
            kwargs["ssl_cert_reqs"] = "none"
            kwargs["ssl_check_hostname"] = False
        if cfg.ca_cert:
            kwargs["ssl_ca_certs"] = cfg.ca_cert
    kwargs.update(overrides)
    return redis.Redis.from_url(url, **kwargs)
