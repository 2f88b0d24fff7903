"""Which Redis a command talks to, and why: the one rule of every command that talks to
Redis, and the words `--help` and `runner stats` use to say it.

An explicit choice wins: REDIS_URL, or the ``[redis] url`` of a file named with
``--config`` (or $RUNNER_CONFIG). Otherwise, while `runner dev` runs its embedded server
for the project, the project's commands talk to that one (it is where dev's jobs are);
otherwise to the ``[redis] url`` of ./runner.toml, or the default 127.0.0.1:6379.
Processes (`runner worker`, `runner web`) never follow a dev session: they are for
production, where there is none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from runner.config import Config
from runner.store.session import chosen, dev_session
from runner.store.urls import redact, same_server

RULE = ("Redis: REDIS_URL, else the [redis] url of the --config file; else, while `runner dev` runs "
        "its embedded server for this project, that one; else the [redis] url of ./runner.toml, "
        "else redis://127.0.0.1:6379/0.")


@dataclass(frozen=True, slots=True)
class Target:
    """The server a command talks to (password hidden), where that came from, and a note
    when a running `runner dev` was passed over for an explicit choice."""

    url: str
    source: str
    prefix: str
    note: str | None = None
    dev_pid: int | None = None  # the `runner dev` whose embedded server this is, followed

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "source": self.source, "prefix": self.prefix}
        if self.note:
            out["note"] = self.note
        return out

    def line(self) -> str:
        text = f"redis: {self.url} ({self.source}), prefix {self.prefix}"
        return f"{text}\n{self.note}" if self.note else text


def resolve(cfg: Config, config_named: bool, follow_dev: bool = True) -> tuple[Config, Target]:
    """The config a command runs with (the Redis URL swapped for dev's embedded server's
    when the rule says so) and the Target to show."""
    session = dev_session(cfg)
    explicit = chosen(cfg, config_named)
    prefix = cfg.redis.prefix
    if session is not None and follow_dev and not explicit:
        source = f"the embedded server of the `runner dev` running for this project, pid {session.pid}"
        return (replace(cfg, redis=replace(cfg.redis, url=session.url)),
                Target(session.url, source, prefix, dev_pid=session.pid))
    note = None
    if session is not None and not same_server(cfg.redis.url, session.url):
        if not follow_dev:
            undo = f"this command never follows one; REDIS_URL={session.url} points it there"
        elif cfg.redis.url_source == "REDIS_URL":
            undo = "unset REDIS_URL to talk to it"
        else:
            undo = "leave out --config to talk to it"
        note = (f"(not used: the embedded server at {session.url} of the `runner dev` running for this project, "
                f"pid {session.pid}; {undo})")
    return cfg, Target(redact(cfg.redis.url), cfg.redis_origin(), prefix, note)
