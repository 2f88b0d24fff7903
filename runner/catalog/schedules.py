"""SCHEDULE and its companion options -> Schedule values, and the arithmetic of ticks.

A function file may declare::

    SCHEDULE = "*/15 * * * *"                # 5-field cron, or a list of entries:
    SCHEDULE = [{"cron": "0 9 * * 1-5", "tz": "Europe/Madrid", "payload": {...}, "id": "morning"}]
    SCHEDULE_TZ = "UTC"                       # the time zone of entries that name none
    SCHEDULE_PAYLOAD = {}                     # the payload of entries that carry none
    MISSED = "latest"                         # after a downtime: "skip" | "latest" | "all"
    OVERLAP = "allow"                         # a tick while the last run is unfinished: "skip" | "allow"

Everything is checked at load (a bad expression, an unknown time zone, a payload the
newest schema rejects, a RESOURCE_KEY the payload cannot render) and reported with the
file and the line of the option. A schedule's id is the function's name for a string
SCHEDULE, and ``<function>:<id>`` for a list entry (entries of a list of two or more
must name an id, unique in the file).

Ticks come from cronsim, chosen over croniter after measuring both (see the commit that
added it and docs/benchmarks.md): about 9 times faster per tick, no dependencies, an
expression that can never match (``0 0 30 2 *``) is an error at parse, and daylight
saving time follows Debian's cron: a time skipped by spring-forward runs once when the
clock jumps, and a fixed time that occurs twice at fall-back runs once (croniter runs it
twice); schedules every hour or more often run by the hour as it comes.

A tick is *missed* when it is found more than its grace late: half the gap to the next
tick, at most 60 s. MISSED then says what happens to missed ticks: "skip" drops them,
"latest" runs the newest one once, "all" runs each (at most MISSED_ALL_MAX, the newest).

``RUNNER_TEST_SCHEDULES=1`` (tests only; production never sets it) also accepts a
6-field expression whose first field is the second, so tests need not wait minutes.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from runner.catalog import limits, templates
from runner.catalog.schemas import Versions
from runner.errors import FunctionLoadError, ValidationFailed

if TYPE_CHECKING:
    import zoneinfo

# cronsim and zoneinfo are imported where a schedule is parsed or ticks: a project without
# SCHEDULE (and every `runner check` and worker start of one) never loads them.

OPTIONS = ("SCHEDULE", "SCHEDULE_TZ", "SCHEDULE_PAYLOAD", "MISSED", "OVERLAP")
MISSED_POLICIES = ("skip", "latest", "all")
OVERLAP_POLICIES = ("skip", "allow")
DEFAULT_MISSED = "latest"
DEFAULT_OVERLAP = "allow"
MISSED_ALL_MAX = 100  # "all" runs at most this many missed ticks of one downtime, the newest
GRACE_MAX_MS = 60_000
COUNT_MAX = 10_000  # missed ticks are counted (for the metrics) up to this many per downtime
TEST_ENV = "RUNNER_TEST_SCHEDULES"
_ENTRY_KEYS = frozenset({"cron", "tz", "payload", "id"})
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_FIELDS = "minute hour day-of-month month day-of-week"


def testing() -> bool:
    """The tests' switch (seconds field, shifted clock); never set in production."""
    return os.environ.get(TEST_ENV) == "1"


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC ("2026-03-29T01:00:00Z"; milliseconds if any)."""
    if ms is None:
        return None
    dt = datetime.fromtimestamp(ms / 1000, UTC)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


class Timeline:
    """The ticks of one (cron, tz), in epoch ms. Shared by every schedule with the same
    pair (see ``timeline``), and it remembers its last answer, so 10,000 schedules due on
    the same minute cost one computation, not 10,000."""

    __slots__ = ("_last", "cron", "tz", "zone")

    def __init__(self, cron: str, tz: str) -> None:
        self.cron = cron
        self.tz = tz
        self.zone: zoneinfo.ZoneInfo = _zone(tz)
        self._last: tuple[int, int] = (-1, -1)

    def next_after(self, ms: int) -> int:
        """The first tick strictly after ``ms``."""
        last = self._last
        if last[0] == ms:
            return last[1]
        import cronsim

        start = datetime.fromtimestamp(ms / 1000, UTC).astimezone(self.zone)
        it = cronsim.CronSim(self.cron, start)
        # cronsim can answer a time before its start inside a repeated (fall-back) hour;
        # such answers are passed over.
        while True:
            t = round(next(it).timestamp() * 1000)
            if t > ms:
                break
        self._last = (ms, t)
        return t

    def grace_ms(self, tick: int) -> int:
        return min(GRACE_MAX_MS, (self.next_after(tick) - tick) // 2)


@functools.lru_cache(maxsize=4096)
def timeline(cron: str, tz: str) -> Timeline:
    return Timeline(cron, tz)


@dataclass(frozen=True, slots=True)
class Step:
    """One atomic step of the ticker on one tick: fire it (enqueue its job) or skip it.
    ``missed`` is how many missed ticks before it the step passes over (counted in the
    metrics), ``late_ms`` how late the step is taken."""

    tick_ms: int
    fire: bool
    missed: int
    late_ms: int


def plan(line: Timeline, missed_policy: str, floor_ms: int, now_ms: int) -> list[Step]:
    """What to do with the ticks in (floor_ms, now_ms], oldest first (see the module's
    docstring for when a tick is missed)."""
    due: deque[int] = deque(maxlen=MISSED_ALL_MAX)
    count = 0
    t = line.next_after(floor_ms)
    while t <= now_ms and count < COUNT_MAX:
        due.append(t)
        count += 1
        t = line.next_after(t)
    if count == COUNT_MAX and t <= now_ms:
        # A long downtime of a frequent schedule: the ticks between are missed, uncounted.
        t = line.next_after(now_ms - 3_600_000)
        due.clear()
        while t <= now_ms:
            due.append(t)
            t = line.next_after(t)
    if not due:
        return []
    newest = due[-1]
    on_time = now_ms - newest <= line.grace_ms(newest)
    if missed_policy == "all":
        passed = count - len(due)
        return [Step(d, True, passed if i == 0 else 0, now_ms - d) for i, d in enumerate(due)]
    if on_time or missed_policy == "latest":
        return [Step(newest, True, count - 1, now_ms - newest)]
    return [Step(newest, False, count, now_ms - newest)]


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    function: str
    queue: str
    cron: str
    tz: str
    payload: Any
    payload_json: str
    version: int  # the newest schema version: the payload is validated against it
    max_attempts: int
    resource_key: str
    missed: str
    overlap: str
    digest: str  # of the definition, "<timing>:<whole>"; a worker whose definition differs never fires it (see ticker)
    limits: str = ""  # "<n> <key>" lines its jobs carry (see catalog.limits)
    priority: int = 0  # the function's PRIORITY: its ticks' jobs wait in the priority set

    @property
    def timeline(self) -> Timeline:
        return timeline(self.cron, self.tz)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "function": self.function, "queue": self.queue, "cron": self.cron,
                "tz": self.tz, "payload": self.payload, "missed": self.missed, "overlap": self.overlap}


def _check_cron(expr: Any, tz: str) -> str:
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError(f"a cron expression must be a non-empty string ({_FIELDS}), got {expr!r}")
    fields = expr.split()
    seconds = testing() and len(fields) == 6
    if len(fields) != 5 and not seconds:
        raise ValueError(f"cron expression {expr!r} has {len(fields)} field(s); expected 5: {_FIELDS}")
    import cronsim

    try:
        it = cronsim.CronSim(expr, datetime(2026, 1, 1, tzinfo=_zone(tz)))
        next(it)
    except (cronsim.CronSimError, StopIteration) as exc:
        why = str(exc) or "it never matches"
        raise ValueError(f"bad cron expression {expr!r}: {why} (fields: {_FIELDS})") from None
    return " ".join(fields)


def _check_tz(tz: Any) -> str:
    if not isinstance(tz, str) or not tz:
        raise ValueError(f"a time zone must be an IANA name such as 'Europe/Madrid', got {tz!r}")
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        close = difflib.get_close_matches(tz, zoneinfo.available_timezones(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else " (an IANA name such as 'Europe/Madrid')"
        raise ValueError(f"unknown time zone {tz!r}{hint}") from None
    return tz


def _zone(tz: str) -> zoneinfo.ZoneInfo:
    import zoneinfo

    return zoneinfo.ZoneInfo(tz)


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(_canonical(list(parts)), digest_size=8).hexdigest()


# Why a value cannot be a job's payload (nested past the limit, NaN, an integer past 64
# bits: the store's encoder decides, and the layer that loads the registry passes it in,
# as the catalog imports no store), or None when it can.
PayloadCheck = Callable[[Any], "str | None"]


def parse(
    module: Any, *, function: str, queue: str, max_attempts: int, versions: Versions,
    flow: limits.Flow, fail: Callable[[str, str | None], FunctionLoadError], max_payload_bytes: int,
    priority: int = 0, payload_check: PayloadCheck | None = None,
) -> tuple[tuple[Schedule, ...], list[str]]:
    """The schedules a function module declares (none without SCHEDULE), and warnings.
    ``fail(message, option)`` builds the error that names the file and the option's line.
    A payload is held to ``max_payload_bytes`` of JSON ([api] max_body_bytes) and to
    ``payload_check``, as every producer's is: each tick enqueues it as it stands."""
    raw = getattr(module, "SCHEDULE", None)
    warnings: list[str] = []
    if raw is None:
        stray = [o for o in OPTIONS[1:] if hasattr(module, o)]
        if stray:
            warnings.append(f"{', '.join(stray)} set without SCHEDULE: no schedule runs")
        return (), warnings

    tz_default: Any = getattr(module, "SCHEDULE_TZ", "UTC")
    try:
        tz_default = _check_tz(tz_default)
    except ValueError as exc:
        raise fail(f"SCHEDULE_TZ: {exc}", "SCHEDULE_TZ") from None
    payload_default = getattr(module, "SCHEDULE_PAYLOAD", {})
    missed = getattr(module, "MISSED", DEFAULT_MISSED)
    if missed not in MISSED_POLICIES:
        raise fail(f"MISSED must be one of {', '.join(map(repr, MISSED_POLICIES))}, got {missed!r}", "MISSED")
    overlap = getattr(module, "OVERLAP", DEFAULT_OVERLAP)
    if overlap not in OVERLAP_POLICIES:
        raise fail(f"OVERLAP must be one of {', '.join(map(repr, OVERLAP_POLICIES))}, got {overlap!r}",
                   "OVERLAP")

    if isinstance(raw, str):
        entries: list[Mapping[str, Any]] = [{"cron": raw}]
    elif isinstance(raw, list | tuple) and raw and all(isinstance(e, Mapping) for e in raw):
        entries = list(raw)
    else:
        raise fail("SCHEDULE must be a cron string ('*/15 * * * *') or a non-empty list of "
                   "{'cron', 'tz', 'payload', 'id'} dicts", "SCHEDULE")

    out: list[Schedule] = []
    seen: set[str] = set()
    for n, entry in enumerate(entries):
        where = "SCHEDULE" if isinstance(raw, str) else f"SCHEDULE[{n}]"
        unknown = set(entry) - _ENTRY_KEYS
        if unknown:
            raise fail(f"{where} has unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                       "an entry takes cron, tz, payload and id", "SCHEDULE")
        if "cron" not in entry:
            raise fail(f"{where} needs a 'cron' expression", "SCHEDULE")
        entry_id = entry.get("id")
        if entry_id is None:
            if len(entries) > 1:
                raise fail(f"{where} needs an 'id': a list of several schedules names each one", "SCHEDULE")
            sid = function
        elif not isinstance(entry_id, str) or not _ID.match(entry_id):
            raise fail(f"{where} id {entry_id!r} must be 1 to 64 letters, digits, '_', '.' or '-'", "SCHEDULE")
        elif entry_id in seen:
            raise fail(f"{where} id {entry_id!r} is used twice in this file", "SCHEDULE")
        else:
            seen.add(entry_id)
            sid = f"{function}:{entry_id}"
        try:
            tz = _check_tz(entry["tz"]) if "tz" in entry else tz_default
            cron = _check_cron(entry["cron"], tz)
        except ValueError as exc:
            raise fail(f"{where}: {exc}", "SCHEDULE") from None
        payload = entry.get("payload", payload_default)
        if "payload" in entry:
            opt, label = "SCHEDULE", f"{where} payload"
        elif hasattr(module, "SCHEDULE_PAYLOAD"):
            opt, label = "SCHEDULE_PAYLOAD", "SCHEDULE_PAYLOAD"
        else:
            opt, label = "SCHEDULE", f"{where} payload (SCHEDULE_PAYLOAD, default {{}})"
        why = payload_check(payload) if payload_check is not None else None
        if why:
            raise fail(f"{label} cannot be a job's payload: {why}", opt)
        try:
            payload_json = _canonical(payload).decode()
        except TypeError as exc:
            raise fail(f"{label} is not JSON: {exc}", opt) from None
        size = len(payload_json.encode())
        if size > max_payload_bytes:
            raise fail(f"{label} is {size:,} bytes of JSON, over [api] max_body_bytes = {max_payload_bytes:,} "
                       "(the most one job may carry): keep large data elsewhere and put a reference in the "
                       "payload, or raise the limit in runner.toml", opt)
        try:
            versions.validate(payload, versions.newest)
        except ValidationFailed as exc:
            problems = "; ".join(f"{e.path}: {e.message}" for e in exc.errors)
            raise fail(f"{label} does not validate against the v{versions.newest} schema: {problems}",
                       opt) from None
        try:
            rkey, lims = flow.render(function, payload)
        except templates.TemplateError as exc:
            raise fail(f"{label}: RESOURCE_KEY or CONCURRENCY key cannot be rendered: {exc}", opt) from None
        out.append(Schedule(
            id=sid, function=function, queue=queue, cron=cron, tz=tz, payload=payload,
            payload_json=payload_json, version=versions.newest, max_attempts=max_attempts,
            resource_key=rkey, missed=str(missed), overlap=str(overlap), limits=lims, priority=priority,
            # "<timing>:<whole>": a deploy that keeps the timing keeps the timeline, so the ticks
            # missed while it restarts are caught up under MISSED (store/lua/adopt.lua).
            digest=f"{_digest(cron, tz)}:"
                   f"{_digest(sid, function, queue, cron, tz, payload_json, versions.newest, missed, overlap)}",
        ))
    return tuple(out), warnings
