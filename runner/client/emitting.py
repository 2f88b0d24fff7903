"""Events (docs/events.md): one emit starts one job per function whose TRIGGERS name it.

The data is validated against every subscriber's newest schema first; one refusal
refuses the event, and nothing is written. Then ONE script call on the event's home
partition (the first subscriber's queue, by function name; the first configured queue
when nobody subscribes) writes, atomically: the jobs for that partition, an outbox
entry for each job of another queue or partition, the event's record, and its
Idempotency-Key. The emitter then places the outbox entries itself; an emitter killed
before it does leaves them to the relay (runner/outbox.py), which places each once by
its id. So an emit leaves every job of the event or none, whatever dies when.

A subscriber added later does not receive past events: an emit enqueues for the
functions loaded when it is made. The same step keeps the event for the jobs waiting for
it (ctx.wait_for_event), which the emitter then tells (client/waking.py).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner import outbox
from runner.catalog.listing import one_request
from runner.catalog.options import EVENT_NAME, MAX_EMIT_BYTES
from runner.catalog.templates import MAX_KEY_BYTES, control_character
from runner.client import waking
from runner.errors import (
    EventConflict,
    EventRejected,
    EventTooLarge,
    FieldError,
    NotReplicated,
    RunnerError,
    ValidationFailed,
)
from runner.observe import tracing
from runner.store import codec, damage, emitted, listeners, records
from runner.store.connection import UNAVAILABLE, reachable
from runner.store.scripts import job_entry

if TYPE_CHECKING:
    from runner.client import Client
    from runner.client.enqueuing import Prepared
    from runner.store.keys import QueueKeys

# The events each queue partition keeps for GET /events (older ones drop off), and the
# most one listing returns.
KEEP_EVENTS = 1_000
MAX_LIST = 500
# How long an emit's Idempotency-Key dedupes the emit (then the same key emits again),
# and how long a partition's list of recent events is kept after its last emit.
IDEM_KEY_S = 86_400
# An event's data past this many bytes (or nested too deep to sit inside its record) is
# kept in the record as a preview: the list of recent events stays bounded in bytes
# (1,000 records of a few KiB per partition), and GET /events moves kilobytes. Each job
# holds the data whole.
DATA_SHOWN_BYTES = 4096


class BadEventName(RunnerError):
    """An event name that no function could subscribe to."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name!r} is not an event name: 1 to 128 letters, digits and . _ : -, starting with a "
                         "letter or digit")


@dataclass(frozen=True, slots=True)
class Emitted:
    """An emit's answer: the event's id and name, its jobs (id, type, queue, status; a
    job of another queue is 'queued' once placed) and whether it was a duplicate (the
    first emit's record, nothing written)."""

    id: str
    name: str
    jobs: list[dict[str, Any]] = field(default_factory=list)
    duplicate: bool = False
    at_ms: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "at_ms": self.at_ms, "jobs": self.jobs,
                "duplicate": self.duplicate}


def check_name(name: str) -> None:
    if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
        raise BadEventName(str(name))


def emit(client: Client, name: str, data: Any, *, idempotency_key: str | None = None) -> Emitted:
    """Start one job per function subscribed to ``name`` with ``data`` as its payload.
    Raises BadEventName, EventRejected (every subscriber's errors; nothing written),
    EventTooLarge (the data times the subscribers past MAX_EMIT_BYTES; nothing written) or
    EventConflict (the key held by an emit of other data); RedisUnavailable as enqueue.
    Traced, an emit is one enqueue span (as a group's), and every job it starts carries
    its trace context."""
    if tracing.enabled():
        with tracing.enqueue_span(f"event {name}") as span:
            out = _emit(client, name, data, idempotency_key, tracing.current_traceparent())
            tracing.annotate(span, event=out.id)
            return out
    return _emit(client, name, data, idempotency_key, None)


