"""Dead letters in bulk: `runner dead requeue --all` and `purge --all` send their jobs in
batches (a few round trips per batch, not per job) and go on the audit trail as one
entry each, with the count and a bounded list of ids, so a bulk action never pushes
earlier operator actions out of the trail."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from click.testing import CliRunner, Result

from runner.cli import cli
from runner.store import audit
from runner.store.scripts import Burial
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, size

# Bulk sizes: past the client's batches of BULK_BATCH (500) and the entry's MAX_IDS ids;
# RUNNER_TEST_FULL=1 runs the sizes the issues gave.
BULK = int(size("DEAD_BULK_JOBS", 1_200, 3_000))
GHOSTS = int(size("DEAD_BULK_GHOSTS", 1_200, 5_000))
KILLED = int(size("DEAD_BULK_KILLED", 8_000, 20_000))

ERROR = json.dumps({"type": "E", "message": "m", "traceback": "Traceback (most recent call last): ..."})


def bury_many(project: Project, n: int, type_: str = "perm") -> list[str]:
    """n dead jobs, enqueued, claimed and buried as the worker would."""
    from runner.client import Request

    rt, k = project.runtime, project.keys()
    ids: list[str] = []
    for start in range(0, n, 1000):
        made = project.client.enqueue_many([Request(type_, {"i": i}) for i in range(start, min(n, start + 1000))])
        reply = list(rt.scripts.claim(k, n=len(made), start=len(made), lease_ms=60_000, token_base=f"w.{start}",
                                      dead_ttl_ms=10**9, done_ttl_ms=10**9))
        got = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
        rt.scripts.bury(k, [Burial(i, t, "permanent failure", ERROR, "", False, "") for i, t in got], 10**9)
        ids += [i for i, _ in got]
    return ids


def run(project: Project, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args], env=project.env,
                              catch_exceptions=False)


def _multi(project: Project) -> int:
    return int(project.runtime.redis.info("commandstats").get("cmdstat_multi", {}).get("calls", 0))


def test_bulk_requeue_and_purge_are_batched_and_one_audit_entry_each(project: Project) -> None:
    """An operator's single requeue stays on the trail after a bulk requeue of BULK dead
    jobs and a bulk purge of BULK more: each bulk action is one entry with its count and
    at most audit.MAX_IDS ids. (Its speed: the slow test below, 500,000 in under a minute.)"""
    c = project.client
    first = bury_many(project, 1)[0]
    assert run(project, "dead", "requeue", first).exit_code == 0
    ids = bury_many(project, BULK)
    out = run(project, "dead", "requeue", "--all", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["requeued"] == BULK
    assert c.stats()["fast"]["dead"] == 0 and {c.get(i).status for i in ids[::100]} == {"queued"}

    for i in ids:
        c.cancel(i)
    gone = bury_many(project, BULK)
    assert run(project, "dead", "purge", "--all", "--yes").exit_code == 0
    assert c.stats()["fast"]["dead"] == 0 and not project.runtime.redis.exists(project.keys().job(gone[0]))

    total, entries = c.audit(limit=10)
    assert total == 3, entries
    purge, requeue, single = entries
    assert (single["action"], single["job_id"]) == ("requeue", first)
    assert (requeue["action"], requeue["count"]) == ("requeue", BULK)
    assert (purge["action"], purge["count"]) == ("purge", BULK)
    assert len(requeue["ids"]) == len(purge["ids"]) == audit.MAX_IDS and set(requeue["ids"]) <= set(ids)
    assert all(len(json.dumps(e)) < 20_000 for e in entries)


def test_the_audit_trail_drops_entries_past_its_age(project: Project) -> None:
    """Entries older than audit.MAX_AGE_MS leave the trail when the next one is written,
    whatever their number (the trail is bounded by age as well as by count)."""
    r, key = project.runtime.redis, f"{project.runtime.config.redis.prefix}:audit"
    (sec, _) = r.time()
    old = int(sec) * 1000 - audit.MAX_AGE_MS - 60_000
    for n in range(5):
        r.rpush(key, json.dumps({"at_ms": old - n, "by": "cli:old", "action": "purge", "queue": "fast"}))
    r.lpush(key, json.dumps({"at_ms": old + 120_000 + audit.MAX_AGE_MS - 60_000, "by": "cli:new",
                             "action": "pause", "queue": "fast"}))
    audit.record(project.runtime.scripts, key, {"by": "cli:me", "action": "delete", "queue": "fast"})
    total, entries = project.client.audit(limit=10)
    assert total == 2 and [e["by"] for e in entries] == ["cli:me", "cli:new"], entries


def test_cancel_all_is_one_audit_entry_per_queue(project: Project) -> None:
    """`runner cancel --all` of 300 queued jobs cancels each (each job's history says who)
    and goes on the trail as one entry with its count, after the earlier action."""
    from runner.client import Request

    c = project.client
    c.pause("slow", by="cli:earlier")
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(300)])]  # type: ignore[union-attr]
    out = run(project, "cancel", "--all", "--status", "queued", "--queue", "fast")
    assert out.exit_code == 0 and "cancelled 300 job(s)" in out.stdout, out.output
    assert {c.get(i).status for i in ids} == {"cancelled"}
    assert c.get(ids[0]).as_dict()["history"][-1]["by"].startswith("cli:")
    total, (bulk, earlier) = c.audit(limit=10)
    assert total == 2 and earlier["by"] == "cli:earlier"
    assert (bulk["action"], bulk["queue"], bulk["count"]) == ("cancel", "fast", 300) and set(bulk["ids"]) <= set(ids)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bulk_requeue_of_500000_dead_jobs_takes_under_a_minute(project: Project) -> None:
    """The issue's figure: `runner dead requeue --all` of 500,000 dead jobs in under a
    minute (one at a time, 776 jobs a second, it took 10.7 min)."""
    bury_many(project, 500_000, type_="noop")
    t0 = time.monotonic()
    out = run(project, "dead", "requeue", "--all", "--json")
    took = time.monotonic() - t0
    assert out.exit_code == 0 and json.loads(out.stdout)["requeued"] == 500_000
    print(f"500,000 dead jobs requeued in {took:.1f} s ({500_000 / took:,.0f}/s)")
    assert took < 60, f"500,000 requeued in {took:.1f} s"


def test_a_bulk_requeue_killed_half_way_is_on_the_trail_with_how_far_it_got(project: Project) -> None:
    """`runner dead requeue --all` of KILLED dead jobs, SIGKILLed half-way: its one audit
    entry was written when it started (who, how many it meant to requeue) and updated
    after each batch, so the trail shows it "running" with the count it reached; a run
    to its end leaves its one entry "done" with its count."""
    import signal
    import subprocess
    import sys

    from conftest import wait_for

    c, r, k = project.client, project.runtime.redis, project.keys()
    bury_many(project, KILLED, type_="noop")
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                             "dead", "requeue", "--all", "--json"], cwd=project.root, env=project.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: r.zcard(k.dead) < KILLED - 2_000 or proc.poll() is not None, timeout=60, interval=0.002,
                 what="the requeue to be under way")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    moved = KILLED - r.zcard(k.dead)
    assert moved < KILLED, "the requeue ended before it was killed"
    total, entries = c.audit(limit=10)
    assert total == 1, entries
    entry = entries[0]
    assert (entry["action"], entry["state"], entry["expected"]) == ("requeue", "running", KILLED), entry
    assert entry["by"].startswith("cli:") and 0 < entry["count"] <= moved, (entry["count"], moved)

    out = run(project, "dead", "requeue", "--all", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["requeued"] == KILLED - moved
    total, (done, killed) = c.audit(limit=10)
    assert total == 2 and killed["state"] == "running"
    assert (done["state"], done["count"], done["expected"]) == ("done", KILLED - moved, KILLED - moved)


def test_a_flood_of_pauses_and_resumes_pushes_no_other_action_off_the_trail(project: Project,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An operate token's pauses and resumes need no job and cost nothing to repeat: past
    the trail's bound (here 20 entries), they pushed an earlier purge off it. They go on a
    trail of their own, bounded alike, and the client's pages (GET /audit) merge the two
    by time: the purge stays, newest first. Each caller's pauses of a queue within the
    hour are one entry, its resumes another; other callers' are their own."""
    monkeypatch.setattr(audit, "MAX_ENTRIES", 20)
    c = project.client
    bury_many(project, 3)
    assert run(project, "dead", "purge", "--all", "--yes").exit_code == 0
    for n in range(30):
        c.pause("fast", by=f"flooder{n}")
        c.resume("fast", by=f"flooder{n}")
    for _ in range(30):
        c.pause("fast", by="flooder")
        c.resume("fast", by="flooder")
    total, page = c.audit(0, 100)
    assert total == 21, total  # the purge, and the newest 20 pauses and resumes
    assert [(e["action"], e["by"], e.get("repeats")) for e in page[:2]] == [
        ("resume", "flooder", 30), ("pause", "flooder", 30)] and page[-1]["action"] == "purge", page
    assert all(a["at_ms"] >= b["at_ms"] for a, b in itertools.pairwise(page)), page
    assert [e["action"] for e in c.audit(20, 5)[1]] == ["purge"]


def test_cli_bulk_actions_on_many_ids_that_do_not_exist_write_no_audit_entry(project: Project) -> None:
    """`runner dead requeue`, `dead purge` and `cancel` of GHOSTS ids that name no job (with
    --queue and without), and `--all` runs that find nothing, act on nothing and write no
    entry: the trail grows by at most one and the earlier action stays. A cancel of
    several real ids is one entry with its count, not one per job."""
    c = project.client
    first = bury_many(project, 1)[0]
    assert run(project, "dead", "requeue", first).exit_code == 0
    before, _ = c.audit()
    ghosts = [f"nosuch{n:05d}" for n in range(GHOSTS)]
    for args in (("dead", "requeue", "--queue", "fast"), ("dead", "requeue"), ("dead", "purge", "--queue", "fast"),
                 ("dead", "purge"), ("cancel",)):
        out = run(project, *args, *ghosts, "--json")
        assert out.exit_code == 1, (args, out.output[-300:])
    for args in (("dead", "purge", "--all", "--yes"), ("cancel", "--all", "--status", "scheduled"),
                 ("cancel", "--all", "--status", "deferred")):
        assert run(project, *args).exit_code == 0, args
    assert c.purge_dead("fast", by="cli:script") == 0
    total, entries = c.audit(limit=100)
    assert total <= before + 1, entries[:3]
    assert (entries[-1]["action"], entries[-1]["job_id"]) == ("requeue", first)

    real = [c.enqueue("record", {"n": n}, delay=600).id for n in range(3)]
    assert run(project, "cancel", *real, "nosuch").exit_code == 1
    total, (bulk, *_) = c.audit(limit=100)
    assert (bulk["action"], bulk["queue"], bulk["count"], sorted(bulk["ids"])) == ("cancel", "fast", 3, sorted(real))
    assert {c.get(i).status for i in real} == {"cancelled"}
