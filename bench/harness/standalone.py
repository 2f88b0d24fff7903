"""One scenario run on its own (bench/flow.py, bench/wait.py): its own server, the
machine and the commit on record, a markdown table printed, and results/<name>.json and
.md written unless told not to."""

from __future__ import annotations

import datetime as dt
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import extras, scenarios, server, systems

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(name: str, title: str, mode: str, server_kind: str, write: bool,
        scenario: Callable[[scenarios.Env], dict[str, Any]],
        markdown: Callable[[dict[str, Any]], list[str]]) -> dict[str, Any]:
    redis = server.start(server_kind)
    work = server.tmpdir(f"bench-{name}-")
    load = _load()
    try:
        print(f"server: {redis.kind} {redis.version}; scratch: {work}; load {load}", flush=True)
        res = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "mode": mode,
               "machine": {**extras.env_info(), "redis": f"{redis.kind} {redis.version}",
                           "kernel": platform.release(), "loadavg_start": load},
               "runner_source": systems.git_state(), **scenario(scenarios.Env(redis, work))}
        res["machine"]["loadavg_end"] = _load()
    finally:
        redis.stop()
    m = res["machine"]
    md = "\n".join([f"# {title}, {res['date']}", "",
                    f"Mode: {mode}. Machine: {m['cpus']} cores, Python {m['python']}, {m['redis']}; "
                    f"runner at commit {res['runner_source']['commit']}; load average at start / end: "
                    f"{m['loadavg_start']} / {m['loadavg_end']}.", "", *markdown(res)])
    print(md)
    if write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        (RESULTS / f"{name}.md").write_text(md)
        print(f"written: {RESULTS}/{name}.json, {name}.md", flush=True)
    return res
