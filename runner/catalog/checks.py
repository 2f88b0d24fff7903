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

import ast
import itertools
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import config as config_mod
from runner.catalog import registry as registry_mod
from runner.catalog.options import MAX_EMIT_BYTES
from runner.catalog.partitioning import Change, split_keys
from runner.catalog.registry import Function, Registry
from runner.catalog.schedules import PayloadCheck
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


def check_files(path: str | Path | None, env: Mapping[str, str] | None = None,
                payload_check: PayloadCheck | None = None) -> Report:
    """Load the config and every function and schema; collect every problem.
    ``payload_check``: as registry.load takes it (the caller's codec.payload_problem)."""
    report = Report()
    try:
        cfg = config_mod.load(path, env=os.environ if env is None else env)
    except ConfigError as exc:
        report.problems.append(Problem("config", str(exc)))
        return report
    report.config = cfg
    reg = registry_mod.load(cfg, payload_check=payload_check)
    report.registry = reg
    for err in reg.errors.values():
        report.problems.append(Problem(f"{err.path}:{err.line}" if err.line else err.path, err.message))
    for w in reg.warnings:
        where, _, message = w.partition(": ")
        report.problems.append(Problem(where, message, "warning"))
    report.problems.extend(orphan_schemas(cfg))
    report.problems.extend(install_problems())
    report.problems.extend(token_problems(cfg, reg))
    report.problems.extend(trigger_problems(reg))
    report.problems.extend(emit_bound_problems(cfg, reg))
    for fn in sorted(reg.functions.values(), key=lambda f: f.name):
        q = cfg.queues.get(fn.queue)
        report.problems.extend(Problem(fn.path, w, "warning") for w in split_keys(fn, q.partitions if q else 1))
    return report


def install_problems(path: Sequence[str] | None = None) -> list[Problem]:
    """The unrelated distribution named ``runner`` on the index (Runner 1.1, 2013)
    installed beside this one (``runner-redis``): its folder ``Runner/`` differs from our
    ``runner/`` only by case, so on a case-insensitive file system (macOS, Windows) it
    writes over our files, and uninstalling it deletes them. Found by its metadata folder
    (``Runner-1.1.dist-info``, ``runner-1.1-py3.11.egg-info``) in the folders of
    ``sys.path``: a listing each, not importlib.metadata, which was most of the deploy
    gate's time."""
    for folder in sys.path if path is None else path:
        try:
            names = os.listdir(folder or ".")
        except OSError:  # a zip, or a folder that is not there
            continue
        for name in names:
            m = _OTHER_RUNNER.match(name)
            if m:
                return [Problem("install", (
                    f"the distribution Runner {m.group(1)} is installed beside runner-redis ({folder}/{name}): it is "
                    "an unrelated package (`pip install runner` installs it), whose folder Runner/ is our runner/ on "
                    "a case-insensitive file system (macOS, Windows), where it overwrites our files; run `pip "
                    "uninstall runner`, then `pip install --force-reinstall runner-redis`"), "warning")]
    return []


# runner-<version>.dist-info or runner-<version>[-pyX.Y].egg-info, any case (not runner_redis-...).
_OTHER_RUNNER = re.compile(r"(?i)^runner-([0-9][^-]*)(-py[0-9.]+)?\.(dist-info|egg-info)$")


def token_problems(cfg: Config, reg: Registry) -> list[Problem]:
    """API tokens that cannot work as written: a secret's variable not set, or a scope
    ``enqueue:<type>`` naming no function (a function that failed to load is already
    reported, so it is not named twice); and, as warnings, secrets short enough to guess."""
    out = [Problem("config", line) for line in config_mod.unset_secrets(cfg)] if cfg.api.auth else []
    if cfg.api.auth:
        out += [Problem("config", line, "warning") for line in config_mod.short_secrets(cfg)]
    for t in cfg.api.tokens:
        for scope in sorted(t.scopes):
            if scope.startswith("emit:"):  # an event nobody subscribes to yet is still an event
                continue
            name = scope.partition(":")[2]
            if name and name not in reg.functions and not (cfg.functions_dir / f"{name}.py").exists():
                have = ", ".join(sorted(reg.functions)) or "none"
                out.append(Problem("config", f"{cfg.source}: api.tokens.{t.name}.scopes: {scope} names no "
                                             f"function (have: {have}); fix the name or add "
                                             f"{cfg.functions_dir / name}.py"))
    return out


def _types(schema: Any) -> set[str] | None:
    """The JSON types a schema admits by its "type" (None: any); "integer" is a "number"."""
    if schema is False:
        return set()
    if not isinstance(schema, Mapping) or "type" not in schema:
        return None
    t = schema["type"]
    types = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    return types | ({"integer"} if "number" in types else set())


def _clash(a: set[str] | None, b: set[str] | None) -> bool:
    return a is not None and b is not None and not (a & b)


