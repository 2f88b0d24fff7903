"""A claim sends at most CLAIM_BYTES of records per call (claim.lua): one call over many
big jobs held Redis for seconds (800 of 1 MiB: 7.6 s, BUSY to every other client) and
sent the worker all of them at once. Past the bound the jobs stay queued, in order and
untouched (no lease, no attempt, no token), and the worker claims again at once.

A real worker's claim calls are told apart by their tokens ("<worker>.<call>:<index>",
see Fetcher.claim): each handler reads its jobs' claim entries from Redis, so the tests
count the jobs (and bytes) each claim call sent without timing anything."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from typing import Any

import pytest
from clusterkit import cluster  # noqa: F401  (the cluster fixture)

from runner.client import Request
from runner.store import records
from runner.store.embedded import Server
from runner.store.scripts import NewJob
from runner.worker.fetcher import BOUNDED, CLAIM_FIELDS

from conftest import Endpoint, Project, assert_no_job_in_two_structures, make_project, wait_for

CLAIM_BYTES = records.SCRIPT_BYTES  # claim.lua's bound
PAD = 1_000_000  # about 1 MB a record: the accepted payload is up to 1 MiB
PER_CALL = CLAIM_BYTES // (PAD + 100)  # the most such jobs one claim call may send


@pytest.fixture
def project(any_project: Project) -> Project:
    """On the embedded Valkey and on Debian's redis-server 7.0 (where the stall was found)."""
    return any_project


def big(job_id: str, pad: int = PAD, priority: int = 0) -> NewJob:
    return NewJob(id=job_id, type="noop", version=1, payload=json.dumps({"pad": "p" * pad}), max_attempts=3,
                  run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-", resource_key="", limits="",
                  priority=priority)


def claim_once(project: Project, n: int, base: str) -> list[Any]:
    return list(project.runtime.scripts.claim(project.keys(), n=n, start=0, lease_ms=60_000, token_base=base,
                                              dead_ttl_ms=10**9, done_ttl_ms=10**9))


def reply_bytes(reply: list[Any]) -> int:
    return sum(len(v) for v in reply[2:] if isinstance(v, bytes | str))


def test_a_claim_stops_at_its_byte_bound_and_leaves_the_rest_queued_in_order(project: Project) -> None:
    """20 jobs of 1 MB, a claim of 20: the first PER_CALL come back (under the bound), the
    call says BOUNDED, and the rest wait in ready as they were: in order, no claim, no
    lease, no state written. The next calls take them in FIFO order."""
    r, k = project.runtime.redis, project.keys()
    ids = [f"j{i:02d}" for i in range(20)]
    project.runtime.scripts.enqueue(k, [big(i) for i in ids])
    reply = claim_once(project, 20, "w.1")
    got = [reply[i] for i in range(2, len(reply), CLAIM_FIELDS)]
    assert got == ids[:PER_CALL]
    assert reply[1] == BOUNDED
    assert reply_bytes(reply) <= CLAIM_BYTES
    rest = ids[PER_CALL:]
    assert r.lrange(k.ready, 0, -1)[::-1] == rest  # (the consumer end is the tail)
    assert r.hmget(k.claims, rest) == [None] * len(rest)
    assert r.zmscore(k.leases, rest) == [None] * len(rest)
    assert r.exists(*(f"{k.job_prefix}{i}:s" for i in rest)) == 0
    order: list[str] = []
    for call in range(2, 10):
        reply = claim_once(project, 20, f"w.{call}")
        assert reply_bytes(reply) <= CLAIM_BYTES
        order += [reply[i] for i in range(2, len(reply), CLAIM_FIELDS)]
        if reply[1] != BOUNDED:
            break
    assert order == rest
    assert r.llen(k.ready) == 0
    assert_no_job_in_two_structures(project)


def test_the_first_job_is_claimed_whatever_its_size_and_small_ones_are_not_bounded(project: Project) -> None:
    """A job alone past the bound is still claimed (it was accepted at enqueue), and 500
    small jobs come in one call: the bound is of bytes, not of count."""
    k = project.keys()
    project.runtime.scripts.enqueue(k, [big("huge", pad=CLAIM_BYTES + 1000), big("next")])
    reply = claim_once(project, 5, "w.1")
    assert [reply[i] for i in range(2, len(reply), CLAIM_FIELDS)] == ["huge"] and reply[1] == BOUNDED
    reply = claim_once(project, 5, "w.2")
    assert [reply[i] for i in range(2, len(reply), CLAIM_FIELDS)] == ["next"] and reply[1] == 0
    project.runtime.scripts.enqueue(k, [big(f"s{i}", pad=100) for i in range(500)])
    reply = claim_once(project, 500, "w.3")
    assert (len(reply) - 2) // CLAIM_FIELDS == 500 and reply[1] == 0


def test_a_bounded_claim_puts_prioritised_jobs_back_in_their_places(project: Project) -> None:
    """Priority jobs past the bound go back to the priority set with their scores: the
    next calls take them before the plain jobs, highest first, FIFO within one."""
    k = project.keys()
    plain = [f"a{i}" for i in range(4)]
    p5 = [f"p5_{i}" for i in range(PER_CALL)]
    p9 = [f"p9_{i}" for i in range(PER_CALL)]
    project.runtime.scripts.enqueue(k, [big(i) for i in plain] + [big(i, priority=5) for i in p5]
                                    + [big(i, priority=9) for i in p9])
    order: list[str] = []
    for call in range(10):
        reply = claim_once(project, 40, f"w.{call}")
        assert reply_bytes(reply) <= CLAIM_BYTES
        order += [reply[i] for i in range(2, len(reply), CLAIM_FIELDS)]
        if reply[1] != BOUNDED:
            break
    assert order == p9 + p5 + plain


