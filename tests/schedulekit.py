"""Helpers for the schedule tests: function files with a SCHEDULE, a clock shifted for
every scheduler at once (the server's TIME plus an offset that only RUNNER_TEST_SCHEDULES
switches on), and the ticks that became jobs, read back from Redis."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runner.catalog.schedules import iso
from runner.store import records
from runner.store.keys import clock_offset

from conftest import SCAN_COUNT, Project, done_ids

TEST_ENV = {"RUNNER_TEST_SCHEDULES": "1"}
OPEN_SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}

QUICK = '''"""Records each run (a schedule's tick)."""
import os

QUEUE = "fast"
{options}


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("run\\n")
    return payload
'''

LONG = '''"""Runs until the file ``release`` exists in $RECORD_DIR (at most 15 s)."""
import os
import time

QUEUE = "fast"
TIMEOUT = 18
{options}


def handle(payload, ctx):
    flag = os.path.join(os.environ["RECORD_DIR"], "release")
    deadline = time.monotonic() + 15
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {{}}
'''


def add_function(project: Project, name: str, options: str, template: str = QUICK,
                 schema: dict[str, Any] | None = None) -> None:
    (project.root / "functions" / f"{name}.py").write_text(template.format(options=options))
    folder = project.root / "schemas" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "v1.json").write_text(json.dumps(schema or OPEN_SCHEMA))
    project._runtime = None


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def server_ms(project: Project) -> int:
    sec, usec = project.runtime.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def set_clock(project: Project, now_ms: int) -> None:
    """Make every scheduler of this project see ``now_ms`` now (and the time run on from it)."""
    r = project.runtime.redis
    offset = now_ms - server_ms(project)
    for queue in project.runtime.keys:  # (one key per queue, under its tag)
        r.set(clock_offset(project.prefix, queue), offset)


def jobs_of(project: Project, queue: str = "fast") -> list[dict[str, Any]]:
    """Every job of a queue that a schedule enqueued, in whichever of its partitions it
    lives: its id, schedule, tick, payload (a done job keeps none: QUICK returns its
    payload, so its result stands in) and the tag of its partition."""
    r = project.runtime.redis
    out = []
    for k in project.runtime.parts[queue]:
        pattern = k.job_prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        ids = {key[len(k.job_prefix):] for key in r.scan_iter(match=pattern, count=SCAN_COUNT)
               if not key.endswith(":s")}
        for job_id in sorted(ids | set(done_ids(r, k))):
            rec, state, claim, outcome = project.runtime.scripts.lookup(k, job_id)
            rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
            v = records.view(job_id, rec, state or [], claim or None, outcome or None)
            if v.get("meta"):
                m = json.loads(v["meta"])
                out.append({"id": job_id, "schedule": m.get("schedule"), "tick": m.get("tick"),
                            "trigger": m.get("trigger"),
                            "payload": json.loads(v.get("payload") or v.get("result") or "null"),
                            "status": v.get("status"), "tag": k.tag})
    return sorted(out, key=lambda j: j["id"])


def ticks(project: Project, schedule: str, queue: str = "fast") -> list[str]:
    """The ticks of one schedule that became jobs, sorted (duplicates kept, so a test sees them)."""
    return sorted(j["tick"] for j in jobs_of(project, queue) if j["schedule"] == schedule and not j["trigger"])


def at(text: str) -> str:
    return iso(ms(text)) or ""


def sibling(project: Project, root: Path) -> Project:
    """A copy of the project's folder (another release of the same app): same Redis, same
    prefix, its own function files."""
    shutil.copytree(project.root, root, ignore=shutil.ignore_patterns("*.log", "records"))
    records = root / "records"
    records.mkdir(exist_ok=True)
    return Project(root=root, server=project.server, prefix=project.prefix, records=records)


def log_has(project: Project, text: str, name: str | None = None) -> bool:
    logs = [project.root / name] if name else sorted(project.root.glob("*.log"))
    return any(text in p.read_text(errors="replace") for p in logs if p.exists())
