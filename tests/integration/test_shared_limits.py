"""A rendered CONCURRENCY or RATE_LIMIT key is one budget for every function that renders
it (docs/flow-control.md): two functions keyed on "api:{account}" share one slot and one
bucket, as two functions sharing a RESOURCE_KEY share one lock."""

from __future__ import annotations

import itertools
import time

from conftest import Project, wait_for

SCHEMA = '{"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]}'

HOLD = '''
import os, time
QUEUE = "fast"
CONCURRENCY = {"key": "api:{account}", "limit": 1}

def handle(payload, ctx):
    start = time.time()
    time.sleep(0.15)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{start} {time.time()}\\n")
'''

RATE = '''
import os, time
QUEUE = "fast"
RATE_LIMIT = {"key": "api:{account}", "limit": 2, "period": 1}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{time.time()}\\n")
'''


def test_two_functions_share_one_concurrency_key(project: Project) -> None:
    """Jobs of two functions with CONCURRENCY {"key": "api:{account}", "limit": 1}, on one
    account, run one at a time, not one per function."""
    p = project
    p.add_function("charge", HOLD, SCHEMA)
    p.add_function("refund", HOLD, SCHEMA)
    p.write_config(concurrency=8)
    c = p.client
    ids = [c.enqueue(t, {"account": "acme"}).id for _ in range(4) for t in ("charge", "refund")]
    p.spawn_worker("fast")
    for i in ids:
        assert c.wait(i, timeout_s=30).status == "done"
    spans = sorted(tuple(map(float, p.runs(i)[0].split())) for i in ids)
    overlaps = [(a, b) for a, b in itertools.pairwise(spans) if a[1] > b[0]]
    assert not overlaps, f"{len(overlaps)} runs overlapped on one account's key of limit 1"


def test_two_functions_share_one_rate_key(project: Project) -> None:
    """Two functions with RATE_LIMIT {"key": "api:{account}", "limit": 2, "period": 1} on
    one account start 2 (the burst) at once between them, then one every half second, not
    twice that."""
    p = project
    p.add_function("ping", RATE, SCHEMA)
    p.add_function("pong", RATE, SCHEMA)
    p.write_config(concurrency=8)
    c = p.client
    ids = [c.enqueue(t, {"account": "acme"}).id for _ in range(3) for t in ("ping", "pong")]
    t0 = time.time()
    p.spawn_worker("fast")
    wait_for(lambda: all(p.runs(i) for i in ids), timeout=30, what="every job to run")
    starts = sorted(float(p.runs(i)[0]) for i in ids)
    # A burst of 2, then a token every 0.5 s: the 6th start is 2 s after the first.
    assert starts[-1] - starts[0] >= 1.8, [round(s - t0, 2) for s in starts]
