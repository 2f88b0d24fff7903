"""Big records (payloads up to the accepted 1 MiB) never make one script call's work
grow with their bytes: a script that reads a whole record into Lua pays about 7 ms of
Redis per MiB, and every other client waits meanwhile (past 5 s, BUSY). A bulk action
sends at most BULK_BYTES of records per call; a listing reads only a preview's bytes.

Each test reads what Redis itself saw (SLOWLOG with every command logged, or INFO
commandstats), not wall time: the hosts these run on are shared and loaded."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from runner.client import Request
from runner.client.administering import BULK_BYTES
from runner.store import listing, records, scriptkeys
from runner.store.scripts import Burial
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, wait_for


@pytest.fixture
def project(any_project: Project) -> Project:
    """On the embedded Valkey and on Debian's redis-server 7.0 (where the cost was measured)."""
    return any_project

ERROR = '{"type": "E", "message": "m", "traceback": "Traceback (most recent call last): ..."}'
PAD = 300_000  # a few hundred KiB a record: enough to show a bound by bytes, not by count


@contextlib.contextmanager
def every_command_logged(r: Any) -> Iterator[None]:
    """SLOWLOG keeps every command (with its first 32 arguments and Redis's own time)
    while the block runs; the server's settings are put back after."""
    before = r.config_get("slowlog-*")
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    try:
        yield
    finally:
        for name, value in before.items():
            r.config_set(name, value)


