"""`runner check`: every problem in config, functions and schemas, the Redis settings,
and the deploy gate.

The deploy gate takes the jobs waiting in Redis, counted per (queue, state, type,
version) by the store (store/census.py), and fails when any carry a type or payload
version that the functions on disk cannot accept or upgrade: an unknown type, a version
newer than the newest schema, or an older version with no ``upgrade()``. Run it in the
release phase of a deploy, with the new code, before the new workers start.

Nothing here talks to Redis: the command that runs the check reads the counts and the
server's settings and hands them over.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import config as config_mod
from runner.catalog import registry as registry_mod
from runner.catalog.partitioning import Change, split_keys
from runner.catalog.registry import Registry
from runner.config import Config
from runner.errors import ConfigError

# The states a waiting job can be in, as a user knows them (see store/census.py).
STATES = ("waiting", "queued", "processing", "scheduled", "dead")  # "waiting": any (the census)


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # a file (with its line), "redis" or "deploy gate"
    message: str
    severity: str = "error"  # or "warning"

    def as_dict(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message, "severity": self.severity}


@dataclass(frozen=True, slots=True)
class Stranded:
    """Waiting jobs of one (queue, state, type, version) that the code on disk cannot run."""

    queue: str
    state: str
    type: str
    version: str
    count: int
    problem: str

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "state": self.state, "type": self.type,
                "version": self.version, "count": self.count, "problem": self.problem}


@dataclass(slots=True)
class Report:
    config: Config | None = None
    registry: Registry | None = None
    problems: list[Problem] = field(default_factory=list)
    stranded: list[Stranded] = field(default_factory=list)
    partitions: list[Change] = field(default_factory=list)  # a partitioned or changed queue each
    scanned: int = 0
    redis_checked: bool = False

    def errors(self, strict: bool = False) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error" or strict]

    def failed(self, strict: bool = False) -> bool:
        return bool(self.errors(strict) or self.stranded)

    def as_dict(self) -> dict[str, Any]:
        reg = self.registry
        return {
            "ok": not self.failed(),
            "config": self.config.source if self.config else None,
            "queues": list(self.config.queues) if self.config else [],
            "functions": sorted(reg.functions) if reg else [],
            "problems": [p.as_dict() for p in self.problems],
            "redis_checked": self.redis_checked,
            "scanned": self.scanned,
            "stranded": [s.as_dict() for s in self.stranded],
            "partitions": [c.as_dict() for c in self.partitions],
        }


# --- config, functions, schemas ----------------------------------------------------


def check_files(path: str | Path | None, env: Mapping[str, str] | None = None) -> Report:
    """Load the config and every function and schema; collect every problem."""
    report = Report()
    try:
        cfg = config_mod.load(path, env=os.environ if env is None else env)
    except ConfigError as exc:
        report.problems.append(Problem("config", str(exc)))
        return report
    report.config = cfg
    reg = registry_mod.load(cfg)
    report.registry = reg
    for err in reg.errors.values():
        report.problems.append(Problem(f"{err.path}:{err.line}" if err.line else err.path, err.message))
    for w in reg.warnings:
        where, _, message = w.partition(": ")
        report.problems.append(Problem(where, message, "warning"))
    report.problems.extend(orphan_schemas(cfg))
    report.problems.extend(token_problems(cfg, reg))
    for fn in sorted(reg.functions.values(), key=lambda f: f.name):
        q = cfg.queues.get(fn.queue)
        report.problems.extend(Problem(fn.path, w, "warning") for w in split_keys(fn, q.partitions if q else 1))
    return report


def token_problems(cfg: Config, reg: Registry) -> list[Problem]:
    """API tokens that cannot work as written: a secret's variable not set, or a scope
    ``enqueue:<type>`` naming no function (a function that failed to load is already
    reported, so it is not named twice)."""
    out = [Problem("config", line) for line in config_mod.unset_secrets(cfg)] if cfg.api.auth else []
    for t in cfg.api.tokens:
        for scope in sorted(t.scopes):
            name = scope.partition(":")[2]
            if name and name not in reg.functions and not (cfg.functions_dir / f"{name}.py").exists():
                have = ", ".join(sorted(reg.functions)) or "none"
                out.append(Problem("config", f"{cfg.source}: api.tokens.{t.name}.scopes: {scope} names no "
                                             f"function (have: {have}); fix the name or add "
                                             f"{cfg.functions_dir / name}.py"))
    return out


def orphan_schemas(cfg: Config) -> list[Problem]:
    """Schema folders with no function file: usually a renamed or deleted function."""
    if not cfg.schemas_dir.is_dir():
        return []
    out = []
    for folder in sorted(cfg.schemas_dir.iterdir()):
        if folder.is_dir() and not folder.name.startswith((".", "_")) \
                and not (cfg.functions_dir / f"{folder.name}.py").exists():
            out.append(Problem(str(folder), f"no function file {cfg.functions_dir / folder.name}.py "
                                            "uses these schemas", "warning"))
    return out


# --- the deploy gate ---------------------------------------------------------------


def classify(reg: Registry, type_: str, version_raw: str) -> str | None:
    """Why the functions of ``reg`` cannot run a job of this type and version (None: they can)."""
    fn = reg.functions.get(type_)
    if fn is None:
        return f"unknown type: no function {type_!r} on disk"
    try:
        version = int(version_raw)
    except ValueError:
        return f"malformed version {version_raw!r}"
    known = sorted(fn.versions.schemas)
    newest = fn.versions.newest
    if version > newest:
        return f"version {version} is newer than the newest schema (v{newest})"
    if version not in fn.versions.schemas:
        return f"no schema for version {version} (have {', '.join(f'v{v}' for v in known)})"
    if version < newest and fn.versions.upgrade is None:
        return f"v{version} needs an upgrade() to reach v{newest}, and {fn.path} has none"
    return None


def gate(reg: Registry, groups: Mapping[tuple[str, str, str, str], int]) -> list[Stranded]:
    """The groups of waiting jobs, counted per (queue, state, type, version), that the
    functions of ``reg`` cannot run, in a stable order."""
    problems: dict[tuple[str, str], str | None] = {}
    stranded = []
    for (q, s, t, v), n in sorted(groups.items(), key=lambda kv: (kv[0][0], STATES.index(kv[0][1]),
                                                                    kv[0][2], kv[0][3])):
        if (t, v) not in problems:
            problems[(t, v)] = classify(reg, t, v)
        why = problems[(t, v)]
        if why is not None:
            stranded.append(Stranded(queue=q, state=s, type=t, version=v, count=n, problem=why))
    return stranded


def behind(reg: Registry, workers: list[Any]) -> list[Problem]:
    """Live workers (from the store's roster) that do not know a function or version on
    disk for a queue they serve: during a rolling deploy they hand such jobs back until a
    newer worker takes them (up to ``[worker] unknown_grace``), so the new code is not
    live until they are replaced."""
    out = []
    for w in workers:
        for fn in reg.functions.values():
            if fn.queue not in w.queues:
                continue
            known = w.functions.get(fn.name)
            if known is None or known < fn.versions.newest:
                what = f"{fn.name} v{fn.versions.newest}" if known is not None else f"function {fn.name}"
                out.append(Problem("deploy gate", f"worker {w.id} (serving {fn.queue}) does not know {what} "
                                   f"(it has {'v' + str(known) if known is not None else 'none'}): it hands "
                                   "such jobs back until a newer worker takes them; replace it", "warning"))
    return out
