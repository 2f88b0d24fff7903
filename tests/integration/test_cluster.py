"""Redis Cluster: a real local 3-master cluster (Debian's redis-server, created with
``redis-cli --cluster create``). Every key of a queue hashes to one slot, so every script
is single-slot; script calls, pipelines (Batch), the client and real workers run on it
via ``redis+cluster://``."""

from __future__ import annotations

import time

import clusterkit
import pytest
import redis
from clusterkit import CLUSTER_MASTERS

from runner.client import Request
from runner.errors import NotReplicated
from runner.store.guard import redis_risks
from runner.store.keys import for_queue
from runner.store.scripts import STAGE_OVER, Ack, Followup, NewJob
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, assert_no_job_in_two_structures, wait_for

# The local cluster and a project on it (clusterkit.py), for every test here.
cluster, cproject = clusterkit.cluster, clusterkit.cproject


def test_client_is_a_cluster_client(cproject: Project) -> None:
    from redis.cluster import RedisCluster

    assert isinstance(cproject.runtime.redis, RedisCluster)
    assert len(cproject.runtime.redis.get_primaries()) == CLUSTER_MASTERS


def test_every_key_of_a_queue_is_in_one_slot(cproject: Project) -> None:
    """The queue's hash tag puts its lists, sets, counters, records, idempotency keys and
    limit keys (holders, waiter lists, the sweep's index) in one slot; two queues may live
    on different masters."""
    r = cproject.runtime.redis
    for q in ("fast", "slow"):
        k = for_queue(cproject.prefix, q)
        keys = [k.ready, k.leases, k.claims, k.done_meta, k.done(0), k.done(0) + ":log", k.res_prefix + "abc",
                k.census, k.scheduled, k.dead, k.notify, k.stats, k.throughput(1), k.job("abc"),
                k.state("abc"), k.idem("record", "user:7"), k.limit("r:res:1"), k.limit("r:res:1") + ":w",
                k.limwait]
        slots = {r.keyslot(key) for key in keys}
        assert len(slots) == 1, (q, slots)


def test_a_cross_slot_script_is_refused(cproject: Project) -> None:
    """Why the hash tag matters: the same script over keys of two queues is refused."""
    r = cproject.runtime.redis
    fast, slow = for_queue("x", "fast"), for_queue("x", "slow")
    if r.keyslot(fast.ready) == r.keyslot(slow.ready):
        pytest.skip("both queues hash to one slot")
    with pytest.raises(redis.exceptions.RedisClusterException):
        r.eval("return 1", 2, fast.ready, slow.ready)




def test_scripts_and_batches_run_and_reload_after_a_script_flush(cproject: Project) -> None:
    """Scripts.call and a Batch (non-transactional cluster pipeline) work, on the clock of
    the master that holds the queue (TIME inside the script); after SCRIPT FLUSH on every
    master they answer NOSCRIPT and are loaded again transparently."""
    rt = cproject.runtime
    sc, k = rt.scripts, rt.keys["fast"]
    before = int(time.time() * 1000)
    jobs = [NewJob(f"j{i}", "record", 1, '{"n":1}', 3, 0, 0, "", "-", "", "") for i in range(3)]
    assert [int(x) for x in sc.enqueue(k, jobs)[::3]] == [1, 1, 1]
    rt.redis.execute_command("SCRIPT FLUSH", target_nodes=rt.redis.PRIMARIES)
    reply = sc.claim(k, n=3, start=3, lease_ms=5000, token_base="t", dead_ttl_ms=60_000, done_ttl_ms=60_000)
    now, claimed = int(reply[0]), reply[2:]
    assert len(claimed) == 3 * CLAIM_FIELDS
    assert abs(now - before) < 60_000  # the node's clock, not a test clock
    assert int(rt.redis.zscore(k.leases, claimed[0]) or 0) == now + 5000
    rt.redis.execute_command("SCRIPT FLUSH", target_nodes=rt.redis.PRIMARIES)
    batch = sc.batch()
    sc.start(k, [(claimed[0], claimed[1])], pipe=batch)
    sc.ack(k, [Ack(claimed[i], claimed[i + 1], "", "{}", "") for i in range(0, 2 * CLAIM_FIELDS, CLAIM_FIELDS)], 60_000,
           pipe=batch)
    sc.release(k, [(claimed[2 * CLAIM_FIELDS], claimed[2 * CLAIM_FIELDS + 1])], pipe=batch)
    sc.renew(rt.keys["slow"], [("nope", "t:0")], 5000, pipe=batch)  # another slot, same pipeline
    replies = batch.execute()
    assert [[int(c) for c in r] for r in replies] == [[0], [1, 1], [1], [-1]]
    assert_no_job_in_two_structures(cproject)