def script_calls(project: Project, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The SLOWLOG entries of the script calls (EVAL or EVALSHA) on exactly these KEYS,
    oldest first: each with its arguments after the keys and Redis's own time for it
    (microseconds). Commands a server logs from inside a script are not counted, nor an
    EVALSHA the server did not know, sent again as EVAL (its NOSCRIPT answer)."""
    out: list[dict[str, Any]] = []
    for e in reversed(project.runtime.redis.execute_command("SLOWLOG", "GET", 100_000)):
        args = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in e[3]]
        if len(args) > 2 and args[0].upper() in ("EVAL", "EVALSHA") and args[2].isdigit():
            n = int(args[2])
            if args[3:3 + n] == list(keys):
                if args[0].upper() == "EVAL" and out and out[-1]["sha"] and out[-1]["argv"] == args[3 + n:]:
                    out.pop()
                out.append({"argv": args[3 + n:], "usec": int(e[2]), "sha": args[0].upper() == "EVALSHA"})
    return out


def bury_big(project: Project, n: int, pad: int = PAD, payloads: list[dict[str, Any]] | None = None) -> list[str]:
    """n dead jobs of the 'perm' function, each with a payload of about ``pad`` bytes
    (or these payloads), in order."""
    rt, k = project.runtime, project.keys()
    payloads = payloads or [{"i": i, "pad": "p" * pad} for i in range(n)]
    made = project.client.enqueue_many([Request("perm", p) for p in payloads])
    got = claim_all(project, len(made), "w.big")
    rt.scripts.bury(k, [Burial(i, t, "permanent failure", ERROR, "", False, "") for i, t in got], 10**9)
    assert len(got) == len(payloads)
    return [i for i, _ in got]


def claim_all(project: Project, n: int, base: str) -> list[tuple[str, str]]:
    """Claim n queued jobs, (id, token) each in order: in several calls, as each sends at
    most records.SCRIPT_BYTES of records."""
    rt, k = project.runtime, project.keys()
    got: list[tuple[str, str]] = []
    for call in range(n):
        reply = list(rt.scripts.claim(k, n=n - len(got), start=n - len(got), lease_ms=60_000,
                                      token_base=f"{base}.{call}", dead_ttl_ms=10**9, done_ttl_ms=10**9))
        got += [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
        if len(got) >= n or len(reply) == 2:
            break
    return got


def test_a_bulk_requeue_of_big_dead_jobs_sends_at_most_bulk_bytes_of_records_per_call(project: Project) -> None:
    """40 dead jobs of 300 KB (12 MB, fewer than a batch's 500 jobs): the bulk requeue
    sends them in requeue.lua calls of at most BULK_BYTES of records each (one call of
    all 40 read and rewrote 12 MB in one script; 500 of 1 MiB ran 5-9 s), and every job
    is requeued, on the trail as one entry."""
    c, r = project.client, project.runtime.redis
    ids = bury_big(project, 40)
    size = r.strlen(project.keys().job(ids[0]))
    assert size > PAD
    with every_command_logged(r):
        done, refused = c.requeue_many("fast", ids, by="ops")
        calls = script_calls(project, scriptkeys.keys("requeue", project.keys()))
    assert sorted(done) == sorted(ids) and not refused
    assert {c.get(i).status for i in ids} == {"queued"}
    counts = [int(call["argv"][1]) for call in calls]  # ARGV: now, n, ...
    print("requeue calls (jobs, usec):", [(n, call["usec"]) for n, call in zip(counts, calls, strict=True)])
    assert sum(counts) == 40, counts
    assert len(counts) > 1 and max(counts) * size <= BULK_BYTES, (counts, size)
    total, (entry,) = c.audit(limit=5)
    assert total == 1 and (entry["action"], entry["count"]) == ("requeue", 40)


def test_a_cancel_of_big_deferred_jobs_reads_at_most_bulk_bytes_of_records_per_call(project: Project) -> None:
    """30 jobs of 300 KB held by a paused function (9 MB, fewer than a batch's 200):
    `runner cancel --all --status deferred` cancels them all in cancel.lua calls that
    each read at most BULK_BYTES of records (one call read all 30 whole)."""
    c, r, rt, k = project.client, project.runtime.redis, project.runtime, project.keys()
    c.pause(function="perm")
    ids = [m.id for m in c.enqueue_many([Request("perm", {"i": i, "pad": "p" * PAD}) for i in range(30)])]  # type: ignore[union-attr]
    while rt.scripts.claim(k, n=10, start=10, lease_ms=60_000, token_base="w.held", dead_ttl_ms=10**9,
                           done_ttl_ms=10**9)[2:]:
        pass
    assert {c.get(i).status for i in ids} == {"deferred"}
    size = r.strlen(k.job(ids[0]))
    with every_command_logged(r):
        got = c.cancel_deferred(type="perm")
        calls = script_calls(project, scriptkeys.keys("cancel", k, job=k.held("perm")))
    assert sorted(got["fast"]) == sorted(ids)
    assert {c.get(i).status for i in ids} == {"cancelled"}
    cancelled = r.hget(k.stats, "cancelled|perm")
    assert cancelled == "30", cancelled
    # The 30 fit one call's count (a batch's 200): the bytes made each call stop and say
    # "more". (Its ARGV[5], the count asked, is past the 32 words SLOWLOG keeps of a call
    # since cancel.lua takes 24 keys.)
    assert len(calls) >= -(-30 * size // BULK_BYTES) >= 2, (len(calls), size)


def test_a_page_of_big_jobs_reads_only_their_previews(project: Project) -> None:
    """A dead-letter page of 20 jobs of 900 KB and 20 small ones, read three times: a
    big job's lookup costs Redis about what a small one's does (it read the whole record
    into Lua to cut a preview: 5-7 ms a MiB, every client waiting), interleaved so the
    host's load weighs on both alike; and each preview keeps its contract: the payload's
    first bytes, whole characters only (a 2-byte character at the cut), its full size."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    payloads = [{"i": i, "pad": ("\u00e9" * 450_000) if i % 2 else "small"} for i in range(40)]
    ids = bury_big(project, 0, payloads=payloads)
    big = {i for n, i in enumerate(ids) if n % 2}
    with every_command_logged(r):
        for _ in range(3):
            total, page = c.dead("fast", limit=50)
            assert total == 40 and len(page) == 40
        usec: dict[bool, list[int]] = {True: [], False: []}
        for i in ids:
            usec[i in big] += [call["usec"] for call in script_calls(project, records.lookup_keys(k, i))]
    assert len(usec[True]) == len(usec[False]) == 60
    ratio = statistics.median(usec[True]) / max(1, statistics.median(usec[False]))
    print(f"lookup median: big {statistics.median(usec[True])} us, small {statistics.median(usec[False])} us")
    assert ratio < 4, (ratio, sorted(usec[True])[:5], sorted(usec[False])[:5])
    cut = listing.preview_bytes(50)
    for job in page:
        view = job.as_dict()
        stored = records.parse(r.get(k.job(view["id"])))
        assert stored is not None
        if view["id"] not in big:
            assert view["payload"]["pad"] == "small" and "truncated" not in view
            continue
        preview = view["payload_preview"]
        assert view["payload"] is None and view["truncated"]["payload"] == len(stored["payload"].encode())
        assert stored["payload"].startswith(preview) and cut - 2 < len(preview.encode()) <= cut, len(preview)


def test_the_reclaim_of_big_jobs_reads_at_most_bulk_bytes_of_records_per_call(project: Project) -> None:
    """30 claimed jobs of 300 KB (9 MB) whose leases lapsed, as after a worker's crash:
    a reclaim call (up to 1,000 jobs, as the scheduler asks) takes back only as many as
    fit in BULK_BYTES of records and says there are more (one call read all 30 whole);
    a real worker's scheduler goes on until every one is back and has run once."""
    c, r, rt, k = project.client, project.runtime.redis, project.runtime, project.keys()
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i, "pad": "p" * PAD}) for i in range(30)])]  # type: ignore[union-attr]
    assert len(claim_all(project, 30, "w.lost")) == 30
    size = r.strlen(k.job(ids[0]))
    reply = [int(x) for x in rt.scripts.reclaim(k, 1000, 10**9, now_ms=int(time.time() * 1000) + 120_000)]
    assert reply[0] + reply[1] == BULK_BYTES // size and reply[2:] == [1], (reply, size)
    assert r.zcard(k.leases) == 30 - BULK_BYTES // size
    r.zadd(k.leases, {i: 1 for i in r.zrange(k.leases, 0, -1)})  # the rest lapse now for the worker
    project.spawn_worker("fast")
    wait_for(lambda: {c.get(i).status for i in ids} == {"done"}, timeout=90, what="the reclaimed jobs run")
    project.stop_all()
    assert r.zcard(k.leases) == 0


