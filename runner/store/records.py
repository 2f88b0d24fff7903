"""Job records in and out of Redis, and the one view a reader sees of a job.

A job is two keys under its queue's tag (the layout is drawn in lua/_lib.lua):

    job:<id>     STRING  "1" then, separated by \x1f: type, version, max_attempts,
                         created_ms, idem_key, idem_hash, resource_key, limits, meta, payload
    job:<id>:s   HASH    its state, once it has one: status (absent: queued), attempt,
                         ready_ms, enqueued_ms, started_ms, finished_ms, error (JSON), reason
                         (dead only), history (comma-joined JSON entries, one per attempt),
                         checkpoint (JSON), deferrals, woken, lost_token, refunds,
                         progress (JSON, the last ctx.progress sent with a renewal),
                         cancel_requested (a running job asked to stop), children (a dead
                         job's ON_FAILURE job, written by its burial), requeued (times
                         requeued from dead)

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

Statuses: queued, scheduled, processing, retrying, deferred (parked on a full limit), done,
dead, cancelled (ended by a cancel: cancel.lua; kept for the done retention).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runner.store import codec

if TYPE_CHECKING:
    from runner.store.keys import QueueKeys

STATUSES = ("queued", "scheduled", "processing", "retrying", "deferred", "done", "dead", "cancelled")
SEP = "\x1f"
WAITED = "waited"  # the meta field that asks for the job's end to be published
CHILDREN = "children"  # a done job's follow-ups, in its outcome's meta (a dead one's: its state)
GROUP = "group"  # a group's member or then-job: the group id, in its meta
ENDED = ("done", "dead", "cancelled")
RECORD_FIELDS = ("type", "version", "max_attempts", "created_ms", "idem_key", "idem_hash", "resource_key",
                 "limits", "meta")


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
         outcome: str | None) -> dict[str, str]:
    """The job as a reader sees it: record, state, claim or done outcome in one set of
    fields (empty when Redis holds nothing of it)."""
    if not isinstance(state, Mapping):
        state = dict(zip(state[::2], state[1::2], strict=True))
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
            if len(parts) >= 6:
                fields["duplicate_of"] = parts[5]
            else:
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
        with contextlib.suppress(ValueError):
            fields["created_ms"] = str(int(job_id[:12], 16))  # the id begins with its creation
        return fields
    rec = parse(record)
    if rec is None:
        if record is None and not state:
            return {}
        rec = {}
    fields = {**rec, **{k: v for k, v in state.items() if k not in ("woken", "lost_token", "refunds", "rated")}}
    fields.setdefault("status", "queued")
    if claim:
        parts = claim.split(" ")
        if len(parts) == 4 and "p" in parts[3] and parts[1].isdigit():
            # Claimed ahead of a free executor: held by a worker, not started, and its
            # attempt not spent until it starts (the record keeps the attempts spent).
            fields.update(status="processing", token=parts[0], attempt=str(int(parts[1]) - 1), claimed_ahead="1")
            fields.pop("started_ms", None)
        elif len(parts) == 4:
            fields.update(status="processing", token=parts[0], attempt=parts[1], started_ms=parts[2])
    return fields


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


def now_ms() -> int:
    return int(time.time() * 1000)


def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _json(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return codec.loads(v)
    except codec.DecodeError:
        return {"unparsable": str(v)[:200]}


def _ts(v: Any) -> float | None:
    ms = _int(v, 0)
    return ms / 1000 if ms else None


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
        view = {
            "id": self.id,
            "type": f.get("type"),
            "version": _int(f.get("version"), 0) or None,
            "queue": self.queue,
            "status": f.get("status"),
            "attempt": _int(f.get("attempt")),
            # A finished job keeps a short outcome, without it: null, not a misleading 0.
            "max_attempts": _int(f.get("max_attempts")) or None,
            "payload": _json(f.get("payload")),
            "created_at": _ts(f.get("created_ms")),
            # The enqueue script leaves out times equal to created_ms.
            "enqueued_at": _ts(f.get("enqueued_ms") or f.get("created_ms")),
            "ready_at": _ts(f.get("ready_ms") or f.get("created_ms")),
            "started_at": _ts(f.get("started_ms")),
            "finished_at": _ts(f.get("finished_ms")),
            "idempotency_key": f.get("idem_key") or None,
            "resource_key": f.get("resource_key") or None,
            "deferrals": _int(f.get("deferrals")),
            # Times requeued from dead; a done job's short outcome does not keep it.
            "requeued": max(0, _int(f["requeued"])) if "requeued" in f else None if f.get("status") == "done" else 0,
            # 1-9 as long as the job lives; a done job's short outcome does not keep it.
            "priority": _int(f["priority"]) if "priority" in f else None if f.get("status") == "done" else 0,
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
            if isinstance(meta.get(GROUP), str):
                view["group"] = meta[GROUP]
            for key, value in meta.items():
                if key not in (WAITED, CHILDREN, GROUP):  # the waiters' mark is not the producer's
                    view.setdefault(key, value)
        return view

    @property
    def status(self) -> str | None:
        return self.fields.get("status")


class ScriptBatch(Protocol):
    def add(self, name: str, keys: Sequence[str], args: Sequence[Any], durable: bool = False) -> None: ...
    def execute(self) -> list[Any]: ...


class ScriptRunner(Protocol):
    """What sends script calls in one round trip: scripts.Scripts over redis-py, or
    link.Scripts over a connection of the store's own."""

    def batch(self) -> ScriptBatch: ...


def lookup_keys(k: QueueKeys, job_id: str) -> tuple[str, ...]:
    """The KEYS of lookup.lua for one job."""
    return (k.job(job_id), k.claims, k.done_meta, k.done_prefix, k.res_prefix)


def lookup(scripts: ScriptRunner, keys: Iterable[QueueKeys], job_id: str) -> Job | None:
    """The job, from whichever queue (or partition) of ``keys`` holds it (None: no such
    job), in one round trip."""
    if not job_id or len(job_id) > 200:
        return None
    found = lookup_many(scripts, keys, [job_id]).get(job_id)
    return Job(job_id, found[0].queue, found[1]) if found else None


def lookup_many(scripts: ScriptRunner, keys: Iterable[QueueKeys],
                job_ids: Sequence[str]) -> dict[str, tuple[QueueKeys, dict[str, str]]]:
    """The jobs of these ids that exist, by id: the keys of the queue (partition) that
    holds each, and the job as readers see it, in one round trip. A job lives under
    exactly one tag (its queue's, or one of its queue's partitions'); one read-only script
    per tag returns its record, state, claim and done outcome (lookup.lua). A key of the
    wrong type (a damaged record) counts as no record. Redis errors are the caller's."""
    every = list(keys)
    batch = scripts.batch()
    for job_id in job_ids:
        for k in every:
            batch.add("lookup", lookup_keys(k, job_id), (job_id,))
    replies = iter(batch.execute())
    out: dict[str, tuple[QueueKeys, dict[str, str]]] = {}
    for job_id in job_ids:
        for k in every:
            record, state, claim, outcome = next(replies)
            record = record if isinstance(record, str) and not record.startswith("\0") else None
            fields = view(job_id, record, state or [], claim or None, outcome or None)
            if fields and job_id not in out:
                out[job_id] = (k, fields)
    return out
