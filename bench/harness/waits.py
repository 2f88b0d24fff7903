"""Call and wait's cost (issue 23), side by side in one run on one server:

- ``POST /jobs/noop?wait=5`` paced at 200 requests/s through `runner web` (defaults)
  with 2 runner workers draining: each answer carries the finished job, so its latency
  is the whole round trip (enqueue, claim, run a no-op, ack, the pushed notice, the
  answer); against the plain ``POST /jobs/noop`` (202) at the same rate, same servers;
- the plain no-op drain with the wait support present but unused, against the last full
  run's runner drain (within 5 %: a job nobody waits for costs no extra command).
"""

from __future__ import annotations

import http.client
import json
import shutil
import statistics
from typing import Any

from harness import extras, flow, scenarios
from harness.procs import Group
from harness.scenarios import Env
from harness.systems import runner_project, runner_system

RATE = 200.0
WAIT_S = 5
TOKEN = "bench-token"


def _sample(port: int, query: str) -> tuple[int, str]:
    """One request by hand: its status and the job's status (wrk counts only 2xx)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S + 5)
    try:
        conn.request("POST", "/jobs/noop" + query, body=b'{"t": 0}',
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        body = json.loads(resp.read() or b"{}")
        return resp.status, str(body.get("status", ""))
    finally:
        conn.close()


def run(env: Env, n: int, reps: int, cap_s: float, seconds: int) -> dict[str, Any]:
    if not shutil.which("wrk"):
        return {"skipped": "wrk is not installed (apt-get install wrk)"}
    from runner.store.embedded import free_port

    toml = runner_project(env.work / "wait-project")
    base = runner_system(toml)
    genv = base.environ(env.url, scenarios.fresh_dir(env.work, "wait-probe"))
    genv.update({"RUNNER_API_TOKEN": TOKEN, "RUNNER_CONFIG": str(toml)})
    for k in ("WEB_CONCURRENCY", "RUNNER_WEB_THREADS"):
        genv.pop(k, None)
    cases = {"plain": "", "wait": f"?wait={WAIT_S}"}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    samples: dict[str, list[tuple[int, str]]] = {c: [] for c in cases}
    port = free_port()
    web_cmd = [*base.worker_cmds[0][: base.worker_cmds[0].index("worker")], "web",
               "--host", "127.0.0.1", "--port", str(port)]
    scenarios.flush(env)
    web = Group().start([web_cmd], genv, str(toml.parent), env.work / "wait-web")
    workers = Group().start(base.worker_cmds, genv, base.cwd, env.work / "wait-workers")
    try:
        if not extras._wait_http(port, 20):
            return {"skipped": "runner web did not listen within 20 s"}
        for q in cases.values():  # warm both routes in every web process
            for _ in range(8):
                _sample(port, q)
        for rep in range(reps):  # interleaved, so drift hits both alike
            for case, q in cases.items():
                r = extras._wrk(port, TOKEN, seconds, 64, env.work, rate=RATE, query=q)
                if r is not None:
                    runs[case].append(r)
                    print(f"    {rep + 1}/{reps} {case}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                          f"{r['req_per_s']:,.0f} req/s, non-2xx {r['non_2xx']}", flush=True)
                samples[case] += [_sample(port, q) for _ in range(5)]
    finally:
        web.stop()
        workers.stop()
    out: dict[str, Any] = {"rate": RATE, "seconds": seconds, "reps": reps, "wait_s": WAIT_S,
                           "workers": base.note, "cases": {}}
    for case, r in runs.items():
        out["cases"][case] = {
            "p50_ms": statistics.median(x["p50_ms"] for x in r) if r else None,
            "p99_ms": statistics.median(x["p99_ms"] for x in r) if r else None,
            "req_per_s": statistics.median(x["req_per_s"] for x in r) if r else None,
            "non_2xx": sum(x["non_2xx"] for x in r), "samples": samples[case], "runs": r,
        }
    # What a waited answer says: 200 with the job done (not a 202 after the wait).
    out["cases"]["wait"]["answered_done"] = all(s == (200, "done") for s in samples["wait"])
    # The plain drain with the wait support present, unused.
    d = [scenarios.drain(env, base, n, cap_s) for _ in range(reps)]
    drain = scenarios.summary(d, "jobs_per_s")
    ref = flow.last_full_run()
    if ref and drain:
        change = drain["median"] / ref["drain"]["median"] - 1
        ref.update(change=change, within=change >= -flow.BASELINE_TOLERANCE)
    out.update(drain=drain, drain_runs=d, last_full_run=ref)
    return out


def markdown(res: dict[str, Any]) -> list[str]:
    if "skipped" in res:
        return [f"Call and wait: skipped ({res['skipped']}).", ""]
    c = res["cases"]

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    out = [f"**Call and wait (issue 23)**: paced at {res['rate']:.0f} requests/s for {res['seconds']} s, "
           f"medians of {res['reps']}; `runner web` defaults, workers: {res['workers']}", "",
           "| request | answer | p50 ms | p99 ms | non-2xx |", "|---|---|---|---|---|",
           f"| `POST /jobs/noop` | 202 queued | {ms(c['plain']['p50_ms'])} | {ms(c['plain']['p99_ms'])} | "
           f"{c['plain']['non_2xx']} |",
           f"| `POST /jobs/noop?wait={res['wait_s']}` | 200 with the finished job"
           f"{'' if c['wait']['answered_done'] else ' (NOT always: see samples)'} | {ms(c['wait']['p50_ms'])} | "
           f"{ms(c['wait']['p99_ms'])} | {c['wait']['non_2xx']} |", ""]
    ref, drain = res.get("last_full_run"), res.get("drain")
    if ref and drain:
        out.append(f"Plain no-op drain with the wait support present, unused: {drain['median']:,.0f} jobs/s "
                   f"against {ref['drain']['median']:,.0f} in the last full run ({ref['file']}, commit "
                   f"{ref['commit']}): {ref['change'] * 100:+.1f} % "
                   f"({'within' if ref['within'] else 'NOT within'} {flow.BASELINE_TOLERANCE * 100:.0f} %).")
    return [*out, ""]