def _emit(client: Client, name: str, data: Any, idempotency_key: str | None, tp: str | None) -> Emitted:
    check_name(name)
    if idempotency_key is not None:
        raw = idempotency_key.encode()
        if not raw or len(raw) > MAX_KEY_BYTES or control_character(idempotency_key) is not None:
            raise ValidationFailed(name, 0, [FieldError("$", (
                f"an idempotency key must be 1 to {MAX_KEY_BYTES} bytes, without control characters"))])
    # Held to what a payload may hold even with no subscriber (waiters read it too), by
    # the encoder every payload takes: NaN was stored as null.
    try:
        body = codec.dumpb_checked(data).decode()
    except codec.TooDeep as exc:
        raise ValidationFailed(name, 0, [FieldError(exc.path, (
            f"the nesting depth is over the limit of {codec.MAX_DEPTH} levels of arrays and objects; "
            "flatten the data"))]) from None
    except codec.EncodeError:
        path, why = codec.not_json(data) or ("$", "the data is not JSON")
        raise ValidationFailed(name, 0, [FieldError(path, why)]) from None
    rt = client.runtime
    subscribers = rt.registry.subscribers(name)
    # Every copy is written by one script call (the home partition's atomic step, outbox
    # entries included): bounded, so one emit never holds Redis for long, whatever its
    # data and however many functions subscribe. Checked before each copy is validated.
    size = len(body.encode())
    if size * len(subscribers) > MAX_EMIT_BYTES:
        raise EventTooLarge(name, size, len(subscribers), MAX_EMIT_BYTES)
    preps: list[Prepared] = []
    rejections: dict[str, tuple[int, list[FieldError]]] = {}
    with one_request():  # the subscribers share one pattern budget and one limit on listed errors
        for fn in subscribers:
            try:
                preps.append(client.prepare(_request(fn.name, data, tp)))
            except ValidationFailed as exc:
                rejections[fn.name] = (exc.version, list(exc.errors))
    for fn_name, err in rt.registry.broken_subscribers(name).items():
        rejections[fn_name] = (0, [FieldError("$", f"the function file failed to load ({err.shown()}); fix it "
                                                    "(runner check names the error), then emit again")])
    if rejections:
        raise EventRejected(name, rejections)
    queue = subscribers[0].queue if subscribers else next(iter(rt.config.queues))
    home = rt.keys[queue]
    if idempotency_key:
        held = _held_elsewhere(client, home, name, idempotency_key, _hash(body))
        if held is not None:
            return held
    here, away = _split(client, home, preps)
    entries = [codec.dumps(job_entry(p.fn.queue, p.job)) for p in away]
    sent = codec.dumps([{"id": p.job.id, "type": p.fn.name, "queue": p.fn.queue, "status": "queued",
                         **({"debounced": True} if p.fn.debounce is not None else {})} for p in away])
    short: NotReplicated | None = None
    with reachable():
        try:
            reply = rt.scripts.emit(
                home, [p.job for p in here], event_id=records.new_id(), name=name, data=shown_data(data, body),
                whole=body,
                idem_key=idempotency_key or "", data_hash=_hash(body), idem_ms=IDEM_KEY_S * 1000,
                keep=KEEP_EVENTS, away=sent, entries=entries)
        except NotReplicated as exc:  # it ran: only its copy on the replicas is unconfirmed
            reply, short = exc.replies[0], exc
    code, record = int(reply[0]), codec.loads(reply[1])
    if code < 0:
        raise EventConflict(name, idempotency_key or "", str(record.get("id")))
    jobs = list(record.get("jobs", []))
    if code == 1 and entries:
        # Placed now rather than a relay pass later (a failure here leaves them to the relay).
        absorbed: dict[str, tuple[str, str]] = {}
        with contextlib.suppress(*UNAVAILABLE):
            outbox.remove(rt, home, outbox.place(rt, entries, absorbed))
        if absorbed:
            jobs = _stand_ins(client, home, str(record["id"]), name, idempotency_key or "", jobs, absorbed)
    if code == 1 and reply[-1]:  # its waiters (ctx.wait_for_event), told now; the rest by the relay
        waking.after_emit(client, home, str(reply[-1]))
    if short is not None:  # named by the event's jobs, every one of which was written
        raise NotReplicated(short.acked, short.wanted, short.timeout_s,
                            [str(j.get("id")) for j in jobs], short.replies)
    return Emitted(str(record["id"]), name, jobs, code == 0, int(record.get("at_ms", 0)))


