"""Where runner's Redis commands per job go at light load (issue 53): one worker process
(shipped defaults), warmed up and idle, then N jobs offered one at a time at R jobs/s;
the server's MONITOR feed is read the whole time and every command is charged to the
script call it ran inside (a script's commands reach MONITOR just after the script's own
line) or to the plain command it is. INFO commandstats over the same span is printed as
a check: its total counts the same commands.

Usage: python bench/commands.py [--n 1000] [--rate 500] [--workers 1] [--drain]
Prints a table per script (calls per job, inner commands per job by name) and the plain
commands per job. MONITOR costs the server CPU: read Redis CPU per job from bench/light.py.

--drain: the other end of the load. N jobs are enqueued one call each with no worker
running, then the workers start and drain them; the enqueue and the drain get a table
each (the drain's includes the workers' start-up, a few hundred commands in all).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import scenarios, server  # noqa: E402
from harness.procs import Group  # noqa: E402

from runner.store.sources import NAMES, SHAS  # noqa: E402

END = "ECHO bench-commands-end"


def watch(mon_client: Any, lines: list[dict[str, Any]]) -> threading.Thread:
    """Read the MONITOR feed into ``lines`` until the END marker (the reader may lag)."""

    def run() -> None:
        with mon_client.monitor() as m:
            for item in m.listen():
                if item["command"] == END:
                    return
                lines.append(item)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.3)
    return t


def table(lines: list[dict[str, Any]], jobs: int, title: str, by_sha: dict[str, str]) -> float:
    """Print the commands of ``lines`` per job, by script and by plain command; returns the
    total per job."""
    scripts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    calls: collections.Counter[str] = collections.Counter()
    plain: collections.Counter[str] = collections.Counter()
    current = "?"
    for item in lines:
        words = item["command"].split(" ")
        cmd = words[0].strip('"').upper()
        if item.get("client_type") == "lua":  # inside the script call just before it
            scripts[current][cmd] += 1
        elif cmd in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO"):
            current = by_sha.get(words[1].strip('"'), "?") if cmd.startswith("EVALSHA") else "(eval)"
            calls[current] += 1
        elif cmd.lower() not in server.HARNESS and cmd not in ("MONITOR", "CONFIG", "INFO", "ECHO"):
            plain[cmd] += 1
    total = sum(calls.values()) + sum(sum(c.values()) for c in scripts.values()) + sum(plain.values())
    print(f"\n{title}: {total / jobs:.2f} commands per job (MONITOR), "
          f"{sum(calls.values()) / jobs:.2f} script calls per job")
    print("\n| script | calls/job | inner commands/job | of which |\n|---|---|---|---|")
    for name, c in sorted(calls.items(), key=lambda kv: -kv[1]):
        inner = scripts[name]
        print(f"| {name} | {c / jobs:.2f} | {sum(inner.values()) / jobs:.2f} | "
              + ", ".join(f"{k} {v / jobs:.2f}" for k, v in inner.most_common()) + " |")
    print("\n| plain command | per job |\n|---|---|")
    for k, v in plain.most_common():
        print(f"| {k} | {v / jobs:.2f} |")
    return total / jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--drain", action="store_true", help="enqueue N with no worker, then drain them")
    a = ap.parse_args()
    by_sha = {SHAS[n]: n for n in NAMES}
    redis = server.start("auto")
    work = server.tmpdir("bench-commands-")
    env = scenarios.Env(redis, work)
    lines: list[dict[str, Any]] = []
    split = 0  # drain: where the drain's lines begin
    try:
        toml = systems.runner_project(work / "project")
        sysm = systems.runner_system(toml, workers=a.workers)
        st = scenarios.flush(env)
        probe = scenarios.fresh_dir(work, "probe")
        if a.drain:
            t = watch(redis.client(), lines)
            st.reset()
            sent = sysm.drive(env.url, probe, "enqueue", "--n", str(a.n), "--mode", "single",
                              "--max-seconds", "120", timeout_s=180)
            split = len(lines)  # (the enqueue's own reply came after its last command)
            group = Group().start(sysm.worker_cmds, sysm.environ(env.url, probe), sysm.cwd, work / "worker")
            try:
                if scenarios.wait_count(probe, int(sent["n"]), 120, group).count < int(sent["n"]):
                    raise SystemExit("the drain did not end within 120 s")
                time.sleep(0.2)
                stats = st.commands()
                redis.client().echo(END.split(" ")[1])
                t.join(30)
            finally:
                group.stop()
        else:
            group = Group().start(sysm.worker_cmds, sysm.environ(env.url, probe), sysm.cwd, work / "worker")
            try:
                sysm.drive(env.url, probe, "enqueue", "--n", "100", "--mode", "single", "--max-seconds", "30")
                if scenarios.wait_count(probe, 100, 60, group).count < 100:
                    raise SystemExit("warm-up jobs did not run within 60 s")
                time.sleep(0.5)
                t = watch(redis.client(), lines)
                st.reset()
                sent = sysm.drive(env.url, probe, "rate", "--n", str(a.n), "--rate", str(a.rate),
                                  "--max-seconds", str(a.n / a.rate * 2 + 5), timeout_s=a.n / a.rate * 2 + 60)
                scenarios.wait_count(probe, 100 + int(sent["n"]), 20, group)
                time.sleep(0.2)
                stats = st.commands()
                redis.client().echo(END.split(" ")[1])
                t.join(30)
            finally:
                group.stop()
    finally:
        redis.stop()
    jobs = int(sent["n"])
    info = sum(v["calls"] for v in stats.values()) / jobs
    if a.drain:
        print(f"{jobs} jobs enqueued one call each, then drained by {a.workers} worker process(es); "
              f"INFO commandstats over both: {info:.2f} commands per job")
        total = table(lines[:split], jobs, "enqueue", by_sha) + table(lines[split:], jobs, "drain", by_sha)
        print(f"\nenqueue and drain: {total:.2f} commands per job (MONITOR)")
    else:
        print(f"{jobs} jobs at {a.rate:.0f}/s, {a.workers} worker process(es); "
              f"INFO commandstats: {info:.2f} commands per job")
        table(lines, jobs, "all", by_sha)


if __name__ == "__main__":
    main()
