"""A big fan-out does not block Redis: a run's ctx.enqueue follow-ups past
scripts.STAGE_OVER are staged in bounded writes before the ack, and the ack (one bounded
script) commits them; the relay then places them a batch at a time. They exist if and
only if the ack landed: a refused ack leaves none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from runner.store import codec
from runner.store.scripts import STAGE_OVER, Ack, Followup, NewJob, job_entry
from runner.worker import relay
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import SCAN_COUNT, Project, size, wait_for

# The big fan-outs' sizes: bounded by default (each well past STAGE_OVER, so staged and
# relayed in many batches); RUNNER_TEST_FULL=1 runs the sizes the review measured.
BIG = int(size("FANOUT_BIG", 12_000, 30_000))
KILLED = int(size("FANOUT_KILLED", 8_000, 20_000))

FAN = '''
QUEUE = "fast"


def handle(payload, ctx):
    for i in range(payload["n"]):
        ctx.enqueue("noop", {"i": i})
    return {"n": payload["n"]}
'''


@contextmanager
def slowlog(project: Project) -> Iterator[None]:
    """Scripts slower than 100 ms go on the server's slow log (put back after)."""
    r = project.runtime.redis
    was = r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    r.config_set("slowlog-log-slower-than", 100_000)
    r.slowlog_reset()
    try:
        yield
    finally:
        r.config_set("slowlog-log-slower-than", was)


def _slow_scripts(project: Project) -> list[tuple[float, str]]:
    return [(e["duration"] / 1e6, str(e["command"])[:80]) for e in project.runtime.redis.slowlog_get(128)
            if b"EVAL" in (e["command"] if isinstance(e["command"], bytes) else str(e["command"]).encode()).upper()]


