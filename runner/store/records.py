"""Job records in and out of Redis, and the one view a reader sees of a job.

A job is two keys under its queue's tag (the layout is drawn in lua/includes/records.lua):

    job:<id>     STRING  "1" then, separated by \x1f: type, version, max_attempts,
                         created_ms, idem_key, idem_hash, resource_key, limits, meta, payload
    job:<id>:s   HASH    its state, once it has one: status (absent: queued), attempt,
                         ready_ms, enqueued_ms, started_ms, finished_ms, error (JSON), reason
                         (dead only), history (comma-joined JSON entries, one per attempt),
                         checkpoint (JSON), deferrals, woken, lost_token, refunds,
                         progress (JSON, the last ctx.progress sent with a renewal),
                         cancel_requested (a running job asked to stop), children (a dead
                         job's ON_FAILURE job, written by its burial), requeued (times
                         requeued from dead), list_next (a cancel that took it out of
                         ready or a deferred list: the id it left in its place, for a
                         job list's cursor; see listing.py)

A job that waits untouched is the string alone. While a job is claimed its entry in the
queue's claims hash holds the token, the attempt and the start. A done job keeps
neither key: its outcome, "<type> <version> <attempt> <started_ms> +<run ms>
[<duplicate of>]\n<history>\n<result>[\n<meta>[\n<payload>]]" (no lines after the first when all are
empty; a null result is left out), sits in a done generation (or on its own for
KEEP_RESULT). ``view`` lays them into the fields below, so readers need not know:

    type, version, payload, status, attempt, max_attempts, created_ms, enqueued_ms,
    ready_ms, started_ms, finished_ms, idem_key, resource_key, deferrals, error, reason,
    history, result, checkpoint, duplicate_of, children (a dead job's follow-ups, comma
    joined), meta (a JSON object of extra fields a producer attached, e.g. a schedule's id
    and tick, a group member's group and number, a done job's children; laid at the top
    level of the job view, never over a field above)

Statuses: queued, scheduled, processing, retrying, deferred (parked on a full limit),
sleeping and waiting (a durable function in ctx.sleep or ctx.wait_for_signal: suspend.lua),
done, dead, cancelled (ended by a cancel: cancel.lua; kept for the done retention).

A durable function's step log lives in its state too (steps, step_bytes, step:<i>, see
lua/step.lua), run_attempt and run_started_ms (the attempt a suspended job ran and when
that attempt's first run began: its view's attempt and started_at, see suspend.lua),
with waiting_for (the signal a waiting job waits for; 'event.<position>'
for ctx.wait_for_event, whose entry names the event and match), sig:<name> (a
signal kept until a wait reads it) and sigkey:<name> (the key of the last signal of that
name the job took, see signal.lua); ``Job.as_dict`` shows ``steps`` and ``waiting_for``.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from runner.store import codec, scriptkeys

if TYPE_CHECKING:
    from runner.store.keys import QueueKeys

# The most bytes of stored records one script call reads whole (a bulk requeue, delete or
# cancel, a reclaim): Lua reads a record at about 7 ms of Redis a MiB, every other client
# waiting; 500 records of 1 MiB in one call blocked Redis 5-9 s, past its busy limit.
SCRIPT_BYTES = 8 * 1024 * 1024

_T = TypeVar("_T")


def text_bytes(text: str) -> int:
    """The UTF-8 length of ``text``, without encoding an ASCII one (isascii is a flag)."""
    return len(text) if text.isascii() else len(text.encode())


def by_bytes(items: Sequence[_T], size: Callable[[_T], int], limit: int = SCRIPT_BYTES) -> list[Sequence[_T]]:
    """``items`` in order, in runs of at most ``limit`` bytes by ``size`` (the first of
    a run whatever its size): the writes of one script call each, so that a call of many
    jobs holds Redis about as long as a bulk action's read at most (jobs of 1 MiB, 100 a
    call, had held it 0.9 to 9.4 s)."""
    sizes = [size(i) for i in items]
    if sum(sizes) <= limit:
        return [items]
    out: list[Sequence[_T]] = []
    start = total = 0
    for n, b in enumerate(sizes):
        if n > start and total + b > limit:
            out.append(items[start:n])
            start, total = n, 0
        total += b
    out.append(items[start:])
    return out
STATUSES = ("queued", "scheduled", "processing", "retrying", "deferred", "sleeping", "waiting", "done", "dead",
            "cancelled")
SEP = "\x1f"
WAITED = "waited"  # the meta field that asks for the job's end to be published
CHILDREN = "children"  # a done job's follow-ups, in its outcome's meta (a dead one's: its state)
# A done job's outcome names its first CHILDREN_SHOWN ctx.enqueue follow-ups (and its
# ON_SUCCESS job) and, past them, their count: the rest are "<id>.<i>" for every i below
# it. An outcome of 100,000 ids was 3 MB, read whole by every view of the job.
CHILDREN_SHOWN = 100
CHILDREN_COUNT = "children_count"
GROUP = "group"  # a group's member or then-job: the group id, in its meta
# A DEBOUNCE function's job: {"key", "period_ms", "max_wait_ms"} in its meta; the state's
# "absorbed" counts the enqueues of its burst after the first (see lua/includes/jobs.lua).
DEBOUNCE = "debounce"
ENDED = ("done", "dead", "cancelled")
# A view's field that names the fields a listing cut (see view), and the job view's name
# of each field that can be cut: a preview of its text takes the place of its value.
CUT = "\0cut"
SHOWN_AS = {"payload": "payload", "result": "result", "checkpoint": "checkpoint", "error": "last_error",
            "progress": "progress", "history": "history"}
RECORD_FIELDS = ("type", "version", "max_attempts", "created_ms", "idem_key", "idem_hash", "resource_key",
                 "limits", "meta")
# A durable function's step log holds at most this many entries (PRODUCT.md; step.lua
# refuses one more): a count past it, or any count or time past its bound below, is
# damage (a record another producer wrote), shown as such in the view's "damaged", never
# expanded or encoded as it is: steps=1000000 built a million-entry step list for every
# view of the job (48 MB), and a 30-digit attempt failed the JSON encoding of each.
MAX_STEPS = 1000
# A job's state hash holds at most about 4,100 fields: some 30 of its own, a step and its
# summary per entry of the log (2 x MAX_STEPS), and per signal name a kept body and the
# key of its last delivery (a signal is kept until a wait reads it, a step). More fields
# than this is damage (another writer's): a reader asks HLEN first (O(1)) and then reads
# only the fields of STATE_SHOWN, by name, never its field names or the hash whole (one
# of 300,000 fields held Redis 2.5 s in each list that showed it). lookup.lua's MAX_FIELDS.
MAX_STATE_FIELDS = 10_000
# A list row's bound (lookup.lua's LIST_FIELDS), with at most 256 fields apart from the
# steps sized: a page of 150 rows of 9,990 fields each held Redis 0.35-0.7 s.
LIST_STATE_FIELDS = 2_200
# The state fields a view shows of a state hash past MAX_STATE_FIELDS (lookup.lua's SHOWN).
STATE_SHOWN = ("status", "attempt", "reason", "error", "history", "progress", "checkpoint", "children",
               "priority", "requeued", "deferrals", "absorbed", "enqueued_ms", "ready_ms", "started_ms",
               "finished_ms", "lease_ms", "run_attempt", "run_started_ms", "token", "cancel_requested")
# A view's field that says its state hash was past MAX_STATE_FIELDS (its count of fields),
# or its state key was of another type (count 0): the job view names "state" in its "damaged".
WIDE = "\0wide"
MAX_COUNT = 2**53 - 1  # the largest integer every JSON reader reads exactly
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31, the last time a date shows
# What a view shows for a step log whose count is damaged: one entry, marked unreadable
# as a damaged entry is, so every reader (the console, `runner job`) shows it as it is.
DAMAGED_STEP = {"name": None, "kind": None, "status": "unreadable"}
# The fields a job view gives only some jobs, each of a shape of its own: a meta key of
# one of these names is never laid on the view (meta {"steps": "abc"} broke the console).
VIEW_OWN = frozenset({"steps", "sleeping_until", "waiting_for", "worker", "claimed_ahead", "lease_expires_at",
                      "children_count", "truncated", "damaged", "steps_more"})


def encode(fields: Mapping[str, Any]) -> str:
    """A record string (what enqueue.lua writes), for tests and tools that plant jobs; a
    record without created_ms is created now."""
    fields = {"created_ms": now_ms(), **fields}
    return SEP.join(["1", *(str(fields.get(f, "")) for f in RECORD_FIELDS), str(fields.get("payload", ""))])


def parse(record: str | None) -> dict[str, str] | None:
    """The fields of a record string; None for anything else."""
    if not record or not record.startswith("1" + SEP):
        return None
    parts = record[2:].split(SEP, len(RECORD_FIELDS))
    if len(parts) != len(RECORD_FIELDS) + 1:
        return None
    out = {k: v for k, v in zip(RECORD_FIELDS, parts, strict=False) if v != ""}
    out["payload"] = parts[-1]
    return out


def _done_entry(attempt: str, started: str, finished: str) -> str:
    return f'{{"attempt":{attempt},"outcome":"done","started_ms":{started},"at_ms":{finished}}}'


def view(job_id: str, record: str | None, state: Mapping[str, str] | Sequence[str], claim: str | None,
         outcome: str | None, sizes: Sequence[Any] = ()) -> dict[str, str]:
    """The job as a reader sees it: record, state, claim or done outcome in one set of
    fields (empty when Redis holds nothing of it). ``sizes`` (lookup.lua's fifth reply,
    given a cut) names the fields that came back cut, with their full length in bytes:
    kept in the CUT field as "name:length,...", for Job.as_dict to show as previews."""
    fields = _view(job_id, record, state, claim, outcome)
    if sizes and fields:
        fields[CUT] = ",".join(f"{sizes[i]}:{sizes[i + 1]}" for i in range(0, len(sizes) - 1, 2))
    return fields


# State fields of the scripts' own, never shown.
_INNER = frozenset({"woken", "lost_token", "refunds", "rated", "list_next"})


def asleep_expanded(state: Mapping[str, str]) -> dict[str, str]:
    """A state as its job's wake writes it back (lua/includes/asleep.lua): a sleeping job
    keeps its log's count and bytes and its run's first start in one field, 'sleep' =
    "<steps> <step_bytes> <run_started_ms>"; a damaged one is dropped."""
    out = {k: v for k, v in state.items() if k != "sleep"}
    parts = str(state.get("sleep") or "").split(" ")
    if len(parts) == 3 and all(p.lstrip("-").isdigit() for p in parts):
        for name, value in zip(("steps", "step_bytes", "run_started_ms"), parts, strict=True):
            out.setdefault(name, value)
    return out


def _view(job_id: str, record: str | None, state: Mapping[str, str] | Sequence[str], claim: str | None,
          outcome: str | None) -> dict[str, str]:
    if not isinstance(state, Mapping):
        state = dict(zip(state[::2], state[1::2], strict=True))
    if "sleep" in state:
        state = asleep_expanded(state)
    if outcome:
        head, _, rest = outcome.partition("\n")
        history, _, rest = rest.partition("\n")
        result, _, rest = rest.partition("\n")
        meta, _, payload = rest.partition("\n")
        parts = head.split(" ")
        fields: dict[str, str] = {"status": "done"}
        if len(parts) >= 5:
            finished = parts[4]
            if finished.startswith("+"):  # written as milliseconds after the start
                with contextlib.suppress(ValueError):
                    finished = str(int(parts[3]) + int(finished[1:]))
            fields.update(type=parts[0], version=parts[1], attempt=parts[2], started_ms=parts[3],
                          finished_ms=finished)
            for part in parts[5:]:
                if part.startswith("="):  # ms from its creation to the finish, both the server's
                    with contextlib.suppress(ValueError):
                        fields["created_ms"] = str(int(finished) - int(part[1:]))
                else:
                    fields["duplicate_of"] = part
            if "duplicate_of" not in fields:
                entry = _done_entry(parts[2], parts[3], finished)
                history = f"{history},{entry}" if history else entry
        if history:
            fields["history"] = history
        if result:
            fields["result"] = result
        if meta:
            fields["meta"] = meta
        if payload:  # kept only under [retention] done_payload = true
            fields["payload"] = payload
        if "created_ms" not in fields:  # an outcome written before it kept its creation
            with contextlib.suppress(ValueError):
                fields["created_ms"] = str(int(job_id[:12], 16))  # the id begins with its producer's clock
        return fields
    rec = parse(record)
    if rec is None:
        if record is None and not state:
            return {}
        rec = {}
    fields = {**rec, **{k: v for k, v in state.items() if k not in _INNER}}
    fields.setdefault("status", "queued")
    held = parse_claim(claim) if claim else None
    if held is not None and held.ahead and state.get("run_attempt") == held.attempt and state.get("run_started_ms"):
        # A durable function resumed within its attempt, its next run not started yet (a
        # child's start mark, or a free executor, to come): it has run in this attempt.
        fields.update(status="processing", token=held.token, attempt=held.attempt,
                      started_ms=state["run_started_ms"], claimed_ahead="1")
    elif held is not None and held.ahead:
        # Claimed ahead of a free executor: held by a worker, not started, and its
        # attempt not spent until it starts (the record keeps the attempts spent).
        fields.update(status="processing", token=held.token, attempt=str(int(held.attempt) - 1), claimed_ahead="1")
        fields.pop("started_ms", None)
    elif held is not None:
        # A durable function resumed within this attempt began at its first run (suspend.lua).
        first = state.get("run_started_ms") if state.get("run_attempt") == held.attempt else None
        fields.update(status="processing", token=held.token, attempt=held.attempt,
                      started_ms=first or held.started_ms)
    elif fields["status"] in ("sleeping", "waiting") and "run_attempt" in state:
        # Suspended: the attempt it ran and when that run began, kept apart from the state's
        # attempt (the attempts spent before it, which the next claim counts from).
        fields.update(attempt=state["run_attempt"], started_ms=state.get("run_started_ms", ""))
    elif fields["status"] == "sleeping" and "run_started_ms" in state:
        # A sleep keeps no run_attempt (suspend.lua): no attempt is spent while it sleeps.
        fields.update(attempt=str(_int(state.get("attempt")) + 1), started_ms=state["run_started_ms"])
    return fields


@dataclass(frozen=True, slots=True)
class Claim:
    """A job's entry in its queue's claims hash: "<token> <attempt> <started_ms> <flags>"."""

    token: str
    attempt: str
    started_ms: str
    ahead: bool  # claimed ahead of a free executor ("p" in the flags): held, not started


def parse_claim(claim: str) -> Claim | None:
    """A claim entry read, None for one of another shape."""
    parts = claim.split(" ")
    if len(parts) != 4:
        return None
    return Claim(parts[0], parts[1], parts[2], "p" in parts[3] and parts[1].isdigit())


class _Entropy(threading.local):
    """Random bytes read from the OS 4 KiB at a time, per thread, kept as hex text: one
    getrandom() call per 819 ids instead of one per id (a syscall is a few microseconds
    on a VM), and one slice per id instead of a slice and a hex conversion."""

    hex = ""
    pos = 0


_entropy = _Entropy()


def _fresh_entropy() -> None:
    # A forked child must not hand out the random bytes its parent will use too.
    global _entropy
    _entropy = _Entropy()


os.register_at_fork(after_in_child=_fresh_entropy)


def new_id() -> str:
    """Time-ordered, unique job id: 12 hex digits of ms since epoch + 10 random hex."""
    e = _entropy
    pos = e.pos
    if pos + 10 > len(e.hex):
        e.hex, pos = os.urandom(4096).hex(), 0
    e.pos = pos + 10
    return f"{int(time.time() * 1000):012x}{e.hex[pos:pos + 10]}"


def parent_of(job_id: str) -> str | None:
    """The job that wrote this one, read off its id: a follow-up is "<parent>.<i>", an
    ON_SUCCESS / ON_FAILURE job "<parent>.s" / "<parent>.f" (scripts.followup_id), and the
    ON_FAILURE job of a requeued parent's later death "<parent>.f2", "<parent>.f3", ..."""
    parent, dot, tail = job_id.rpartition(".")
    if dot and parent and (tail.isdigit() or tail in ("s", "f") or (tail[:1] == "f" and tail[1:].isdigit())):
        return parent
    return None