def _subscribers(reg: Registry) -> dict[str, list[Function]]:
    """Each event's subscribing functions (TRIGGERS), by event name."""
    by_event: dict[str, list[Function]] = {}
    for fn in reg.functions.values():
        for name in fn.triggers:
            by_event.setdefault(name, []).append(fn)
    return by_event


def trigger_problems(reg: Registry) -> list[Problem]:
    """An event no data could satisfy: its subscribers' newest schemas contradict each
    other (the document's type, or the type of a field one of them requires, or a field
    one requires that another's additionalProperties: false forbids), so every emit of it
    would be refused. Checked on the schemas' own words, not on every keyword."""
    by_event = _subscribers(reg)
    out = []
    for name, subs in sorted(by_event.items()):
        subs.sort(key=lambda f: f.name)
        docs = [(f, f.versions.schemas[f.versions.newest].document) for f in subs]
        why = None
        for i, (fa, da) in enumerate(docs):
            if _types(da) == set():
                why = f"{fa.name}'s v{fa.versions.newest} schema admits nothing"
            for fb, db in docs[i + 1:]:
                if _clash(_types(da), _types(db)):
                    why = f"{fa.name} and {fb.name} want data of types {sorted(_types(da) or ())} and " \
                          f"{sorted(_types(db) or ())}"
                for x, dx, y, dy in ((fa, da, fb, db), (fb, db, fa, da)):
                    if not isinstance(dx, Mapping) or not isinstance(dy, Mapping):
                        continue
                    props_x, props_y = dx.get("properties") or {}, dy.get("properties") or {}
                    for field_ in dx.get("required") or []:
                        if field_ not in props_y and dy.get("additionalProperties") is False:
                            why = f"{x.name} requires field {field_!r}, which {y.name} forbids " \
                                  "(additionalProperties: false)"
                        elif field_ in props_y and _clash(_types(props_x.get(field_)), _types(props_y[field_])):
                            why = f"{x.name} and {y.name} want field {field_!r} of types " \
                                  f"{sorted(_types(props_x.get(field_)) or ())} and " \
                                  f"{sorted(_types(props_y[field_]) or ())}"
        if why:
            out.append(Problem(subs[0].path, f"TRIGGERS: no data of event {name!r} could be valid for every "
                                             f"subscriber ({', '.join(f.name for f in subs)}): {why}; every "
                                             "emit of it would be refused (422). Make the schemas agree, or "
                                             "subscribe to different events"))
    return out


def emit_bound_problems(cfg: Config, reg: Registry) -> list[Problem]:
    """Warnings: an event with so many subscribers that an emit of data the API accepts
    ([api] max_body_bytes) would pass MAX_EMIT_BYTES, one copy per subscriber, and be
    refused (413), with the most data an emit of it may carry."""
    by_event = _subscribers(reg)
    out = []
    for name, subs in sorted(by_event.items()):
        most = MAX_EMIT_BYTES // len(subs)
        if most < cfg.api.max_body_bytes:
            subs.sort(key=lambda f: f.name)
            out.append(Problem(subs[0].path, f"TRIGGERS: event {name!r} has {len(subs)} subscribers "
                                             f"({', '.join(f.name for f in subs)}): an emit writes its data once "
                                             f"for each, at most {MAX_EMIT_BYTES:,} bytes in all, so an emit of "
                                             f"more than {most:,} bytes of data is refused (413) although "
                                             f"[api] max_body_bytes is {cfg.api.max_body_bytes:,}; pass a "
                                             "reference to big data, or subscribe fewer functions", "warning"))
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


# The durable calls whose first argument is the name a step log records (worker/journal.py).
DURABLE_CALLS = frozenset({"step", "sleep", "sleep_until", "wait_for_signal", "wait_for_event", "invoke"})


def durable_names(path: str) -> set[str] | None:
    """The names a function file's durable calls record (``ctx.step("charge", ...)``...);
    None when the file cannot tell (a name that is not a literal, or no file to read)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DURABLE_CALLS \
                and isinstance(node.func.value, ast.Name) and node.args:
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                return None
            names.add(first.value)
    return names


_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)


def durable_order(path: str) -> list[str] | None:
    """The names of a function file's durable calls in the order the file writes them,
    when that is the order every run reaches them in: each name once, all calls in one
    function and none in a loop, a comprehension or a lambda (branches keep the order of
    the calls a run does reach). None when the file cannot tell."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    found: list[tuple[int, int, str]] = []
    owners: set[int] = set()

    def visit(node: ast.AST, owner: int, looped: bool) -> bool:
        for child in ast.iter_child_nodes(node):
            inner, loop = owner, looped or isinstance(child, _LOOPS)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = id(child)
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and child.func.attr in DURABLE_CALLS and isinstance(child.func.value, ast.Name) and child.args:
                first = child.args[0]
                if loop or not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    return False
                found.append((child.lineno, child.col_offset, first.value))
                owners.add(inner)
            if not visit(child, inner, loop):
                return False
        return True

    if not visit(tree, 0, False) or len(owners) > 1:
        return None
    names = [n for _, _, n in sorted(found)]
    return names if len(set(names)) == len(names) else None


