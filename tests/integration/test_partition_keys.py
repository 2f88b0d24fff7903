"""Keys across a change of ``partitions`` (docs/partitions.md, "Changing N"): a key that
the old count placed in one partition is found there by every process on the new count,
until it expires. An idempotent re-send after 3 -> 6 or 6 -> 4 returns the first job
(queued or done), and a RESOURCE_KEY held or queued under the old placement still
excludes the new count's jobs of that resource."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)

from runner.client import Client, Request
from runner.store import routing
from runner.store.keys import partition_tags

from conftest import SCAN_COUNT, Project, make_project, wait_for


def _on(p: Project, partitions: int) -> Client:
    """A client of its own on ``partitions`` (the previous one stays open: a process not
    restarted yet)."""
    p._runtime = None
    p.write_config(vt=2, fast=f"partitions = {partitions}", concurrency=16)
    return p.client


def _moved(keys: list[str], old: int, new: int) -> list[str]:
    """The keys whose route lands on another tag under the new count."""
    to = partition_tags("fast", old), partition_tags("fast", new)
    return [k for k in keys if to[0][routing.partition_of(f"i:idem:{k}", old)]
            != to[1][routing.partition_of(f"i:idem:{k}", new)]]


@pytest.mark.parametrize(("old", "new"), [(3, 6), (6, 4)])
def test_an_idempotent_resend_after_a_change_returns_the_first_job(cproject: Project, old: int, new: int) -> None:  # noqa: F811
    """60 orders on the old count, half of them run to done (a drained queue), half still
    queued; the count changes; each order sent again through a producer on the new count
    is the first job, and none runs twice."""
    p = cproject
    keys = [f"o{i}" for i in range(60)]
    assert len(_moved(keys, old, new)) >= 15, "the change must move keys"
    before = _on(p, old)
    first = {k: before.enqueue("idem", {"k": k}).id for k in keys[:30]}
    w = p.spawn_worker("fast")
    for k in keys[:30]:
        assert before.wait(first[k], timeout_s=30).status == "done"
    w.kill()
    w.wait()
    first |= {k: before.enqueue("idem", {"k": k}).id for k in keys[30:]}
    after = _on(p, new)
    again = after.enqueue_many([Request("idem", {"k": k}) for k in keys])
    wrong = [k for k, a in zip(keys, again, strict=True)
             if isinstance(a, Exception) or not a.duplicate or a.id != first[k]]
    assert not wrong, f"{len(wrong)} of 60 re-sends were new jobs: {wrong[:5]}"
    single = after.enqueue("idem", {"k": keys[-1]})
    assert single.duplicate and single.id == first[keys[-1]]
    p.spawn_worker("fast")
    for k in keys[30:]:
        assert after.wait(first[k], timeout_s=30).status == "done"
    runs = {k: len((p.records / f"idem-{k}").read_text().splitlines()) for k in keys}
    assert set(runs.values()) == {1}, {k: n for k, n in runs.items() if n != 1}


def test_a_resource_held_under_the_old_count_excludes_the_new_counts_jobs(cproject: Project) -> None:  # noqa: F811
    """Jobs of 12 resources hold them for 1 s on a worker of 6 partitions, and more wait
    queued behind them; the count goes to 4 and a producer and a worker on 4 send and run
    the same resources' jobs: no resource is ever held by two runs at once."""
    p = cproject
    res = [f"r{i}" for i in range(12)]
    to6, to4 = partition_tags("fast", 6), partition_tags("fast", 4)
    assert sum(to6[routing.partition_of(f"r:res:{r}", 6)] != to4[routing.partition_of(f"r:res:{r}", 4)]
               for r in res) >= 4
    before = _on(p, 6)
    ids = [before.enqueue("resource", {"r": r, "hold": 1.0}).id for r in res]
    ids += [before.enqueue("resource", {"r": r, "hold": 0.5}).id for r in res]
    p.spawn_worker("fast")
    wait_for(lambda: _running(p, before) >= 6, timeout=20, interval=0.05, what="the old count's jobs to start")
    after = _on(p, 4)
    ids += [after.enqueue("resource", {"r": r, "hold": 0.3}).id for r in res]
    p.spawn_worker("fast")
    for i in ids:
        assert after.wait(i, timeout_s=60).status == "done", i
    spans: dict[str, list[tuple[float, float]]] = {}
    for i, r in zip(ids, res * 3, strict=True):
        (line,) = p.runs(i)
        start, end, _ = line.split()
        spans.setdefault(r, []).append((float(start), float(end)))
    overlaps = [r for r, s in spans.items()
                if any(a[1] > b[0] for a, b in itertools.pairwise(sorted(s)))]
    assert not overlaps, f"held twice at once: {overlaps}"


