"""``[redis] wait_replicas``: an enqueue is answered only once that many replicas hold it.

A master and one replica, started by the test. With the replica up, every enqueue path
(single, combined, many, all, asyncio, HTTP, CLI, a schedule's trigger) returns with the
job already on the replica; with the replica stopped (SIGSTOP) it fails within the
timeout with NotReplicated (HTTP 503 not-replicated, CLI exit 3), the job written to the
master. With ``wait_replicas = 0`` no WAIT is sent at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
import redis
from click.testing import CliRunner
from schedulekit import add_function

from runner.cli import cli
from runner.client import Request
from runner.errors import NotReplicated, SignalPending
from runner.store.embedded import Server, bundled_binary, debian_binary
from runner.web import create_app

from conftest import Project, make_project, wait_for

TIMEOUT_S = 0.25


@dataclass
class Pair:
    master: Server
    replica: Server

    def client(self, server: Server) -> Any:
        return redis.Redis(port=server.port, decode_responses=True)

    def calls(self, command: str) -> int:
        """How often the master has run ``command`` (INFO commandstats)."""
        c = self.client(self.master)
        try:
            return int(c.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))
        finally:
            c.close()

    def waits(self) -> int:
        return self.calls("wait")

    def reset_counts(self) -> None:
        c = self.client(self.master)
        c.config_resetstat()
        c.close()

    @contextlib.contextmanager
    def replica_stopped(self) -> Iterator[None]:
        """The replica's process stopped (SIGSTOP): connected, but it acknowledges nothing."""
        assert self.replica.proc is not None
        os.kill(self.replica.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.replica.proc.pid, signal.SIGCONT)


def _online(master: Server) -> bool:
    c = redis.Redis(port=master.port, decode_responses=True)
    try:
        info = c.info("replication")
        return info.get("connected_slaves") == 1 and info["slave0"]["state"] == "online"
    except (redis.RedisError, KeyError):
        return False
    finally:
        c.close()


def _caught_up(master: Server) -> bool:
    """The replica has acknowledged every write of the master."""
    c = redis.Redis(port=master.port, decode_responses=True)
    try:
        c.set("probe", 1)
        return int(c.wait(1, 100)) == 1
    finally:
        c.close()


