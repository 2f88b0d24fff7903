"""Reading a durable function's step log: the entries lua/step.lua and lua/suspend.lua
recorded in the job's state hash (``steps``, the count; ``step:<i>``, each entry's JSON,
an object or a compact array: records.entry_of),
for a run's replay (worker/journal.py) and the job's views."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from runner.store import codec, records
from runner.store.keys import QueueKeys

# A job's step log is bounded (PRODUCT.md): entries and bytes of all entries.
MAX_STEPS = records.MAX_STEPS  # (there: a view reads a count past it as damage)
MAX_LOG_BYTES = 4 * 1024 * 1024
MAX_STEP_BYTES = 256 * 1024  # [worker] max_step_bytes by default: one step's result
# Signals one job keeps unread (sent before its waits read them): a bound, so no caller
# grows a job's state without end (signal.lua; a child's end is never refused).
MAX_KEPT_SIGNALS = 32
MAX_KEPT_SIGNAL_BYTES = 1024 * 1024
# A wait without a timeout ends after this long, as a sleep can last at most this long.
YEAR_MS = 366 * 86_400_000
# A step's value and a signal's body: held to the one limit (codec.MAX_DEPTH), as a
# payload and a result are; a log entry holds it one level down (a child's end two),
# within the headroom every record read back has (codec.READ_DEPTH).
VALUE_DEPTH = codec.MAX_DEPTH
# A signal's name: it stands in a URL path (POST /jobs/{id}/signals/{name}).
SIGNAL_NAME = re.compile(r"[A-Za-z0-9._:-]{1,100}")
# The names a child's end sends its parent (ctx.invoke): runner's own, so no caller can
# forge a child's result and no wait collides with one.
RESERVED_SIGNAL = re.compile(r"(child|event)\.[0-9]+")


def check_signal_name(name: Any) -> str:
    """A signal name a caller may send or wait for (ValueError naming the rule if not)."""
    if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
        raise ValueError(f"a signal's name is 1 to 100 letters, digits, '.', '_', ':' or '-', not {name!r}")
    if RESERVED_SIGNAL.fullmatch(name):
        raise ValueError(f"the signal name {name!r} is reserved: 'child.' or 'event.' and a number is the signal "
                         "a child job's end sends its parent (ctx.invoke), or an event its waiter "
                         "(ctx.wait_for_event); choose another name")
    return name


def read(scripts: Any, k: QueueKeys, job_id: str, type_: str = "", durable: bool = False) -> list[dict[str, Any]]:
    """The job's step log, oldest first ([] for a job without one), in one round trip
    (lua/steps.lua). An entry that is not JSON (damage) reads as a step named by its
    position and marked ``damaged``, so a replay fails on it loudly, saying so. With ``type_``, a run that finds a log
    counts a replay of that function. ``durable`` (a run's replay, with [redis]
    wait_replicas): a log is confirmed by the replicas before a run returns one of its
    entries (NotReplicated): read again with the replay's count, a write, which the WAIT
    behind it covers with every write before it, the log's own. An empty log needs none."""
    stats = f"replays|{type_}" if type_ else ""
    if durable and getattr(scripts, "replicas", 0) > 0:
        values = scripts.steps(k, job_id, "")
        if values:
            values = scripts.steps(k, job_id, stats, durable=True)
    else:
        values = scripts.steps(k, job_id, stats)
    out: list[dict[str, Any]] = []
    for i, v in enumerate(values or []):
        try:
            entry = codec.loads(v) if v else None
        except codec.TooDeep:  # written before VALUE_DEPTH held at the entry: it reads all the same
            try:
                entry = orjson.loads(v)
            except orjson.JSONDecodeError:
                entry = None
        except codec.DecodeError:
            entry = None
        entry = records.entry_of(entry)
        out.append(entry if entry is not None else
                   {"name": f"<damaged entry {i + 1}>", "kind": "?", "damaged": True})
    return out