def children_meta(ids: Sequence[str]) -> dict[str, Any]:
    """What a done outcome keeps of its children (see CHILDREN_SHOWN): the first ids of
    its ctx.enqueue follow-ups and its destination's id, and past them the count."""
    numbered = [i for i in ids if i.rpartition(".")[2].isdigit()]
    if len(numbered) <= CHILDREN_SHOWN:
        return {CHILDREN: list(ids)}
    rest = [i for i in ids if not i.rpartition(".")[2].isdigit()]
    return {CHILDREN: numbered[:CHILDREN_SHOWN] + rest, CHILDREN_COUNT: len(ids)}


def names_child(view: Mapping[str, Any], job_id: str) -> bool:
    """Whether a job's view (as_dict) names ``job_id`` among its children, those past
    the ones it shows included (a follow-up "<id>.<i>" with i below their count)."""
    shown = view.get("children") or []
    if job_id in shown:
        return True
    count = view.get("children_count")
    tail = job_id.rpartition(".")[2]
    if not isinstance(count, int) or not tail.isdigit():
        return False
    numbered = count - sum(1 for i in shown if not str(i).rpartition(".")[2].isdigit())
    return int(tail) < numbered


def now_ms() -> int:
    return int(time.time() * 1000)


def _int(v: Any, default: int = 0) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        return default
    return n if -MAX_COUNT <= n <= MAX_COUNT else default