def durable_unconditional(path: str) -> set[str]:
    """The names of a function file's durable calls that every run passing them reaches:
    not under an if, a match, an except or else clause, a conditional expression, an and
    or or, or a loop. A step of these that comes before a recorded one but is not in the
    record is new: a replay would meet it where the record names another."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    out: set[str] = set()

    def visit(node: ast.AST, maybe: bool) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in DURABLE_CALLS and node.args and not maybe:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                out.add(first.value)
        if isinstance(node, ast.Try | ast.TryStar):
            # A try body's calls are reached only while nothing before them raised: a
            # handled error skips the rest, so none of them counts as reached on every path.
            for stmt in node.finalbody:
                visit(stmt, maybe)
            for other in [*node.body, *node.handlers, *node.orelse]:
                visit(other, True)
            return
        branchy = isinstance(node, (ast.If, ast.IfExp, ast.Match, ast.BoolOp, *_LOOPS))
        test = node.test if isinstance(node, ast.If | ast.IfExp) else None
        for child in ast.iter_child_nodes(node):
            # An if's test runs always; its branches may not.
            visit(child, maybe or (branchy and child is not test))

    visit(tree, False)
    return out


def _inserted(order: list[str] | None, always: set[str], names: list[str]) -> str | None:
    """A step every run reaches that the file now calls before the last recorded one, and
    that the record lacks (so it was added since), or None."""
    if order is None or any("#" in n for n in names):
        return None
    at = {n: i for i, n in enumerate(order)}
    reached = [at[n] for n in names if n in at]
    if not reached:
        return None
    recorded = set(names)
    return next((n for n in order[:max(reached)] if n in always and n not in recorded), None)


def _out_of_order(order: list[str] | None, names: list[str]) -> tuple[str, str] | None:
    """Two recorded steps the file now reaches the other way round, or None."""
    if order is None or any("#" in n for n in names):
        return None
    at = {n: i for i, n in enumerate(order)}
    seen = [n for n in names if n in at]
    for a, b in itertools.pairwise(seen):
        if at[a] > at[b]:
            return a, b
    return None


def drift(reg: Registry, jobs: Sequence[tuple[str, str, str, str, list[str]]]) -> list[Problem]:
    """The sleeping and waiting jobs (store/steps.py: suspended) whose step log names a
    step the function on disk no longer reaches: their replay would fail for good as
    non-deterministic (docs/durable.md). One problem per function, naming its jobs."""
    by_type: dict[str, list[str]] = {}
    missing_of: dict[str, str] = {}
    known: dict[str, set[str] | None] = {}
    orders: dict[str, list[str] | None] = {}
    swapped_of: dict[str, tuple[str, str]] = {}
    always: dict[str, set[str]] = {}
    inserted_of: dict[str, str] = {}
    for _queue, job_id, type_, status, names in jobs:
        fn = reg.functions.get(type_)
        if fn is None:
            continue  # the deploy gate names an unknown type
        if type_ not in known:
            known[type_] = durable_names(fn.path)
        have = known[type_]
        if have is None:
            continue
        gone = [n for n in names if n.split("#")[0] not in have]
        if gone:
            by_type.setdefault(type_, []).append(f"{job_id} ({status})")
            missing_of.setdefault(type_, gone[0])
            continue
        if type_ not in orders:
            orders[type_] = durable_order(fn.path)
        swapped = _out_of_order(orders[type_], names)
        if swapped is not None:
            swapped_of.setdefault(type_, swapped)
            by_type.setdefault(type_, []).append(f"{job_id} ({status})")
            continue
        if type_ not in always:
            always[type_] = durable_unconditional(fn.path)
        new = _inserted(orders[type_], always[type_], names)
        if new is not None:
            inserted_of.setdefault(type_, new)
            by_type.setdefault(type_, []).append(f"{job_id} ({status})")
    out = []
    for t, ids in sorted(by_type.items()):
        listed = f"Jobs: {', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}"
        if t in missing_of:
            what = (f"recorded step {missing_of[t]!r}, which {reg.functions[t].path} no longer reaches: their "
                    "replay would fail as non-deterministic. Let them finish on the code they started with, or "
                    "keep that step (its name and order).")
        elif t in inserted_of:
            what = (f"a record without step {inserted_of[t]!r}, which {reg.functions[t].path} now calls before "
                    "their recorded steps: their replay would meet it where the record names another step and "
                    "fail as non-deterministic. Let them finish on the code they started with, or add the new "
                    "step after the steps they recorded.")
        else:
            a, b = swapped_of[t]
            what = (f"recorded step {a!r} before {b!r}, which {reg.functions[t].path} now reaches in the other "
                    "order: their replay would fail as non-deterministic. Let them finish on the code they "
                    "started with, or keep the steps' order.")
        out.append(Problem("deploy gate", f"{len(ids)} sleeping or waiting job(s) of {t} {what} {listed}"))
    return out
