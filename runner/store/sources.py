"""The Lua scripts as sent: each file of lua/ with the files of ``lua/includes/`` it
declares prepended, assembled on first use, and its SHA1 for EVALSHA. Apart from scripts.py
(their typed callers on redis-py) so that a reader on a connection of its own (link.py)
sends the same text under the same SHA without importing redis-py.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from runner.store.scriptkeys import binding

try:  # CPython's own SHA1: hashlib loads OpenSSL's first, about 3 ms of a `runner job`
    from _sha1 import sha1
except ImportError:  # an interpreter without it
    from hashlib import sha1

NAMES = (
    "enqueue", "claim", "hold", "start", "renew", "ack", "retry", "bury", "release",
    "reclaim", "promote", "requeue", "remove", "checkpoint", "trim", "lookup",
    "tick", "adopt", "alive", "relay", "resume", "watch", "cancel", "group", "group_count", "seek", "prune",
    "index_delayed", "seek_list", "audit", "seek_trail", "step", "steps", "suspend", "signal", "wait", "emit",
    "emit_named", "joblog", "run_now", "listen", "unlisten", "stage", "unstage", "unroster", "aside", "count",
    "weigh", "statuses", "member_page",
)
# Scripts sent as several files in a row: a schedule's tick is its guard, then the
# enqueue script itself, so a tick's job is written as every other job is.
COMPOSED = {"tick": ("tick", "enqueue")}


LUA = Path(__file__).parent / "lua"
# A script or an include names an include it needs on a line of its own, as BullMQ's
# scripts do: --- @include "records" (the file lua/includes/records.lua).
INCLUDE = re.compile(r'^--- @include "([a-z_]+)"[ \t]*$', re.M)


def _source(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def _include(topic: str) -> str:
    return (LUA / "includes" / f"{topic}.lua").read_text(encoding="utf-8")


def includes(body: str) -> list[str]:
    """Every include ``body`` needs, each once, an include after the ones it declares
    itself (a Lua local exists only below its definition), in the order declared."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(topic: str) -> None:
        if topic in order:
            return
        if topic in visiting:
            raise ValueError(f"lua/includes: {' -> '.join([*visiting, topic])} includes itself")
        visiting.append(topic)
        for dep in INCLUDE.findall(_include(topic)):
            visit(dep)
        visiting.pop()
        order.append(topic)

    for topic in INCLUDE.findall(body):
        visit(topic)
    return order


def assemble(body: str) -> str:
    """The script as sent: the includes ``body`` declares (and theirs), then the body.
    Every helper an include defines is a closure Redis builds on each call (about 0.2 us
    apiece), so the includes are small topics and a script declares only those it calls."""
    return "\n".join([*(_include(t) for t in includes(body)), body])


class _Sources(dict[str, str]):
    """Every script as sent, assembled on first use and then kept for the process (the
    files are package data): `runner job` needs one script of the twenty-odd."""

    def __missing__(self, name: str) -> str:
        if name not in NAMES:
            raise KeyError(name)
        # The names of its KEYS first (scriptkeys.py), then its includes and body.
        body = "\n".join(_source(part) for part in COMPOSED.get(name, (name,)))
        src = binding(name) + "\n" + assemble(body)
        self[name] = src
        return src


class _Shas(dict[str, str]):
    def __missing__(self, name: str) -> str:
        sha: str = sha1(SOURCES[name].encode()).hexdigest()
        self[name] = sha
        return sha


# Shared by every user of the process; a miss fills one entry (two threads missing at
# once compute the same text).
SOURCES = _Sources()
SHAS = _Shas()
