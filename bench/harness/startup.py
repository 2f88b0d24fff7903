"""Start-up: what a person waits for before a command answers, and what a new worker
process costs before it runs its first job.

cli     `python -c pass` (the interpreter's own start), `runner --help`, `runner stats`
        and `runner job ID`, each a fresh process, interleaved round by round so drift
        hits them alike; wall and CPU time (from the children's rusage) per run, and
        each command's median over the interpreter's; measured once the machine has
        had a quiet second (waited for up to a minute, and recorded).
worker  one queued job, then one worker command of the system started: seconds from
        the launch to that job's start (the probe's first hit), per system.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import scenarios
from harness.procs import Group
from harness.systems import System

QUIET_BUSY = 0.15  # the busy share of the CPUs below which the machine counts as quiet
QUIET_MAX_S = 60.0


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, timeout=60)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def _busy_share(window_s: float) -> float:
    """The machine's busy share of its CPUs over ``window_s`` (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # idle + iowait
    total0, idle0 = sample()
    time.sleep(window_s)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def settle(max_s: float = QUIET_MAX_S) -> dict[str, float]:
    """Wait, up to ``max_s``, for a second in which the machine is at most QUIET_BUSY busy.
    A start-up is a few tens of milliseconds of one core: measured while an earlier
    scenario's processes still wind down (the full run of 2026-12-04 02:31 began this one
    at a load average of 3.8), the difference over the interpreter grew by a third, for
    the interpreter and the command alike. Recorded, so a run that never got quiet says so."""
    t0 = time.monotonic()
    busy = _busy_share(1.0)
    while busy > QUIET_BUSY and time.monotonic() - t0 < max_s:
        busy = _busy_share(1.0)
    return {"waited_s": round(time.monotonic() - t0, 1), "busy_share": round(busy, 3)}


def over(runs: list[float], base: list[float]) -> list[float]:
    return [a - b for a, b in zip(runs, base, strict=True)]


def quartiles(values: list[float]) -> list[float]:
    """The first and third quartile: the spread of the middle half."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return [q[0], q[2]]


def cli(env: scenarios.Env, runner: System, rounds: int) -> dict[str, Any]:
    """Median wall and CPU ms of each command, and its difference over `python -c pass`."""
    scenarios.flush(env)
    probe = scenarios.fresh_dir(env.work, "probe")
    penv = runner.environ(env.url, probe)
    job = runner.drive(env.url, probe, "enqueue", "--n", "1", "--mode", "single", "--max-seconds", "10")
    base = runner.worker_cmds[0][: runner.worker_cmds[0].index("worker")]
    r = env.redis.client()
    job_id = next((k.rsplit(":", 1)[-1] for k in r.scan_iter("*:job:*", count=1000)), "missing")
    commands = {
        "python -c pass": [runner.python, "-c", "pass"],
        "runner --help": [*base, "--help"],
        "runner stats": [*base, "stats"],
        "runner job ID": [*base, "job", str(job_id)],
    }
    samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in commands}
    codes: dict[str, set[int]] = {k: set() for k in commands}
    quiet = settle()
    for cmd in commands.values():  # a warm-up each: the page cache, compiled bytecode
        _timed(cmd, penv, runner.cwd)
    for _ in range(rounds):
        for name, cmd in commands.items():
            wall, cpu, code = _timed(cmd, penv, runner.cwd)
            samples[name]["wall"].append(wall * 1000)
            samples[name]["cpu"].append(cpu * 1000)
            codes[name].add(code)
    out: dict[str, Any] = {"rounds": rounds, "enqueued": job.get("n"), "quiet": quiet, "commands": {}}
    py = samples["python -c pass"]
    for name, s in samples.items():
        out["commands"][name] = {
            "wall_ms": scenarios.summary([{"v": v} for v in s["wall"]], "v"),
            "cpu_ms": scenarios.summary([{"v": v} for v in s["cpu"]], "v"),
            # Pair by pair (same round), so a slow moment of the machine cancels out.
            "over_python_wall_ms": statistics.median(over(s["wall"], py["wall"])),
            "over_python_cpu_ms": statistics.median(over(s["cpu"], py["cpu"])),
            "over_python_wall_quartiles_ms": quartiles(over(s["wall"], py["wall"])),
            "over_python_cpu_quartiles_ms": quartiles(over(s["cpu"], py["cpu"])),
            "exit_codes": sorted(codes[name]),
        }
    return out


def worker_ready(env: scenarios.Env, systems: list[System], reps: int) -> dict[str, Any]:
    """Seconds from starting one worker command to the start of the job waiting for it."""
    out: dict[str, Any] = {}
    runs: dict[str, list[dict[str, float]]] = {s.name: [] for s in systems}
    for _ in range(reps):
        for s in systems:
            scenarios.flush(env)
            probe = scenarios.fresh_dir(env.work, "probe")
            s.drive(env.url, probe, "enqueue", "--n", "1", "--mode", "single", "--max-seconds", "10")
            launched = time.time()
            group = Group().start(s.worker_cmds[:1], s.environ(env.url, probe), s.cwd,
                                  env.work / f"{s.name}-ready")
            try:
                first = scenarios.wait_count(probe, 1, 30, group)
            finally:
                group.stop()
            if first.count:
                runs[s.name].append({"ready_s": first.first - launched})
    for s in systems:
        out[s.name] = {"label": s.label, "ready_s": scenarios.summary(runs[s.name], "ready_s")}
    return out


def run(env: scenarios.Env, runner: System, systems: list[System], rounds: int, reps: int) -> dict[str, Any]:
    return {"cli": cli(env, runner, rounds), "worker_ready": worker_ready(env, systems, reps)}


def _spread(q: list[float] | None) -> str:
    return f" ({q[0]:.1f} to {q[1]:.1f})" if q else ""  # results of before kept no quartiles


def markdown(x: dict[str, Any]) -> list[str]:
    from harness.report import cell

    out: list[str] = []
    c = x.get("cli")
    if c:
        q = c.get("quiet")
        before = (f"; began after {q['waited_s']:g} s of waiting for a quiet machine, at "
                  f"{100 * q['busy_share']:.0f} % busy") if q else ""
        out += [f"**Start-up of a command** ({c['rounds']} rounds, interleaved; each a fresh process{before})", "",
                "| command | wall ms | CPU ms | over `python -c pass`: wall ms (middle half) | CPU ms "
                "(middle half) | exit |",
                "|---|---|---|---|---|---|"]
        for name, r in c["commands"].items():
            out.append(f"| `{name}` | {cell(r['wall_ms'], 1)} | {cell(r['cpu_ms'], 1)} | "
                       f"{r['over_python_wall_ms']:.1f}{_spread(r.get('over_python_wall_quartiles_ms'))} | "
                       f"{r['over_python_cpu_ms']:.1f}{_spread(r.get('over_python_cpu_quartiles_ms'))} | "
                       f"{','.join(map(str, r['exit_codes']))} |")
        out.append("")
    w = x.get("worker_ready")
    if w:
        out += ["**A worker's start: launch to its first job's start** (one job waiting, one worker "
                "command)", "", "| system | seconds |", "|---|---|"]
        for r in w.values():
            out.append(f"| {r['label']} | {cell(r['ready_s'], 3)} |")
        out.append("")
    return out

