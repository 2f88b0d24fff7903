"""The Redis guard, run wherever a process starts: settings under which Redis could
evict or lose jobs, and what a server already holds (so `runner dev` can say whose
server it is about to share)."""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.errors import password_line
from runner.store import urls
from runner.store.link import is_outage

log = logging.getLogger("runner.guard")


def redis_risks(client: Any, wait_replicas: int = 0) -> list[str]:
    """Each risk with the exact setting to change; empty when Redis is safe for jobs.
    ``wait_replicas``: [redis] wait_replicas, checked against the replicas connected now."""
    risks: list[str] = []
    if wait_replicas:
        have = connected_replicas(client)
        if have < wait_replicas:
            risks.append(
                f"[redis] wait_replicas is {wait_replicas} but the master has {have} connected replica(s): "
                "every enqueue will be refused (NotReplicated, HTTP 503) until enough replicas are "
                "connected; add replicas or lower wait_replicas"
            )
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        aof = client.config_get("appendonly").get("appendonly")
        save = client.config_get("save").get("save")
    except Exception as exc:  # CONFIG is often disabled on managed Redis: read INFO instead
        if is_outage(exc):
            raise
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


def connected_replicas(client: Any) -> int:
    """Replicas connected to the master (on Redis Cluster, the fewest of any master's)."""
    cluster = sys.modules.get("redis.cluster")  # a client of a cluster has loaded it; a Link has not
    if cluster is not None and isinstance(client, cluster.RedisCluster):
        per_node: Any = client.info("replication", target_nodes=cluster.RedisCluster.PRIMARIES)
        return min((int(v.get("connected_slaves", 0)) for v in per_node.values()), default=0)
    return int(client.info("replication").get("connected_slaves", 0))


def replicas_by_key(client: Any, keys: Sequence[str]) -> list[int | None]:
    """For each key, the replicas connected to the master that holds it now (None: that
    master did not answer): one INFO per master. With ``wait_replicas`` above that count,
    the key's partition is held: its claims and enqueues wait for a replica that is not
    there (a master just promoted, whose replica has not rejoined)."""
    cluster = sys.modules.get("redis.cluster")
    if cluster is None or not isinstance(client, cluster.RedisCluster):
        try:
            have = int(client.info("replication").get("connected_slaves", 0))
        except Exception as exc:
            if not is_outage(exc):
                raise
            return [None] * len(keys)
        return [have] * len(keys)
    nodes = [client.get_node_from_key(k) for k in keys]
    counts: dict[str, int | None] = {}
    for node in nodes:
        if node.name in counts:
            continue
        try:
            info: Any = client.info("replication", target_nodes=node)
            counts[node.name] = int(info.get("connected_slaves", 0))
        except Exception as exc:  # a master down: its partitions are down, not held
            if not is_outage(exc):
                raise
            counts[node.name] = None
    return [counts[node.name] for node in nodes]


def warn_redis_settings(client: Any, wait_replicas: int = 0) -> list[str]:
    """Log each risk as a loud warning; Redis down at start-up is a warning, not fatal. A
    refused password is one error line in the words every process uses (it lasts until the
    URL or the server changes; the loops then say the same)."""
    try:
        risks = redis_risks(client, wait_replicas)
    except Exception as exc:
        if not is_outage(exc):
            raise
        refused = password_line(exc)
        if refused is not None:
            log.error("cannot check Redis settings: %s", refused)
        else:
            log.warning("cannot check Redis settings now: %s", urls.scrub(str(exc)))
        return []
    for r in risks:
        log.warning("REDIS RISK: %s", r)
    return risks


# Keys counted under a prefix before giving up: enough to tell "empty" from "in use"
# without walking a big server's whole keyspace at start-up.
KEY_COUNT_CAP = 10_000


@dataclass(frozen=True, slots=True)
class Holdings:
    """Who a server is and what it holds: ``software`` as "Redis 7.0.15" or "Valkey
    9.1.0"; keys under the prefix (at most KEY_COUNT_CAP counted) and in all."""

    software: str
    under_prefix: int
    capped: bool
    total: int


def holdings(client: Any, prefix: str) -> Holdings:
    """Read with INFO, DBSIZE and a bounded SCAN; raises what the client raises."""
    info: Any = client.info("server")
    if info and all(isinstance(v, dict) for v in info.values()):  # a cluster client: one dict per node
        info = next(iter(info.values()))
    name = "Valkey" if info.get("server_name") == "valkey" or "valkey_version" in info else "Redis"
    version = info.get("valkey_version") or info.get("redis_version") or "?"
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + ":*"
    found = sum(1 for _ in itertools.islice(client.scan_iter(match=pattern, count=1000), KEY_COUNT_CAP))
    return Holdings(software=f"{name} {version}", under_prefix=found, capped=found >= KEY_COUNT_CAP,
                    total=int(client.dbsize()))