def test_two_live_counts_agree_on_one_partition_per_key(cproject: Project) -> None:  # noqa: F811
    """During a rolling deploy (6 -> 4) a producer on each count sends the jobs of 30 new
    resources. The producer on 6 has not learnt of count 4 yet (it looks every 10 s), so
    its first jobs go where 6 puts them, the 4-producer's where 4 does: split. Once both
    know both counts, every job of a resource lands in one partition, whichever count
    sent it, one by one or in a batch (before: each producer found the other's jobs and
    went there, so a split key stayed split and its resource was held twice at once)."""
    p = cproject
    res = [f"fresh{i}" for i in range(30)]
    to6, to4 = partition_tags("fast", 6), partition_tags("fast", 4)
    assert sum(to6[routing.partition_of(f"r:res:{r}", 6)] != to4[routing.partition_of(f"r:res:{r}", 4)]
               for r in res) >= 10
    six = _on(p, 6)
    six.enqueue("record", {"n": 0})
    four = _on(p, 4)
    for r in res:  # (the 4-producer knows both counts; the 6-producer not yet)
        four.enqueue("resource", {"r": r, "hold": 0})
        six.enqueue("resource", {"r": r, "hold": 0})
    six.runtime.discover(record=True)
    assert "fast" in six.runtime.placements and "fast" in four.runtime.placements
    ids: dict[str, list[str]] = {r: [] for r in res}
    for n, r in enumerate(res):
        first, second = (six, four) if n % 2 else (four, six)
        ids[r] += [c.enqueue("resource", {"r": r, "hold": 0}).id for c in (first, second)]
    for c in (six, four):
        for r, a in zip(res, c.enqueue_many([Request("resource", {"r": r, "hold": 0}) for r in res]), strict=True):
            assert not isinstance(a, Exception)
            ids[r].append(a.id)
    split = [r for r in res if len({four._find(i)[0].tag for i in ids[r]}) > 1]
    assert not split, f"{len(split)} of 30 resources split between partitions: {split[:5]}"


def _running(p: Project, c: Client) -> int:
    return int(c.stats()["fast"]["processing"])


def test_check_names_what_a_change_of_count_implies(cproject: Project) -> None:  # noqa: F811
    """With keys placed by 3 partitions, `runner check` on a runner.toml of 6 says that keyed
    jobs keep meeting the old count's placement, though no tag drains."""
    import json
    import subprocess
    import sys

    p = cproject
    before = _on(p, 3)
    before.enqueue("idem", {"k": "x"})
    _on(p, 6)
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"),
                          "check", "--json"], cwd=p.root, env=p.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    (change,) = [c for c in json.loads(out.stdout)["partitions"] if c["queue"] == "fast"]
    assert change["draining"] == [] and change["counts"] == [3]
    text = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"), "check"],
                          cwd=p.root, env=p.env, capture_output=True, text=True, timeout=60).stdout
    assert "partitions = 3" in text and "idempotency" in text, text


def test_a_queue_of_one_partition_marks_no_limit_key(tmp_path: Path) -> None:
    """With partitions = 1 and no other count recorded, a job under a limit key writes no
    placement marker (one key per rendered key, for a day, at every enqueue: gigabytes
    with unique keys): there is no other placement to look it up from. A queue of more
    partitions still marks (a later change of count finds its keys)."""
    from runner.store.embedded import Server as Embedded

    srv = Embedded(tmp_path / "r", appendonly=False).start()
    try:
        p = make_project(tmp_path / "p", srv)
        c = p.client
        c.enqueue("resource", {"r": "one", "hold": 0})
        c.enqueue_many([Request("resource", {"r": f"many{i}", "hold": 0}) for i in range(3)])
        assert not list(p.runtime.redis.scan_iter(count=SCAN_COUNT, match="*:at")), "a marker was written"
        more = _on(p, 3)
        more.enqueue("resource", {"r": "two", "hold": 0})
        assert list(p.runtime.redis.scan_iter(count=SCAN_COUNT, match="*:at"))
        p.runtime.close()
    finally:
        srv.stop()


DEBOUNCED = '''
import os
QUEUE = "fast"
DEBOUNCE = {"key": "doc:{doc}", "period": 60, "max_wait": 600}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "deb-" + payload["doc"]), "a") as f:
        f.write(ctx.job_id + "\\n")
'''


@pytest.mark.parametrize(("old", "new"), [(3, 6), (4, 2)])
def test_a_debounced_resend_after_a_change_joins_its_pending_burst(project: Project, old: int, new: int) -> None:
    """Bursts of 16 debounce keys pending on the old count (a period of 60 s); the count
    changes and a producer on the new count sends each key again: every re-send joins its
    key's burst (the one job's id, its payload replaced), also for the keys the new count
    routes elsewhere (before: those started a second burst there, and the handler ran
    twice per key), one by one or in a batch."""
    project.add_function("deb", DEBOUNCED, '{"type": "object", "properties": {"doc": {"type": "string"}}}')
    docs = [f"d{i}" for i in range(16)]
    to = partition_tags("fast", old), partition_tags("fast", new)
    moved = [d for d in docs if to[0][routing.partition_of(f"d:deb:doc:{d}", old)]
             != to[1][routing.partition_of(f"d:deb:doc:{d}", new)]]
    assert len(moved) >= 4, "the change must move keys"
    before = _on(project, old)
    first = {d: before.enqueue("deb", {"doc": d, "v": 1}).id for d in docs}
    after = _on(project, new)
    one = {d: after.enqueue("deb", {"doc": d, "v": 2}).id for d in docs[:8]}
    many = after.enqueue_many([Request("deb", {"doc": d, "v": 3}) for d in docs[8:]])
    again = one | {d: a.id for d, a in zip(docs[8:], many, strict=True) if not isinstance(a, Exception)}
    wrong = [d for d in docs if again.get(d) != first[d]]
    assert not wrong, f"{len(wrong)} of 16 re-sends started a second burst ({len(moved)} keys moved): {wrong}"
    assert after.get(first[docs[0]]).as_dict()["absorbed"] == 1
