"""Runner-only scenarios: validation cost, idempotency keys + resource locks, the fast
queue beside long slow jobs, metrics on/off, redis-py versions, HTTP through gunicorn."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import scenarios, variants
from harness.procs import Group
from harness.scenarios import Env
from harness.systems import BENCH, REPO, System, runner_src, runner_system

# Example payloads for the shipped schemas: one valid and one invalid per version.
EXAMPLES: dict[tuple[str, int], tuple[dict[str, Any], dict[str, Any]]] = {
    ("send_email", 1): ({"user_id": 7, "to": "ada@example.com", "template": "welcome"},
                       {"user_id": 0, "to": 5, "template": "nope", "extra": True}),
    ("send_email", 2): ({"user_id": 7, "to": ["ada@example.com", "bob@example.com"], "name": "Ada",
                        "template": "welcome"},
                       {"user_id": "7", "to": [], "template": "nope"}),
    ("refresh_report", 1): ({"report_id": "weekly-42", "chunks": 20, "chunk_seconds": 0.1},
                           {"report_id": "no spaces!", "chunks": 0}),
}


def _ns(fn: Callable[[], Any], budget_s: float = 0.3) -> float:
    """Nanoseconds per call, median of 5 timed batches sized to the budget."""
    n, t = timeit.Timer(fn).autorange()
    n = max(1, int(n * budget_s / 5 / max(t, 1e-9)))
    runs = timeit.Timer(fn).repeat(repeat=5, number=n)
    return sorted(runs)[2] / n * 1e9


def validation(env: Env) -> dict[str, Any]:
    """Cost per payload of validating the example schemas (compiled validators), next to
    the cost of one Redis round trip and of the whole client-side prepare step."""
    from runner import config as config_mod
    from runner.catalog import registry
    from runner.client import Client, Request
    from runner.runtime import Runtime

    repo = runner_src() / "repo" if runner_src() != REPO else REPO
    cfg = config_mod.load(repo / "runner.toml", env={"REDIS_URL": env.url})
    reg = registry.load(cfg)
    rows = []
    for (typ, ver), (good, bad) in EXAMPLES.items():
        fn = reg.functions.get(typ)
        if fn is None or ver not in fn.versions.schemas:
            continue
        schema = fn.versions.schemas[ver]
        rows.append({
            "schema": f"{typ} v{ver}",
            "valid_is_valid_us": _ns(lambda s=schema, g=good: s.validator.is_valid(g)) / 1000,
            "valid_validate_us": _ns(lambda f=fn, g=good, v=ver: f.versions.validate(g, v)) / 1000,
            "invalid_all_errors_us": _ns(lambda s=schema, b=bad: s.errors(b)) / 1000,
            "invalid_error_count": len(schema.errors(bad)),
        })
    client = Client(Runtime.create(cfg, reg))
    out: dict[str, Any] = {"schemas": rows}
    if "send_email" in reg.functions:
        req = Request("send_email", EXAMPLES[("send_email", 2)][0])
        out["prepare_send_email_us"] = _ns(lambda: client.prepare(req)) / 1000
    r = env.redis.client()
    out["redis_ping_us"] = _ns(r.ping) / 1000
    client.runtime.close()
    return out


def guarded(env: Env, base: System, n: int, reps: int, cap_s: float) -> dict[str, Any]:
    """Plain no-op jobs against jobs with an idempotency key and a resource lock (one
    distinct key and resource per job: the cost of the bookkeeping, not of contention)."""
    keyed = System(**{**base.__dict__, "env": {**base.env, "BENCH_RUNNER_TYPE": "noop_guarded"}})
    res: dict[str, Any] = {}
    for label, s in (("plain", base), ("idempotency+lock", keyed)):
        drains = [scenarios.drain(env, s, n, cap_s) for _ in range(reps)]
        singles = [scenarios.enqueue(env, s, min(n, 10000), "single", 10) for _ in range(reps)]
        batches = [scenarios.enqueue(env, s, n, "batch", 10) for _ in range(reps)]
        res[label] = {
            "drain": scenarios.summary(drains, "jobs_per_s"),
            "enqueue_single": scenarios.summary(singles, "jobs_per_s"),  # type: ignore[arg-type]
            "enqueue_batch": scenarios.summary(batches, "jobs_per_s"),  # type: ignore[arg-type]
            "commands_per_job": scenarios.summary(drains, "commands_per_job"),
            "worker_cpu_ms_per_job": scenarios.summary(drains, "worker_cpu_ms_per_job"),
        }
    return res


def _sleepers(env: Env, toml: Path, count: int, seconds: float, busy: bool = False) -> None:
    from runner import config as config_mod
    from runner.client import Client, Request
    from runner.runtime import Runtime

    client = Client(Runtime.create(config_mod.load(toml, env={"REDIS_URL": env.url})))
    client.enqueue_many([Request("sleeper", {"s": seconds}) for _ in range(count)])
    client.runtime.close()


def mix(env: Env, toml: Path, n: int, lat_n: int, reps: int, cap_s: float) -> dict[str, Any]:
    """The fast queue's drain and latency alone, and while long jobs run on the slow queue:
    in the Procfile layout (fast workers + a separate slow worker) and with workers that
    serve both queues in one process."""
    fast = runner_system(toml)
    slow_cmd = [c for c in fast.worker_cmds[0] if c not in ("--queue", "fast")] + ["--queue", "slow"]
    both_cmd = [c for c in fast.worker_cmds[0] if c not in ("--queue", "fast")]
    layouts = {
        "fast only (2 fast workers)": (fast.worker_cmds, 0),
        "Procfile: 2 fast + 1 slow worker, 2 slow jobs running": ([*fast.worker_cmds, slow_cmd], 4),
        "2 workers serving both queues, 4 slow jobs running": ([both_cmd, both_cmd], 8),
    }
    out: dict[str, Any] = {}
    for label, (cmds, slow_jobs) in layouts.items():
        s = System(**{**fast.__dict__, "worker_cmds": cmds})
        hook = (lambda k=slow_jobs: _sleepers(env, toml, k, 60.0)) if slow_jobs else None
        drains = [scenarios.drain(env, s, n, cap_s, before_workers=hook) for _ in range(reps)]
        lats = [scenarios.latency(env, s, lat_n, 500, before_workers=hook) for _ in range(reps)]
        out[label] = {"drain": scenarios.summary(drains, "jobs_per_s"),
                      "p50_ms": scenarios.summary(lats, "p50_ms"),
                      "p99_ms": scenarios.summary(lats, "p99_ms")}
    return out


def metrics_cost(env: Env, toml: Path, n: int, reps: int, cap_s: float) -> dict[str, Any]:
    """Drain and enqueue with the metrics as shipped and neutralised, same launcher."""
    work = env.work / "variants"
    on = variants.copy_runner(work / "metrics-on")
    off = variants.copy_runner(work / "metrics-off", variants.METRICS_OFF)
    systems = {
        "metrics on": runner_system(toml, name="runner (metrics on)", env=variants.pythonpath(on)),
        "metrics off": runner_system(toml, name="runner (metrics off)", env=variants.pythonpath(off)),
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {"drain": [], "single": []} for k in systems}
    for _ in range(reps):  # interleaved, so drift hits both alike
        for label, s in systems.items():
            runs[label]["drain"].append(scenarios.drain(env, s, n, cap_s))
            runs[label]["single"].append(scenarios.enqueue(env, s, min(n, 10000), "single", 10) or {})
    out: dict[str, Any] = {}
    for label, r in runs.items():
        out[label] = {
            "drain": scenarios.summary(r["drain"], "jobs_per_s"),
            "enqueue_single": scenarios.summary(r["single"], "jobs_per_s"),
            "worker_cpu_ms_per_job": scenarios.summary(r["drain"], "worker_cpu_ms_per_job"),
            "redis_cpu_ms_per_job": scenarios.summary(r["drain"], "redis_cpu_ms_per_job"),
            "commands_per_job": scenarios.summary(r["drain"], "commands_per_job"),
            "script_server_share": scenarios.summary(r["drain"], "script_share"),
        }
    a, b = out["metrics on"]["drain"], out["metrics off"]["drain"]
    if a and b:
        out["overhead_pct"] = 100 * (b["median"] - a["median"]) / b["median"]
    return out


def redis_py(env: Env, toml: Path, n: int, reps: int, cap_s: float) -> dict[str, Any]:
    """redis-py as pinned (6.x) against the newest: per round trip, and on runner's drain
    and one-by-one enqueue (the same runner source, on PYTHONPATH, in both)."""
    roundtrip = str(BENCH / "harness" / "roundtrip.py")
    out: dict[str, Any] = {}
    new_py = variants.new_redis_env()
    src = variants.copy_runner(env.work / "variants" / "redis-py")
    envs = {"pinned": sys.executable}
    if new_py:
        envs["newest"] = new_py
    trips: dict[str, list[dict[str, Any]]] = {label: [] for label in envs}
    for _ in range(3):  # interleaved: one noisy moment must not decide the comparison
        for label, py in envs.items():
            rt = subprocess.run([py, roundtrip, env.url], capture_output=True, text=True, timeout=300)
            try:
                trips[label].append(json.loads(rt.stdout))
            except json.JSONDecodeError:
                trips[label].append({"error": rt.stderr[-400:]})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {label: {"drain": [], "single": []} for label in envs}
    built = {label: runner_system(toml, name=f"runner on redis-py {label}", python=py,
                                  env=variants.pythonpath(src)) for label, py in envs.items()}
    for _ in range(reps):
        for label, s in built.items():
            runs[label]["drain"].append(scenarios.drain(env, s, n, cap_s))
            runs[label]["single"].append(scenarios.enqueue(env, s, min(n, 10000), "single", 10) or {})
    for label in envs:
        out[label] = {
            "roundtrip": _median_trips(trips[label]),
            "drain": scenarios.summary(runs[label]["drain"], "jobs_per_s"),
            "enqueue_single": scenarios.summary(runs[label]["single"], "jobs_per_s"),
            "worker_cpu_ms_per_job": scenarios.summary(runs[label]["drain"], "worker_cpu_ms_per_job"),
        }
    return out


def _median_trips(trips: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [t for t in trips if "error" not in t]
    if not ok:
        return trips[0] if trips else {}
    out: dict[str, Any] = {k: v for k, v in ok[0].items() if not isinstance(v, dict)}
    for mode in ("default", "python_parser", "resp3"):
        runs = [t[mode] for t in ok if isinstance(t.get(mode), dict) and "error" not in t[mode]]
        if runs:
            out[mode] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out


# --- HTTP ------------------------------------------------------------------------------

def _wait_http(port: int, timeout_s: float) -> bool:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


# wrk paces itself when given a rate: each of its threads keeps one schedule (due times
# at 1/rate apart, per thread) and a free connection waits until the next due time. That
# is an open loop as long as connections are free; latency is counted from the send.
_PACE = """
local ffi = require("ffi")
ffi.cdef[[ typedef struct { long tv_sec; long tv_nsec; } bench_ts; int clock_gettime(int, bench_ts *); ]]
local ts = ffi.new("bench_ts")
local function now_ms()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local interval = %f
local due = nil
function delay()
  local t = now_ms()
  if due == nil or due < t - 1000 then due = t end  -- never burst to catch up a stall
  due = due + interval
  local d = due - t
  if d < 0 then return 0 end
  return d