def count_of(raw: Any, most: int = MAX_COUNT) -> int | None:
    """A count (or a time) read back from Redis: None unless a whole number from 0 to
    ``most``."""
    try:
        n = int(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else -1
    except ValueError:
        return None
    return n if 0 <= n <= most else None


def _count(f: Mapping[str, Any], name: str, damaged: list[str], most: int = MAX_COUNT) -> int | None:
    """A count (or a time) of the record: None when absent, and when out of its range
    (then named in ``damaged``)."""
    raw = f.get(name)
    if raw is None or raw == "":
        return None
    n = count_of(raw, most)
    if n is None:
        damaged.append(name)
    return n


def _json(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return codec.loads(v)
    except codec.DecodeError:
        return {"unparsable": str(v)[:200]}


def _ts(v: Any) -> float | None:
    ms = _int(v, 0)
    return ms / 1000 if 0 < ms <= MAX_TIME_MS else None


def seconds_of(ms: Any) -> float | None:
    """A time in ms read back from Redis as the epoch seconds a view shows: None unless a
    whole number from 1 to MAX_TIME_MS (absent, damaged, or another writer's)."""
    n = count_of(ms, MAX_TIME_MS)
    return n / 1000 if n else None


def _time_key(key: str) -> int:
    """The unit a detail field's name gives its value, as every view reads it: 1000 for
    ms ("*_ms", "ts"), 1 for epoch seconds ("*_at", "*until", "at"), 0 for no time."""
    if key.endswith("_ms") or key == "ts":
        return 1000
    return 1 if key.endswith(("_at", "until")) or key == "at" else 0


def time_in_range(key: str, value: Any) -> bool:
    """Whether a detail field holds no time by its name, or one a date can show: a number
    from 0 to MAX_TIME_MS ms (a time of 1e300 made the console throw and `runner job`
    print a traceback)."""
    unit = _time_key(key)
    if not unit or not isinstance(value, int | float) or isinstance(value, bool):
        return True
    return 0 <= value <= MAX_TIME_MS * unit / 1000


def bounded_detail(obj: dict[str, Any], where: str, damaged: list[str]) -> dict[str, Any]:
    """A detail object read back (a history entry, a log line) with each time out of
    range shown as absent (None) and named in ``damaged`` as ``<where>.<field>``."""
    out = obj
    for key, value in obj.items():
        if not time_in_range(key, value):
            out = dict(out) if out is obj else out
            out[key] = None
            damaged.append(f"{where}.{key}")
    return out


def worker_of(token: str) -> str:
    """The worker id in a claim token: the worker passes "<worker id>.<claim number>" as
    the token base and claim.lua appends ":<index>" (a host name may hold dots, the
    number none)."""
    return token.rsplit(":", 1)[0].rsplit(".", 1)[0]


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    queue: str
    fields: Mapping[str, str]

    def as_dict(self) -> dict[str, Any]:
        f = self.fields
        history_raw = f.get("history") or ""
        try:
            history = codec.loads("[" + history_raw + "]") if history_raw else []
        except codec.DecodeError:
            history = [{"unparsable": history_raw[:200]}]
        damaged: list[str] = []
        history = [bounded_detail(h, f"history[{i}]", damaged) if isinstance(h, dict) else h
                   for i, h in enumerate(history)]
        for name in ("created_ms", "enqueued_ms", "ready_ms", "started_ms", "finished_ms", "lease_ms"):
            _count(f, name, damaged, MAX_TIME_MS)
        requeued = _count(f, "requeued", damaged)
        priority = _count(f, "priority", damaged, 9)
        view = {
            "id": self.id,
            "type": f.get("type"),
            "version": _count(f, "version", damaged) or None,
            "queue": self.queue,
            "status": f.get("status"),
            "attempt": _count(f, "attempt", damaged) or 0,
            # A finished job keeps a short outcome, without it: null, not a misleading 0.
            "max_attempts": _count(f, "max_attempts", damaged) or None,
            "payload": _json(f.get("payload")),
            "created_at": _ts(f.get("created_ms")),
            # The enqueue script leaves out times equal to created_ms.
            "enqueued_at": _ts(f.get("enqueued_ms") or f.get("created_ms")),
            "ready_at": _ts(f.get("ready_ms") or f.get("created_ms")),
            "started_at": _ts(f.get("started_ms")),
            "finished_at": _ts(f.get("finished_ms")),
            "idempotency_key": f.get("idem_key") or None,
            "resource_key": f.get("resource_key") or None,
            "deferrals": _count(f, "deferrals", damaged) or 0,
            # Times requeued from dead; a done job's short outcome does not keep it.
            "requeued": requeued if requeued is not None else None if f.get("status") == "done" else 0,
            # 1-9 as long as the job lives; a done job's short outcome does not keep it.
            "priority": priority if priority is not None else None if f.get("status") == "done" else 0,
            "last_error": _json(f.get("error")),
            "reason": f.get("reason") or None,
            "history": history,
            "result": _json(f.get("result")),
            "checkpoint": _json(f.get("checkpoint")),
            "progress": _json(f.get("progress")),
            "duplicate_of": f.get("duplicate_of") or None,
            "parent": parent_of(self.id),
            "children": f["children"].split(",") if f.get("children") else [],
            "group": None,
        }
        if "steps" in f:
            steps = _count(f, "steps", damaged, MAX_STEPS)
            left = self._steps_left_out() if steps is not None else 0
            view["steps"] = step_views(f, steps, left) if steps is not None else [dict(DAMAGED_STEP)]
            if left:
                view["steps_more"] = left  # a list row's: its log's earlier steps, not listed
            if f.get("status") == "sleeping":
                view["sleeping_until"] = _ts(due_ms(f))
            elif f.get("status") == "waiting":
                # The wait's own step says until when (None: no timeout); the job's due time
                # may be an earlier check of its own (a ctx.invoke's parent looks at its child
                # every 30 s), not the timeout the handler asked for.
                last = view["steps"][-1] if view["steps"] else {}
                waiting = waiting_view(f)
                if "until" in last:
                    waiting["timeout_at"] = last["until"]
                if last.get("child"):
                    waiting["job"] = last["child"]
                view["waiting_for"] = waiting
        if f.get("token"):
            # Only while claimed: which worker holds it and, in a job list, until when.
            view["worker"] = worker_of(f["token"])
            if f.get("claimed_ahead"):
                view["claimed_ahead"] = True  # waiting in the worker for an executor
            if f.get("lease_ms"):
                view["lease_expires_at"] = _ts(f["lease_ms"])
        meta = _json(f.get("meta"))
        if isinstance(meta, dict):
            if isinstance(meta.get(CHILDREN), list) and not view["children"]:
                view["children"] = [str(c) for c in meta[CHILDREN]]
            if isinstance(meta.get(CHILDREN_COUNT), int):
                view["children_count"] = meta[CHILDREN_COUNT]
            if isinstance(meta.get(GROUP), str):
                view["group"] = meta[GROUP]
            if isinstance(meta.get(DEBOUNCE), dict):
                # Enqueues merged into this one job: its state's count, once done its outcome's.
                view["absorbed"] = _count(f if "absorbed" in f else meta, "absorbed", damaged) or 0
            for key, value in meta.items():
                if key in (WAITED, CHILDREN, CHILDREN_COUNT, GROUP) or key in view:  # (the waiters' mark is
                    continue  # not the producer's; a field of the view's own is never laid over)
                if key in VIEW_OWN or key.endswith("_preview") or not time_in_range(key, value):
                    # A name the view gives a shape of its own (steps: a list), or a time past
                    # the last date: another writer's, shown as absent.
                    damaged.append(f"meta.{key}")
                    continue
                view[key] = value
        if f.get(CUT):
            self._previews(view)
        if f.get(WIDE):
            damaged.append("state")  # past MAX_STATE_FIELDS: only STATE_SHOWN was read
        if damaged:
            view["damaged"] = damaged  # the fields read back out of their range, shown as absent
        return view

    def _steps_left_out(self) -> int:
        """A list row's count of earlier steps lookup.lua left out ("steps" in CUT), else 0."""
        for part in (self.fields.get(CUT) or "").split(","):
            name, _, n = part.rpartition(":")
            if name == "steps":
                return max(0, _int(n) or 0)
        return 0

    def _previews(self, view: dict[str, Any]) -> None:
        """A listing's entry whose fields came back cut (lookup.lua): each such value is
        null (an error keeps its type and the start of its message, see _error_start),
        its first bytes are ``<name>_preview`` (JSON text, cut), and ``truncated``
        maps it to its full size in bytes; ``GET /jobs/{id}`` has it whole."""
        truncated: dict[str, int] = {}
        for part in self.fields[CUT].split(","):
            name, _, size = part.rpartition(":")
            shown = SHOWN_AS.get(name)
            if shown is None:
                continue
            preview = codec.shown_text(_whole_chars(self.fields.get(name) or ""))
            view[shown] = [] if shown == "history" else _error_start(preview) if name == "error" else None
            view[f"{shown}_preview"] = preview
            truncated[shown] = _int(size)
        view["truncated"] = truncated

    @property
    def status(self) -> str | None:
        return self.fields.get("status")


def _whole_chars(text: str) -> str:
    """A preview without the bytes of a character Redis cut in two (read back
    surrogate-escaped: 1 to 3 at the end), so it holds only whole characters and at most
    the bytes it was cut to, never a replacement character for the stray bytes."""
    end = len(text)
    while end > 0 and len(text) - end < 3 and "\udc80" <= text[end - 1] <= "\udcff":
        end -= 1
    return text[:end]


_ERROR_HEAD = re.compile(r'\{"type":("(?:[^"\\]|\\.)*"),"message":"((?:[^"\\]|\\u[0-9a-fA-F]{4}|\\[^u])*)(")?')


def _error_start(preview: str) -> dict[str, Any]:
    """A cut error as an error still: its type and the start of its message (marked with
    " ...", and ``"cut": true``), so a list row shows what failed whatever the size of
    the message. An error record runner did not write shows its text's start."""
    m = _ERROR_HEAD.match(preview)
    if m is None:
        return {"type": None, "message": preview[:400] + " ...", "cut": True}
    try:
        type_ = codec.loads(m.group(1))
        message = codec.loads('"' + m.group(2) + '"')
    except codec.DecodeError:
        return {"type": None, "message": preview[:400] + " ...", "cut": True}
    return {"type": type_, "message": codec.shown_text(message) + ("" if m.group(3) else " ..."), "cut": True}


STEP_EXCERPT = 200  # characters of a step's result a job view shows
# A job list reads a step log entry up to this many bytes whole; a longer one, as its
# summary (stephead:<i>: the entry without its value, with finished_ms and its size),
# which its writer keeps beside it (step_head, step.lua, wait.lua; lookup.lua). A page
# then reads a few hundred bytes a step, not the 4 MiB a log may hold.
STEP_INLINE = 256
# A summary is at most this many bytes (lookup.lua's HEAD_MAX): it keeps no wait's match
# past MATCH_KEPT bytes, nor long strings. A list row lists the last LIST_STEPS steps of
# its log (steps_more: how many before them it leaves out), so a row is a few kilobytes
# whatever the job holds (990 event waits with 4 KiB matches made a 4 MB row).
STEP_HEAD_MAX = 512
MATCH_KEPT = 128
LIST_STEPS = 50
_HEAD_SCALARS = ("name", "kind", "status", "event", "signal", "child", "ms", "started_ms", "finished_ms",
                 "until_ms")

# A step log entry is a JSON object, or, for the two entries almost every durable job
# has, a JSON array: a step that returned, ["s", name, value, ms, finished_ms], and a
# sleep, ["z", name, started_ms, until_ms] (the times appended by step.lua and
# suspend.lua). Short entries keep a sleeping job's state hash in Redis's compact
# encoding (a field over 64 bytes turns the whole hash into a table: about 3x the bytes).
# Objects are read as ever (entries recorded before the arrays, and every other kind).
STEP_OK, SLEEP = "s", "z"


def step_ok_entry(name: str, value_json: str, ms: float) -> str:
    """A returned step's compact entry, without finished_ms (step.lua appends it)."""
    return f'["{STEP_OK}",{codec.dumps(name)},{value_json},{codec.dumps(ms)}]'


def sleep_entry(name: str, started_ms: int | None = None, until_ms: int | None = None) -> str:
    """A sleep's compact entry; without its times, suspend.lua appends them."""
    times = [t for t in (started_ms, until_ms) if t is not None]
    return codec.dumps([SLEEP, name, *times])


def step_head(entry: str) -> str:
    """A step log entry's summary for job lists, without finished_ms and size (step.lua
    adds them): the entry without its value, and an error step's error without its
    traceback; '' for an entry a list reads whole (at most STEP_INLINE bytes, stamped)."""
    if len(entry.encode()) + 20 <= STEP_INLINE:  # (finished_ms takes up to 20 more)
        return ""
    try:
        e = entry_of(codec.loads(entry))
    except codec.DecodeError:
        return ""
    if e is None:
        return ""
    return codec.dumps(_bounded_head({k: v for k, v in e.items() if k != "finished_ms"}))


def wait_head(head: str) -> str:
    """A wait's entry head (a JSON object without its closing brace, journal.py) as its
    summary's head (wait.lua adds status, finished_ms and size): bounded as step_head's
    summaries are; '' when it is not an object (wait.lua then takes the head as it is)."""
    try:
        e = codec.loads(head + "}")
    except codec.DecodeError:
        return ""
    if not isinstance(e, dict):
        return ""
    return codec.dumps(_bounded_head(e))[:-1]


def _bounded_head(e: dict[str, Any]) -> dict[str, Any]:
    """An entry without its value, a match past MATCH_KEPT bytes or an error's traceback;
    past STEP_HEAD_MAX (less what the scripts add), its short scalar fields alone."""
    head = {k: v for k, v in e.items() if k != "value"}
    if "match" in head and len(codec.dumps(head["match"]).encode()) > MATCH_KEPT:
        del head["match"]
    error = head.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        head["error"] = {"type": error.get("type"),
                         "message": message[:STEP_EXCERPT] if isinstance(message, str) else message}
    if len(codec.dumps(head).encode()) > STEP_HEAD_MAX - 100:  # (status, finished_ms, size to come)
        head = {k: v for k, v in head.items() if k in _HEAD_SCALARS and (
            isinstance(v, int | float) or (isinstance(v, str) and len(v.encode()) <= 128))}
    return head or {"name": None}


def entry_of(value: Any) -> dict[str, Any] | None:
    """A decoded step log entry as every reader takes it (an object with name, kind,
    status...): an object as it is, a compact array expanded; None for anything else
    (damage)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[1], str):
        return None
    if value[0] == STEP_OK and 4 <= len(value) <= 5:
        out = {"name": value[1], "kind": "step", "status": "ok", "ms": value[3], "value": value[2]}
        if len(value) == 5:
            out["finished_ms"] = value[4]
        return out
    if value[0] == SLEEP and len(value) <= 4:
        out = {"name": value[1], "kind": "sleep", "status": "ok"}
        for field, t in zip(("started_ms", "until_ms"), value[2:], strict=False):
            out[field] = t
        return out
    return None


def due_ms(f: Mapping[str, str]) -> str | None:
    """When a job waiting for a time is due, as its fields say: its ready_ms, or for a
    sleeping job (whose state keeps none, suspend.lua) its sleep's until_ms, the last entry
    of its step log; None when neither says."""
    if f.get("ready_ms") or f.get("status") != "sleeping":
        return f.get("ready_ms")
    try:
        last = codec.loads(f.get(f"step:{int(f.get('steps') or 0) - 1}") or "null")
    except (codec.DecodeError, ValueError):
        return None
    e = entry_of(last)
    until = e.get("until_ms") if e is not None and e.get("kind") == "sleep" else None
    return str(until) if isinstance(until, int | float) and not isinstance(until, bool) else None


def waiting_view(f: Mapping[str, str]) -> dict[str, Any]:
    """What a waiting job waits for: a signal, or an event (ctx.wait_for_event: its name
    and match, read from the wait's entry), and until when."""
    signal = f.get("waiting_for") or ""
    until = _ts(f.get("ready_ms"))
    if signal.startswith("event."):
        try:
            e = codec.loads(f.get(f"step:{signal[6:]}") or "null")
        except codec.DecodeError:
            e = None
        if isinstance(e, dict) and e.get("kind") == "event":
            return {"event": e.get("event"), "match": e.get("match"), "timeout_at": until}
    return {"signal": signal, "timeout_at": until}


def step_views(f: Mapping[str, str], count: int, start: int = 0) -> list[dict[str, Any]]:
    """A durable function's step log as a job view shows it, its entries from ``start``
    to ``count`` (at most MAX_STEPS: the caller's bound): each entry's name, kind,
    status, times and a result excerpt (its first STEP_EXCERPT characters of JSON)."""
    out: list[dict[str, Any]] = []
    for i in range(max(0, start), min(count, MAX_STEPS)):
        raw = f.get(f"step:{i}")
        try:
            e = entry_of(codec.loads(raw)) if raw else None
        except codec.DecodeError:
            e = None
        if e is None:
            out.append(dict(DAMAGED_STEP))
            continue
        finished = e.get("finished_ms")
        started = e.get("started_ms")
        if started is None and isinstance(finished, int) and isinstance(e.get("ms"), int | float):
            started = finished - int(e["ms"])
        one: dict[str, Any] = {"name": e.get("name"), "kind": e.get("kind"), "status": e.get("status"),
                               "started_at": _ts(str(started)) if started is not None else None,
                               "finished_at": _ts(str(finished)) if finished is not None else None}
        if e.get("kind") == "sleep":
            one["until"] = _ts(str(e.get("until_ms")))
        if e.get("kind") == "invoke":
            one["child"] = e.get("child")  # ctx.invoke's child job (its view names this job: invoked_by)
        if e.get("kind") in ("signal", "invoke", "event") and e.get("status") == "waiting":
            one["until"] = _ts(str(e.get("until_ms")))
        if e.get("kind") == "signal":
            one["signal"] = e.get("signal")
        if e.get("kind") == "event":
            one["event"] = e.get("event")
            one["match"] = e.get("match")
        if "value" in e:
            text = codec.dumps(e["value"])
            one["result"] = text if len(text) <= STEP_EXCERPT else text[:STEP_EXCERPT] + "\u2026"
        # The bytes its entry takes in the log (a list's summary says, lookup.lua).
        size = e.get("size") if "value" not in e else None
        one["size"] = size if isinstance(size, int) and not isinstance(size, bool) else len((raw or "").encode())
        if isinstance(e.get("error"), dict):
            one["error"] = e["error"]
        out.append(one)
    return out


class ScriptBatch(Protocol):
    def add(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool = False) -> None: ...
    def execute(self) -> list[Any]: ...


class ScriptRunner(Protocol):
    """What sends script calls in one round trip: scripts.Scripts over redis-py, or
    transport.LinkScripts over a connection of the store's own."""

    def batch(self) -> ScriptBatch: ...


def lookup_keys(k: QueueKeys, job_id: str) -> tuple[str, ...]:
    """The KEYS of lookup.lua for one job."""
    return scriptkeys.keys("lookup", k, job=k.job(job_id))


def lookup(scripts: ScriptRunner, keys: Iterable[QueueKeys], job_id: str) -> Job | None:
    """The job, from whichever queue (or partition) of ``keys`` holds it (None: no such
    job), in one round trip."""
    if not job_id or len(job_id) > 200:
        return None
    found = lookup_many(scripts, keys, [job_id]).get(job_id)
    return Job(job_id, found[0].queue, found[1]) if found else None


def lookup_many(scripts: ScriptRunner, keys: Iterable[QueueKeys], job_ids: Sequence[str],
                away: list[tuple[QueueKeys, BaseException]] | None = None,
                ) -> dict[str, tuple[QueueKeys, dict[str, str]]]:
    """The jobs of these ids that exist, by id: the keys of the queue (partition) that
    holds each, and the job as readers see it, in one round trip. A job lives under
    exactly one tag (its queue's, or one of its queue's partitions'); one read-only script
    per tag returns its record, state, claim and done outcome (lookup.lua). A key of the
    wrong type (a damaged record) counts as no record. Redis errors are the caller's,
    but for ``away`` on Redis Cluster: a partition whose master did not answer (an
    outage: stalled, down) is added there with its error, and the jobs found on the
    others are returned (its jobs are then neither found nor known missing)."""
    every = list(keys)
    batch = scripts.batch()
    for job_id in job_ids:
        for k in every:
            batch.add("lookup", lookup_keys(k, job_id), (job_id,))
    if away is None or getattr(scripts, "one_server", True):
        replies = iter(batch.execute())
    else:
        replies = iter(_answered(batch, every, len(job_ids), away))
    out: dict[str, tuple[QueueKeys, dict[str, str]]] = {}
    for job_id in job_ids:
        for k in every:
            record, state, claim, outcome = next(replies)
            record = record if isinstance(record, str) and not record.startswith("\0") else None
            fields = view(job_id, record, state or [], claim or None, outcome or None)
            if fields and job_id not in out:
                out[job_id] = (k, fields)
    return out


def _answered(batch: ScriptBatch, every: Sequence[QueueKeys], ids: int,
              away: list[tuple[QueueKeys, BaseException]]) -> list[Any]:
    """The replies of lookup_many's batch on Redis Cluster, each master's on its own: an
    outage of a partition's master is added to ``away`` (once per partition) and its
    replies read as no job; any other error is raised, as execute raises it."""
    from runner.store.connection import UNAVAILABLE

    empty = [None, None, None, None]
    try:
        replies = batch.execute(raise_on_error=False)  # type: ignore[call-arg]
    except UNAVAILABLE as exc:  # (a batch of one call raises its error)
        if len(every) * ids != 1:
            raise
        away.append((every[0], exc))
        return [empty]
    out: list[Any] = []
    for i, reply in enumerate(replies):
        if isinstance(reply, UNAVAILABLE):
            k = every[i % len(every)]
            if all(k is not seen for seen, _ in away):
                away.append((k, reply))
            reply = empty
        elif isinstance(reply, BaseException):
            raise reply
        out.append(reply)
    return out