def test_a_plain_requeue_or_delete_reads_a_big_record_by_its_head(project: Project) -> None:
    """Dead jobs of 900 KB and small ones, interleaved: a bulk requeue (no edit, no
    idempotency key: nothing to write back) and a bulk delete read only the fields of a
    big record, so a call over big records costs Redis about what one over small records
    does (each read every record whole: 7-25 ms of Redis a MiB). Ratios, not times: the
    host's load weighs on both alike."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    payloads = [{"i": i, "pad": ("p" * 900_000) if i % 2 else "small"} for i in range(16)]
    ids = bury_big(project, 0, payloads=payloads)
    big, small = ids[1::2], ids[0::2]
    project.runtime.scripts.requeue_many(k, [("none", "", "", "", "")])  # loaded: no compile in a call timed
    project.runtime.scripts.remove(k, "none")
    with every_command_logged(r):
        c.requeue_many("fast", big)
        c.requeue_many("fast", small)
        calls = script_calls(project, scriptkeys.keys("requeue", k))
    assert [int(call["argv"][1]) for call in calls] == [8, 8]
    assert calls[0]["usec"] / max(1, calls[1]["usec"]) < 4, calls
    for i in ids:
        c.cancel(i)
    ids = bury_big(project, 0, payloads=payloads)
    with every_command_logged(r):
        done, missing = c.delete_many("fast", ids)
        usec: dict[bool, list[int]] = {True: [], False: []}
        for n, i in enumerate(ids):
            usec[bool(n % 2)] += [call["usec"] for call in script_calls(project, scriptkeys.keys(
                "remove", k, job=k.job(i)))]
    assert sorted(done) == sorted(ids) and not missing
    assert len(usec[True]) == len(usec[False]) == 8
    assert statistics.median(usec[True]) / max(1, statistics.median(usec[False])) < 4, usec


def test_a_claim_holding_a_paused_functions_big_jobs_reads_their_heads(project: Project) -> None:
    """A claim that meets jobs of a paused function holds them (deferred) without their
    payloads, so 8 jobs of 900 KB cost it about what 8 small ones do (it read each whole:
    0.5-0.7 s of Redis per claim after a bulk requeue of 1 MiB jobs); a claim that takes
    a big job still hands the worker its whole payload."""
    c, r, rt, k = project.client, project.runtime.redis, project.runtime, project.keys()
    c.pause(function="perm")
    rt.scripts.claim(k, n=1, start=1, lease_ms=60_000, token_base="w.warm", dead_ttl_ms=10**9, done_ttl_ms=10**9)
    timed: dict[bool, list[int]] = {True: [], False: []}
    for round_ in range(3):
        for big in (True, False):
            ids = [m.id for m in c.enqueue_many([Request("perm", {"i": i, "pad": "p" * 900_000 if big else "s"})  # type: ignore[union-attr]
                                                 for i in range(8)])]
            with every_command_logged(r):
                assert rt.scripts.claim(k, n=8, start=8, lease_ms=60_000, token_base=f"w.{round_}.{big}",
                                        dead_ttl_ms=10**9, done_ttl_ms=10**9)[2:] == []
                timed[big] += [call["usec"] for call in script_calls(project, scriptkeys.keys("claim", k))]
            assert {c.get(i).status for i in ids} == {"deferred"}
    assert len(timed[True]) == len(timed[False]) == 3, timed
    # (reading each whole cost 40-300 times a small claim's time; a head, 1-6 times)
    assert statistics.median(timed[True]) / max(1, statistics.median(timed[False])) < 10, timed
    c.resume(function="perm")
    got = rt.scripts.claim(k, n=1, start=1, lease_ms=60_000, token_base="w.run", dead_ttl_ms=10**9,
                           done_ttl_ms=10**9)
    assert len(got[2:]) == CLAIM_FIELDS and len(got[2 + 5]) > 900_000  # (id, token, attempt, type, version, payload)