def test_a_big_fan_out_blocks_redis_for_no_script_past_100_ms(project: Project) -> None:
    """One run enqueues BIG follow-ups (30,000 at full size; one script writing them all
    took about 0.4 s):
    every follow-up is written once, by its id, and no script call took 100 ms."""
    # The test is about Redis, not the handler's speed: 30,000 ctx.enqueue calls take a
    # second on a quiet machine, more on a loaded one.
    (project.root / "functions" / "fan.py").write_text(FAN.replace('QUEUE = "fast"', 'QUEUE = "fast"\nTIMEOUT = 20'))
    (project.root / "schemas" / "fan").mkdir()
    (project.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    c, r, k = project.client, project.runtime.redis, project.keys()
    parent = c.enqueue("fan", {"n": BIG}).id
    with slowlog(project):
        project.spawn_worker("fast")
        assert c.result(parent, 120) == {"n": BIG}
        wait_for(lambda: r.llen(k.outbox) == 0 and int(r.hget(k.stats, "succeeded|noop") or 0) == BIG,
                 timeout=120, what="every follow-up to run")
        project.stop_all()
        slow = _slow_scripts(project)
    assert all(c.get(f"{parent}.{i}").status == "done" for i in (0, 1, BIG // 2 - 1, BIG - 2))
    assert slow == []


def test_staged_follow_ups_exist_only_if_the_ack_lands(project: Project) -> None:
    """Follow-ups past STAGE_OVER go with the ack as a staged list: a refused ack (another
    token) commits nothing and the relay places nothing; the owning ack commits them all,
    and the relay places each once, in bounded batches."""
    rt, k = project.runtime, project.keys()
    parent = project.client.enqueue("record", {"n": 1}).id
    reply = list(rt.scripts.claim(k, n=1, start=1, lease_ms=60_000, token_base="w.1", dead_ttl_ms=10**9,
                                  done_ttl_ms=10**9))
    assert len(reply) == 2 + CLAIM_FIELDS
    token = reply[3]
    n = STAGE_OVER * 3 + 7
    follow = tuple(Followup("fast", NewJob(f"{parent}.{i}", "noop", 1, json.dumps({"i": i}), 3, 0, 0, "", "-",
                                           "", "")) for i in range(n))

    assert rt.scripts.ack(k, [Ack(parent, "not-the-token", "null", "record|1", "", 0, follow)], 60_000) == [-1]
    assert relay.drain(rt, k) == 0 and rt.redis.llen(k.outbox) == 0
    assert not rt.redis.exists(k.job(f"{parent}.0"))

    assert rt.scripts.ack(k, [Ack(parent, token, "null", "record|1", "", 0, follow)], 60_000) == [1]
    assert rt.redis.llen(k.outbox) == 1 and not rt.redis.exists(k.job(f"{parent}.0"))
    passes = 0
    while rt.redis.llen(k.outbox):
        relay.drain(rt, k)
        passes += 1
        assert passes < 100
    assert passes >= n // relay.BATCH
    assert all(rt.redis.exists(k.job(f"{parent}.{i}")) for i in range(n))
    assert rt.redis.llen(k.ready) == n
    # The commit is once: the same ack again is refused, and places nothing twice.
    assert rt.scripts.ack(k, [Ack(parent, token, "null", "record|1", "", 0, follow)], 60_000) == [-1]
    assert rt.redis.llen(k.outbox) == 0 and rt.redis.llen(k.ready) == n
    assert codec.loads(codec.dumps(job_entry("fast", follow[0].job)))[0] == "fast"


def test_a_fan_out_parents_outcome_names_its_first_children_and_counts_the_rest(project: Project) -> None:
    """A run with 700 follow-ups: its stored outcome keeps the first 100 children's ids and
    the count (the rest are <parent>.<i>, i below the count), not every id, so it stays a
    few KB whatever the fan-out; a follow-up past the first 100 is still found by
    waiting on its announced id."""
    (project.root / "functions" / "fan.py").write_text(FAN)
    (project.root / "schemas" / "fan").mkdir()
    (project.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    c, r, k = project.client, project.runtime.redis, project.keys()
    parent = c.enqueue("fan", {"n": 700}).id
    project.spawn_worker("fast")
    assert c.result(parent, 60) == {"n": 700}
    view = c.get(parent).as_dict()
    assert view["children"] == [f"{parent}.{i}" for i in range(100)]
    assert view["children_count"] == 700
    stored = r.hstrlen(k.done(int(r.hget(k.done_meta, "gen") or 0)), parent)
    assert 0 < stored < 4000, stored
    assert c.result(f"{parent}.650", 60) == {"i": 650}  # announced past the first 100: waited for


def test_a_stage_cut_off_after_its_first_chunk_expires_and_goes_at_the_reclaim(project: Project) -> None:
    """A worker killed while it stages a run's follow-ups leaves part of a stage: that part
    has its expiry from its first write on (it was set last, so a kill mid-way left it for
    ever), and the reclaim that takes the job back deletes it. Written chunk by chunk, as
    the worker writes it, so the cut is where the test puts it, not where a race lands."""
    import time

    from runner.store import scriptkeys
    from runner.store.scripts import STAGE_CHUNK, STAGE_TTL_MS, stage_suffix

    rt, k = project.runtime, project.keys()
    parent = project.client.enqueue("record", {"n": 1}).id
    reply = list(rt.scripts.claim(k, n=1, start=1, lease_ms=1_000, token_base="w.1", dead_ttl_ms=10**9,
                                  done_ttl_ms=10**9))
    token = reply[3]
    stage = k.job_prefix + stage_suffix(parent, token)
    entries = [json.dumps(job_entry("fast", NewJob(f"{parent}.{i}", "noop", 1, "{}", 3, 0, 0, "", "-", "", "")))
               for i in range(STAGE_CHUNK)]
    # The first chunk; then the kill.
    rt.scripts.call("stage", scriptkeys.keys("stage", stage=stage), [STAGE_TTL_MS, "1", *entries])
    assert 0 < rt.redis.pttl(stage) <= STAGE_TTL_MS
    assert rt.redis.llen(stage) == STAGE_CHUNK
    rt.scripts.reclaim(k, 100, 10**7, now_ms=int(time.time() * 1000) + 10_000)
    assert not rt.redis.exists(stage), "the killed run's stage outlived the reclaim"
    assert rt.redis.llen(k.outbox) == 0 and not rt.redis.exists(k.job(f"{parent}.0"))


def test_a_worker_killed_anywhere_in_a_big_fan_out_leaves_every_follow_up_placed_once(project: Project) -> None:
    """A worker SIGKILLed at some point of a run with KILLED follow-ups (20,000 at full
    size; handler, staging,
    ack or relay: wherever the kill lands): the next worker finishes the run, each follow-up
    is placed once, and no stage is left behind."""
    import signal

    (project.root / "functions" / "fan.py").write_text(FAN.replace('QUEUE = "fast"', 'QUEUE = "fast"\nTIMEOUT = 20'))
    (project.root / "schemas" / "fan").mkdir()
    (project.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    c, r, k = project.client, project.runtime.redis, project.keys()
    parent = c.enqueue("fan", {"n": KILLED}).id
    worker = project.spawn_worker("fast")
    pattern = f"{project.prefix}*{parent}:fu:*"
    wait_for(lambda: c.get(parent).status != "queued", timeout=60, what="the run to start")
    wait_for(lambda: list(r.scan_iter(pattern, count=SCAN_COUNT)) or c.get(parent).status == "done",
             timeout=60, interval=0.001, what="the stage's first write")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    project.spawn_worker("fast")
    assert c.result(parent, 120) == {"n": KILLED}
    wait_for(lambda: r.llen(k.outbox) == 0 and int(r.hget(k.stats, "succeeded|noop") or 0) >= KILLED,
             timeout=180, what="every follow-up to run")
    assert int(r.hget(k.stats, "succeeded|noop") or 0) == KILLED
    assert list(r.scan_iter(pattern, count=SCAN_COUNT)) == []


def test_two_relays_of_one_stage_place_every_follow_up_once(project: Project) -> None:
    """Two schedulers relay the same committed stage at once (every worker's does): both
    read the same head and place it (once each, by id); only one takes it off the stage.
    Both used to trim it, the second dropping the next batch, unplaced."""
    from runner.store import followups

    r, k = project.runtime.redis, project.keys()
    key = k.job_prefix + "parent:fu:t"
    entries = [json.dumps(job_entry("fast", NewJob(f"parent.{i}", "noop", 1, "{}", 3, 0, 0, "", "-", "", "")),
                          separators=(",", ":")) for i in range(450)]
    r.rpush(key, *entries)
    first = followups.stage_head(r, key, relay.BATCH)
    second = followups.stage_head(r, key, relay.BATCH)
    assert first == second == entries[:relay.BATCH]
    assert project.runtime.scripts.unstage(k, key, first[0], len(first), []) is True
    assert project.runtime.scripts.unstage(k, key, second[0], len(second), []) is False
    assert r.lrange(key, 0, -1) == entries[relay.BATCH:]


def test_a_big_fan_out_under_three_workers_places_every_follow_up(project: Project) -> None:
    """5,000 follow-ups relayed by the schedulers of three workers at once: every one is
    placed and run, once (1,200 and 1,600 of 5,000 were lost with two workers)."""
    (project.root / "functions" / "fan.py").write_text(FAN.replace('QUEUE = "fast"', 'QUEUE = "fast"\nTIMEOUT = 20'))
    (project.root / "schemas" / "fan").mkdir()
    (project.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    c, r, k = project.client, project.runtime.redis, project.keys()
    for _ in range(3):
        project.spawn_worker("fast")
    parent = c.enqueue("fan", {"n": 5_000}).id
    assert c.result(parent, 60) == {"n": 5_000}
    wait_for(lambda: r.llen(k.outbox) == 0 and int(r.hget(k.stats, "succeeded|noop") or 0) >= 5_000,
             timeout=60, what="every follow-up to run")
    assert int(r.hget(k.stats, "succeeded|noop") or 0) == 5_000
    assert all(c.get(f"{parent}.{i}").status == "done" for i in range(0, 5_000, 97))
