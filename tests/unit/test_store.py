"""Job records as the API shows them: fields the enqueue script leaves out at their
default read back as that default."""

from __future__ import annotations

from runner.store import records
from runner.store.records import Job


def test_a_record_written_without_its_defaults_reads_as_them() -> None:
    """A fresh record carries only type, version, payload, status, max_attempts and
    created_ms: attempt and deferrals read 0, enqueued_at and ready_at read created_at,
    and there is no idempotency or resource key."""
    d = Job("j1", "fast", {"type": "noop", "version": "1", "payload": '{"a":1}', "status": "queued",
                           "max_attempts": "3", "created_ms": "1800000000000"}).as_dict()
    assert d["attempt"] == 0 and d["deferrals"] == 0
    assert d["created_at"] == d["enqueued_at"] == d["ready_at"] == 1_800_000_000.0
    assert d["idempotency_key"] is None and d["resource_key"] is None
    assert d["payload"] == {"a": 1} and d["history"] == []


def test_written_times_win_over_the_defaults() -> None:
    """A delayed job's ready_ms and a requeued job's enqueued_ms are kept as written."""
    d = Job("j2", "fast", {"type": "noop", "version": "1", "payload": "{}", "status": "scheduled",
                           "max_attempts": "3", "created_ms": "1000", "enqueued_ms": "2000",
                           "ready_ms": "5000"}).as_dict()
    assert (d["created_at"], d["enqueued_at"], d["ready_at"]) == (1.0, 2.0, 5.0)


def test_new_ids_are_unique_across_threads_and_a_fork() -> None:
    """Ids drawn from buffered randomness stay unique: many per thread, across threads, and
    in a forked child, which must not reuse the bytes its parent still holds."""
    import os
    import threading

    from runner.store import records

    got: list[list[str]] = []

    def draw() -> None:
        got.append([records.new_id() for _ in range(5_000)])

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records.new_id()  # this thread's buffer now holds bytes the child inherits
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.write(w, " ".join(records.new_id()[12:] for _ in range(50)).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    child = set(os.read(r, 1 << 16).decode().split())
    os.close(r)
    parent = {records.new_id()[12:] for _ in range(50)}
    every = [i for ids in got for i in ids]
    assert len(set(every)) == len(every) == 20_000
    assert len(child) == 50 and not child & parent
    assert all(len(i) == 22 and int(i, 16) >= 0 for i in every)


def test_view_lays_a_claim_or_an_outcome_over_the_record_and_survives_garbage() -> None:
    """A claim shows the job processing with its token, attempt and start; an outcome
    shows it done with its result, meta and one more history entry, and hides an earlier
    attempt's error; a damaged claim is ignored and a damaged outcome still reads done."""
    from runner.store import records

    record = records.encode({"type": "t", "version": 1, "max_attempts": 3, "created_ms": 5, "payload": "{}"})
    state = {"attempt": "1", "history": '{"attempt":1}', "error": '{"type":"E"}'}
    assert records.parse(record) == {"type": "t", "version": "1", "max_attempts": "3", "created_ms": "5",
                                     "payload": "{}"}
    queued = records.view("x", record, {}, None, None)
    assert queued["status"] == "queued" and queued["payload"] == "{}"
    claimed = records.view("x", record, state, "w.1:0 2 1000 -", None)
    assert claimed["status"] == "processing" and claimed["token"] == "w.1:0"
    assert claimed["attempt"] == "2" and claimed["started_ms"] == "1000"
    done = records.view("x", None, {}, None, 't 1 2 1000 2000\n{"attempt":1}\n{"ok":true}\n{"schedule":"s"}')
    assert done["status"] == "done" and done["finished_ms"] == "2000" and done["result"] == '{"ok":true}'
    assert done["history"].startswith('{"attempt":1},{"attempt":2,"outcome":"done"') and "error" not in done
    job = Job("x", "fast", done).as_dict()
    assert [h["attempt"] for h in job["history"]] == [1, 2] and job["result"] == {"ok": True}
    assert job["schedule"] == "s" and job["type"] == "t"
    dup = records.view("x", None, {}, None, "t 1 0 0 2000 first\n\n")
    assert dup["duplicate_of"] == "first" and "history" not in dup
    assert records.view("x", record, state, "garbage", None)["status"] == "queued"
    assert records.view("x", None, {}, None, "garbage")["status"] == "done"
    assert records.view("x", None, {}, None, None) == {}
    assert records.parse("garbage") is None and records.parse(None) is None


def test_a_jobs_parent_is_read_off_its_id() -> None:
    """Follow-ups are "<parent>.<i>", destinations "<parent>.s" / ".f"; a group's then-job
    ("<group>.then") and any other id have none."""
    assert records.parent_of("abc.0") == "abc" and records.parent_of("abc.12") == "abc"
    assert records.parent_of("abc.1.s") == "abc.1" and records.parent_of("abc.f") == "abc"
    assert [records.parent_of(i) for i in ("abc", "gabc.then", ".0", "abc.x")] == [None] * 4


def test_the_job_view_shows_children_and_group_apart_from_other_meta() -> None:
    done = Job("p", "fast", {"status": "done", "meta": '{"children":["p.0","p.s"],"tick":"t"}'}).as_dict()
    assert done["children"] == ["p.0", "p.s"] and done["tick"] == "t" and done["group"] is None
    dead = Job("p", "fast", {"status": "dead", "children": "p.f"}).as_dict()
    assert dead["children"] == ["p.f"]
    member = Job("m", "fast", {"meta": '{"group":"g1","member":3}'}).as_dict()
    assert (member["group"], member["member"], member["parent"], member["children"]) == ("g1", 3, None, [])


def test_a_new_job_is_its_enqueue_fields_in_order() -> None:
    """enqueue_call sends a NewJob as it is: its fields must stay the 12 job fields of
    enqueue.lua followed by the priority. A field added or moved in NewJob would shift
    every argument after it; this names the mismatch instead."""
    from runner.store.keys import QueueKeys
    from runner.store.scripts import NewJob, Scripts, _job_fields

    j = NewJob("id1", "noop", 2, '{"a":1}', 5, 7, 8, "k", "h", "r", "1 x", '{"m":1}', 4)
    assert list(j) == [*_job_fields(j), j.priority]
    _, _, args = Scripts.enqueue_call(QueueKeys("p", "fast"), [j, j._replace(id="id2", priority=0)], now_ms=1)
    assert args[2:-1] == [*_job_fields(j), 4, *_job_fields(j._replace(id="id2")), 0]
    assert args[-1] > 0  # then how long a limit key stays marked


def test_a_resumed_durable_job_claimed_ahead_shows_the_attempt_it_ran() -> None:
    """A durable function resumed on a queue whose jobs start in child processes is claimed
    ahead of its start (flag p): it showed attempt 0 and no start until its child said it
    began, though it had run in that attempt. It shows the attempt it ran and its first
    start; a fresh job claimed ahead still shows no attempt spent and no start."""
    from runner.store import records

    record = records.encode({"type": "t", "version": 1, "max_attempts": 3, "created_ms": 5, "payload": "{}"})
    resumed = records.view("x", record, {"attempt": "0", "run_attempt": "1", "run_started_ms": "900"},
                           "w.1:0 1 0 p", None)
    assert (resumed["status"], resumed["attempt"], resumed["started_ms"]) == ("processing", "1", "900")
    fresh = records.view("x", record, {}, "w.1:0 1 0 p", None)
    assert (fresh["status"], fresh["attempt"], fresh.get("started_ms")) == ("processing", "0", None)