def test_a_look_at_a_partition_loads_its_scripts_in_one_more_round_trip(cproject: Project) -> None:
    """The scheduler's look (Transport.gather_on_node) on a master whose script cache is
    empty (a worker's first look at it, or after SCRIPT FLUSH) answers every call: the
    scripts answered NOSCRIPT ran nowhere and go again by their source, behind a load,
    in the same bounded call, and the next look finds them loaded. Before, such a look
    answered None and each call went on its own (a round trip or two each, on a slow
    master all of them ahead of its due jobs' promote)."""
    rt = cproject.runtime
    sc, k = rt.scripts, rt.keys["fast"]
    sc.enqueue(k, [NewJob("due", "record", 1, '{"n":1}', 3, 0, 0, "", "-", "", "")])
    r = rt.redis
    r.zadd(k.scheduled, {"due": 1})  # (due long ago: a job the promote moves)
    r.lrem(k.ready, 0, "due")
    node = r.get_node_from_key(k.ready)
    r.execute_command("SCRIPT FLUSH", target_nodes=r.PRIMARIES)
    calls = [sc.promote_call(k, 100), sc.reclaim_call(k, 100, 60_000), ("LLEN", k.outbox)]
    replies = sc.gather_on_node(k.ready, calls, "a look")
    assert replies is not None
    assert int(replies[0][0]) == 1 and [int(x) for x in replies[1][:2]] == [0, 0] and int(replies[2]) == 0
    assert r.lrange(k.ready, 0, -1) == ["due"] and r.zcard(k.scheduled) == 0
    assert r.execute_command("SCRIPT EXISTS", sc.shas["promote"], sc.shas["reclaim"], target_nodes=node) == [1, 1]
    assert sc.gather_on_node(k.ready, calls, "a look") is not None


def test_workers_run_both_queues_on_the_cluster(cproject: Project) -> None:
    """A real worker on ``redis+cluster://``: jobs of both queues run once and end done;
    a worker killed after its handler is reclaimed by the scheduler on the cluster."""
    p = cproject
    p.write_config(vt=1)
    c = p.client
    fast = [c.enqueue("record", {"n": i}).id for i in range(20)]
    slow = [c.enqueue("slow", {"seconds": 0.05}).id for _ in range(3)]
    # The worker dies after its 20th handler returns, before that job's ack.
    w = p.spawn_worker("fast", env={"RUNNER_FAULT": "after_handler", "RUNNER_FAULT_AFTER": "19"})
    p.spawn_worker("slow")
    assert c.wait(slow[0], timeout_s=10).status == "done"
    assert w.wait(timeout=20) == -9
    p.spawn_worker("fast")
    for job_id in [*fast, *slow]:
        assert c.wait(job_id, timeout_s=20).status == "done", job_id
    runs = [len(p.runs(i)) for i in fast]
    assert all(1 <= n <= 2 for n in runs) and runs.count(2) >= 1
    stats = c.stats()
    assert stats["fast"]["ready"] == 0 and stats["slow"]["ready"] == 0
    assert_no_job_in_two_structures(p)
    assert_no_job_in_two_structures(p, "slow")


