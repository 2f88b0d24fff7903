"""/metrics through a real gunicorn agrees with what the jobs did, with /queues and with
`runner stats`: successes, retries, dead letters, duplicates, deferrals, the histograms,
and the queue gauges."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_web_support import Web, gunicorn

from runner.store import codec

from conftest import Project, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(web: Web) -> Samples:
    r = web.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def fig(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def settled(web: Web, ids: list[str]) -> bool:
    return all(web.get(f"/jobs/{i}").json()["status"] in ("done", "dead") for i in ids)


def test_metrics_agree_with_the_jobs_run(project: Project) -> None:
    """Counters per function (enqueued, succeeded, retried, dead, duplicates, deferred),
    latency and run-time histograms (of attempts that succeeded, as their help text says:
    they counted retried and dead attempts too), and the queue gauges match the jobs' own
    records."""
    with gunicorn(project) as web:
        post = web.post
        record = [post("/jobs/record", json=p).json()["id"]
                  for p in ({"n": 1}, {"n": 2}, {"n": 3, "fail_times": 1}, {"n": 4, "fail_times": 99})]
        perm = post("/jobs/perm", json={}).json()["id"]
        first = post("/jobs/idem", json={"k": "a"}).json()["id"]
        assert post("/jobs/idem", json={"k": "a"}).json()["duplicate"] is True  # refused at enqueue
        # A queued job whose key another job has completed since (as when two producers
        # race across the retention window) is settled at claim without running.
        dup = post("/jobs/idem", json={"k": "b"}).json()["id"]
        k = project.keys("fast")
        held = project.runtime.redis.get(k.idem("idem", "b"))
        project.runtime.redis.set(k.idem("idem", "b"), "0000someother " + held.split()[1] + " done")
        locked = [post("/jobs/resource", json={"r": "x", "hold": 0.2}).json()["id"] for _ in range(2)]
        project.spawn_worker("fast")
        ids = [*record, perm, first, dup, *locked]
        wait_for(lambda: settled(web, ids), timeout=30, interval=0.05, what="every job to settle")
        # Successes' figures reach Redis within a second of their acks (the worker sums them).
        wait_for(lambda: fig(scrape(web), "runner_jobs_succeeded_total", queue="fast", function="record") == 3,
                 timeout=5, interval=0.1, what="the successes in the figures")

        s = scrape(web)
        fast = {"queue": "fast"}
        assert fig(s, "runner_redis_up") == 1
        assert fig(s, "runner_jobs_enqueued_total", **fast, function="record") == 4
        assert fig(s, "runner_jobs_succeeded_total", **fast, function="record") == 3
        assert fig(s, "runner_jobs_retried_total", **fast, function="record") == 1 + 3
        assert fig(s, "runner_jobs_dead_total", **fast, function="record") == 1
        assert fig(s, "runner_jobs_dead_total", **fast, function="perm") == 1
        assert fig(s, "runner_jobs_enqueued_total", **fast, function="idem") == 2
        assert fig(s, "runner_jobs_succeeded_total", **fast, function="idem") == 1
        assert fig(s, "runner_jobs_duplicates_total", **fast, function="idem") == 1
        assert fig(s, "runner_jobs_deduplicated_total", **fast, function="idem") == 1
        assert web.get(f"/jobs/{dup}").json()["duplicate_of"] == "0000someother"
        # A done job keeps no deferral count; the counter has them all.
        assert fig(s, "runner_jobs_deferred_total", **fast, function="resource") >= 1
        assert fig(s, "runner_jobs_lost_total", **fast, function="record") == 0
        # Functions that never ran are exported with zeros, so rate() has a start.
        assert fig(s, "runner_jobs_enqueued_total", queue="slow", function="slow") == 0

        for hist in ("runner_job_latency_seconds", "runner_job_run_seconds"):
            labels = {**fast, "function": "record"}
            count = fig(s, f"{hist}_count", **labels)
            # Attempts that succeeded only, as documented: count == succeeded_total (the 4
            # retried attempts and the dead one are counted by their own counters).
            assert count == fig(s, "runner_jobs_succeeded_total", **labels) == 3
            assert fig(s, f"{hist}_bucket", **labels, le="+Inf") == count
            assert fig(s, f"{hist}_sum", **labels) >= 0
            buckets = sorted((float(dict(lv)["le"]), v) for (name, lv), v in s.items()
                             if name == f"{hist}_bucket" and dict(lv)["function"] == "record")
            assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
        # The handler of record runs in well under a second: its run-time sits in a low bucket.
        assert fig(s, "runner_job_run_seconds_bucket", **fast, function="record", le="1.0") == 3
        # A function that never succeeded has empty histograms.
        for hist in ("runner_job_latency_seconds", "runner_job_run_seconds"):
            assert fig(s, f"{hist}_count", **fast, function="perm") == 0

        assert fig(s, "runner_queue_dead_jobs", **fast) == 2
        for gauge in ("ready", "in_flight", "scheduled", "lease_expired"):
            assert fig(s, f"runner_queue_{gauge}_jobs", **fast) == 0

        # /queues reads the same figures.
        q = next(q for q in web.get("/queues").json()["queues"] if q["name"] == "fast")
        assert q["dead"] == 2 and q["functions"]["record"]["succeeded"] == 3
        assert q["functions"]["record"]["latency"]["count"] == 3

        # So does `runner stats`.
        out = subprocess.run([sys.executable, "-m", "runner.cli", "stats", "--json"], cwd=project.root,
                             env={**project.env, "RUNNER_CONFIG": str(project.root / "runner.toml")},
                             capture_output=True, timeout=30, check=True)
        stats: dict[str, Any] = json.loads(out.stdout)
        assert stats["queues"] == web.get("/queues").json()["queues"]
        for figures in stats["queues"]:
            queue = figures["name"]
            for field, name in (("ready", "ready"), ("processing", "in_flight"), ("scheduled", "scheduled"),
                                ("dead", "dead")):
                assert figures[field] == fig(s, f"runner_queue_{name}_jobs", queue=queue)
            for fn, counters in figures["functions"].items():
                for kind in ("enqueued", "succeeded", "retried", "dead", "duplicates", "deferred", "lost"):
                    label = "_malformed" if fn == "?" else fn
                    assert fig(s, f"runner_jobs_{kind}_total", queue=queue, function=label) == counters[kind], kind


def test_queue_gauges_show_waiting_due_and_expired_work(project: Project) -> None:
    """With no worker: ready jobs and the age of the oldest, scheduled jobs that are already
    due but not promoted, and leases past their deadline are all visible."""
    with gunicorn(project) as web:
        web.post("/jobs/noop", json={})
        web.post("/jobs/noop?delay=0.05", json={})
        r = project.runtime.redis
        k = project.keys("fast")
        r.zadd(k.leases, {"ghost": 1})  # a lease that lapsed long ago, as a dead worker leaves it

        def due() -> Samples | None:
            s = scrape(web)
            return s if fig(s, "runner_queue_scheduled_due_jobs", queue="fast") == 1 else None

        s = wait_for(due, timeout=5, what="the delayed job to fall due")
        assert fig(s, "runner_queue_ready_jobs", queue="fast") == 1
        assert fig(s, "runner_queue_scheduled_jobs", queue="fast") == 1
        assert fig(s, "runner_queue_in_flight_jobs", queue="fast") == 1
        assert fig(s, "runner_queue_lease_expired_jobs", queue="fast") == 1
        assert fig(s, "runner_queue_oldest_ready_age_seconds", queue="fast") > 0
        assert fig(s, "runner_queue_oldest_ready_age_seconds", queue="slow") == 0
        assert fig(s, "runner_functions_loaded") == len(web.get("/functions").json()["functions"])

        om = web.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        tput = web.get("/throughput?minutes=5").json()
        assert len(tput["times"]) == 5 and tput["queues"]["fast"]["done"] == [0] * 5
        assert codec.loads(codec.dumps(tput)) == tput


def test_the_oldest_ready_age_sees_a_job_waiting_in_the_priority_set(project: Project) -> None:
    """A queue whose only waiting job has a priority (it waits in the priority set, not in
    ready) still has an oldest ready age: the gauge an autoscaler reads is not 0 while a
    job waits."""
    from runner.observe.figures import read_queues

    job = project.client.enqueue("slow", {"seconds": 0}, priority=5)
    created = int(job.id[:12], 16)  # an id begins with its creation, in ms
    figures = {q.name: q for q in read_queues(project.runtime, created + 5_000)}
    assert figures["slow"].ready == 1
    age = figures["slow"].oldest_ready_age_s
    assert age is not None and 4.0 <= age <= 6.0, age


def test_a_stats_hash_of_very_many_function_names_keeps_the_scrape_bounded(project: Project) -> None:
    """Each "<figure>|<type>" name of a queue's stats hash was a series of its own (about 40
    samples each): 10,000 names another writer put there made a scrape take 18 s (30,000:
    45 s). The functions loaded here keep their series, and so do the MAX_NAMED busiest
    other names; the rest are summed in one function="_other" series, nothing lost."""
    from runner.observe.figures import MAX_NAMED, OTHER

    extra = 5_000
    r, k = project.runtime.redis, project.keys("fast")
    r.hset(k.stats, mapping={f"succeeded|junk{i}": i + 1 for i in range(extra)})
    r.hset(k.stats, mapping={"succeeded|_other": 7, "dead|?": 2})  # (a writer's "_other" is folded too)
    loaded = {f.name for f in project.runtime.registry.functions.values() if f.queue == "fast"}
    with gunicorn(project) as web:
        samples = scrape(web)
        names = {dict(labels)["function"] for (name, labels) in samples
                 if name == "runner_jobs_succeeded_total" and dict(labels)["queue"] == "fast"}
        assert len(names) <= len(loaded) + MAX_NAMED + 2, len(names)
        assert loaded <= names and "_malformed" in names and OTHER in names
        busiest = {f"junk{i}" for i in range(extra - MAX_NAMED, extra)}
        assert busiest <= names and len(names - loaded - busiest - {"_malformed", OTHER}) == 0
        folded = sum(range(1, extra - MAX_NAMED + 1)) + 7
        assert fig(samples, "runner_jobs_succeeded_total", queue="fast", function=OTHER) == folded
        total = sum(v for (name, labels), v in samples.items()
                    if name == "runner_jobs_succeeded_total" and dict(labels)["queue"] == "fast")
        assert total == sum(range(1, extra + 1)) + 7
        assert len(samples) < 100 * (len(loaded) + MAX_NAMED + 2), len(samples)
        queues = {q["name"]: q for q in web.get("/queues").json()["queues"]}
        assert len(queues["fast"]["functions"]) <= len(loaded) + MAX_NAMED + 2
        assert queues["fast"]["functions"][OTHER]["succeeded"] == folded
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "stats", "--json"], env=project.env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-600:]
    fast = next(q for q in json.loads(cli.stdout)["queues"] if q["name"] == "fast")
    assert len(fast["functions"]) <= len(loaded) + MAX_NAMED + 2 and fast["functions"][OTHER]["succeeded"] == folded


def commands_run(project: Project, call: Any) -> tuple[Any, list[list[str]]]:
    """``call()``'s value and every command the server ran meanwhile (its SLOWLOG at 0 us),
    each as its first two words: what a reader asked, whatever its time on this host."""
    r = project.runtime.redis
    was = r.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    size = r.config_get("slowlog-max-len")["slowlog-max-len"]
    r.config_set("slowlog-max-len", 10_000)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    try:
        value = call()
        seen = [[w.decode() if isinstance(w, bytes) else str(w) for w in e["command"].split()[:2]]
                if isinstance(e["command"], bytes) else list(map(str, e["command"][:2]))
                for e in r.slowlog_get(10_000)]
    finally:
        r.config_set("slowlog-log-slower-than", was)
        r.config_set("slowlog-max-len", size)
    return value, seen


def test_a_stats_hash_too_wide_to_read_whole_is_read_by_name_and_says_what_it_left_out(project: Project) -> None:
    """Another writer's type names grew a stats hash to 1.44 million fields, and every
    reader (/metrics, GET /queues, the dashboard, `runner stats`) read it whole: one
    HGETALL held Redis 0.7-0.85 s per read. A hash past STATS_WHOLE fields is read by the
    names of the functions loaded (and "?", "_other"), never whole, and the figures say how
    many fields they left out."""
    from runner.observe.figures import OTHER, queue_view, read_queues

    r, k = project.runtime.redis, project.keys("fast")
    junk = 25_000  # (past store/stats.py STATS_WHOLE)
    pipe = r.pipeline(transaction=False)
    for i in range(0, junk, 5_000):
        pipe.hset(k.stats, mapping={f"dead|junk{j}": 1 for j in range(i, i + 5_000)})
    pipe.hset(k.stats, mapping={"succeeded|noop": 4, "lat|noop|5": 4, "dead|?": 2, f"dead|{OTHER}": 3, "stray": 1})
    pipe.execute()
    figures, seen = commands_run(project, lambda: read_queues(project.runtime))
    fast = next(q for q in figures if q.name == "fast")
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert fast.functions["noop"].counters["succeeded"] == 4 and fast.functions["noop"].latency.count == 4
    assert fast.functions["?"].counters["dead"] == 2 and fast.functions[OTHER].counters["dead"] == 3
    assert fast.stray == 1 and fast.stats_left_out == junk
    assert queue_view(fast, project.runtime.config.queues["fast"])["stats_fields_left_out"] == junk
    counted, seen = commands_run(project, project.client.stats)
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert counted["fast"]["stats_fields_left_out"] == junk and counted["fast"]["counters"]["succeeded|noop"] == 4
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "stats"],
                         env=project.env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-600:]
    assert f"fast: {junk} fields of its stats hash left out" in cli.stdout, cli.stdout


def test_a_stats_hash_of_few_fields_but_many_bytes_is_read_by_name(project: Project) -> None:
    """The read bound counted fields only: 1,000 fields named by 100 KB types (a worker of
    the release before counted foreign records so) made each scrape, GET /queues and
    `runner stats` an HGETALL of 100 MB (0.65-0.97 s a scrape). A hash past STATS_BYTES
    (its size as Redis estimates it, MEMORY USAGE) is read by name as a wide one is."""
    from runner.observe.figures import read_queues
    from runner.store.stats import STATS_BYTES

    r, k = project.runtime.redis, project.keys("fast")
    heavy = 1_000
    name = "x" * (2 * STATS_BYTES // heavy)
    pipe = r.pipeline(transaction=False)
    for i in range(0, heavy, 100):
        pipe.hset(k.stats, mapping={f"dead|{name}{j}": 1 for j in range(i, i + 100)})
    pipe.hset(k.stats, mapping={"succeeded|noop": 4, "dead|?": 2})
    pipe.execute()
    figures, seen = commands_run(project, lambda: read_queues(project.runtime))
    fast = next(q for q in figures if q.name == "fast")
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert fast.functions["noop"].counters["succeeded"] == 4 and fast.functions["?"].counters["dead"] == 2
    assert fast.stats_left_out == heavy
    counted, seen = commands_run(project, project.client.stats)
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert counted["fast"]["stats_fields_left_out"] == heavy and counted["fast"]["counters"]["succeeded|noop"] == 4


def test_a_stats_hash_of_many_small_fields_and_a_few_heavy_ones_is_read_by_name(project: Project) -> None:
    """MEMORY USAGE at its default sampling reads a hash's first 5 entries in table order:
    5,000 ordinary figures beside 50 fields named by 100 KB types (5 MB) were estimated
    at about 0.3 MB, so every read took the hash whole, and with 1,000 such fields each
    read sent 100 MB. The bytes bound is exact for any hash narrow enough to be read whole,
    so such a hash is read by name whatever its table order."""
    from runner.observe.figures import read_queues
    from runner.store.stats import STATS_BYTES

    r, k = project.runtime.redis, project.keys("fast")
    heavy, name = 50, "x" * 100_000
    for attempt in range(20):  # a table order whose first entries are small (most are)
        r.delete(k.stats)
        pipe = r.pipeline(transaction=False)
        pipe.hset(k.stats, mapping={f"lat|fn{i // 40}_{attempt}|{i % 40}": 1 for i in range(5_000)})
        for i in range(heavy):
            pipe.hset(k.stats, f"dead|{name}{attempt}_{i}", 1)
        pipe.hset(k.stats, mapping={"succeeded|noop": 4, "dead|?": 2})
        pipe.execute()
        if r.memory_usage(k.stats) <= STATS_BYTES < r.memory_usage(k.stats, samples=0):
            break
    else:
        raise AssertionError("every table order had a heavy field among its first entries")
    figures, seen = commands_run(project, lambda: read_queues(project.runtime))
    fast = next(q for q in figures if q.name == "fast")
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert fast.functions["noop"].counters["succeeded"] == 4 and fast.functions["?"].counters["dead"] == 2
    assert fast.stats_left_out == 5_000 + heavy
    counted, seen = commands_run(project, project.client.stats)
    assert not [c for c in seen if c[0].upper() == "HGETALL" and c[1] == k.stats], seen
    assert counted["fast"]["stats_fields_left_out"] == 5_000 + heavy


def test_a_type_name_no_function_can_have_is_counted_and_shown_as_malformed(project: Project) -> None:
    """A type comes from another producer's record as it wrote it: a 100 KB name made every
    /metrics scrape 5.7 MB (the name in each of its samples), and one with "|" split into a
    figure of no series. Any name no function can have is shown as the malformed "?"."""
    from runner.observe.figures import read_queues

    r, k = project.runtime.redis, project.keys("fast")
    huge = "x" * 100_000
    r.hset(k.stats, mapping={f"dead|{huge}": 5, "dead|a|b": 2, "lat|a|b|5": 2, "dead|a b": 1, "dead|noop": 1})
    fast = next(q for q in read_queues(project.runtime) if q.name == "fast")
    assert max(map(len, fast.functions)) < 300, sorted(map(len, fast.functions))
    assert fast.functions["?"].counters["dead"] == 8 and fast.functions["?"].latency.count == 2
    assert fast.functions["noop"].counters["dead"] == 1
