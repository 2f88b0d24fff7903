"""RESOURCE_KEY, CONCURRENCY and RATE_LIMIT -> the ``limits`` a job carries into Redis.

A job's limits are "<n> <key>" lines (claim.lua takes a slot of each, or parks the job
on the first full one): ``RESOURCE_KEY`` is limit 1 on ``r:<rendered>``, ``CONCURRENCY =
N`` is limit N on ``c:<type>`` (every job of the function), and ``CONCURRENCY = {"key":
template, "limit": N}`` is limit N on ``ck:<rendered>``. ``RATE_LIMIT = {"limit": N,
"period": S}`` is the line "N/<period ms> q:<type>" (a token bucket: see includes/limits.lua), with
an optional "key" template making it ``qk:<rendered>``. Every producer (client, ticker,
manual trigger) builds them here, so a limit means the same whoever enqueued.

A rendered key names one budget, whichever function renders it (as a RESOURCE_KEY names
one lock): ``"api:{account}"`` in two functions is one quota. So two functions may not
size one key template differently, nor render one key (a RESOURCE_KEY too) from two
queues, whose limits live apart (``clashes``, refused at load).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.catalog import templates

MAX_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True)
class Concurrency:
    limit: int
    key: templates.Template | None = None  # None: one limit for the whole function

    def describe(self) -> dict[str, Any]:
        return {"limit": self.limit, "key": self.key.source if self.key else None}


@dataclass(frozen=True, slots=True)
class Rate:
    limit: int
    period_s: float
    key: templates.Template | None = None  # None: one bucket for the whole function

    def describe(self) -> dict[str, Any]:
        return {"limit": self.limit, "period": self.period_s, "key": self.key.source if self.key else None}


@dataclass(frozen=True, slots=True)
class Flow:
    """What limits a function's jobs: its resource template and its concurrency."""

    resource_key: templates.Template | None = None
    concurrency: Concurrency | None = None
    rate: Rate | None = None

    def render(self, type_: str, payload: Mapping[str, Any]) -> tuple[str, str]:
        """(resource key, limits) of one job; TemplateError when the payload cannot
        render a template."""
        rkey = self.resource_key.render(payload) if self.resource_key is not None else ""
        lines = [f"1 r:{rkey}"] if rkey else []
        c = self.concurrency
        if c is not None:
            key = f"c:{type_}" if c.key is None else f"ck:{c.key.render(payload)}"
            lines.append(f"{c.limit} {key}")
        r = self.rate
        if r is not None:
            key = f"q:{type_}" if r.key is None else f"qk:{r.key.render(payload)}"
            lines.append(f"{r.limit}/{max(1, round(r.period_s * 1000))} {key}")
        return rkey, "\n".join(lines)


def _limit(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_LIMIT:
        raise ValueError(f"the limit must be an integer from 1 to {MAX_LIMIT}, got {v!r}")
    return v


def parse_concurrency(raw: Any) -> Concurrency:
    """CONCURRENCY = N or {"key": template, "limit": N}; ValueError says what is wrong."""
    if isinstance(raw, Mapping):
        extra = set(raw) - {"key", "limit"}
        if extra or "limit" not in raw or "key" not in raw:
            raise ValueError(f'a dict needs exactly the keys "key" and "limit", got {sorted(map(str, raw))}')
        try:
            tpl = templates.parse(raw["key"])
        except templates.TemplateError as exc:
            raise ValueError(f"key: {exc}") from None
        return Concurrency(limit=_limit(raw["limit"]), key=tpl)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return Concurrency(limit=_limit(raw))
    raise ValueError(f'must be an integer N or {{"key": template, "limit": N}}, got {raw!r}')


def parse_rate(raw: Any) -> Rate:
    """RATE_LIMIT = {"limit": N, "period": S[, "key": template]}; ValueError says what is wrong."""
    if not isinstance(raw, Mapping) or not {"limit", "period"} <= set(raw) or set(raw) - {"limit", "period", "key"}:
        raise ValueError(f'must be a dict with "limit" and "period" (seconds) and an optional "key", got {raw!r}')
    period = raw["period"]
    if not isinstance(period, int | float) or isinstance(period, bool) or not 0.001 <= period <= 86_400 * 366:
        raise ValueError(f"period must be a number of seconds from 0.001 to a year, got {period!r}")
    tpl = None
    if raw.get("key") is not None:
        try:
            tpl = templates.parse(raw["key"])
        except templates.TemplateError as exc:
            raise ValueError(f"key: {exc}") from None
    return Rate(limit=_limit(raw["limit"]), period_s=float(period), key=tpl)


def shape(t: templates.Template) -> str:
    """What a key template renders, up to its fields' values: its literal parts, a mark
    where each field goes. ``api:{acct}`` and ``api:{account}`` have one shape, so they
    render the same keys."""
    return "".join(literal + ("\x00" if field is not None else "") for literal, field in t.parts)


def clashes(flows: Mapping[str, Flow], queues: Mapping[str, str] | None = None) -> dict[str, str]:
    """Functions (by name) whose keyed CONCURRENCY or RATE_LIMIT renders the keys of a
    template (compared by shape, not by text) that another function sizes differently, or
    whose RESOURCE_KEY or keyed limit a function of another queue renders too (``queues``:
    each function's queue; a queue's limits live in its own partitions, so the two would
    take from two budgets, and two jobs holding one RESOURCE_KEY would run at once), each
    with the error that says so."""
    seen: dict[tuple[str, str], list[tuple[str, Any, str]]] = {}
    for name, flow in sorted(flows.items()):
        if flow.resource_key is not None:  # (always limit 1: only its queues can clash)
            t = flow.resource_key
            seen.setdefault(("RESOURCE_KEY", shape(t)), []).append((name, {"limit": 1}, t.source))
        if flow.concurrency is not None and flow.concurrency.key is not None:
            t = flow.concurrency.key
            seen.setdefault(("CONCURRENCY", shape(t)), []).append((name, {"limit": flow.concurrency.limit}, t.source))
        if flow.rate is not None and flow.rate.key is not None:
            t = flow.rate.key
            seen.setdefault(("RATE_LIMIT", shape(t)), []).append(
                (name, {"limit": flow.rate.limit, "period": flow.rate.period_s}, t.source))
    out: dict[str, str] = {}
    where = queues or {}
    for (option, _), users in seen.items():
        if len({repr(size) for _, size, _ in users}) > 1:
            for name, size, source in users:
                others = "; ".join(f"function {n} declares {s} for {src!r}" for n, s, src in users if n != name)
                out.setdefault(name, f"{option} key {source!r} names one budget for every function that "
                                     f"renders it, and {others} (this one {size}): declare the same size in "
                                     f"each, or give each its own key")
        elif len({where.get(n, "") for n, _, _ in users}) > 1:
            for name, _, source in users:
                others = "; ".join(f"function {n} of queue {where.get(n)!r} renders it as {src!r}"
                                   for n, _, src in users if n != name and where.get(n) != where.get(name))
                if option == "RESOURCE_KEY":
                    why = (f"RESOURCE_KEY {source!r} names one lock for every function that renders it, but a "
                           f"queue keeps its locks apart from another queue's, so jobs of both would run at once "
                           f"for one key")
                else:
                    why = (f"{option} key {source!r} names one budget for every function that renders it, but a "
                           f"queue keeps its limits apart from another queue's")
                out.setdefault(name, f"{why}, and {others} (this one is on queue {where.get(name)!r}): put them "
                                     f"on one queue, or give each its own key")
    return out