def test_guard_reads_cluster_settings(cproject: Project) -> None:
    assert isinstance(redis_risks(cproject.runtime.redis), list)


PARENT = '''
QUEUE = "fast"

def handle(payload, ctx):
    return {"children": [ctx.enqueue("leaf_slow", {"parent": ctx.job_id, "i": i}).id for i in range(2)]}
'''
LEAF = '''
import os
QUEUE = "slow"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], f"leaf-{payload['parent']}-{payload['i']}"), "a") as f:
        f.write(ctx.job_id + "\\n")
'''


def test_a_cross_queue_followup_arrives_once_with_the_relay_killed(cproject: Project) -> None:
    """Parents on `fast` enqueue two follow-ups each to a function on `slow`, a queue on
    another master: the acks write them to fast's outbox, and the relay moves them across
    slots. One worker is SIGKILLed just before its first relay, the next just after its
    relay placed them (before it took them off the outbox); a third finishes. Every
    follow-up runs exactly once, under the id its parent was given."""
    p = cproject
    for name, src in (("parent", PARENT), ("leaf_slow", LEAF)):
        (p.root / "functions" / f"{name}.py").write_text(src)
        (p.root / "schemas" / name).mkdir(exist_ok=True)
        (p.root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    p.write_config(vt=1, concurrency=2)
    r = p.runtime.redis
    fast, slow = p.keys("fast"), p.keys("slow")
    if r.nodes_manager.get_node_from_slot(r.keyslot(fast.ready)).name == \
            r.nodes_manager.get_node_from_slot(r.keyslot(slow.ready)).name:
        pytest.skip("fast and slow hash to one master")
    c = p.client
    parents = [c.enqueue("parent", {"n": i}).id for i in range(6)]
    w1 = p.spawn_worker("fast", env={"RUNNER_FAULT": "before_relay"})
    assert w1.wait(timeout=30) == -9
    assert r.llen(fast.outbox) >= 2  # acks landed; their follow-ups wait in the outbox
    w2 = p.spawn_worker("fast", env={"RUNNER_FAULT": "after_relay"})
    assert w2.wait(timeout=30) == -9
    assert r.llen(slow.ready) >= 2 and r.llen(fast.outbox) >= 2  # placed, not yet removed
    p.spawn_worker("fast", "slow")
    for pid in parents:
        assert c.wait(pid, timeout_s=30).status == "done", pid
    kids = {pid: c.get(pid).as_dict()["result"]["children"] for pid in parents}
    wait_for(lambda: r.llen(fast.outbox) == 0, timeout=20, what="the outbox drained")
    for pid, ids in kids.items():
        for i, kid in enumerate(ids):
            assert c.wait(kid, timeout_s=30).status == "done", kid
            ran = (p.records / f"leaf-{pid}-{i}").read_text().split()
            assert ran == [kid], (pid, i, ran)
    assert_no_job_in_two_structures(p)
    assert_no_job_in_two_structures(p, "slow")

FAN = """
QUEUE = "fast"


def handle(payload, ctx):
    for i in range(payload["n"]):
        ctx.enqueue("noop", {"i": i})
    return {"n": payload["n"]}
"""


def test_a_big_fan_out_is_staged_committed_and_relayed_on_the_cluster(cproject: Project) -> None:
    """A run with more follow-ups than STAGE_OVER on a partitioned queue of the cluster:
    its stage is written (through the script transport), its ack commits it, and the
    relay places every follow-up once. Before, the stage went out as EVAL on the client's
    own pipeline, which on Redis Cluster takes no script: a TypeError at every ack, the
    run retried until dead and none of its follow-ups ran."""
    p = cproject
    (p.root / "functions" / "fan.py").write_text(FAN)
    (p.root / "schemas" / "fan").mkdir()
    (p.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    p.write_config(fast="partitions = 3")
    n = STAGE_OVER + 100
    c = p.client
    parent = c.enqueue("fan", {"n": n}).id
    w = p.spawn_worker("fast")
    assert c.result(parent, 60) == {"n": n}
    for i in range(n):
        assert c.wait(f"{parent}.{i}", timeout_s=30).status == "done", i
    log = (p.root / "worker-0.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert w.poll() is None


def test_a_staged_ack_and_its_relay_on_one_partition_of_the_cluster(cproject: Project) -> None:
    """The scripts themselves: the ack of a run past STAGE_OVER commits its stage (one
    entry on the outbox), and the relay places each follow-up once, in batches."""
    import json

    from runner.worker import relay

    rt, k = cproject.runtime, cproject.keys()
    parent = cproject.client.enqueue("record", {"n": 1}).id
    reply = list(rt.scripts.claim(k, n=1, start=1, lease_ms=60_000, token_base="w.1", dead_ttl_ms=10**9,
                                  done_ttl_ms=10**9))
    assert len(reply) == 2 + CLAIM_FIELDS
    n = STAGE_OVER * 2 + 7
    follow = tuple(Followup("fast", NewJob(f"{parent}.{i}", "noop", 1, json.dumps({"i": i}), 3, 0, 0, "", "-",
                                           "", "")) for i in range(n))
    assert rt.scripts.ack(k, [Ack(parent, reply[3], "null", "record|1", "", 0, follow)], 60_000) == [1]
    r = rt.redis
    assert r.llen(k.outbox) == 1
    for _ in range(100):
        if not r.llen(k.outbox):
            break
        relay.drain(rt, k)
    assert r.llen(k.outbox) == 0 and r.llen(k.ready) == n
    assert all(r.exists(k.job(f"{parent}.{i}")) for i in (0, n // 2, n - 1))


def test_wait_replicas_waits_on_the_master_that_holds_the_queue(cproject: Project) -> None:
    """With wait_replicas on Redis Cluster the WAIT follows the script on a connection of
    the master that holds the queue's slot (a WAIT anywhere else confirms nothing). This
    cluster has no replicas, so every enqueue path answers NotReplicated with 0 of 1, and
    the job is on its master: a single enqueue, a stream, and a two-queue round trip."""
    p = cproject
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace("[redis]\n", "[redis]\nwait_replicas = 1\nwait_timeout = 0.05\n", 1))
    p._runtime = None
    c = p.client
    with pytest.raises(NotReplicated) as one:
        c.enqueue("record", {"n": 1})
    assert (one.value.acked, one.value.wanted) == (0, 1)
    assert c.get(one.value.job_ids[0]).status == "queued"
    with pytest.raises(NotReplicated) as many:
        c.enqueue_many([Request("record", {"n": i}) for i in range(3)])
    assert len(many.value.job_ids) == 3
    answers = c._send_prepared([c.prepare(Request("record", {"n": 2})), c.prepare(Request("slow", {"seconds": 0}))])
    assert all(isinstance(a, NotReplicated) for a in answers)
    assert c.get(answers[1].job_ids[0]).queue == "slow"  # type: ignore[union-attr]
    waits = sum(int(n.get("cmdstat_wait", {}).get("calls", 0))
                for n in p.runtime.redis.info("commandstats", target_nodes=p.runtime.redis.PRIMARIES).values())
    assert waits >= 1 + 1 + 2


def test_guard_counts_the_replicas_of_every_master(cproject: Project) -> None:
    """On a cluster without replicas, wait_replicas = 1 is flagged (the fewest of any master)."""
    risks = redis_risks(cproject.runtime.redis, wait_replicas=1)
    assert any("0 connected replica(s)" in r for r in risks), risks


def test_concurrent_round_trips_to_a_slow_master_are_not_queued_behind_each_other(cproject: Project) -> None:
    """Each caller sends its own round trip's calls to the masters at once: six threads
    whose batches all wait on slow masters (a WAIT short of replicas, 0.3 s each) take
    about as long each as one alone, not six times as long behind a shared sending lane
    per master."""
    import threading

    p = cproject
    p.write_config(fast="partitions = 6")
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace("[redis]\n", "[redis]\nwait_replicas = 1\nwait_timeout = 0.3\n", 1))
    p._runtime = None
    c = p.client
    def send(tag: str) -> float:
        s = time.monotonic()
        with pytest.raises(NotReplicated):  # every master is short of its replica
            c.enqueue_many([Request("record", {"n": i}, idempotency_key=f"{tag}{i}") for i in range(60)])
        return time.monotonic() - s

    send("warm")
    one_s = send("one")
    took: list[float] = []

    def batch(t: int) -> None:
        took.append(send(f"t{t}i"))

    threads = [threading.Thread(target=batch, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(took) == 6
    assert max(took) < 2.5 * one_s + 0.3, f"one batch alone {one_s:.2f} s; six at once: {sorted(took)}"


def test_the_consoles_actions_on_a_partitioned_queue_of_the_cluster(cproject: Project) -> None:
    """On 6 partitions over 3 masters: the worker is on the roster (its own slot), a run now
    moves delayed jobs of every partition to ready in their own slots, and the search by
    idempotency key finds a dead job wherever it lives."""
    from runner.client.inspecting import find

    p = cproject
    p.write_config(fast="partitions = 6")
    p.add_function("doomed", 'from runner import PermanentFailure\nQUEUE = "fast"\nIDEMPOTENCY_KEY = "{k}"\n\n\n'
                   'def handle(payload, ctx):\n    raise PermanentFailure("never")\n',
                   (p.root / "schemas" / "idem" / "v1.json").read_text())
    c = p.client
    delayed = [c.enqueue("record", {"n": i}, delay=3600).id for i in range(12)]
    assert len({find(c, i)[0].tag for i in delayed}) >= 3
    dead = {k: c.enqueue("doomed", {"k": k}).id for k in "abcdef"}
    w = p.spawn_worker("fast")
    wait_for(lambda: [x["pid"] for x in c.workers()] == [w.pid], timeout=20, what="the worker on the roster")
    assert [c.run_now(i) for i in delayed] == ["scheduled"] * len(delayed)
    for job_id in [*delayed, *dead.values()]:
        assert c.wait(job_id, timeout_s=20, statuses=("done", "dead")).status in ("done", "dead"), job_id
    assert all(c.get(i).status == "done" for i in delayed)
    for k, job_id in dead.items():
        assert [(j.id, j.status) for j in c.by_idempotency_key(k)] == [(job_id, "dead")]


def test_a_slot_being_migrated_is_an_outage_to_every_producer(cproject: Project) -> None:
    """While the queue's slot moves to another master (MIGRATING on its owner, IMPORTING on
    the other), the enqueue script, whose keys are partly there and partly not, gets
    TRYAGAIN until redis-py gives up ("TTL exhausted"): nothing ran, so every producer sees
    RedisUnavailable and HTTP a 503, and nothing is written. Once the slot is stable again,
    the same calls go through."""
    import asyncio

    import falcon.testing

    from runner.errors import RedisUnavailable
    from runner.web import create_app

    c = cproject.client
    c.enqueue("record", {"n": 0})
    k = for_queue(cproject.prefix, "fast")
    ports = [int(s.rsplit(":", 1)[1]) for s in cproject.server.url.split("//", 1)[1].split(",")]
    seed = redis.Redis(port=ports[0], decode_responses=True)
    slot = int(seed.cluster("keyslot", k.ready))
    owner = next(int(row[2][1]) for row in seed.execute_command("CLUSTER", "SLOTS")
                 if int(row[0]) <= slot <= int(row[1]))
    other = next(p for p in ports if p != owner)
    src, dst = redis.Redis(port=owner, decode_responses=True), redis.Redis(port=other, decode_responses=True)
    before = int(src.cluster("countkeysinslot", slot))
    web = falcon.testing.TestClient(create_app(cproject.runtime))
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", dst.cluster("myid"))
    try:
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.cluster("myid"))
        calls = {
            "enqueue": lambda: c.enqueue("record", {"n": 1}),
            "aenqueue": lambda: asyncio.run(c.aenqueue("record", {"n": 2})),
            "enqueue_many": lambda: c.enqueue_many([Request("record", {"n": 3})]),
            "enqueue_all": lambda: c.enqueue_all([Request("record", {"n": 4})]),
            "group": lambda: c.group([Request("record", {"n": 8})], Request("record", {"n": 9})),
        }
        for name, call in calls.items():
            try:
                call()
            except RedisUnavailable as exc:
                assert str(exc).startswith("Redis Cluster cannot serve this now"), (name, exc)
            else:
                pytest.fail(f"{name} went through on a slot being migrated")
        r = web.simulate_post("/jobs/record", json={"n": 5})
        assert r.status_code == 503, (r.status_code, r.text)
        assert int(src.cluster("countkeysinslot", slot)) == before
    finally:
        for node in (src, dst):
            node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    assert c.enqueue("record", {"n": 6}).id
    assert web.simulate_post("/jobs/record", json={"n": 7}).status_code == 202


def test_a_dead_worker_s_roster_entry_is_pruned_on_the_cluster(cproject: Project) -> None:
    """A worker died without leaving (its entry went stale): a live worker's heartbeat,
    winning the pruning bid, deletes the entry on the cluster, and its scheduler logs no
    error. Before, the pruning sent its compare-and-delete through a cluster pipeline,
    which takes no EVAL: a TypeError at every bid ("scheduler: unexpected error" with a
    traceback), the rest of that tick skipped, and the dead entry kept for ever."""
    import json

    from runner.store import roster

    p = cproject
    r, prefix = p.runtime.redis, p.runtime.config.redis.prefix
    now = roster.server_ms(r)
    dead = {"id": "gone:2:bb", "host": "h", "pid": 2, "queues": ["fast"], "functions": {"record": 1},
            "started_ms": now - 60_000, "seen_ms": now - 30_000, "ttl_ms": 5_000}
    r.hset(roster.key(prefix), "gone:2:bb", json.dumps(dead))
    w = p.spawn_worker("fast", env={"RUNNER_TEST_ROSTER": "0.2,5"})
    wait_for(lambda: [x["pid"] for x in p.client.workers()] == [w.pid], timeout=20, what="the worker on the roster")
    wait_for(lambda: "gone:2:bb" not in r.hkeys(roster.key(prefix)), timeout=5, interval=0.1,
             what="the dead worker's entry pruned")
    log = (p.root / "worker-0.log").read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    assert w.poll() is None


def test_an_enqueue_on_the_cluster_is_sent_by_its_caller(cproject: Project) -> None:
    """One-at-a-time enqueues on Redis Cluster (keyless, over 3 partitions, so every
    master), a script flush among them, go out on the calling thread, bounded by their
    socket's timeout: no thread of the pool is started for them. Before, each call was
    handed to a pool thread that the caller waited on (about 30% of a call's time)."""
    import threading

    from runner.client.inspecting import find

    p = cproject
    p.write_config(fast="partitions = 3")
    c = p.client
    rt = p.runtime
    before = {t.name for t in threading.enumerate()}
    ids = [c.enqueue("record", {"n": i}).id for i in range(30)]
    for node in rt.redis.get_primaries():
        rt.redis.get_redis_connection(node).script_flush()
    ids += [c.enqueue("record", {"n": i}).id for i in range(30, 60)]
    started = {t.name for t in threading.enumerate()} - before
    assert not [t for t in started if t.startswith("redis-send")], started
    assert len(set(ids)) == 60
    assert len({find(c, i)[0].tag for i in ids}) == 3
