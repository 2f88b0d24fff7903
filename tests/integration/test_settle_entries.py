"""What the settler writes for each outcome: one script call per transition (start, ack,
retry, bury, release) for a partition's batch, each with one entry per settlement, in the
batch's order. A done job's entry carries its result, census line, kept
result, follow-ups and group count (its stats fields go beside the call, counted once it
lands); a retry, a rate-limited hand-back and a deferral, a
death, a cancel and an expiry each have their history entry, refund and stats; a release
carries its mode and note; a start mark goes only for a run that does not also end in
the batch, whose ack carries the start instead."""

from __future__ import annotations

import queue as stdqueue
from typing import Any

from runner.observe import metrics
from runner.store import codec
from runner.store.scripts import Ack, Burial, Hand, Member, RetryAt
from runner.worker.entries import AckFigures
from runner.worker.execute import CANCELLED, EXPIRED, Claimed, Dead, Done, RetryLater
from runner.worker.ledger import START, Ledger, Release, Run, Settlement
from runner.worker.settler import Settler

from conftest import Project

NOW = 1_700_000_000_000
READY = NOW - 50  # every job was ready 50 ms before its run started
STARTED = NOW - 20
RUN_S = 0.007
ERROR = {"type": "ValueError", "message": "boom", "traceback": "Traceback ..."}

SOURCE = '''QUEUE = "fast"
KEEP_RESULT = 60
ON_SUCCESS = "sink"
ON_FAILURE = "sink"


def handle(payload, ctx):
    return payload
'''
SINK = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'


