"""The Redis guard: settings under which Redis could evict or lose jobs."""

from __future__ import annotations

import logging
from typing import Any

from runner.store.connection import UNAVAILABLE

log = logging.getLogger("runner.guard")


def redis_risks(client: Any) -> list[str]:
    """Each risk with the exact setting to change; empty when Redis is safe for jobs."""
    risks: list[str] = []
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        aof = client.config_get("appendonly").get("appendonly")
        save = client.config_get("save").get("save")
    except UNAVAILABLE:
        raise
    except Exception:  # CONFIG is often disabled on managed Redis: read INFO instead
        info = client.info()
        policy = info.get("maxmemory_policy")
        aof = "yes" if info.get("aof_enabled") else "no"
        save = "unknown"
    if policy and policy != "noeviction":
        risks.append(
            f"maxmemory-policy is {policy}: Redis may evict job records under memory pressure; "
            "set `maxmemory-policy noeviction`"
        )
    if aof != "yes" and not save:
        risks.append(
            "persistence is off (appendonly no, no save points): a Redis restart loses every "
            "job; set `appendonly yes` (and `appendfsync everysec`)"
        )
    return risks


def warn_redis_settings(runtime: Any) -> list[str]:
    try:
        risks = redis_risks(runtime.redis)
    except UNAVAILABLE as exc:
        log.warning("cannot check Redis settings now: %s", exc)
        return []
    for r in risks:
        log.warning("REDIS RISK: %s", r)
    return risks