def _stand_ins(client: Client, home: QueueKeys, event_id: str, name: str, key: str, jobs: list[dict[str, Any]],
               absorbed: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """The event's jobs with each job sent away that another stands for (the DEBOUNCE
    burst's job it joined, or the job that holds its idempotency key there) named by
    that job, the one that runs, and its status; its record says the same (a failure
    here leaves the record naming the job sent, and the answer right)."""
    out, renamed = [], []
    for j in jobs:
        if j.get("id") not in absorbed:
            out.append(j)
            continue
        stand_in, status = absorbed[j["id"]]
        now = {**j, "id": stand_in, "status": status}
        renamed.append((codec.dumps(j), codec.dumps(now)))
        out.append(now)
    with contextlib.suppress(*UNAVAILABLE):
        client.runtime.scripts.emit_named(home, event_id, name, key, KEEP_EVENTS, renamed)
    return out


def shown_data(data: Any, body: str) -> str:
    """The event's data as its record holds it: whole, or past DATA_SHOWN_BYTES or too
    deep to sit one level down in the record, a preview (the first bytes of its JSON, whole
    characters), null data and its full size under "truncated", as a job list shows a
    big payload."""
    raw = body.encode()
    if len(raw) <= DATA_SHOWN_BYTES and codec.too_deep(data, codec.READ_DEPTH - 1) is None:
        return '"data":' + body
    preview = raw[:DATA_SHOWN_BYTES].decode("utf-8", "ignore")
    return f'"data":null,"data_preview":{codec.dumps(preview)},"truncated":{{"data":{len(raw)}}}'


def _held_elsewhere(client: Client, home: QueueKeys, name: str, key: str, data_hash: str) -> Emitted | None:
    """An emit of this Idempotency-Key recorded on another queue's home partition: the
    home follows the first subscriber, and a deploy that adds or moves one moves it, so a
    producer's retry across that deploy is looked for on every home. (The script still
    decides on the home, atomically, for concurrent emits of one release.)"""
    rt = client.runtime
    others = [rt.keys[q] for q in rt.config.queues if rt.keys[q].tag != home.tag]
    if not others:
        return None
    with reachable():
        held = emitted.held(rt.redis, others, name, key)
    if held is None:
        return None
    got_hash, raw = held
    record = codec.loads(raw)
    if got_hash != data_hash:
        raise EventConflict(name, key, str(record.get("id")))
    return Emitted(str(record["id"]), name, list(record.get("jobs", [])), True, int(record.get("at_ms", 0)))


def events(client: Client, *, limit: int = 50, name: str | None = None,
           damaged: list[damage.Damaged] | None = None) -> list[dict[str, Any]]:
    """The newest ``limit`` events (at most MAX_LIST), of ``name`` only when given, newest
    first, each with the jobs it started. A partition's list of another Redis type reads
    as none, named in ``damaged`` (store/damage.py)."""
    if name is not None:
        check_name(name)
    rt = client.runtime
    homes = [k for parts in rt.parts.values() for k in parts]
    with reachable():
        out = emitted.recent(rt.redis, homes, max(1, min(limit, MAX_LIST)), name, damaged)
        counts = listeners.woke(rt.redis, rt.config.redis.prefix,
                                [(str(e.get("name")), str(e.get("id"))) for e in out])
    for e, n in zip(out, counts, strict=True):
        e["waiters_resumed"] = n  # ctx.wait_for_event waits it resumed (kept a week)
    return out


def _request(type_: str, data: Any, traceparent: str | None = None) -> Any:
    from runner.client.enqueuing import Request

    return Request(type=type_, payload=data, traceparent=traceparent)


def _split(client: Client, home: QueueKeys, preps: list[Prepared]) -> tuple[list[Prepared], list[Prepared]]:
    """The jobs written on ``home`` itself, and those sent through its outbox: another
    queue's, and its own queue's whose keys route them to another partition."""
    rt = client.runtime
    here: list[Prepared] = []
    away: list[Prepared] = []
    mine = [p for p in preps if p.fn.queue == home.queue]
    if len(rt.parts[home.queue]) > 1 and mine:
        rt.discover_due(record=True)
        where = outbox.destinations(rt, home.queue, [
            outbox.Keyed(p.fn.name, p.job.idem_key, p.job.limits, p.job.meta) for p in mine])
        parts = rt.parts[home.queue]
        for p, idx in where.items():
            (here if parts[p].tag == home.tag else away).extend(mine[i] for i in idx)
    else:
        here = mine
    away += [p for p in preps if p.fn.queue != home.queue]
    return here, away


def _hash(body: str) -> str:
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()

