"""What `runner check` says of partitioned queues (docs/partitions.md):

- ``split_keys``: a function on a partitioned queue whose keys can route two jobs that
  should meet (one idempotency key, one lock) to two partitions. A job goes where its
  first key sends it (RESOURCE_KEY, then CONCURRENCY, then RATE_LIMIT, then the
  idempotency key); a later key holds across partitions only when the first key's fields
  are all among its own, so equal values of the later key mean one first key.
- ``Change``: what a change of ``partitions`` implies, from the tags and counts that
  processes have recorded in Redis (store/tagset.py), which the command reads and hands over.

Nothing here talks to Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.catalog.registry import Function
from runner.catalog.templates import Template

Key = tuple[str, Template | None]  # (option, its template; None: one key for the function)


def _keys(fn: Function) -> list[Key]:
    out: list[Key] = []
    if fn.resource_key is not None:
        out.append(("RESOURCE_KEY", fn.resource_key))
    if fn.concurrency is not None:
        out.append(("CONCURRENCY", fn.concurrency.key))
    if fn.rate is not None:
        out.append(("RATE_LIMIT", fn.rate.key))
    return out


def _fields(t: Template | None) -> set[str]:
    return set() if t is None else set(t.fields)


def split_keys(fn: Function, partitions: int) -> list[str]:
    """Warnings for the keys of ``fn`` that hold per partition only, on a queue of
    ``partitions`` (none on one partition). Each says what to change."""
    limits = _keys(fn)
    if partitions <= 1 or not limits:
        return []
    (first, route), rest = limits[0], limits[1:]
    if route is None or not route.fields:  # one key for every job: all in one partition
        return []
    need = _fields(route)  # the fields that choose a job's partition
    out = []
    for option, t in rest:
        if t is None or not need <= _fields(t):
            what = "the function-wide limit" if t is None else f"its key {t.source!r}"
            out.append(f"{option}: on a queue of {partitions} partitions, jobs are placed by {first} "
                       f"{_source(route)}, so {what} holds in each partition on its own "
                       f"(up to {partitions} times the limit); make {first} a function of the "
                       f"{option} key's fields, or put the function on a queue of one partition")
    if fn.idempotency_key is not None and not need <= _fields(fn.idempotency_key):
        out.append(f"IDEMPOTENCY_KEY: on a queue of {partitions} partitions, jobs are placed by {first} "
                   f"{_source(route)}; two payloads with one idempotency key but other "
                   f"{', '.join(sorted(need - _fields(fn.idempotency_key)))} can land in two partitions, "
                   "where the conflict goes unseen and both run; build the idempotency key from "
                   f"{first}'s fields too")
    return out


def _source(t: Template | None) -> str:
    return "(one key for the function)" if t is None else repr(t.source)


@dataclass(frozen=True, slots=True)
class Change:
    """One queue's partitions as configured, against the tags recorded in Redis."""

    queue: str
    partitions: int
    added: tuple[str, ...]  # this count's tags no process has recorded yet
    draining: tuple[str, ...]  # recorded tags this count lacks: served until they drain
    draining_jobs: int  # jobs not done in those (the census)
    counts: tuple[int, ...] = ()  # the other counts processes routed by within the retention

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "partitions": self.partitions, "added": list(self.added),
                "draining": list(self.draining), "draining_jobs": self.draining_jobs,
                "counts": list(self.counts)}

    def message(self) -> str | None:
        """What the change implies, or None when there is none to tell."""
        out = []
        if self.draining:
            tags = ", ".join("{" + t + "}" for t in self.draining)
            where = f"{self.draining_jobs} job(s) not done there" if self.draining_jobs else "now empty"
            out.append(f"queue {self.queue}: partitions = {self.partitions} no longer routes to {tags} "
                       f"({where}); workers keep serving them until they hold nothing for a retention")
        if self.counts:
            was = " and ".join(f"partitions = {n}" for n in self.counts)
            out.append(f"queue {self.queue}: keys were placed by {was} within the retention; a keyed job "
                       f"(an idempotency key, RESOURCE_KEY, CONCURRENCY, RATE_LIMIT or DEBOUNCE key) goes where "
                       f"that count put its key while the key lives there, one look-up more per enqueue "
                       f"of keyed jobs until a retention after the last process on {was} stopped; the "
                       f"other jobs go by partitions = {self.partitions}. Run every process on one count "
                       f"before the next change")
        return "; ".join(out) or None


def changes(partitions: dict[str, int], own: dict[str, tuple[str, ...]], recorded: dict[str, list[str]],
            jobs: dict[str, int], counts: dict[str, list[int]] | None = None) -> list[Change]:
    """Per queue: ``own`` tags of the configured count, the ``recorded`` ones, the jobs
    not done in each recorded tag (``jobs``, by tag) and the ``counts`` recorded lately."""
    out = []
    for q, tags in own.items():
        seen = recorded.get(q, [])
        gone = tuple(t for t in seen if t not in tags)
        added = tuple(t for t in tags if seen and t not in seen)
        others = tuple(n for n in (counts or {}).get(q, []) if n != partitions[q])
        if partitions[q] > 1 or gone or added or others:
            out.append(Change(q, partitions[q], added, gone, sum(jobs.get(f"{q}|{t}", 0) for t in gone), others))
    return out