end
"""


def _wrk(port: int, token: str, seconds: int, connections: int, work: Path,
         rate: float | None = None, batch: int = 0, query: str = "") -> dict[str, Any] | None:
    """Closed loop (as fast as the connections go) or, with ``rate``, paced at that many
    requests/s in all. With ``batch``, each request carries that many jobs to the batch
    route; ``query`` is appended to the path (``?wait=5``)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    threads = 2
    script = work / "post.lua"
    body = "[" + ", ".join(['{"t": 0}'] * batch) + "]" if batch else '{"t": 0}'
    text = ('wrk.method = "POST"\nwrk.body = \'' + body + '\'\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {token}"\n')
    if rate:
        text += _PACE % (threads * 1000.0 / rate)
    script.write_text(text)
    proc = subprocess.run(
        [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
         f"http://127.0.0.1:{port}/jobs/noop" + ("/batch" if batch else "") + query],
        capture_output=True, text=True, timeout=seconds + 30,
    )
    text = proc.stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        if not m:
            return float("nan")
        v = float(m.group(1))
        return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {"connections": connections, "seconds": seconds, "rate": rate, "batch": batch,
            "req_per_s": float(rps.group(1)) if rps else float("nan"),
            "p50_ms": ms("50%"), "p99_ms": ms("99%"),
            "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sum(int(g) for g in errs.groups()) if errs else 0}


def _hello(env: Env) -> tuple[Group, int] | None:
    """hello_app under gunicorn with `runner web`'s settings (2 processes of its uvicorn
    worker class, a socket each, keep-alive 5 s), listening: (its group, its port). The
    worker class is the runner under test's (the frozen copy), as `runner web` serves it."""
    if not shutil.which("wrk"):
        return None
    from runner.store.embedded import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "gunicorn", "-w", "2", "-k", "runner.web.server.Worker", "--reuse-port",
           "--keep-alive", "5", "-b", f"127.0.0.1:{port}", "hello_app:app"]
    genv = {k: v for k, v in os.environ.items() if k != "GUNICORN_CMD_ARGS"}
    if runner_src() != REPO:
        genv["PYTHONPATH"] = str(runner_src())
    web = Group().start([cmd], genv, str(BENCH / "harness"), env.work / "hello")
    if not _wait_http(port, 20):
        web.stop()
        return None
    return web, port


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median requests/s (an odd count: the middle one; even: the upper)."""
    return sorted(runs, key=lambda r: r["req_per_s"])[len(runs) // 2]


def _closed_pairs(env: Env, token: str, hello_port: int, web_port: int, wrk_s: int,
                  pairs: int) -> dict[str, Any]:
    """Closed loop against hello-world and the enqueue route in turn, ``pairs`` times, the
    order swapped every pair: a single run of each wandered by 2x on these machines, and
    the ratio with it. Returns the median run of each and every pair's ratio."""
    hello: list[dict[str, Any]] = []
    route: list[dict[str, Any]] = []
    for i in range(pairs):
        for which in (("hello", "route") if i % 2 == 0 else ("route", "hello")):
            if which == "hello":
                hello.append(_wrk(hello_port, token, wrk_s, 32, env.work) or {"req_per_s": float("nan")})
            else:
                scenarios.flush(env)  # every run starts on an empty queue
                route.append(_wrk(web_port, token, wrk_s, 32, env.work) or {"req_per_s": float("nan")})
    ratios = [r["req_per_s"] / h["req_per_s"] for h, r in zip(hello, route, strict=True) if h["req_per_s"]]
    return {"reference": _median_run(hello), "closed": _median_run(route), "ratios": ratios,
            "hello_runs": [h["req_per_s"] for h in hello], "route_runs": [r["req_per_s"] for r in route]}