def _pair(root: Path, binary: str) -> Iterator[Pair]:
    # No 5 s wait for more replicas before the first full sync.
    master = Server(root / "master", binary=binary, extra=["--repl-diskless-sync-delay", "0"]).start()
    replica = Server(root / "replica", binary=binary,
                     extra=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        # Online is not enough: a replica's first acknowledgement comes up to a second later.
        wait_for(lambda: _online(master) and _caught_up(master), timeout=20, interval=0.05,
                 what="the replica to sync and acknowledge")
        yield Pair(master, replica)
    finally:
        if replica.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(replica.proc.pid, signal.SIGCONT)
        replica.stop(kill=True)
        master.stop(kill=True)


@pytest.fixture(params=["valkey", "redis7"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    binary = bundled_binary() if request.param == "valkey" else debian_binary()
    if binary is None:
        pytest.skip("Debian's redis-server is not installed here (apt-get install redis-server runs these)")
    yield from _pair(tmp_path / "servers", binary)


@pytest.fixture
def valkey_pair(tmp_path: Path) -> Iterator[Pair]:
    yield from _pair(tmp_path / "servers", bundled_binary())


def durable(p: Project, replicas: int, timeout_s: float = TIMEOUT_S) -> Project:
    """The project's runner.toml with wait_replicas and wait_timeout in [redis]."""
    path = p.root / "runner.toml"
    text = path.read_text().replace(
        "[redis]\n", f"[redis]\nwait_replicas = {replicas}\nwait_timeout = {timeout_s}\n", 1)
    path.write_text(text)
    if p._runtime is not None:
        p._runtime.close()
    p._runtime = None
    return p


@pytest.fixture
def rproject(tmp_path: Path, valkey_pair: Pair) -> Iterator[Project]:
    p = make_project(tmp_path / "p", valkey_pair.master)
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def cli_run(p: Project, *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["--config", str(p.root / "runner.toml"), *args],
                              env={**p.env, **(env or {})}, catch_exceptions=False)


def test_no_wait_is_sent_without_wait_replicas(rproject: Project, valkey_pair: Pair) -> None:
    """The default (wait_replicas = 0) sends no WAIT on any enqueue path: the master's
    command counters show scripts run and not one WAIT."""
    p = rproject
    c = p.client
    http = falcon.testing.TestClient(create_app(p.runtime))
    valkey_pair.reset_counts()
    c.enqueue("record", {"n": 1})
    c.enqueue_many([Request("record", {"n": i}) for i in range(5)])
    c.enqueue_all([Request("record", {"n": i}) for i in range(5)])
    asyncio.run(c.aenqueue("record", {"n": 2}))
    assert http.simulate_post("/jobs/record", json={"n": 3}).status_code == 202
    assert http.simulate_post("/jobs/record/batch", json=[{"n": 4}, {"n": 5}]).status_code == 202
    assert cli_run(p, "enqueue", "record", '{"n": 6}').exit_code == 0
    assert c.stats()["fast"]["ready"] == 16
    assert valkey_pair.calls("evalsha") >= 7 and valkey_pair.waits() == 0


def test_every_enqueue_path_returns_with_the_job_on_the_replica(tmp_path: Path, pair: Pair) -> None:
    """wait_replicas = 1, replica up: each path answers as usual, and the job is on the
    replica the moment the answer is back (WAIT confirmed it); one WAIT per script call,
    pipelined behind it. On Valkey 9 and Redis 7.0."""
    p = durable(make_project(tmp_path / "p", pair.master), 1, timeout_s=5)
    rep = pair.client(pair.replica)
    k = p.keys()
    c = p.client
    http = falcon.testing.TestClient(create_app(p.runtime))
    try:
        def on_replica(*ids: str) -> None:
            for job_id in ids:
                assert rep.exists(k.job(job_id)), job_id

        c.enqueue("record", {"n": 0})  # loads the script (its first call answers NOSCRIPT)
        before = pair.waits()
        on_replica(c.enqueue("record", {"n": 1}).id)
        assert pair.waits() == before + 1
        on_replica(*[j.id for j in c.enqueue_many([Request("record", {"n": i}) for i in range(250)])
                     if not isinstance(j, Exception)])
        on_replica(*[j.id for j in c.enqueue_all([Request("record", {"n": i}) for i in range(5)])])
        on_replica(asyncio.run(c.aenqueue("record", {"n": 2})).id)
        # One combined round trip for two queues: both scripts, then one WAIT.
        both = c._send_prepared([c.prepare(Request("record", {"n": 3})), c.prepare(Request("slow", {"seconds": 0}))])
        on_replica(both[0].id)  # type: ignore[union-attr]
        assert rep.exists(p.keys("slow").job(both[1].id))  # type: ignore[union-attr]
        r = http.simulate_post("/jobs/record", json={"n": 4})
        assert r.status_code == 202, r.text
        on_replica(r.json["id"])
        r = http.simulate_post("/jobs/record/batch", json=[{"n": 5}, {"n": 6}])
        assert r.status_code == 202, r.text
        on_replica(*[j["id"] for j in r.json["jobs"]])
        out = cli_run(p, "enqueue", "record", '{"n": 7}', "--json")
        assert out.exit_code == 0, out.output
        on_replica(json.loads(out.stdout)["id"])
        # 250 jobs stream as 3 calls of 100, each with its WAIT.
        assert pair.waits() >= before + 1 + 3 + 1 + 1 + 1 + 1 + 1 + 1
    finally:
        rep.close()
        if p._runtime is not None:
            p._runtime.close()


def test_a_stopped_replica_fails_the_enqueue_with_not_replicated(rproject: Project, valkey_pair: Pair) -> None:
    """Replica stopped: each enqueue path fails within about the timeout with NotReplicated
    naming its job, which is on the master (written, not confirmed). HTTP answers 503
    not-replicated with the job's id, never 202; the CLI exits 3. Once the replica is back,
    the same idempotency key answers with the same job: the retry was safe."""
    p = durable(rproject, 1)
    c = p.client
    http = falcon.testing.TestClient(create_app(p.runtime))
    with valkey_pair.replica_stopped():
        t0 = time.monotonic()
        with pytest.raises(NotReplicated) as err:
            c.enqueue("idem", {"k": "order-7", "v": 1})
        took = time.monotonic() - t0
        assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 2, took
        e = err.value
        assert (e.acked, e.wanted) == (0, 1) and len(e.job_ids) == 1
        assert "written to the Redis master" in str(e) and "idempotency key" in str(e)
        assert c.get(e.job_ids[0]).status == "queued"  # on the master
        first = e.job_ids[0]

        with pytest.raises(NotReplicated) as many:
            c.enqueue_many([Request("record", {"n": i}) for i in range(3)])
        assert len(many.value.job_ids) == 3
        with pytest.raises(NotReplicated):
            asyncio.run(c.aenqueue("record", {"n": 1}))

        r = http.simulate_post("/jobs/record", json={"n": 1})
        assert r.status_code == 503, r.text
        assert r.headers["Content-Type"] == "application/problem+json"
        body = r.json
        assert body["type"] == "urn:runner:problem:not-replicated" and body["status"] == 503
        assert body["replicas_acked"] == 0 and body["replicas_wanted"] == 1
        assert len(body["job_ids"]) == 1 and "Idempotency-Key" in body["detail"]
        assert r.headers["Retry-After"] == "1"
        assert c.get(body["job_ids"][0]).status == "queued"
        r = http.simulate_post("/jobs/record/batch", json=[{"n": 1}, {"n": 2}])
        assert r.status_code == 503 and len(r.json["job_ids"]) == 2, r.text

        out = cli_run(p, "enqueue", "record", '{"n": 1}', "--json")
        assert out.exit_code == 3, out.output
        assert json.loads(out.stdout)["kind"] == "NotReplicated"
        assert "not replicated" in out.stderr

    wait_for(lambda: _caught_up(valkey_pair.master), timeout=20, what="the replica back")
    again = c.enqueue("idem", {"k": "order-7", "v": 1})
    assert again.duplicate and again.id == first


def test_more_replicas_than_there_are(rproject: Project, valkey_pair: Pair) -> None:
    """wait_replicas = 2 with one replica: the one that did confirm is counted, the enqueue
    still fails; set through the environment (RUNNER_REDIS_WAIT_REPLICAS), which wins."""
    p = rproject
    env = {"RUNNER_REDIS_WAIT_REPLICAS": "2", "RUNNER_REDIS_WAIT_TIMEOUT": str(TIMEOUT_S)}
    out = cli_run(p, "enqueue", "record", '{"n": 1}', env=env)
    assert out.exit_code == 3 and "only 1 of 2 replica(s)" in out.stderr, out.output


def test_a_schedules_trigger_waits_too(rproject: Project, valkey_pair: Pair) -> None:
    """A schedule's tick goes through the same durable path: triggered by hand with the
    replica stopped, it is NotReplicated naming its job; with the replica up it returns."""
    add_function(rproject, "report", 'SCHEDULE = "0 * * * *"')
    p = durable(rproject, 1)
    assert p.client.trigger("report").status == "queued"
    with valkey_pair.replica_stopped(), pytest.raises(NotReplicated) as err:
        p.client.trigger("report")
    assert len(err.value.job_ids) == 1


def test_a_group_waits_too(rproject: Project, valkey_pair: Pair) -> None:
    """A group is an enqueue path like any other: with the replica up each of its writes is
    followed by a WAIT; with it stopped client.group raises NotReplicated naming every
    member and POST /groups answers 503 not-replicated, never 202 (the group is on the
    master, whole)."""
    p = durable(rproject, 1)
    c = p.client
    http = falcon.testing.TestClient(create_app(p.runtime))
    members = [Request("record", {"n": i}) for i in range(3)]
    c.group(members, then=Request("record", {"n": 9}))  # loads the script
    before = valkey_pair.waits()
    c.group(members, then=Request("record", {"n": 9}))
    assert valkey_pair.waits() == before + 1
    with valkey_pair.replica_stopped():
        with pytest.raises(NotReplicated) as err:
            c.group(members, then=Request("record", {"n": 9}))
        assert len(err.value.job_ids) == 3 and (err.value.acked, err.value.wanted) == (0, 1)
        # The client's (and so the CLI's) words agree with the HTTP answer's: no key to retry with.
        assert "takes no idempotency key" in str(err.value) and "same idempotency key" not in str(err.value)
        assert c.get(err.value.job_ids[0]).status == "queued"  # on the master
        body = {"members": [{"type": "record", "payload": {"n": 1}}] * 2, "then": {"type": "record", "payload": {}}}
        r = http.simulate_post("/groups", json=body)
        assert r.status_code == 503, r.text
        assert r.json["type"] == "urn:runner:problem:not-replicated" and len(r.json["job_ids"]) == 2
        assert "takes no Idempotency-Key" in r.json["detail"] and "Retry with the same" not in r.json["detail"]


CHARGE = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 200

def charge(ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "charge"), "a") as f:
        f.write(str(ctx.attempt) + "\\n")
    return "charged"

def handle(payload, ctx):
    got = ctx.step("charge", charge, ctx)
    with open(os.path.join(os.environ["RECORD_DIR"], "after"), "a") as f:
        f.write(str(ctx.attempt) + "\\n")
    return got
'''


def test_a_step_s_value_reaches_the_handler_only_once_a_replica_holds_its_record(
        rproject: Project, valkey_pair: Pair) -> None:
    """wait_replicas = 1, replica stopped: no step's value reaches the handler. The claim
    itself is not confirmed, so the job is not run at all (its jobs handed back; before,
    it ran, and its replay and step record failed NotReplicated, retried); once the
    replica is back, the job ends done with the step run once."""
    p = durable(rproject, 1)
    p.add_function("pay", CHARGE)
    c = p.client
    job = c.enqueue("pay", {}).id
    with valkey_pair.replica_stopped():
        valkey_pair.reset_counts()
        p.spawn_worker("fast")
        wait_for(lambda: valkey_pair.waits() >= 2, timeout=30, what="claims sent")
        time.sleep(0.5)
        assert not (p.records / "after").exists(), "a step's value reached the handler unconfirmed"
        assert not (p.records / "charge").exists(), "a job ran on a claim its replica did not confirm"
    assert c.wait(job, 60).as_dict()["status"] == "done"
    assert len((p.records / "charge").read_text().splitlines()) == 1
    assert len((p.records / "after").read_text().splitlines()) == 1


WAITER = '''
QUEUE = "fast"
MAX_ATTEMPTS = 200

def handle(payload, ctx):
    return ctx.wait_for_signal("go", timeout=3600)
'''


def test_a_signal_is_answered_only_once_a_replica_holds_it(rproject: Project, valkey_pair: Pair) -> None:
    """wait_replicas = 1, replica stopped: a signal (client, HTTP, CLI) is refused with
    NotReplicated (503 not-replicated, exit 3) naming the job and the signal, never
    answered "resumed"; once the replica is back the same signal answers SignalPending
    (the master kept it), and each job ends with its body."""
    p = durable(rproject, 1)
    p.add_function("waiter", WAITER)
    c = p.client
    jobs = [c.enqueue("waiter", {}).id for _ in range(3)]
    w = p.spawn_worker("fast")
    wait_for(lambda: all(c.get(j).status == "waiting" for j in jobs), timeout=30, what="the jobs to wait")
    w.kill()
    w.wait(10)
    http = falcon.testing.TestClient(create_app(p.runtime))
    with valkey_pair.replica_stopped():
        with pytest.raises(NotReplicated) as err:
            c.signal(jobs[0], "go", {"ok": 0})
        assert err.value.job_ids == [jobs[0]] and err.value.signal == "go"
        assert "signal 'go'" in str(err.value) and "Send it again" in str(err.value)
        r = http.simulate_post(f"/jobs/{jobs[1]}/signals/go", json={"ok": 1})
        assert r.status_code == 503, r.text
        assert r.json["type"] == "urn:runner:problem:not-replicated" and r.json["job_ids"] == [jobs[1]]
        out = cli_run(p, "signal", jobs[2], "go", '{"ok": 2}', "--json", "--key", "cli-1")
        assert out.exit_code == 3, out.output
        assert "'cli-1'" in out.output, out.output  # the key to send it again with
    wait_for(lambda: _caught_up(valkey_pair.master), timeout=20, what="the replica back")
    with pytest.raises(SignalPending):
        c.signal(jobs[0], "go", {"ok": 0})  # a new signal (another key) while it is unread
    assert c.signal(jobs[0], "go", {"ok": 0}, key=err.value.key) == "duplicate"  # as the error advises
    out = cli_run(p, "signal", jobs[2], "go", '{"ok": 2}', "--key", "cli-1")
    assert out.exit_code == 0 and "duplicate" in out.output, out.output
    p.spawn_worker("fast")
    for i, j in enumerate(jobs):
        assert c.wait(j, 60).as_dict()["result"] == {"ok": i}


WAIT_TWICE = '''
QUEUE = "fast"
MAX_ATTEMPTS = 200

def handle(payload, ctx):
    first = ctx.wait_for_signal("go", timeout=3600)
    second = ctx.wait_for_signal("go", timeout=3600)
    return {"first": first, "second": second}
'''


def _on_second_wait(c: Any, job: str) -> bool:
    view = c.get(job).as_dict()
    return view["status"] == "waiting" and len(view.get("steps") or []) == 2


def test_a_signal_sent_again_as_advised_is_never_delivered_twice(rproject: Project, valkey_pair: Pair) -> None:
    """A signal answered NotReplicated is on the master, and the job may read it before
    the caller hears back. Sent again once the replicas are back, as the error says (with
    the key it names: Client.signal(key=), the Idempotency-Key header), it is answered
    "duplicate" and delivered nothing, even to the job's next wait of that name; a new
    signal (another key) still reaches that wait."""
    p = durable(rproject, 1)
    p.add_function("twice", WAIT_TWICE)
    c = p.client
    jobs = [c.enqueue("twice", {}).id for _ in range(2)]
    p.spawn_worker("fast")
    wait_for(lambda: all(c.get(j).status == "waiting" for j in jobs), timeout=30, what="the jobs to wait")
    http = falcon.testing.TestClient(create_app(p.runtime))
    with valkey_pair.replica_stopped():
        with pytest.raises(NotReplicated) as err:
            c.signal(jobs[0], "go", {"n": 1})
        key = err.value.key
        assert key and key in str(err.value), str(err.value)
        r = http.simulate_post(f"/jobs/{jobs[1]}/signals/go", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
        assert r.status_code == 503 and r.json["key"] == "k-1", r.text
    wait_for(lambda: _caught_up(valkey_pair.master), timeout=20, what="the replica back")
    # Each job read the first send (it was on the master) and waits for "go" again.
    for j in jobs:
        wait_for(lambda j=j: _on_second_wait(c, j), timeout=60, what="the second wait")
    assert c.signal(jobs[0], "go", {"n": 1}, key=key) == "duplicate"
    r = http.simulate_post(f"/jobs/{jobs[1]}/signals/go", json={"n": 1}, headers={"Idempotency-Key": "k-1"})
    assert r.status_code == 200 and r.json["delivery"] == "duplicate" and r.json["duplicate"] is True, r.text
    assert _on_second_wait(c, jobs[0]) and _on_second_wait(c, jobs[1])  # nothing delivered
    assert c.signal(jobs[0], "go", {"n": 2}) == "resumed"
    r = http.simulate_post(f"/jobs/{jobs[1]}/signals/go", json={"n": 2}, headers={"Idempotency-Key": "k-2"})
    assert r.status_code == 202 and r.json["delivery"] == "resumed", r.text
    for j in jobs:
        assert c.wait(j, 60).as_dict()["result"] == {"first": {"n": 1}, "second": {"n": 2}}


def test_an_emit_short_of_replicas_names_its_jobs_and_exits_3(rproject: Project, valkey_pair: Pair) -> None:
    """wait_replicas = 2 with one replica: an emit is written and says so, naming every
    job it wrote (not "0 jobs"); `runner emit` exits 3, as `runner enqueue` does."""
    p = rproject
    p.add_function("on_order", 'TRIGGERS = ["order.created"]\n\ndef handle(payload, ctx):\n    return 1\n',
                   '{"type": "object"}')
    env = {"RUNNER_REDIS_WAIT_REPLICAS": "2", "RUNNER_REDIS_WAIT_TIMEOUT": str(TIMEOUT_S)}
    out = cli_run(p, "emit", "order.created", '{"n": 1}', env=env)
    assert out.exit_code == 3, out.output
    assert "only 1 of 2 replica(s)" in out.stderr and "job " in out.stderr, out.output
    job_id = out.stderr.split("job ", 1)[1].split()[0]
    assert p.client.get(job_id).as_dict()["type"] == "on_order"


def test_a_job_placed_from_an_outbox_leaves_it_only_once_a_replica_holds_it(rproject: Project,
                                                                           valkey_pair: Pair) -> None:
    """An event's job for another queue is placed from the home partition's outbox by the
    relay script, which waits for the replicas as an enqueue does: short of them, the
    entry stays in the (replicated) outbox, so a failover of the job's master loses
    nothing, and the relay places it again later, nothing twice."""
    p = durable(rproject, 2)
    sub = 'QUEUE = "{q}"\nTRIGGERS = ["order.made"]\n\ndef handle(payload, ctx):\n    return 1\n'
    p.add_function("a_home", sub.format(q="fast"), '{"type": "object"}')
    p.add_function("b_away", sub.format(q="slow"), '{"type": "object"}')
    with pytest.raises(NotReplicated):
        p.client.emit("order.made", {"n": 1})
    r = p.runtime.redis
    home, away = p.keys("fast"), p.keys("slow")
    assert r.llen(home.outbox) == 1  # kept until a replica confirms the job it placed
    assert r.llen(away.ready) == 1  # placed all the same: the relay places it once by its id
    from runner import outbox
    assert outbox.place(p.runtime, r.lrange(home.outbox, 0, -1)) == []
    assert r.llen(away.ready) == 1


def test_a_trigger_short_of_replicas_is_on_the_audit_trail(rproject: Project, valkey_pair: Pair) -> None:
    """POST /schedules/{name}/trigger with the replica stopped answers 503 not-replicated,
    and the trigger it wrote to the master is on the audit trail all the same (naming its
    job, marked unconfirmed): an operator's action that may have changed state is on
    record whatever the answer."""
    add_function(rproject, "report", 'SCHEDULE = "0 * * * *"')
    p = durable(rproject, 1)
    http = falcon.testing.TestClient(create_app(p.runtime))
    with valkey_pair.replica_stopped():
        r = http.simulate_post("/schedules/report/trigger")
        assert r.status_code == 503, r.text
        assert r.json["type"] == "urn:runner:problem:not-replicated" and len(r.json["job_ids"]) == 1
        job_id = r.json["job_ids"][0]
        assert "takes no Idempotency-Key" in r.json["detail"] and "Retry with the same" not in r.json["detail"]
        with pytest.raises(NotReplicated) as err:
            p.client.trigger("report")
        assert "takes no idempotency key" in str(err.value) and "same idempotency key" not in str(err.value)
    wait_for(lambda: _caught_up(valkey_pair.master), timeout=20, what="the replica back")
    entries = http.simulate_get("/audit").json["entries"]
    triggers = [e for e in entries if e["action"] == "trigger"]
    assert len(triggers) == 1, entries
    assert triggers[0]["job_id"] == job_id and triggers[0]["schedule"] == "report"
    assert triggers[0]["unconfirmed"] is True
    assert p.client.get(job_id).status == "queued"


def _all_done(c: Any, ids: list[str]) -> bool:
    return all(c.get(i).status == "done" for i in ids)


def test_a_worker_sends_no_wait_without_wait_replicas(rproject: Project, valkey_pair: Pair) -> None:
    """The default (wait_replicas = 0): a worker's claims and settlements send no WAIT (the
    master's command counters show scripts run and not one WAIT)."""
    p = rproject
    c = p.client
    ids = [c.enqueue("record", {"n": i}).id for i in range(20)]
    valkey_pair.reset_counts()
    p.spawn_worker("fast")
    wait_for(lambda: _all_done(c, ids), timeout=30, interval=0.05, what="every job done")
    assert valkey_pair.calls("evalsha") >= 2 and valkey_pair.waits() == 0


def test_a_worker_runs_nothing_its_replicas_do_not_confirm(rproject: Project, valkey_pair: Pair) -> None:
    """wait_replicas = 1: each claim and settlement carries its WAIT (in the same write),
    and a claim the replica does not confirm is not run: its jobs are handed back. With
    the replica stopped the worker runs nothing (before, it ran every job, and a failover
    then could wipe its claims and acks: the jobs ran again); once it is back, each job
    runs once."""
    p = durable(rproject, 1)
    c = p.client
    with valkey_pair.replica_stopped():
        ids: list[str] = []
        for i in range(5):
            try:
                ids.append(c.enqueue("record", {"n": i}).id)
            except NotReplicated as exc:  # (written to the master all the same)
                ids += exc.job_ids
        valkey_pair.reset_counts()
        p.spawn_worker("fast")
        wait_for(lambda: valkey_pair.waits() >= 2 or any(p.runs(i) for i in ids), timeout=30, interval=0.05,
                 what="claims sent")
        time.sleep(1.0)
        assert not any(p.runs(i) for i in ids), "a job ran on a claim its replica did not confirm"
    wait_for(lambda: _all_done(c, ids), timeout=30, interval=0.05, what="every job done")
    assert [len(p.runs(i)) for i in ids] == [1] * len(ids)
    assert valkey_pair.waits() <= valkey_pair.calls("evalsha")
