"""Profiles of runner's hot paths with py-spy (sampling, from outside the process):

- one worker process while two drain a deep queue: samples of the thread holding the
  GIL, i.e. where the worker's CPU goes;
- the one-by-one producer (wall clock, idle included: the wait for Redis's reply is the
  point of the question).

The raw collapsed stacks go to bench/results/profiles/ (not committed); the summary
(top functions by self and by inclusive share, grouped by file) goes to the results.
"""

from __future__ import annotations

import collections
import re
import subprocess
from pathlib import Path
from typing import Any

from harness import scenarios
from harness.procs import Group
from harness.scenarios import Env
from harness.systems import PEERS_DIR, System

FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^:()]+)(:\d+)?\)$")


def _frame(f: str) -> tuple[str, str]:
    m = FRAME.match(f.strip())
    if not m:
        return f.strip(), ""
    path = m.group("file")
    for marker in ("site-packages/", "lib/python3", "/runner/", "/bench/"):
        if marker in path:
            path = path[path.index(marker) + len(marker):]
            break
    return m.group("fn"), path


def bucket(file: str, fn: str) -> str:
    """Which layer a sampled frame belongs to."""
    top = file.split("/")[0]
    if top in ("runner", "redis", "falcon", "gunicorn", "hiredis", "benchprobe.py"):
        return {"benchprobe.py": "the probe", "hiredis": "redis"}.get(top, top)
    if top in ("threading.py", "queue.py") or fn in ("wait", "acquire"):
        return "threads: waits and hand-offs"
    if top.startswith(("socket", "selectors", "ssl")):
        return "sockets"
    return "other"


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit() or not stack:
            continue
        count = int(n)
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        fn, file = frames[-1]
        self_c[f"{fn} ({file})"] += count
        buckets[bucket(file, fn)] += count
        for key in {f"{f} ({p})" for f, p in frames}:
            incl[key] += count
    pct = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "self": [(k, pct(v)) for k, v in self_c.most_common(top)],
        "inclusive": [(k, pct(v)) for k, v in incl.most_common(top * 2)],
        "buckets": {k: pct(v) for k, v in buckets.most_common()},
    }


def py_spy(bin_dir: Path) -> str | None:
    p = bin_dir / "py-spy"
    return str(p) if p.exists() else None


def worker(env: Env, sysm: System, spy: str, n: int, out_dir: Path) -> dict[str, Any]:
    """Sample one of the two workers while they drain n jobs."""
    res: dict[str, Any] = {}
    for mode in ("cpu",):
        scenarios.flush(env)
        probe = scenarios.fresh_dir(env.work, "probe")
        sysm.drive(env.url, probe, "enqueue", "--n", str(n), "--mode", "fast", timeout_s=120)
        group = Group().start(sysm.worker_cmds, sysm.environ(env.url, probe), sysm.cwd,
                              env.work / f"profile-{mode}")
        raw = out_dir / f"worker-{mode}.txt"
        try:
            scenarios.wait_count(probe, 1, 30, group)  # sample the drain, not the imports
            # Only the thread holding the GIL: where a GIL-bound process spends its CPU.
            args = [spy, "record", "-p", str(group.pids[0]), "-r", "1000", "-f", "raw", "-o", str(raw),
                    "-d", "30", "--nonblocking", "--gil"]
            spy_proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            done = scenarios.wait_count(probe, n, 30, group)
            spy_proc.send_signal(2)  # SIGINT: py-spy writes what it has and exits
            spy_proc.wait(timeout=30)
        finally:
            group.stop()
        res[mode] = summarize(raw) if raw.exists() else {"error": "py-spy wrote nothing"}
        res[mode]["jobs"] = done.count
    return res


def producer(env: Env, sysm: System, spy: str, n: int, out_dir: Path) -> dict[str, Any]:
    """Sample the one-by-one producer, idle (waiting on the socket) included."""
    scenarios.flush(env)
    probe = scenarios.fresh_dir(env.work, "probe")
    raw = out_dir / "producer-wall.txt"
    cmd = [spy, "record", "-r", "500", "-f", "raw", "-o", str(raw), "--idle", "--",
           sysm.python, str(PEERS_DIR / "drive.py"), sysm.producer or sysm.name, "enqueue", "--n", str(n),
           "--mode", "single", "--max-seconds", "30"]
    subprocess.run(cmd, env=sysm.environ(env.url, probe), cwd=sysm.cwd, capture_output=True,
                   timeout=120)
    return summarize(raw) if raw.exists() else {"error": "py-spy wrote nothing"}
