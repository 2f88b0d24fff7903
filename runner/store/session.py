"""The session file of a running `runner dev` (.runner/dev.json): which embedded server
serves the project, so the project's other commands talk to it. Reading it is every CLI
call's first step, so it stays apart from embedded.py, which starts servers and needs
subprocess, sockets and redis-py.

And the worker this process runs jobs for (``host``, ``hosted``): a handler's own
``Client.from_config()`` reaches the server and prefix its worker runs on, in the worker
(thread isolation) and in its child processes, which are told over their socket at start
(never through the environment, which a handler's tools inherit).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from runner.config import STATE_DIR, Config, RedisConfig


def session_file(cfg: Config) -> Path:
    return cfg.root / STATE_DIR / "dev.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class DevSession:
    """A `runner dev` running for a project with its embedded Redis (.runner/dev.json)."""

    url: str
    pid: int


def dev_session(cfg: Config) -> DevSession | None:
    """The `runner dev` whose embedded Redis serves this project, if one is running."""
    try:
        raw = session_file(cfg).read_bytes()
    except OSError:
        return None
    # Here: most commands find no session file, and the codec (orjson) is a few ms of
    # every `runner --help`.
    from runner.store import codec

    try:
        data = codec.loads(raw)
        found = DevSession(url=data["url"], pid=int(data["pid"]))
    except (codec.DecodeError, KeyError, TypeError, ValueError):
        return None
    return found if isinstance(found.url, str) and _alive(found.pid) else None


def session_url(cfg: Config) -> str | None:
    """The URL of the embedded Redis of a `runner dev` running for this project, if any."""
    found = dev_session(cfg)
    return None if found is None else found.url


def chosen(cfg: Config, config_named: bool) -> bool:
    """Whether the Redis URL was chosen explicitly: REDIS_URL, or the ``[redis] url`` of a
    config file the caller named. Only an unchosen URL gives way to a running dev."""
    return cfg.redis.url_source == "REDIS_URL" or (config_named and cfg.redis.url_source == "file")


def follow_dev(cfg: Config, config_named: bool) -> Config:
    """``cfg`` with the URL of the embedded server of a `runner dev` running for the project,
    unless the URL was chosen explicitly: the rule of the CLI's client commands, and of
    ``Client.from_config()`` beside `runner dev`."""
    if chosen(cfg, config_named):
        return cfg
    found = dev_session(cfg)
    return cfg if found is None else replace(cfg, redis=replace(cfg.redis, url=found.url))


@dataclass(frozen=True, slots=True)
class Host:
    """The worker this process runs jobs for: its config file (resolved; it may not exist)
    and the Redis settings it runs on, which need not be the file's or the environment's
    (`runner dev` on its embedded server)."""

    source: str
    redis: RedisConfig


_host: Host | None = None


def host(source: str, redis: RedisConfig) -> Host:
    """Record that this process runs jobs for the worker of config file ``source`` on
    ``redis`` (the worker at its start, a child process from its worker's first message).
    One worker a process: the last recorded is the one, until it ``leave``s."""
    global _host
    _host = Host(str(Path(source).resolve()), redis)
    return _host


def leave(recorded: Host | None) -> None:
    """The worker that recorded ``recorded`` has stopped (unless another came since)."""
    global _host
    if recorded is not None and _host is recorded:
        _host = None


def hosted(path: str | Path | None, env: Mapping[str, str] | None = None) -> Host | None:
    """The worker's, when this process runs a worker's jobs and ``path`` means its file: no
    path (nor RUNNER_CONFIG), or one that resolves to it. Another path is another app's."""
    found = _host
    if found is None:
        return None
    named = path if path is not None else (os.environ if env is None else env).get("RUNNER_CONFIG")
    if not named:
        return found
    return found if str(Path(named).resolve()) == found.source else None
