"""A function file's options (QUEUE, MAX_ATTEMPTS, TIMEOUT, ...): one table row per
option, with its default from the function's queue and a reader that checks a value and
gives the one kept, or refuses it with the message the file's author sees.

QUEUE is read first (its queue gives the others' defaults), then the table before the
schemas, then (once the schemas loaded, registry.py) the table after them, whose keys and
limits are checked against the newest schema. Options are read in that order and the
first refusal is the file's error. The schedule options are schedules.py's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from runner.catalog import limits, templates
from runner.catalog import schedules as schedules_mod
from runner.config import ISOLATIONS, JITTER_MODES, MAX_COUNT, MAX_SECONDS, Backoff, Config, QueueConfig


class Refused(Exception):
    """An option's value refused: the message names the option and what it must be."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option  # the option whose line the error points at (set by read)


@dataclass(slots=True)
class Seen:
    """What an option's reader may look at: the function's queue, the options read before
    it, and (for the options read after the schemas) the newest schema."""

    queue: QueueConfig
    values: dict[str, Any] = field(default_factory=dict)
    newest: Mapping[str, Any] | None = None  # the newest version's schema document
    version: int = 0  # its number

    def declared(self, what: str, tpl: templates.Template | None) -> None:
        """A key template over a field the newest schema lacks would render from nothing."""
        for fld in tpl.fields if tpl else ():
            if self.newest is not None and not templates.schema_has(self.newest, fld):
                raise Refused(f"{what} names field {fld!r}, which the v{self.version} schema does not declare")


# (option name, the value the file set or the default, what is known) -> the value kept
Reader = Callable[[str, Any, Seen], Any]


@dataclass(frozen=True, slots=True)
class Option:
    """One function option, a module-level NAME in the function's file: the value when
    the file leaves it out (from the function's queue), and its reader."""

    name: str
    default: Callable[[QueueConfig], Any]
    read: Reader


def _num(v: Any) -> bool:
    # Finite: a setting of inf or nan means no bound, and overflows where it meets a clock.
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(valid: Callable[[Any], bool], must: str, optional: bool = False) -> Reader:
    """A reader that keeps a valid value as it is and refuses another with
    "<NAME> <must>, got <value>"; ``optional``: None is no value, kept as None."""
    def read(name: str, v: Any, seen: Seen) -> Any:
        if not (valid(v) or (optional and v is None)):
            raise Refused(f"{name} {must}, got {v!r}")
        return v
    return read


def _seconds(optional: bool) -> Reader:
    """A positive number of seconds, at most MAX_SECONDS (as runner.toml's durations: past
    it, a worker's milliseconds overflow); ``optional``: None is no value."""
    def read(name: str, v: Any, seen: Seen) -> Any:
        if optional and v is None:
            return None
        if not (_num(v) and v > 0):
            raise Refused(f"{name} must be a positive number of seconds, got {v!r}")
        if v > MAX_SECONDS:
            raise Refused(f"{name} must be at most {MAX_SECONDS:,} seconds, got {v!r}")
        return v
    return read


_positive_s = _seconds(optional=False)
_positive_s_or_none = _seconds(optional=True)
_function_name = _check(lambda v: isinstance(v, str) and v.isidentifier(), "must name a function (a string)",
                        optional=True)


# An event name: what POST /events/{name} carries in its path and `runner emit` takes.
# The most bytes one emit writes: its data once per subscriber, all in one script call
# (one partition's atomic step), during which Redis answers nobody (records.SCRIPT_BYTES,
# the bound of what one call reads whole, on the same grounds). Past it, the emit is
# refused before anything is written (errors.EventTooLarge: 413).
MAX_EMIT_BYTES = 8 * 1024 * 1024
EVENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def _triggers(name: str, raw: Any, seen: Seen) -> tuple[str, ...]:
    """TRIGGERS: the event names the function runs for, each at most once."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple) or not all(isinstance(e, str) for e in raw):
        raise Refused(f'{name} must be a list of event names (strings), got {raw!r}')
    for e in raw:
        if not EVENT_NAME.fullmatch(e):
            raise Refused(f"{name}: {e!r} is not an event name: 1 to 128 letters, digits and . _ : -, "
                          "starting with a letter or digit")
    if len(set(raw)) != len(raw):
        raise Refused(f"{name} names an event twice: {sorted(e for e in set(raw) if raw.count(e) > 1)}")
    return tuple(raw)


def _timeout(name: str, v: Any, seen: Seen) -> Any:
    """Seconds, at most the queue's max_timeout (a lease renewed that long at most)."""
    _positive_s(name, v, seen)
    q = seen.queue
    if v > q.max_timeout_s:
        raise Refused(f"{name} {v} s does not fit queue {q.name!r}: its max_timeout is {q.max_timeout_s:g} s "
                      f"(10 x visibility_timeout unless set); use a queue with a longer lease or raise "
                      f"queues.{q.name}.max_timeout")
    return v


