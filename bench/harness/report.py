"""Results out: bench/results/latest.json (+ a dated copy), latest.md, latest.png."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from harness.systems import BENCH

RESULTS = BENCH / "results"


def _num(v: float, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:,.{digits}f}"


def cell(s: dict[str, float] | None, digits: int = 0) -> str:
    if not s:
        return "n/a"
    if s["min"] == s["max"]:
        return _num(s["median"], digits)
    return f"{_num(s['median'], digits)} ({_num(s['min'], digits)}-{_num(s['max'], digits)})"


def ratio(runner: dict[str, float] | None, other: dict[str, float] | None, lower_better: bool = False) -> str:
    if not runner or not other or not other["median"] or not runner["median"]:
        return "n/a"
    r = other["median"] / runner["median"] if lower_better else runner["median"] / other["median"]
    return f"{r:.2f}x"


def main_table(res: dict[str, Any]) -> list[str]:
    systems = res["systems"]
    rn = systems.get("runner", {})
    out = [
        "| system | mode | drain jobs/s | runner ÷ | enqueue 1-by-1 jobs/s | runner ÷ | "
        "enqueue batch jobs/s | runner ÷ | p50 / p99 ms at 500/s | Redis cmds/job (scripts) | "
        "worker CPU ms/job | worker RSS MB | Redis CPU ms/job |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in systems.items():
        lat = s.get("latency") or {}
        over = s.get("over_capacity")
        latcell = "over capacity" if over else (
            f"{cell(lat.get('p50_ms'), 2)} / {cell(lat.get('p99_ms'), 2)}" if lat else "n/a")
        cmds = s.get("commands_per_job")
        scr = s.get("script_calls_per_job")
        cmdcell = f"{_num(cmds['median'], 1)}" if cmds else "n/a"
        if scr and scr["median"] >= 0.05:
            cmdcell += f" ({_num(scr['median'], 2)})"
        out.append(
            f"| {s['label']} | {s.get('note', '')} | {cell(s.get('drain'))} | "
            f"{'' if name == 'runner' else ratio(rn.get('drain'), s.get('drain'))} | "
            f"{cell(s.get('enqueue_single'))} | "
            f"{'' if name == 'runner' else ratio(rn.get('enqueue_single'), s.get('enqueue_single'))} | "
            f"{cell(s.get('enqueue_batch'))} | "
            f"{'' if name == 'runner' else ratio(rn.get('enqueue_batch'), s.get('enqueue_batch'))} | "
            f"{latcell} | {cmdcell} | {cell(s.get('worker_cpu_ms_per_job'), 3)} | "
            f"{cell(s.get('worker_rss_mb'))} | {cell(s.get('redis_cpu_ms_per_job'), 3)} |"
        )
    return out


WORK_LABELS = {"incr": "one Redis INCR", "sleep": "1 ms sleep"}


def io_table(res: dict[str, Any]) -> list[str]:
    """Drain with handlers that do I/O, next to the no-op: jobs/s, runner's ratio over
    each system, and the workers' CPU per job."""
    systems = res["systems"]
    work = [w for w in WORK_LABELS if any(s.get(f"drain_{w}") for s in systems.values())]
    if not work:
        return []
    rn = systems.get("runner", {})
    head = ["no-op drain jobs/s", "worker CPU ms/job"]
    for w in work:
        head += [f"{WORK_LABELS[w]}: drain jobs/s", "runner ÷", "worker CPU ms/job"]
    out = ["**Handlers that do I/O** (the same drain; each job's handler makes one Redis INCR round "
           "trip, or sleeps 1 ms)", "", "| system | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for name, s in systems.items():
        row = [cell(s.get("drain")), cell(s.get("worker_cpu_ms_per_job"), 3)]
        for w in work:
            row += [cell(s.get(f"drain_{w}")),
                    "" if name == "runner" else ratio(rn.get(f"drain_{w}"), s.get(f"drain_{w}")),
                    cell(s.get(f"worker_cpu_ms_per_job_{w}"), 3)]
        out.append(f"| {s['label']} | " + " | ".join(row) + " |")
    return [*out, ""]


def light_table(res: dict[str, Any]) -> list[str]:
    """Light load (issue 53): each system's cost per job while jobs arrive one at a time
    at the latency scenario's rate, beside Huey's; the targets are runner's worker CPU and
    Redis CPU per job at most Huey's, and at most 15 Redis commands per job."""
    systems = res["systems"]
    rows = {n: s for n, s in systems.items() if s.get("light")}
    if not rows:
        return []
    rate = res.get("config", {}).get("rate", 500.0)
    huey = (systems.get("huey") or {}).get("light") or {}
    out = [f"**Light load** ({rate:,.0f} jobs/s offered one at a time, open loop, to idle workers: the latency "
           "scenario above. Per job: the workers' CPU, the server's CPU (INFO cpu) and its commands, those "
           "inside scripts counted (INFO commandstats), script calls in parentheses. `÷ Huey` is the figure "
           "over Huey's: at most 1.00 is the target for runner)", "",
           "| system | mode | worker CPU ms/job | ÷ Huey | Redis CPU ms/job | ÷ Huey | Redis cmds/job (scripts) | "
           "p50 / p99 ms |", "|---|---|---|---|---|---|---|---|"]
    for name, s in rows.items():
        lt, lat = s["light"], s.get("latency") or {}
        cmds, scr = lt.get("commands_per_job"), lt.get("script_calls_per_job")
        cmdcell = cell(cmds, 1) + (f" ({_num(scr['median'], 2)})" if scr and scr["median"] >= 0.05 else "")
        cpu = {k: (cell(lt.get(k), 3), "" if name == "huey" else ratio(lt.get(k), huey.get(k)))
               for k in ("worker_cpu_ms_per_job", "redis_cpu_ms_per_job")}
        out.append(
            f"| {s['label']} | {s.get('note', '')} | {' | '.join(cpu['worker_cpu_ms_per_job'])} | "
            f"{' | '.join(cpu['redis_cpu_ms_per_job'])} | {cmdcell} | "
            f"{cell(lat.get('p50_ms'), 2)} / {cell(lat.get('p99_ms'), 2)} |")
    return [*out, ""]


def memory_table(res: dict[str, Any]) -> list[str]:
    """Redis memory per job in the no-op drain: while queued, and still held once every
    job ran (what each system keeps by default: records, results, acked messages)."""
    systems = res["systems"]
    if not any(s.get("queued_bytes_per_job") for s in systems.values()):
        return []
    rn = systems.get("runner", {})
    out = ["**Redis memory per job** (the no-op drain above: the growth of used_memory from the empty server "
           "to the end of the enqueue, and to after the workers ran every job and stopped, over the jobs; the "
           "same small payload for every system. Each system's constant costs, its scripts and the server's own "
           "structures, are spread over the jobs: compare within this table; runner's own per-job figures, "
           "after a warm-up, are under Runner-only scenarios. `runner ÷` above 1: runner uses less)", "",
           "| system | bytes per queued job | runner ÷ | bytes still held per finished job |", "|---|---|---|---|"]
    for name, s in systems.items():
        q = s.get("queued_bytes_per_job")
        out.append(f"| {s['label']} | {cell(q)} | "
                   f"{'' if name == 'runner' else ratio(rn.get('queued_bytes_per_job'), q, lower_better=True)} | "
                   f"{cell(s.get('held_bytes_per_job'))} |")
    return [*out, ""]


def limits(res: dict[str, Any]) -> list[str]:
    """Where runner's drain stands against the CPU it costs."""
    r = res["systems"].get("runner")
    if not r or not r.get("worker_cpu_ms_per_job") or not r.get("redis_cpu_ms_per_job") or not r.get("drain"):
        return []
    w, s, d = r["worker_cpu_ms_per_job"]["median"], r["redis_cpu_ms_per_job"]["median"], r["drain"]["median"]
    cores = res["machine"]["cpus"] or 2
    ceiling = cores * 1000 / (w + s)
    return [
        f"**What limits runner's drain.** Per job, the 2 workers spend {w:.3f} ms of CPU and the "
        f"server {s:.3f} ms; at the measured {d:,.0f} jobs/s that is {w * d / 1000:.2f} + "
        f"{s * d / 1000:.2f} of {cores} cores. Were CPU the only limit, {cores} cores would drain "
        f"about {ceiling:,.0f} jobs/s; the gap is time spent waiting (round trips, thread "
        "hand-offs inside a worker, and whatever else runs on the machine).",
        "",
    ]


def _pairs_table(title: str, rows: dict[str, dict[str, Any]], cols: list[tuple[str, str, int]]) -> list[str]:
    out = [f"**{title}**", "", "| | " + " | ".join(c[1] for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for label, r in rows.items():
        if not isinstance(r, dict):
            continue
        out.append(f"| {label} | " + " | ".join(cell(r.get(c[0]), c[2]) for c in cols) + " |")
    return [*out, ""]


def extras_md(x: dict[str, Any]) -> list[str]:
    out: list[str] = []
    failed = {k: v["error"] for k, v in x.items() if isinstance(v, dict) and "error" in v}
    x = {k: v for k, v in x.items() if k not in failed}
    for k, err in failed.items():
        out += [f"**{k}**: failed in this run: {err}", ""]
    v = x.get("validation")
    if v:
        out += ["**Validation cost per payload (compiled validators, issue 3)**", "",
                "| schema | valid: is_valid µs | valid: validate µs | invalid: every error µs (errors) |",
                "|---|---|---|---|"]
        for r in v["schemas"]:
            out.append(f"| {r['schema']} | {r['valid_is_valid_us']:.2f} | {r['valid_validate_us']:.2f} | "
                       f"{r['invalid_all_errors_us']:.1f} ({r['invalid_error_count']}) |")
        out += ["", f"One Redis PING round trip: {v['redis_ping_us']:.0f} µs; the whole client-side "
                f"prepare of a send_email v2 job (validate, templates, payload hash, encode): "
                f"{v.get('prepare_send_email_us', float('nan')):.1f} µs.", ""]
    cols = [("drain", "drain jobs/s", 0), ("enqueue_single", "enqueue 1-by-1 jobs/s", 0),
            ("enqueue_batch", "enqueue batch jobs/s", 0), ("commands_per_job", "Redis cmds/job", 1),
            ("worker_cpu_ms_per_job", "worker CPU ms/job", 3)]
    if x.get("guarded"):
        out += _pairs_table("Idempotency keys + resource locks vs plain jobs (issue 4)", x["guarded"], cols)
    if x.get("mix"):
        out += _pairs_table("Fast queue beside long jobs on the slow queue", x["mix"],
                            [("drain", "fast drain jobs/s", 0), ("p50_ms", "fast p50 ms", 2),
                             ("p99_ms", "fast p99 ms", 2)])
    m = x.get("metrics")
    if m:
        rows = {k: v for k, v in m.items() if isinstance(v, dict)}
        out += _pairs_table("Metrics on vs neutralised (issue 7)", rows,
                            [("drain", "drain jobs/s", 0), ("enqueue_single", "enqueue 1-by-1 jobs/s", 0),
                             ("worker_cpu_ms_per_job", "worker CPU ms/job", 3),
                             ("redis_cpu_ms_per_job", "Redis CPU ms/job", 3),
                             ("commands_per_job", "Redis cmds/job", 1),
                             ("script_server_share", "script share of Redis CPU", 2)])
        if "overhead_pct" in m:
            out += [f"Drain throughput cost of metrics: {m['overhead_pct']:.1f} %.", ""]
    rp = x.get("redis_py")
    if rp:
        out += ["**redis-py: pinned vs newest**", "",
                "| redis-py | PING µs | SET µs | EVALSHA µs | pipelined GET µs/cmd | PING µs, pure-Python parser "
                "| PING µs, RESP3 | runner drain jobs/s | runner enqueue 1-by-1 jobs/s |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in rp.values():
            rt = r.get("roundtrip", {})
            d = rt.get("default", {})
            out.append(
                f"| {rt.get('redis_py', '?')} | {_num(d.get('ping_us'), 1)} | {_num(d.get('set_us'), 1)} | "
                f"{_num(d.get('evalsha_us'), 1)} | {_num(d.get('pipelined_get_us'), 2)} | "
                f"{_num(rt.get('python_parser', {}).get('ping_us'), 1)} | "
                f"{_num(rt.get('resp3', {}).get('ping_us'), 1)} | {cell(r.get('drain'))} | "
                f"{cell(r.get('enqueue_single'))} |")
        out.append("")
    h = x.get("http")
    if h:
        out += ["**HTTP enqueue through gunicorn (issue 5)**", ""]
        if "skipped" in h:
            out += [f"Skipped: {h['skipped']}.", ""]
        else:
            out += [f"Server: `{h['server']}` (2 gunicorn processes, uvicorn workers), load from wrk.", "",
                    "| phase | load | offered req/s | achieved req/s | p50 ms | p99 ms | errors / non-202 |",
                    "|---|---|---|---|---|---|---|"]
            ref = h.get("reference")
            if ref:
                out.append(_closed_row("reference: hello-world ASGI app, same gunicorn settings", ref))
            for phase, runs in h.get("phases", {}).items():
                if "skipped" in runs:
                    out.append(f"| {phase} | skipped: {runs['skipped']} | | | | | |")
                    continue
                for r in runs.get("paced", []):
                    if not r:
                        continue
                    if "error" in r:
                        out.append(f"| {phase} | failed | {_num(r.get('rate'))} | | | | |")
                        continue
                    what = "open loop (Python)" if r.get("generator") == "python" else "wrk, paced, 128 conn."
                    achieved = r.get("achieved", r.get("req_per_s"))
                    bad = r.get("non_2xx", r.get("sent", 0) - r.get("ok", 0) - r.get("errors", 0))
                    errs = r.get("socket_errors", r.get("errors", 0))
                    out.append(f"| {phase} | {what} | {_num(r.get('rate'))} | {_num(achieved)} | "
                               f"{_num(r.get('p50_ms'), 2)} | {_num(r.get('p99_ms'), 2)} | {errs} / {bad} |")
                if runs.get("closed"):
                    out.append(_closed_row(phase, runs["closed"]))
                if runs.get("batch"):
                    out.append(_closed_row(phase, runs["batch"]))
            out.append("")
            closed = (h.get("phases", {}).get("web alone") or {}).get("closed")
            vs = h.get("versus_hello")
            if vs and vs.get("ratios"):
                r = sorted(vs["ratios"])
                out += [f"Enqueue route over the hello-world app, closed loop: "
                        f"{statistics.median(r) * 100:.0f} % (median of {len(r)} interleaved pairs; "
                        f"{r[0] * 100:.0f}-{r[-1] * 100:.0f} %). Runs, req/s: hello-world "
                        f"{', '.join(f'{x:,.0f}' for x in vs['hello_runs'])}; enqueue "
                        f"{', '.join(f'{x:,.0f}' for x in vs['route_runs'])}. The rows above show the "
                        f"median run of each.", ""]
            elif ref and closed and ref.get("req_per_s"):
                out += [f"Enqueue route over the hello-world app, closed loop, same run: "
                        f"{closed['req_per_s'] / ref['req_per_s'] * 100:.0f} %.", ""]
    if x.get("startup"):
        from harness import startup

        out += startup.markdown(x["startup"])
    if x.get("memory") and "error" not in x["memory"]:
        import memory

        out += memory.markdown(x["memory"])
    if x.get("flow"):
        from harness import flow

        out += flow.markdown(x["flow"])
    ev = x.get("events")
    if ev and "error" not in ev:
        out += [f"**Events (issue 50)**: one producer thread, {ev['emits']:,} each, same run: enqueue of one job "
                f"{_num(ev['enqueue_per_s'])}/s; emit to 1 subscriber {_num(ev['emit_1_per_s'])}/s; emit to 5 "
                f"subscribers on 2 queues {_num(ev['emit_5_per_s'])}/s ({_num(5 * ev['emit_5_per_s'])} jobs/s).", ""]
    sl = x.get("sleeping")
    if sl and "error" not in sl:
        out += [f"**Sleeping durable jobs (issue 49)**: {sl['jobs']:,} jobs asleep after one step: "
                f"{_num(sl['bytes_per_job'])} B of Redis memory each, {_num(sl['beyond_payload_and_log'])} B beyond "
                f"payload and step log ({sl['step_log_bytes']} B); {_num(sl['more_than_queued'])} B more than queued, "
                f"{_num(sl['more_than_queued_beyond_log'])} B beyond the log (target 300); state hash "
                f"{sl['state_encoding']}.", ""]
    bt = x.get("batches")
    if bt and "error" not in bt:
        out += [f"**BATCH drain (issue 50)**: {bt['jobs']:,} no-op jobs, one worker, median of {bt['reps']}: without "
                f"BATCH {_num(bt['single_jobs_per_s'])}/s, with BATCH size {bt['size']} wait {bt['wait']} s "
                f"{_num(bt['batched_jobs_per_s'])}/s: {bt['speedup']:.2f}x.", ""]
    return out


def _closed_row(phase: str, w: dict[str, Any]) -> str:
    """A table row for a closed-loop wrk run (with ``batch``, jobs per request too)."""
    load, achieved = f"wrk, closed loop, {w['connections']} conn.", _num(w["req_per_s"])
    if w.get("batch"):
        load += f", {w['batch']} jobs per request (batch route)"
        achieved += f" (**{_num(w['req_per_s'] * w['batch'])} jobs/s**)"
    return (f"| {phase} | {load} | - | {achieved} | {_num(w['p50_ms'], 2)} | {_num(w['p99_ms'], 2)} | "
            f"{w.get('socket_errors', 0)} / {w['non_2xx']} |")


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# Benchmark results, {res['date']}",
        "",
        f"Machine: {m['cpus']} cores, Python {m['python']}, server {m['redis']} (append-only off), "
        f"same server for every system. Mode: {res['config']['mode']}, {res['config']['reps']} "
        "repetition(s); medians with (min-max); `runner ÷` is runner's figure over the peer's "
        "(above 1: runner is faster). "
        f"runner: commit {res.get('runner_source', {}).get('commit', '?')} (uncommitted changes in "
        f"runner/: {res.get('runner_source', {}).get('runner_dirty', '?')}), frozen at the start of the run. "
        "Load average at start / end: "
        f"{m.get('loadavg_start', '?')} / {m.get('loadavg_end', '?')} (other work on the machine "
        "skews every figure; worker CPU per job is the steadiest).",
        "",
    ]
    lines += main_table(res)
    lines += ["", "Drain: jobs enqueued first, then 2 worker processes started; jobs/s from the first "
              "job's start to the last's. Enqueue->start latency: idle workers, 500 jobs/s offered "
              "open loop. Redis commands per job count the commands inside scripts too; the "
              "figure in parentheses is script calls (EVALSHA) per job.", ""]
    lines += light_table(res)
    lines += io_table(res)
    lines += memory_table(res)
    lines += limits(res)
    if res.get("runner_only"):
        lines += ["## Runner-only scenarios", "", *extras_md(res["runner_only"])]
    if res.get("profiles"):
        lines += ["## Profiles (py-spy)", ""]
        for name, p in res["profiles"].items():
            views = p.items() if "buckets" not in p else [("", p)]
            for mode, v in views:
                if not isinstance(v, dict) or "buckets" not in v:
                    continue
                lines.append(f"**{name} {mode}** ({v['samples']} samples): " + ", ".join(
                    f"{k} {s} %" for k, s in v["buckets"].items()))
                lines.append("")
                lines += [f"- {k}: {s} % self" for k, s in v["self"][:8]]
                lines.append("")
    return "\n".join(lines) + "\n"


def write(res: dict[str, Any], chart_python: str | None) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = res["date"].replace(":", "").replace("-", "")[:13]
    latest = RESULTS / "latest.json"
    latest.write_text(json.dumps(res, indent=1, default=str))
    shutil.copy(latest, RESULTS / f"{stamp}.json")
    (RESULTS / "latest.md").write_text(markdown(res))
    if chart_python:
        proc = subprocess.run([chart_python, str(BENCH / "harness" / "chart.py"), str(latest),
                               str(RESULTS / "latest.png")], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"chart not drawn: {proc.stderr.strip()[-300:]}")
    return latest