def http(env: Env, toml: Path, rates: list[float], seconds: float, wrk_s: int, pairs: int = 5) -> dict[str, Any]:
    """POST /jobs/noop through `runner web` with its defaults (gunicorn, uvicorn workers,
    keep-alive): first with the web server alone on the machine, then with 2 runner
    workers draining the queue meanwhile; alone, also POST /jobs/noop/batch with 100 jobs
    per request. The web server alone is held against a hello-world app under the same
    gunicorn settings, in ``pairs`` interleaved closed-loop pairs (see _closed_pairs).
    Load from wrk (C, so the generator takes little
    of the 2 cores): paced at each rate, then closed loop over 32 connections. Without wrk,
    the Python open-loop generator stands in (it needs most of a core itself)."""
    if not (runner_src() / "runner" / "web" / "server.py").exists():
        return {"skipped": "runner/web/server.py does not exist yet"}
    from runner.store.embedded import free_port

    token = "bench-token"
    base = runner_system(toml)
    genv = base.environ(env.url, scenarios.fresh_dir(env.work, "probe"))
    genv.update({"RUNNER_API_TOKEN": token, "RUNNER_CONFIG": str(toml)})
    genv.pop("WEB_CONCURRENCY", None)
    genv.pop("RUNNER_WEB_THREADS", None)
    out: dict[str, Any] = {"server": "runner web (defaults)", "phases": {}, "reference": None}
    hello = _hello(env)
    try:
        for phase, draining in (("web alone", False), ("2 workers draining", True)):
            port = free_port()
            web_cmd = [*base.worker_cmds[0][: base.worker_cmds[0].index("worker")], "web",
                       "--host", "127.0.0.1", "--port", str(port)]
            scenarios.flush(env)
            web = Group().start([web_cmd], genv, str(toml.parent), env.work / f"web-{int(draining)}")
            workers = (Group().start(base.worker_cmds, genv, base.cwd, env.work / "http-workers")
                       if draining else None)
            runs: dict[str, Any] = {"paced": [], "closed": None}
            try:
                if not _wait_http(port, 20):
                    runs["skipped"] = "runner web did not listen within 20 s"
                    out["phases"][phase] = runs
                    continue
                loadgen = str(BENCH / "harness" / "loadgen.py")
                # A few requests first, so each gunicorn worker has built its app before timing.
                subprocess.run([sys.executable, loadgen, "127.0.0.1", str(port), "/jobs/noop", "--rate", "100",
                                "--seconds", "1", "--token", token], capture_output=True, timeout=60)
                for rate in rates:
                    if shutil.which("wrk"):
                        runs["paced"].append(_wrk(port, token, max(2, int(seconds)), 128, env.work, rate=rate))
                        continue
                    proc = subprocess.run(
                        [sys.executable, loadgen, "127.0.0.1", str(port), "/jobs/noop", "--rate", str(rate),
                         "--seconds", str(seconds), "--token", token],
                        capture_output=True, text=True, timeout=seconds + 90,
                    )
                    try:
                        runs["paced"].append({**json.loads(proc.stdout), "generator": "python"})
                    except json.JSONDecodeError:
                        runs["paced"].append({"rate": rate, "error": proc.stderr[-400:]})
                if not draining and hello is not None:
                    versus = _closed_pairs(env, token, hello[1], port, wrk_s, pairs)
                    out["reference"] = versus.pop("reference")
                    runs["closed"] = versus.pop("closed")
                    out["versus_hello"] = versus
                else:
                    runs["closed"] = _wrk(port, token, wrk_s, 32, env.work)
                if not draining:
                    # The batch route: 100 jobs per request, so jobs/s is 100x the requests.
                    runs["batch"] = _wrk(port, token, wrk_s, 32, env.work, batch=100)
            finally:
                web.stop()
                if workers is not None:
                    workers.stop()
            out["phases"][phase] = runs
    finally:
        if hello is not None:
            hello[0].stop()
    return out


def env_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