def _backoff(name: str, raw: Any, seen: Seen) -> Backoff:
    """A dict of some of base, cap, jitter over the queue's backoff (None: the queue's)."""
    backoff = seen.queue.backoff
    if raw is None:
        return backoff
    if not isinstance(raw, dict) or set(raw) - {"base", "cap", "jitter"}:
        raise Refused(f"{name} must be a dict with keys base, cap, jitter")
    base, cap = raw.get("base", backoff.base_s), raw.get("cap", backoff.cap_s)
    jitter = raw.get("jitter", backoff.jitter)
    if not (_num(base) and _num(cap) and 0 <= base <= cap) or jitter not in JITTER_MODES:
        raise Refused(f"{name} needs 0 <= base <= cap and jitter in {JITTER_MODES}")
    return Backoff(float(base), float(cap), str(jitter))


_megabytes = _check(lambda v: _num(v) and v >= 16, "must be a number of megabytes >= 16", optional=True)


def _memory_mb(name: str, v: Any, seen: Seen) -> Any:
    """A child process's memory cap: process isolation only."""
    _megabytes(name, v, seen)
    if v is not None and seen.values["ISOLATION"] != "process":
        raise Refused(f'{name} caps a child process: it needs ISOLATION = "process"')
    return v


def _key(name: str, raw: Any, seen: Seen) -> templates.Template | None:
    """A key template (IDEMPOTENCY_KEY, RESOURCE_KEY) over declared payload fields."""
    if raw is None:
        return None
    try:
        tpl = templates.parse(raw)
    except templates.TemplateError as exc:
        raise Refused(f"{name}: {exc}") from None
    seen.declared(name, tpl)
    return tpl


def _limit(parse: Callable[[Any], limits.Concurrency | limits.Rate]) -> Reader:
    """CONCURRENCY or RATE_LIMIT (see catalog.limits), its key over declared fields."""
    def read(name: str, raw: Any, seen: Seen) -> Any:
        if raw is None:
            return None
        try:
            limit = parse(raw)
        except ValueError as exc:
            raise Refused(f"{name} {exc}") from None
        seen.declared(f"{name} key", limit.key)
        return limit
    return read


@dataclass(frozen=True, slots=True)
class Debounce:
    """DEBOUNCE: one job per burst of enqueues with the same rendered key, run with the
    latest payload ``period_s`` after the last enqueue, never later than ``max_wait_s``
    after the first (see docs/events.md)."""

    key: templates.Template
    period_s: float
    max_wait_s: float

    def describe(self) -> dict[str, Any]:
        return {"key": self.key.source, "period": self.period_s, "max_wait": self.max_wait_s}


def _debounce(name: str, raw: Any, seen: Seen) -> Debounce | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"key", "period", "max_wait"} or "key" not in raw \
            or "period" not in raw:
        raise Refused(f'{name} must be a dict with "key", "period" and optionally "max_wait", got {raw!r}')
    period, max_wait = raw["period"], raw.get("max_wait", raw["period"] * 10)
    if not (_num(period) and period > 0 and _num(max_wait) and max_wait >= period):
        raise Refused(f"{name} needs a period > 0 s and a max_wait >= period, got period {period!r}, "
                      f"max_wait {max_wait!r}")
    if seen.values.get("IDEMPOTENCY_KEY") is not None:
        raise Refused(f"{name} and IDEMPOTENCY_KEY exclude each other: a burst's enqueues all land on one job, "
                      "which is what an idempotency key would refuse; keep one of them")
    try:
        tpl = templates.parse(raw["key"])
    except templates.TemplateError as exc:
        raise Refused(f"{name} key: {exc}") from None
    seen.declared(f"{name} key", tpl)
    return Debounce(tpl, float(period), float(max_wait))


@dataclass(frozen=True, slots=True)
class Batch:
    """BATCH: up to ``size`` jobs of the function in one ``handle_batch(payloads, ctx)``
    call, or what came within ``wait_s`` of the first; with ``key``, one batch per rendered
    key (see docs/events.md)."""

    size: int
    wait_s: float
    key: templates.Template | None = None

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "wait": self.wait_s, "key": self.key.source if self.key else None}


BATCH_MAX_SIZE = 1000  # jobs in one call at most
BATCH_MAX_WAIT_S = 60.0  # the longest a batch waits for more (its members' leases are renewed meanwhile)