class Recorder:
    """The scripts' settle calls, recorded instead of sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []

    def _record(self, name: str, items: Any, **kw: Any) -> None:
        kw.pop("pipe", None)
        self.calls.append((name, list(items), kw))

    def start(self, k: Any, owned: Any, **kw: Any) -> None:
        self._record("start", owned, **kw)

    def ack(self, k: Any, acks: Any, idem_ttl_ms: int, done_ttl_ms: int, done_max: int, **kw: Any) -> None:
        self._record("ack", acks, idem_ttl_ms=idem_ttl_ms, done_ttl_ms=done_ttl_ms, done_max=done_max, **kw)

    def retry(self, k: Any, items: Any, **kw: Any) -> None:
        self._record("retry", items, **kw)

    def bury(self, k: Any, items: Any, dead_ttl_ms: int, **kw: Any) -> None:
        self._record("bury", items, dead_ttl_ms=dead_ttl_ms, **kw)

    def release(self, k: Any, items: Any, **kw: Any) -> None:
        self._record("release", items, **kw)


def _run(i: int, type_: str = "noop", attempt: int = 1, max_attempts: int = 3, meta: str = "") -> Run:
    # claimed_ms 0: the history's times are the settle's own clock (NOW), not an estimate
    return Run(Claimed(f"j{i}", f"w.{i}", attempt, type_, "1", '{"n": 1}', max_attempts, "", "", READY,
                       READY - 5, "", "fast", 0, meta_raw=meta))


def _history(attempt: int, outcome: str, error: Any = None) -> str:
    entry: dict[str, Any] = {"attempt": attempt, "outcome": outcome, "started_ms": STARTED, "at_ms": NOW}
    if error is not None:
        entry["error"] = {"type": error["type"], "message": error["message"]}
    return codec.dumps(entry)


def test_each_outcome_builds_the_entry_its_script_takes(project: Project) -> None:
    project.add_function("src", SOURCE)
    project.add_function("sink", SINK)
    rt = project.runtime
    q = rt.config.queues["fast"]
    settler = Settler(rt, q, Ledger(q.concurrency, 64, 1), stdqueue.SimpleQueue())
    recorder = Recorder()
    rt._scripts = recorder

    member_meta = codec.dumps({"group": "g1", "member": 2})
    runs = [_run(i) for i in range(16)]
    runs[1] = _run(1, "src")
    runs[2] = _run(2, meta=member_meta)
    runs[7] = _run(7, "src", attempt=3)
    runs[8] = _run(8, "src")
    runs[9] = _run(9, meta=member_meta)
    runs[10] = _run(10, "src")
    runs[4] = _run(4, attempt=3, max_attempts=3)

    def settled(i: int, outcome: Any, **extra: Any) -> Settlement:
        return Settlement(runs[i], outcome, RUN_S, STARTED, extra)

    batch = [
        settled(0, Done("null")),
        settled(1, Done('{"a": 1}')),
        settled(2, Done('{"a": 2}')),
        settled(3, RetryLater(1.5, ERROR)),
        settled(4, RetryLater(2.0, ERROR, refund=True, rate_limited=True)),
        settled(5, RetryLater(30.0, ERROR, refund=True)),
        settled(6, RetryLater(1.5, ERROR), abandoned=True),
        settled(7, Dead("max attempts reached", ERROR, False)),
        settled(8, Dead("invalid payload", ERROR, True)),
        settled(9, Dead(CANCELLED, None, False)),
        settled(10, Dead(EXPIRED, {"type": "Expired", "message": "old"}, True)),
        settled(11, Release("later", "interrupted")),
        settled(12, Release()),
        settled(13, START),  # its run ends in this batch: no start mark
        settled(14, START),
        settled(13, Done("null")),
    ]
    groups: list[list[Settlement]] = []
    figures: list[AckFigures | None] = []
    settler.entries.add_calls(rt.keys["fast"], batch, NOW, None, groups, figures)  # type: ignore[arg-type]

    assert [name for name, _, _ in recorder.calls] == ["start", "ack", "retry", "bury", "release"]
    by = {name: (items, kw) for name, items, kw in recorder.calls}
    assert [[s.run.job.id for s in g] for g in groups] == [
        ["j14"], ["j0", "j1", "j2", "j13"], ["j3", "j4", "j5", "j6"], ["j7", "j8", "j9", "j10"], ["j11", "j12"]]
    assert by["start"][0] == [("j14", "w.14")]
    assert all(s.run.settling for s in batch if s.outcome is not START)
    assert not runs[14].settling

    # Done: the fields of each, summed once for the batch, kept beside the ack call (the
    # settler counts them once it lands), not sent; a result kept on its own and the
    # ON_SUCCESS job for src; the group's count for a member.
    totals = metrics.Totals()
    fields = [metrics.succeeded(t, STARTED - READY, RUN_S * 1000, totals) for t in ("noop", "src", "noop", "noop")]
    totals.add("followups|src", 1)
    fields[1] += " followups|src=1"
    assert [f is not None for f in figures] == [False, True, False, False, False]
    fig = figures[1]
    assert fig is not None and fig.stats_key == rt.keys["fast"].stats
    assert fig.totals.counts == totals.counts and fig.fields == fields
    acks, kw = by["ack"]
    ret = rt.config.retention
    assert kw == {"idem_ttl_ms": int(ret.idempotency_s * 1000), "done_ttl_ms": int(ret.done_s * 1000),
                  "done_max": ret.done_max}
    a0, a1, a2, a13 = acks
    assert a0 == Ack("j0", "w.0", "", "noop|1", "", 0, (), None, READY - 5)
    # Its start mark not sent, its outcome carries its handler's start (not the claim's).
    assert a13 == Ack("j13", "w.13", "", "noop|1", "", 0, (), None, READY - 5, STARTED)
    (dest,) = a1.followups
    assert (dest.queue, dest.job.id, dest.job.type) == ("fast", "j1.s", "sink")
    assert codec.loads(dest.job.payload)["result"] == {"a": 1}
    assert a1 == Ack("j1", "w.1", '{"a": 1}\n' + codec.dumps({"children": ["j1.s"]}), "src|1",
                     "", 60_000, (dest,), None, READY - 5)
    assert a2 == Ack("j2", "w.2", '{"a": 2}\n' + member_meta, "noop|1", "", 0, (),
                     Member("g1", 2, "done", '{"id":"j2","status":"done","result":{"a": 2}}', ""), READY - 5)

    # Retries: a failure, a rate limit on the last attempt, a deferral, an abandoned run;
    # each carries its handler's start, which the script writes as the attempt's. No failed
    # attempt carries timings: the histograms are of attempts that succeeded.
    retries, _ = by["retry"]
    assert retries == [
        RetryAt("j3", "w.3", 1500, codec.dumps(ERROR), _history(1, "retry", ERROR), "retried|noop",
                started_ms=STARTED),
        RetryAt("j4", "w.4", 2000, codec.dumps(ERROR), _history(3, "rate limited", ERROR), "ratelimited|noop",
                refund=True, rate_limited=True, last=True, started_ms=STARTED),
        RetryAt("j5", "w.5", 30_000, codec.dumps(ERROR), "", "deferred|noop", refund=True, started_ms=STARTED),
        RetryAt("j6", "w.6", 1500, codec.dumps(ERROR), _history(1, "retry", ERROR),
                "retried|noop abandoned|noop", started_ms=STARTED),
    ]

    # Burials: dead (with its ON_FAILURE job), dead unrun, cancelled (no ON_FAILURE, its
    # group told), expired (a history entry though no attempt was spent).
    burials, kw = by["bury"]
    assert kw == {"dead_ttl_ms": int(ret.dead_s * 1000)}
    b7, b8, b9, b10 = burials
    assert [f.job.id for f in b7.followups] == ["j7.f"] and codec.loads(b7.followups[0].job.payload)["error"] == ERROR
    assert b7 == Burial("j7", "w.7", "max attempts reached", codec.dumps(ERROR),
                        _history(3, "max attempts reached", ERROR), False,
                        "dead|src followups|src=1", b7.followups, None, STARTED)
    assert [f.job.id for f in b8.followups] == ["j8.f"]
    assert b8 == Burial("j8", "w.8", "invalid payload", codec.dumps(ERROR), "", True, "dead|src followups|src=1",
                        b8.followups, None, STARTED)
    assert b9 == Burial("j9", "w.9", CANCELLED, "", _history(1, CANCELLED), False, "cancelled|noop",
                        (), Member("g1", 2, "cancelled", codec.dumps(
                            {"id": "j9", "status": "cancelled", "reason": CANCELLED, "error": None}), ""), STARTED)
    expired_error = {"type": "Expired", "message": "old"}
    assert [f.job.id for f in b10.followups] == ["j10.f"]
    assert b10 == Burial("j10", "w.10", EXPIRED, codec.dumps(expired_error), _history(1, EXPIRED, expired_error), True,
                         "dead|src expired|src followups|src=1", b10.followups, None, STARTED)

    # Releases: one handed back at its lease's end with a note, one at once without.
    releases, kw = by["release"]
    assert kw == {"done_ttl_ms": int(ret.done_s * 1000)}
    note = codec.dumps({"attempt": 1, "outcome": "interrupted", "at_ms": NOW})
    assert releases == [Hand("j11", "w.11", "later", note), Hand("j12", "w.12", "now", "")]


def test_a_done_job_keeps_its_payload_when_retention_says_so(project: Project) -> None:
    """[retention] done_payload: the outcome keeps the result, the meta and the payload, a
    line each (an empty line for no meta)."""
    rt = project.runtime
    q = rt.config.queues["fast"]
    settler = Settler(rt, q, Ledger(q.concurrency, 64, 1), stdqueue.SimpleQueue())
    settler.entries.keep_payload = True  # as done_payload = true sets it
    recorder = Recorder()
    rt._scripts = recorder
    plain, annotated = _run(0), _run(1, meta='{"tick": "x"}')
    settler.entries.add_calls(rt.keys["fast"], [Settlement(plain, Done("null"), RUN_S, STARTED),
                                         Settlement(annotated, Done("7"), RUN_S, STARTED)], NOW, None, [],
                              [])  # type: ignore[arg-type]
    [(_, acks, _)] = recorder.calls
    assert [a.result for a in acks] == ['\n\n{"n": 1}', '7\n{"tick": "x"}\n{"n": 1}']
