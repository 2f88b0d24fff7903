"""The Lua scripts as sent: each file of lua/ with the helpers of ``lua/_lib.lua`` it
uses prepended, assembled on first use, and its SHA1 for EVALSHA. Apart from scripts.py
(their typed callers on redis-py) so that a reader on a connection of its own (link.py)
sends the same text under the same SHA without importing redis-py.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

try:  # CPython's own SHA1: hashlib loads OpenSSL's first, about 3 ms of a `runner job`
    from _sha1 import sha1
except ImportError:  # an interpreter without it
    from hashlib import sha1

NAMES = (
    "enqueue", "claim", "start", "renew", "ack", "retry", "bury", "release",
    "reclaim", "promote", "requeue", "remove", "checkpoint", "trim", "lookup",
    "tick", "adopt", "alive", "relay", "resume", "watch", "cancel", "group",
)
# Scripts sent as several files in a row: a schedule's tick is its guard, then the
# enqueue script itself, so a tick's job is written as every other job is.
COMPOSED = {"tick": ("tick", "enqueue")}


def _source(name: str) -> str:
    return (Path(__file__).parent / "lua" / f"{name}.lua").read_text(encoding="utf-8")


_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")


def _helpers(lib: str) -> list[tuple[str, str]]:
    """The top-level definitions of _lib.lua, in order: (name, text with its comment).
    A definition starts at a ``local`` in column 0; column-0 comments and blank lines
    before it belong to it; everything else (indented lines, ``end``) continues it."""
    blocks: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for line in lib.splitlines():
        m = _DEFINITION.match(line)
        if m:
            blocks.append((m.group(1), [*pending, line]))
            pending = []
        elif line.startswith("--") or not line.strip():
            pending.append(line)
        elif blocks:
            blocks[-1][1].append(line)
    return [(name, "\n".join(text)) for name, text in blocks]


_WORD = re.compile(r"\w+")


@functools.lru_cache(maxsize=4)
def _library(lib: str) -> tuple[list[tuple[str, str]], dict[str, set[str]]]:
    """The helpers of a library and the helpers each one names, worked out once per text."""
    helpers = _helpers(lib)
    names = {name for name, _ in helpers}
    return helpers, {name: names.intersection(_WORD.findall(src)) for name, src in helpers}


def assemble(lib: str, body: str) -> str:
    """The script as sent: the helpers ``body`` names, and the ones they name, in their
    order in the library, then the body. Every helper defined is a closure Redis builds
    on each call (about 0.2 us apiece), so a script carries only what it can call;
    naming one in a comment just includes it."""
    # A helper is named where it stands as a whole word: the words of each text, found
    # once, rather than a search per helper per text (that was most of a CLI call's time).
    helpers, refs = _library(lib)
    todo = list(refs.keys() & set(_WORD.findall(body)))
    wanted: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += refs[name] - wanted
    used = [src for name, src in helpers if name in wanted]
    return "\n".join([*used, body])


@functools.cache
def _lib() -> str:
    return _source("_lib")


class _Sources(dict[str, str]):
    """Every script as sent, assembled on first use and then kept for the process (the
    files are package data): `runner job` needs one script of the twenty-odd."""

    def __missing__(self, name: str) -> str:
        if name not in NAMES:
            raise KeyError(name)
        src = assemble(_lib(), "\n".join(_source(part) for part in COMPOSED.get(name, (name,))))
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