def waiting_event(redis: Any, k: QueueKeys, job_id: str) -> tuple[str, dict[str, Any], int] | None:
    """What a job waits for when it waits for an event (ctx.wait_for_event): its name, its
    match and the wait's position; None for a job that does not (two round trips)."""
    waits = redis.hget(k.state(job_id), "waiting_for")
    if not waits or not str(waits).startswith("event."):
        return None
    try:
        position = int(str(waits)[6:])
        entry = codec.loads(redis.hget(k.state(job_id), f"step:{position}") or "null")
    except (ValueError, codec.DecodeError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("event"), str) \
            or not isinstance(entry.get("match"), dict):
        return None
    return entry["event"], entry["match"], position


# The deploy gate reads at most this many scheduled jobs of each partition, in chunks
# (and says so when a partition holds more): sleepers hide among delayed jobs there.
SUSPENDED_READ_MAX = 100_000
_CHUNK = 1_000


def suspended(redis: Any, keys: Sequence[QueueKeys], limit: int = SUSPENDED_READ_MAX
              ) -> tuple[list[tuple[str, str, str, str, list[str]]], list[tuple[str, int, int]]]:
    """(queue, job id, type, status, recorded step names) of the sleeping and waiting jobs
    of each partition (`runner check`): the scheduled set's (waiting ones, and sleeping ones
    an earlier release suspended) and the sleeping set's, each read in chunks of _CHUNK:
    each job's status first, then the record and steps of the suspended ones only, each job
    once; and the partitions read only in part, as (queue, read, held), when one holds over
    ``limit``."""
    out: list[tuple[str, str, str, str, list[str]]] = []
    short: list[tuple[str, int, int]] = []
    keys = list(keys)
    pipe = redis.pipeline(transaction=False)
    for k in keys:
        pipe.zcard(k.scheduled)
        pipe.zcard(k.sleeping)
    sizes = pipe.execute(raise_on_error=False)
    for i, k in enumerate(keys):
        seen: set[str] = set()
        for key, held in ((k.scheduled, sizes[2 * i]), (k.sleeping, sizes[2 * i + 1])):
            if isinstance(held, Exception):
                if key == k.scheduled:
                    raise held
                continue  # a damaged sleeping set: the reclaim puts it aside
            held = int(held or 0)
            if held > limit:
                short.append((k.queue, limit, held))
            for start in range(0, min(held, limit), _CHUNK):
                pipe = redis.pipeline(transaction=False)
                pipe.zrange(key, start, min(start + _CHUNK, limit) - 1)
                ids = [x for x in pipe.execute()[0] if x not in seen]
                seen.update(ids)
                if ids:
                    out += _suspended_of(redis, k, ids)
    return out, short


def _suspended_of(redis: Any, k: QueueKeys, ids: Sequence[str]) -> list[tuple[str, str, str, str, list[str]]]:
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.execute_command("HMGET", k.state(job_id), "status", "steps", "sleep")
    # A count past the log's bound is damage: read as none (it asked a million fields). A
    # sleeping job's count is in its 'sleep' field (records.asleep_expanded).
    chosen = [(job_id, records.count_of(steps or (sleep or "").split(" ")[0] or 0, MAX_STEPS) or 0, status)
              for job_id, (status, steps, sleep) in zip(ids, pipe.execute(), strict=True)
              if status in ("sleeping", "waiting")]
    if not chosen:
        return []
    pipe = redis.pipeline(transaction=False)
    for job_id, n, _ in chosen:
        pipe.get(k.job(job_id))
        pipe.execute_command("HMGET", k.state(job_id), "type", *[f"step:{i}" for i in range(n)])
    replies = pipe.execute()
    out: list[tuple[str, str, str, str, list[str]]] = []
    for (job_id, _n, status), raw, entries in zip(chosen, replies[::2], replies[1::2], strict=True):
        rec = records.parse(raw)
        if rec is None:
            continue
        names = []
        for one in entries[1:]:
            try:
                entry = records.entry_of(codec.loads(one or "null"))
            except codec.DecodeError:
                entry = None
            if entry is not None and isinstance(entry.get("name"), str):
                names.append(entry["name"])
        out.append((k.queue, job_id, rec.get("type", ""), status, names))
    return out
