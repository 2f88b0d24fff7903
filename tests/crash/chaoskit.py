"""The chaos run: worker processes and a producer over load while a driver SIGKILLs and
SIGTERMs workers and restarts Redis; then every accepted job is checked. Workers lead
process groups of their own; with process isolation a SIGTERM goes to every process of
the worker (as Heroku and systemd stop one).

Load: jobs of the ``chaos`` fixture function, each with its own idempotency key (some
enqueued twice), one of 20 resource keys, a 20 % chance of a transient failure per run,
and a few slow runs longer than the 1 s visibility timeout (lease renewal at work).

Faults, at random moments (one every 0.3-1.5 s): SIGKILL a worker (a replacement
starts), SIGTERM a worker (it drains within its grace period; a replacement starts);
and every 3-7 s Redis is restarted, gracefully (SIGTERM) and by SIGKILL in turn. Redis
runs with appendonly and appendfsync always, so a write it acknowledged survives its own
SIGKILL, which is what lets the check demand "none lost".
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from crashkit import configure, lock_keys, new_project

from runner.client import Client, Request
from runner.errors import RedisUnavailable
from runner.store import census, records
from runner.store.embedded import Server

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for


@dataclass
class Figures:
    jobs: int = 0
    enqueue_calls_retried: int = 0
    duplicates_at_enqueue: int = 0
    duplicates_at_claim: int = 0
    sigkills: int = 0
    sigterms: int = 0
    redis_restarts: int = 0
    redis_sigkills: int = 0
    done: int = 0
    dead: int = 0
    retries: int = 0
    redeliveries: int = 0
    extra_runs: int = 0
    extra_completions: int = 0
    resource_overlaps: int = 0
    unstarted_burials: int = 0  # dead as "worker lost" with no handler run at all
    charged_unrun: int = 0  # attempts spent beyond the handler starts recorded for the job
    max_enqueue_to_done_s: float = 0.0
    p99_enqueue_to_done_s: float = 0.0
    seconds: float = 0.0
    dead_reasons: Counter[str] = field(default_factory=Counter)

    def table(self) -> str:
        rows = [
            ("jobs accepted", self.jobs),
            ("  done / dead", f"{self.done} / {self.dead}"),
            ("  dead, by reason", ", ".join(f"{r}: {n}" for r, n in self.dead_reasons.most_common()) or "-"),
            ("duplicates suppressed at enqueue (same key)", self.duplicates_at_enqueue),
            ("duplicates suppressed at claim (key already done)", self.duplicates_at_claim),
            ("enqueue batches retried (Redis away)", self.enqueue_calls_retried),
            ("workers SIGKILLed", self.sigkills),
            ("workers SIGTERMed (graceful)", self.sigterms),
            ("Redis restarts (of which SIGKILL)", f"{self.redis_restarts} ({self.redis_sigkills})"),
            ("transient failures retried", self.retries),
            ("redeliveries (lapsed lease, 'worker lost')", self.redeliveries),
            ("handler runs beyond one per attempt", self.extra_runs),
            ("dead as 'worker lost' without a handler run", self.unstarted_burials),
            ("attempts spent beyond the handler's starts", self.charged_unrun),
            ("completed twice (ack lost: killed or lease lapsed first)", self.extra_completions),
            ("runs of one resource overlapping (lease lost)", self.resource_overlaps),
            ("jobs lost / in two structures / locks left", "0 / 0 / 0"),
            ("enqueue-to-done p99 / max, s", f"{self.p99_enqueue_to_done_s:.2f} / {self.max_enqueue_to_done_s:.2f}"),
            ("wall time, s", f"{self.seconds:.0f}"),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"| {'figure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
        return "\n".join(lines)


class Chaos:
    def __init__(
        self, root: Path, *, jobs: int, seconds: float, workers: int, faults: bool, seed: int,
        redis_restarts: bool = True, resources: int = 20, slow: bool = True, isolation: str = "thread",
    ) -> None:
        self.isolation = isolation
        self.root = root
        self.n_jobs = jobs
        self.seconds = seconds
        self.n_workers = workers
        self.faults = faults
        self.redis_restarts = redis_restarts and faults
        self.rnd = random.Random(seed)
        self.resources = resources
        self.slow = slow
        self.fig = Figures()
        self.accepted: dict[str, str] = {}  # idempotency key -> job id
        self.payloads: dict[str, dict[str, Any]] = {}
        # appendfsync always: an acknowledged write survives a SIGKILL of Redis. A small
        # rewrite threshold keeps the append-only file, and so each restart, short.
        self.server = Server(root / "redis", appendonly=True, extra=[
            "--appendfsync", "always", "--auto-aof-rewrite-min-size", "8mb"])
        self.project: Project | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.draining: list[subprocess.Popen[bytes]] = []
        self._producer_done = threading.Event()
        self._producer_error: BaseException | None = None
        self._redis_lock = threading.Lock()
        self._next_restart = 0.0
        self._restart_gap = (3.0, 7.0)

    # --- load ------------------------------------------------------------------------

    def _payload(self, i: int) -> dict[str, Any]:
        roll = self.rnd.random()
        sleep = 0.0
        if roll < 0.04 and self.slow:
            sleep = round(self.rnd.uniform(1.1, 1.6), 3)  # longer than the lease: renewed
        elif roll < 0.15:
            sleep = round(self.rnd.uniform(0.01, 0.1), 3)
        return {"k": f"k{i}", "r": self.rnd.randrange(self.resources), "sleep": sleep, "fail_rate": 0.2}

    def _client(self) -> Client:
        assert self.project is not None
        return self.project.client

    def _send(self, batch: list[Request]) -> None:
        while True:
            try:
                out = self._client().enqueue_many(batch)
                break
            except RedisUnavailable:
                self.fig.enqueue_calls_retried += 1
                time.sleep(0.05)  # the producer's own retry loop, not a synchronisation
        for req, res in zip(batch, out, strict=True):
            if isinstance(res, Exception):
                raise AssertionError(f"enqueue refused {req.payload}: {res}")
            key = req.payload["k"]
            if key in self.accepted:
                assert res.id == self.accepted[key], "one idempotency key produced two jobs"
            else:
                self.accepted[key] = res.id
            if res.duplicate:
                self.fig.duplicates_at_enqueue += 1

    def _produce(self) -> None:
        try:
            span = max(self.seconds * 0.8, 0.1)
            t0 = time.monotonic()
            batch: list[Request] = []
            for i in range(self.n_jobs):
                p = self._payload(i)
                self.payloads[p["k"]] = p
                batch.append(Request("chaos", p))
                if self.rnd.random() < 0.05 and i > 10:  # the same key again, same payload
                    old = self.payloads[f"k{self.rnd.randrange(i)}"]
                    batch.append(Request("chaos", old))
                if len(batch) >= 50:
                    self._send(batch)
                    batch = []
                    # Spread the load over the run.
                    ahead = (i / self.n_jobs) * span - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            if batch:
                self._send(batch)
        except BaseException as exc:  # surfaced by run()
            self._producer_error = exc
        finally:
            self._producer_done.set()

    # --- faults ----------------------------------------------------------------------

    def _spawn(self) -> None:
        """A worker leading a process group of its own, as a PaaS starts one."""
        assert self.project is not None
        p = self.project
        args = [sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"), "worker",
                "--queue", "fast"]
        log = open(p.root / f"worker-{len(p.procs)}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(args, cwd=p.root, env=p.env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        p.procs.append(proc)
        self.workers.append(proc)

    def _stop(self, w: subprocess.Popen[bytes]) -> None:
        """A graceful stop; with children, as Heroku and systemd's KillMode=control-group
        stop a worker: SIGTERM to its group and to every process under it."""
        w.send_signal(signal.SIGTERM)
        if self.isolation == "process":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, signal.SIGTERM)
            for pid in descendants(w.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _act(self) -> None:
        roll = self.rnd.random()
        # The first two faults are a SIGKILL and a SIGTERM: a short run has both kinds
        # whatever its rolls.
        roll = 0.0 if not self.fig.sigkills else 0.5 if not self.fig.sigterms else roll
        self.workers = [w for w in self.workers if w.poll() is None]
        if roll < 0.45 and self.workers:
            w = self.rnd.choice(self.workers)
            w.send_signal(signal.SIGKILL)
            w.wait()
            self.workers.remove(w)
            self.fig.sigkills += 1
        elif roll < 0.75 and self.workers:
            w = self.rnd.choice(self.workers)
            self._stop(w)
            self.workers.remove(w)
            self.draining.append(w)
            self.fig.sigterms += 1
        if self.redis_restarts and time.monotonic() >= self._next_restart:
            kill = self.fig.redis_restarts % 2 == 1  # graceful and SIGKILL in turn
            self.server.stop(kill=kill)
            self.fig.redis_restarts += 1
            self.fig.redis_sigkills += int(kill)
            self.server.start(timeout_s=60)
            self._next_restart = time.monotonic() + self.rnd.uniform(*self._restart_gap)
        while len(self.workers) < self.n_workers:
            self._spawn()

    # --- the run ---------------------------------------------------------------------

    def run(self) -> Figures:
        t0 = time.monotonic()
        self.server.start()
        try:
            self.project = new_project(self.root / "project", self.server)
            configure(self.project, vt=1, concurrency=4, grace=2, max_attempts=8, prefetch=4,
                      isolation=self.isolation)
            for _ in range(self.n_workers):
                self._spawn()
            producer = threading.Thread(target=self._produce, name="producer", daemon=True)
            producer.start()
            # A short run restarts Redis sooner and more often: a graceful restart and a
            # SIGKILL within its first seconds.
            short = self.seconds < 30
            self._restart_gap = (2.0, 3.5) if short else (3.0, 7.0)
            self._next_restart = time.monotonic() + (self.rnd.uniform(1.5, 2.5) if short else self.rnd.uniform(2, 5))
            end = time.monotonic() + self.seconds
            while time.monotonic() < end:
                time.sleep(self.rnd.uniform(0.3, 1.5))  # the time between two faults
                if self.faults:
                    self._act()
            wait_for(self._producer_done.is_set, timeout=300, interval=0.1, what="the producer")
            if self._producer_error is not None:
                raise self._producer_error
            self.workers = [w for w in self.workers if w.poll() is None]
            while len(self.workers) < self.n_workers:
                self._spawn()
            self._wait_all_final()
            for w in self.workers + self.draining:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in self.workers + self.draining:
                assert w.wait(timeout=30) is not None
            self.fig.seconds = time.monotonic() - t0
            self._check()
            return self.fig
        finally:
            if self.project is not None:
                self.project.stop_all()
                if self.project._runtime is not None:
                    self.project._runtime.close()
            self.server.stop(kill=True)

    def _records(self, ids: list[str]) -> dict[str, dict[str, str]]:
        assert self.project is not None
        k = self.project.keys("fast")
        sc = self.project.runtime.scripts
        out: dict[str, dict[str, str]] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            batch = sc.batch()
            for job_id in chunk:
                sc.lookup(k, job_id, pipe=batch)
            for job_id, (rec, state, claim, outcome) in zip(chunk, batch.execute(), strict=True):
                rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
                out[job_id] = records.view(job_id, rec, state or [], claim or None, outcome or None)
        return out

    def _wait_all_final(self) -> None:
        pending = list(self.accepted.values())

        def settled() -> bool:
            nonlocal pending
            try:
                recs = self._records(pending)
            except redis.ConnectionError:
                return False
            pending = [i for i in pending if recs[i].get("status") not in ("done", "dead")]
            return not pending

        wait_for(settled, timeout=180, interval=0.25, what="every accepted job to finish")

    def _check(self) -> None:
        assert self.project is not None
        p = self.project
        ids = list(self.accepted.values())
        assert len(set(ids)) == len(ids), "two keys share a job id"
        self.fig.jobs = len(ids)
        recs = self._records(ids)
        latencies: list[float] = []
        spans: dict[str, list[tuple[float, float]]] = {}
        for key, job_id in self.accepted.items():
            f = recs[job_id]
            assert f, f"job {job_id} ({key}) is lost: no record"
            status = f["status"]
            assert status in ("done", "dead"), (job_id, f)
            history = [h["outcome"] for h in _history(f)]
            attempt = int(f["attempt"])
            # (A done job keeps no max_attempts: its outcome is compact.)
            assert "max_attempts" not in f or attempt <= int(f["max_attempts"]), (job_id, f)
            lines = p.runs(job_id)
            starts = [ln for ln in lines if ln.startswith("start ")]
            ends = [ln for ln in lines if ln.startswith("end ")]
            if status == "done":
                self.fig.done += 1
                if f.get("duplicate_of"):
                    assert not starts
                    continue
                assert history.count("done") == 1 and history[-1] == "done", (job_id, history)
                latencies.append((int(f["finished_ms"]) - int(f["created_ms"])) / 1000)
            else:
                self.fig.dead += 1
                self.fig.dead_reasons[f.get("reason", "?")] += 1
                if f.get("reason") == "worker lost" and not starts:
                    self.fig.unstarted_burials += 1
            # Entries that spent no attempt: a prefetched run lost before its start was
            # recorded, a run its worker gave up at shutdown.
            unspent = history.count("lost unstarted") + history.count("interrupted")
            assert len(history) - unspent == attempt, (job_id, history, attempt)
            # Every handler start belongs to an attempt the history accounts for.
            assert len(starts) <= len(history), (job_id, starts, history)
            # And the other way: an attempt spent with no handler start recorded for it (a
            # job charged while it waited for its child, or killed before its start).
            self.fig.charged_unrun += max(0, attempt - len(starts))
            self.fig.retries += history.count("retry")
            self.fig.redeliveries += history.count("worker lost") + unspent
            self.fig.extra_runs += max(0, len(starts) - 1 - history.count("retry"))
            self.fig.extra_completions += max(0, len(ends) - 1)
            # No duplicated effect across jobs: every run under this key is this job's.
            key_file = p.records / f"key-{key}"
            runs_of_key = key_file.read_text().splitlines() if key_file.exists() else []
            assert {ln.split()[0] for ln in runs_of_key} <= {job_id}, (key, runs_of_key)
            for ln in ends:
                _, _, s, e, _ = ln.split()
                spans.setdefault(str(self.payloads[key]["r"]), []).append((float(s), float(e)))
        for runs in spans.values():
            runs.sort()
            for (_, e1), (s2, _) in itertools.pairwise(runs):
                if s2 < e1:
                    self.fig.resource_overlaps += 1
        stats = p.client.stats()["fast"]["counters"]
        self.fig.duplicates_at_claim = stats.get("duplicates|chaos", 0)
        latencies.sort()
        if latencies:
            self.fig.max_enqueue_to_done_s = latencies[-1]
            self.fig.p99_enqueue_to_done_s = latencies[int(len(latencies) * 0.99) - 1 if len(latencies) > 1 else 0]
        s = structures(p)
        assert s["ready"] == [] and s["leases"] == [] and s["scheduled"] == [], s
        assert sorted(s["dead"]) == sorted(i for i in ids if recs[i]["status"] == "dead")
        left = {key: p.runtime.redis.zrange(key, 0, -1, withscores=True) for key in lock_keys(p)}
        assert not left, f"resource lock(s) left behind: {left}"
        assert_no_job_in_two_structures(p)
        # The deploy gate's census (kept by the scripts through every kill, retry, late ack
        # and duplicate above) says what a scan of every waiting job says.
        _, counted = census.counts(p.runtime.redis, {"fast": p.keys("fast")})
        _, scanned = census.waiting_versions(p.runtime.redis, {"fast": p.keys("fast")})
        by_version: Counter[tuple[str, str]] = Counter()
        for (_, _, type_, version), n in scanned.items():
            by_version[(type_, version)] += n
        assert {(t, v): n for (_, _, t, v), n in counted.items()} == dict(by_version), (counted, scanned)


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if f[0] != "Z":
            parents.setdefault(int(f[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _history(f: dict[str, str]) -> list[dict[str, Any]]:
    import orjson

    raw = f.get("history") or ""
    return list(orjson.loads("[" + raw + "]")) if raw else []
