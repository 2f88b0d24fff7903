"""Light load (issue 53): what a worker costs when there is little or nothing to do.

idle      one worker process that has run one job and then sits idle (nothing queued,
          nothing scheduled), measured over a span: its CPU time (every thread, from
          /proc/<pid>/task/*/schedstat, in nanoseconds) as a share of one core, each
          thread's wake-ups per second (its context switches), and the Redis commands it
          sends per second, the benchmark's probe thread left out. Target: under 0.5 % of
          a core over 60 s.
at 500/s  the latency scenario (scenarios.latency) of runner with 1 and with 2 worker
          processes and of Huey, interleaved: worker CPU ms per job while 500 jobs/s are
          offered one at a time. Target: runner's at most Huey's, for both.

Thread names come from a py-spy dump (by native thread id) when py-spy is at hand.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import scenarios
from harness.procs import Group, tree
from harness.scenarios import Env
from harness.systems import BENCH, System

IDLE_TARGET_PCT = 0.5
# The benchprobe's reporter thread (it wakes every 50 ms in every system): shown, but left
# out of the totals, which are the system's own.
PROBE_THREAD = "bench-probe"


def _task_stats(pid: int) -> dict[int, tuple[int, int]]:
    """Per thread of ``pid``: (CPU ns, context switches)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return out  # the process is gone
    for tid in tids:
        try:
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        switches = sum(int(m) for m in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", status, re.M))
        out[tid] = (ns, switches)
    return out


def _py_spy() -> str | None:
    venv = BENCH / ".venv-peers" / "bin" / "py-spy"
    return str(venv) if venv.exists() else shutil.which("py-spy")


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name (py-spy dump), or nothing."""
    spy = _py_spy()
    if spy is None:
        return {}
    try:
        out = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]*)"', out, re.M)}


def _label(name: str) -> str:
    """A thread's name without its number, so the 16 executor threads add up to one row."""
    return re.sub(r"-\d+$", "-N", name)


def idle(env: Env, sysm: System, seconds: float, settle_s: float = 3.0) -> dict[str, Any]:
    """One idle run of ``sysm``'s first worker command (see the module's docstring)."""
    st = scenarios.flush(env)
    probe = scenarios.fresh_dir(env.work, "probe")
    group = Group().start(sysm.worker_cmds[:1], sysm.environ(env.url, probe), sysm.cwd,
                          env.work / f"{sysm.name}-idle")
    main = group.pids[0]
    try:
        sysm.drive(env.url, probe, "enqueue", "--n", "1", "--mode", "single", "--max-seconds", "30", timeout_s=90)
        if scenarios.wait_count(probe, 1, 60, group).count < 1:
            raise RuntimeError(f"{sysm.name}: the warm-up job did not run within 60 s")
        time.sleep(settle_s)  # the warm-up's settlement and any start-up work done
        pids = tree(group.pids)
        names: dict[int, str] = {}
        for pid in pids:
            names.update(thread_names(pid))
        st.reset()
        before = {pid: _task_stats(pid) for pid in pids}
        t0 = time.monotonic()
        time.sleep(seconds)
        after = {pid: _task_stats(pid) for pid in pids}
        span = time.monotonic() - t0
        cmds = st.commands()
        if not group.alive():
            raise RuntimeError(f"{sysm.name}: the worker exited while idle; see its log")
    finally:
        group.stop()
    threads: dict[str, dict[str, float]] = {}
    total_ns = probe_ns = 0
    for pid, now in after.items():
        for tid, (ns, sw) in now.items():
            ns0, sw0 = before.get(pid, {}).get(tid, (0, 0))
            name = _label(names.get(tid, "?" if pid == main else "child"))
            if name == PROBE_THREAD:
                probe_ns += ns - ns0  # the benchmark's own reporter: not the system's cost
            else:
                total_ns += ns - ns0
            row = threads.setdefault(name, {"threads": 0, "cpu_ms": 0.0, "wakeups_per_s": 0.0})
            row["threads"] += 1
            row["cpu_ms"] += (ns - ns0) / 1e6
            row["wakeups_per_s"] += (sw - sw0) / span
    calls = {k: v["calls"] / span for k, v in cmds.items()}
    return {
        "seconds": span, "processes": len(pids),
        "cpu_pct": 100 * total_ns / 1e9 / span, "probe_cpu_pct": 100 * probe_ns / 1e9 / span,
        "wakeups_per_s": sum(r["wakeups_per_s"] for k, r in threads.items() if k != PROBE_THREAD),
        "threads": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in
                    sorted(threads.items(), key=lambda kv: -kv[1]["wakeups_per_s"])},
        "redis_commands_per_s": sum(calls.values()),
        "redis_commands": {k: round(v, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= 0.05},
    }


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_idle(env: Env, systems: list[System], reps: int, seconds: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for rep in range(reps):
        for s in systems:  # interleaved: drift on the machine hits each alike
            print(f"  idle {s.name} {rep + 1}/{reps} ({seconds:.0f} s)", flush=True)
            r = idle(env, s, seconds)
            print(f"    {r['cpu_pct']:.3f} % of a core, {r['wakeups_per_s']:.1f} wake-ups/s, "
                  f"{r['redis_commands_per_s']:.1f} Redis commands/s", flush=True)
            runs[s.name].append(r)
    return {name: {"label": next(s.label for s in systems if s.name == name),
                   "cpu_pct": spread([r["cpu_pct"] for r in rs]),
                   "wakeups_per_s": spread([r["wakeups_per_s"] for r in rs]),
                   "redis_commands_per_s": spread([r["redis_commands_per_s"] for r in rs]),
                   "runs": rs} for name, rs in runs.items()}


def run_rate(env: Env, systems: list[System], reps: int, n: int, rate: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for rep in range(reps):
        for s in systems:
            print(f"  {rate:.0f}/s {s.name} {rep + 1}/{reps}", flush=True)
            r = scenarios.latency(env, s, n, rate)
            print(f"    worker {r['worker_cpu_ms_per_job']:.3f} ms/job, Redis {r['redis_cpu_ms_per_job']:.3f} "
                  f"ms/job, {r['commands_per_job']:.1f} commands/job, p50/p99 {r['p50_ms']:.2f}/{r['p99_ms']:.2f} ms",
                  flush=True)
            runs[s.name].append(r)
    out: dict[str, Any] = {}
    for s in systems:
        rs = runs[s.name]
        out[s.name] = {"label": s.label, "note": s.note,
                       **{k: spread([r[k] for r in rs]) for k in
                          ("worker_cpu_ms_per_job", "redis_cpu_ms_per_job", "commands_per_job",
                           "script_calls_per_job", "p50_ms", "p99_ms")},
                       "runs": rs}
    return out


def _fmt(s: dict[str, float] | None, digits: int = 3) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def idle_markdown(res: dict[str, Any]) -> list[str]:
    out = [f"Idle worker over {res['seconds']:.0f} s, medians of {res['reps']} (min-max); target: under "
           f"{IDLE_TARGET_PCT} % of a core.", "",
           "| system | CPU % of a core | wake-ups/s | Redis commands/s |", "|---|---|---|---|"]
    for r in res["idle"].values():
        out.append(f"| {r['label']} | {_fmt(r['cpu_pct'])} | {_fmt(r['wakeups_per_s'], 1)} | "
                   f"{_fmt(r['redis_commands_per_s'], 1)} |")
    for name, r in res["idle"].items():
        last = r["runs"][-1]
        out += ["", f"{name}, by thread (last run): CPU ms over the span, wake-ups/s", "",
                "| thread | threads | CPU ms | wake-ups/s |", "|---|---|---|---|"]
        out += [f"| {t} | {v['threads']:.0f} | {v['cpu_ms']:.1f} | {v['wakeups_per_s']:.2f} |"
                for t, v in last["threads"].items()]
        out += ["", "Redis commands/s (last run): " + ", ".join(
            f"{k} {v}" for k, v in last["redis_commands"].items())]
    return out


def rate_markdown(res: dict[str, Any]) -> list[str]:
    rows = res["rate"]
    out = [f"{res['n']} jobs offered at {res['rate_per_s']:.0f} jobs/s, open loop, medians of {res['reps']} "
           "(min-max).", "",
           "| system | worker CPU ms/job | Redis CPU ms/job | commands/job | script calls/job | p50 ms | p99 ms |",
           "|---|---|---|---|---|---|---|"]
    for r in rows.values():
        out.append(f"| {r['label']} ({r['note']}) | {_fmt(r['worker_cpu_ms_per_job'])} | "
                   f"{_fmt(r['redis_cpu_ms_per_job'])} | {_fmt(r['commands_per_job'], 1)} | "
                   f"{_fmt(r['script_calls_per_job'], 2)} | {_fmt(r['p50_ms'], 2)} | {_fmt(r['p99_ms'], 2)} |")
    huey = (rows.get("huey") or {}).get("worker_cpu_ms_per_job")
    if huey:
        out.append("")
        for name, r in rows.items():
            if name != "huey" and r.get("worker_cpu_ms_per_job"):
                ratio = r["worker_cpu_ms_per_job"]["median"] / huey["median"]
                out.append(f"- {name}: {ratio:.2f}x Huey's worker CPU per job (target: at most 1.00)")
    return out