# Each call records, per job, its claim entry as Redis holds it while the handler runs.
BATCHED = '''
import json, os, redis
QUEUE = "fast"
ISOLATION = "{isolation}"
BATCH = {{"size": 40, "wait": 0.5}}
TIMEOUT = 60  # (a loaded host moves 40 MB to a child slowly)

def handle_batch(payloads, ctx):
    r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    claims = r.hmget("{prefix}:{{fast}}:claims", [j.id for j in ctx.jobs])
    with open(os.path.join(os.environ["RECORD_DIR"], "runs.jsonl"), "a") as f:
        for j, c, p in zip(ctx.jobs, claims, payloads):
            f.write(json.dumps({{"id": j.id, "claim": c, "bytes": len(p["pad"])}}) + "\\n")
    return None
'''

PLAIN = '''
import json, os
QUEUE = "fast"
TIMEOUT = 60

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "runs.jsonl"), "a") as f:
        f.write(json.dumps({"id": ctx.job_id, "claim": ctx.token, "bytes": len(payload["pad"])}) + "\\n")
'''


def runs(project: Project) -> list[dict[str, Any]]:
    p = project.records / "runs.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def claim_call(entry: str) -> str:
    """The claim call a job came in: its token without the index ("<worker>.<call>")."""
    return entry.split()[0].rsplit(":", 1)[0]


def check_every_job_once_and_calls_bounded(project: Project, ids: list[str]) -> dict[str, int]:
    client = project.client
    wait_for(lambda: all(client.get(i).status == "done" for i in ids), timeout=120, what="every big job done")
    got = runs(project)
    assert sorted(r["id"] for r in got) == sorted(ids), "every job run exactly once"
    per_call = Counter(claim_call(r["claim"]) for r in got)
    sent = {c: sum(r["bytes"] for r in got if claim_call(r["claim"]) == c) for c in per_call}
    assert max(sent.values()) <= CLAIM_BYTES, per_call
    assert max(per_call.values()) <= PER_CALL, per_call
    return dict(per_call)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_batch_of_big_jobs_is_gathered_from_bounded_claims(project: Project, isolation: str) -> None:
    """40 jobs of 1 MB queued for a BATCH function of size 40 (whose claims ask for 40):
    no claim call sends more than CLAIM_BYTES of them, and every job is done once."""
    project.write_config(vt=30, concurrency=2)
    project.add_function("bulk", textwrap.dedent(BATCHED.format(isolation=isolation, prefix=project.prefix)))
    ids = [e.id for e in project.client.enqueue_many([Request("bulk", {"n": i, "pad": "p" * PAD})
                                                      for i in range(40)])]
    project.spawn_worker("fast")
    per_call = check_every_job_once_and_calls_bounded(project, ids)
    assert len(per_call) >= 40 // PER_CALL


def test_a_deep_prefetch_of_big_jobs_is_claimed_in_bounded_calls(project: Project) -> None:
    """A plain queue with a prefetch of 64: 40 jobs of 1 MB come in calls of at most
    CLAIM_BYTES, each job run once."""
    project.write_config(vt=30, concurrency=2, prefetch=64, batch=64)
    project.add_function("plainbig", PLAIN)
    ids = [e.id for e in project.client.enqueue_many([Request("plainbig", {"n": i, "pad": "p" * PAD})
                                                      for i in range(40)])]
    project.spawn_worker("fast")
    check_every_job_once_and_calls_bounded(project, ids)


def test_jobs_left_by_a_bounded_claim_are_claimed_without_waiting_for_a_wake_up(project: Project) -> None:
    """The wake-up of the enqueue is gone (another worker took it): the jobs a bounded
    claim left in ready are claimed by the calls that follow at once, none sent behind a
    wait on the notify list (which no enqueue would end, nor any other: a second each)."""
    project.write_config(vt=30, concurrency=2, prefetch=64, batch=64)
    project.add_function("plainbig", PLAIN)
    r, k = project.runtime.redis, project.keys()
    ids = [e.id for e in project.client.enqueue_many([Request("plainbig", {"n": i, "pad": "p" * PAD})
                                                      for i in range(40)])]
    r.delete(k.notify)
    r.config_resetstat()
    project.spawn_worker("fast")
    wait_for(lambda: r.llen(k.ready) == 0, timeout=60, what="every job claimed")
    waits = r.info("commandstats").get("cmdstat_blpop", {}).get("calls", 0)
    # (one may follow the last claim, which found the queue empty)
    assert waits <= 1, f"{waits} claim(s) waited for a wake-up with jobs in ready"
    check_every_job_once_and_calls_bounded(project, ids)


def test_partitions_on_a_cluster_are_claimed_in_bounded_calls(tmp_path: Any, cluster: list[Server]) -> None:  # noqa: F811
    """A queue of 3 partitions on a Redis Cluster (claims in flight per master): 48 jobs
    of 1 MB, about 16 a partition, each partition's claims bounded, every job run once."""
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in cluster[:2])
    p = make_project(tmp_path / "p", Endpoint(url))  # type: ignore[arg-type]
    try:
        p.write_config(vt=30, fast="partitions = 3", concurrency=2, prefetch=64, batch=64)
        p.add_function("plainbig", PLAIN)
        # (in calls of 4 MB: a loaded host moves 48 MB slower than the cluster's node wait)
        ids = [e.id for e in p.client.enqueue_many([Request("plainbig", {"n": i, "pad": "p" * PAD})
                                                    for i in range(48)], batch=4)]
        p.spawn_worker("fast")
        check_every_job_once_and_calls_bounded(p, ids)
    finally:
        p.stop_all()
        if p._runtime is not None:
            p._runtime.close()