def _batch(name: str, raw: Any, seen: Seen) -> Batch | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"size", "wait", "key"} or "size" not in raw or "wait" not in raw:
        raise Refused(f'{name} must be a dict with "size", "wait" and optionally "key", e.g. '
                      f'{{"size": 100, "wait": 1.0}}, got {raw!r}')
    size, wait = raw["size"], raw["wait"]
    if not (_whole(size) and 1 <= size <= BATCH_MAX_SIZE):
        raise Refused(f'{name} "size" must be an integer from 1 to {BATCH_MAX_SIZE}, got {size!r}')
    if not (_num(wait) and 0 <= wait <= BATCH_MAX_WAIT_S):
        raise Refused(f'{name} "wait" must be a number of seconds from 0 to {BATCH_MAX_WAIT_S:g}, got {wait!r}')
    tpl = None
    if raw.get("key") is not None:
        try:
            tpl = templates.parse(raw["key"])
        except templates.TemplateError as exc:
            raise Refused(f"{name} key: {exc}") from None
        seen.declared(f"{name} key", tpl)
    limit = seen.values.get("CONCURRENCY")
    if limit is not None and limit.limit < size:
        # Each member of a batch holds a CONCURRENCY slot while the call runs: a batch
        # could never fill, and a wait would only delay every call.
        raise Refused(f'{name} "size" {size} is above CONCURRENCY {limit.limit}: each member of a batch holds '
                      f"a concurrency slot while the call runs, so a batch could never fill; lower the size to "
                      f"at most {limit.limit} or raise the limit")
    if seen.values.get("RESOURCE_KEY") is not None:
        raise Refused(f"{name} and RESOURCE_KEY exclude each other: a resource key lets one job at a time hold "
                      "it, and a batch runs many at once; use CONCURRENCY (at least the batch size) instead")
    if seen.values.get("DEBOUNCE") is not None:
        raise Refused(f"{name} and DEBOUNCE exclude each other: a debounced function runs one job per burst; "
                      "keep one of them")
    return Batch(size, float(wait), tpl)


def _unset(queue: QueueConfig) -> None:
    return None


BEFORE_SCHEMAS: tuple[Option, ...] = (
    Option("MAX_ATTEMPTS", lambda q: q.max_attempts, _check(lambda v: _whole(v) and 1 <= v <= MAX_COUNT,
                                                            f"must be a positive integer, at most {MAX_COUNT:,}")),
    Option("TIMEOUT", lambda q: min(q.visibility_timeout_s, q.max_timeout_s), _timeout),
    Option("BACKOFF", _unset, _backoff),
    Option("ISOLATION", lambda q: q.isolation, _check(lambda v: v in ISOLATIONS,
                                                      f"must be one of {', '.join(map(repr, ISOLATIONS))}")),
    Option("MEMORY_MB", _unset, _memory_mb),
    Option("KEEP_RESULT", _unset, _positive_s_or_none),
    Option("MAX_AGE", _unset, _positive_s_or_none),
    Option("HOLD_LOCKS_WHILE_SUSPENDED", lambda q: False, _check(lambda v: isinstance(v, bool),
                                                                 "must be True or False")),
    Option("ON_SUCCESS", _unset, _function_name),
    Option("ON_FAILURE", _unset, _function_name),
    Option("TRIGGERS", _unset, _triggers),
)
AFTER_SCHEMAS: tuple[Option, ...] = (
    Option("IDEMPOTENCY_KEY", _unset, _key),
    Option("RESOURCE_KEY", _unset, _key),
    Option("CONCURRENCY", _unset, _limit(limits.parse_concurrency)),
    Option("RATE_LIMIT", _unset, _limit(limits.parse_rate)),
    Option("PRIORITY", lambda q: 0, _check(lambda v: _whole(v) and 0 <= v <= 9, "must be an integer from 0 to 9")),
    Option("DEBOUNCE", _unset, _debounce),
    Option("BATCH", _unset, _batch),
)
# Every option's name: an upper-case name close to one of these is taken for a typo.
OPTIONS = ("QUEUE", *(o.name for o in BEFORE_SCHEMAS + AFTER_SCHEMAS), *schedules_mod.OPTIONS)


def queue_of(module: ModuleType, config: Config) -> QueueConfig:
    """QUEUE, the first configured queue when left out."""
    name = getattr(module, "QUEUE", None)
    if name is None:
        name = next(iter(config.queues))
    if not isinstance(name, str):
        raise Refused(f"QUEUE must be a string, got {name!r}", "QUEUE")
    if name not in config.queues:
        raise Refused(f"QUEUE {name!r} is not defined in {config.source} (have: {', '.join(config.queues)})", "QUEUE")
    return config.queues[name]


def read(module: ModuleType, table: tuple[Option, ...], seen: Seen) -> None:
    """Read ``table``'s options from ``module`` into ``seen.values``, in order."""
    for opt in table:
        try:
            seen.values[opt.name] = opt.read(opt.name, getattr(module, opt.name, opt.default(seen.queue)), seen)
        except Refused as exc:
            exc.option = opt.name
            raise
